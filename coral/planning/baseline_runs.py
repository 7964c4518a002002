"""The baselines, run beside Coral's plan on the same templates: for the comparison the plan
file shows, and as starts of Coral's own search (`baseline_start`), so that Coral's plan is
never worse than one of them.

The plan stands without them: when `coral.baselines` is missing or fails, the plan carries a
note saying why instead.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from coral.allocator.problem import TemplateRegion
from coral.allocator.scenario.load import Scenario
from coral.catalog.loader import Catalog
from coral.planning.columns import ID_SEP
from coral.templates.builder.build import Template
from coral.templates.space.operating_points import PerfLike, shared_tables

log = logging.getLogger(__name__)


def baseline_start(result: Any) -> dict[TemplateRegion, int]:
    """A baseline's instances as Coral's columns would hold them: its column ids name
    (prefix, model, mode, combination), Coral's `model|mode|combination`. A column Coral
    lacks is dropped by the solve; one Coral holds is valued at Coral's own planned capacity
    and the scenario's prices, so the start is judged as Coral's plans are."""
    plan = getattr(result, "plan", None)
    out: dict[TemplateRegion, int] = {}
    for (tid, region), n in (plan.instances.items() if plan is not None else ()):
        parts = str(tid).split(":")
        if len(parts) < 4:
            continue
        key = (ID_SEP.join(parts[-3:]), region)
        out[key] = out.get(key, 0) + int(n)
    return out


def baselines_beside(scenario: Scenario, templates: Mapping[str, Sequence[Template]],
                   catalog: Catalog, perf: PerfLike, nmax: int, *, time_limit_s: float,
                   mip_gap: float) -> tuple[dict[str, Any], str | None]:
    """Every baseline but Coral's own allocation (that is the plan), or ({}, why not)."""
    try:
        from coral.baselines import BASELINES, run_baselines
    except ImportError as exc:
        return {}, f"baselines not run: coral.baselines is not available ({exc})"
    names = [n for n in BASELINES if n != "coral"]
    try:
        results = run_baselines(
            scenario, {m: list(t) for m, t in templates.items()}, catalog=catalog, perf=perf,
            tables=shared_tables(perf, catalog), time_limit_s=time_limit_s, mip_gap=mip_gap,
            baselines=names, n_max=nmax,
        )
    except ImportError as exc:
        return {}, f"baselines not run: {exc}"
    except Exception as exc:  # noqa: BLE001 - the plan stands without the comparison
        log.warning("baselines failed", exc_info=True)
        return {}, f"baselines failed, plan shown without them: {type(exc).__name__}: {exc}"
    return dict(results), None
