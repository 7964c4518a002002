"""A plan's file format and its decoded instances: what `coral plan --out` writes and every
reader of a plan (`coral simulate`, `coral serve`, the runtime's deployment, the baselines'
deployments) reads.

`decode_instances` turns an allocation's instance counts into `PlannedInstances`, each with
its template's nodes and layer placement; `read_plan_file` reads a plan file back and
`plan_slos` the SLO every model was planned for; `baseline_summary` is a baseline's entry in
the file. They sit in the allocator layer, below the
planner that writes plans and the baselines, simulator and runtime that read them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from coral.errors import CoralError
from coral.allocator.problem import AllocationPlan, TemplateColumn
from coral.perf.pipeline import PipelineShape
from coral.templates.build import Template
from coral.templates.slo import SloSpec


@dataclass(frozen=True)
class PlannedInstances:
    """`count` instances of one template in one region."""

    region: str
    template_id: str
    model: str
    mode: str
    count: int
    node_counts: Mapping[str, int]  # node type -> nodes in one instance
    shape: PipelineShape | None  # what one instance deploys (None: no template known)
    capacity: float  # one instance, in `unit`
    unit: str
    capacity_rps: float  # one instance, planned requests/s of the model's workload mix
    usd_per_hour: float  # one instance, in this region
    started: int  # of `count`, started against the current deployment
    utilisation: float = 1.0  # planned capacity / full throughput (queueing headroom)
    market: str = "on_demand"  # or `spot` (`coral plan --spot`); a reader takes missing as on_demand

    @property
    def node_mix(self) -> str:
        return ", ".join(f"{k}x {g}" for g, k in self.node_counts.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "template_id": self.template_id,
            "model": self.model,
            "mode": self.mode,
            "count": self.count,
            "nodes": dict(self.node_counts),
            "stages": self.shape.to_dicts() if self.shape is not None else [],
            "capacity": self.capacity,
            "unit": self.unit,
            "capacity_rps": self.capacity_rps,
            "usd_per_hour": self.usd_per_hour,
            "usd_per_hour_total": self.usd_per_hour * self.count,
            "started": self.started,
            "utilisation": self.utilisation,
            "market": self.market,
        }


class PlanFileError(CoralError, ValueError):
    """A file that should hold a plan written by `coral plan --out` does not."""


#: Largest plan file read. A plan holds one row per template and region it uses (and the
#: lists of templates and columns it chose from), far below this; the bound refuses a wrong
#: file at once instead of parsing gigabytes.
MAX_PLAN_FILE_BYTES = 64 << 20


def read_plan_file(path: str | Path) -> dict[str, Any]:
    """The JSON payload of a plan file from `coral plan SCENARIO --out FILE` (it names its
    scenario and lists its instances), or `PlanFileError` saying what is wrong. Its rows are
    not checked here: every reader checks them with `coral.allocator.plan_check`."""
    p = Path(path)
    if not p.is_file():
        raise PlanFileError(f"plan file {p} does not exist")
    size = p.stat().st_size
    if size > MAX_PLAN_FILE_BYTES:
        raise PlanFileError(f"{p} holds {size / 2**20:.0f} MiB, more than a plan file's "
                            f"{MAX_PLAN_FILE_BYTES >> 20} MiB; expected a file from "
                            "`coral plan SCENARIO --out FILE`")
    try:
        payload = json.loads(p.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanFileError(f"{p} is not JSON ({exc}); expected a file from "
                            "`coral plan SCENARIO --out FILE`") from None
    except (ValueError, RecursionError) as exc:  # a number of >4300 digits; deep nesting
        raise PlanFileError(f"{p} is not a plan's JSON ({type(exc).__name__}: {exc}); "
                            "expected a file from `coral plan SCENARIO --out FILE`") from None
    if not isinstance(payload, dict) or "instances" not in payload or "scenario" not in payload:
        raise PlanFileError(f"{p} is not a plan: expected 'scenario' and 'instances' (write "
                            "one with `coral plan SCENARIO --out FILE`)")
    return payload


def plan_slos(payload: Mapping[str, Any], path: str | Path = "the plan"
              ) -> dict[str, SloSpec] | None:
    """The SLO of every model a plan file was planned for (its `slos`); None for a plan
    written without them. A malformed entry raises `PlanFileError` naming it."""
    raw = payload.get("slos")
    if raw is None:
        return None
    if not isinstance(raw, MappingABC):
        raise PlanFileError(f"{path}: 'slos' must map each model to its SLO")
    out = {}
    for model, values in raw.items():
        try:
            out[str(model)] = SloSpec(**values)
        except (TypeError, ValueError) as exc:
            raise PlanFileError(f"{path}: slos[{model!r}] is not an SLO ({exc})") from None
    return out


def decode_instances(plan: AllocationPlan, columns: Sequence[TemplateColumn],
                     templates: Mapping[str, Template], markets: Mapping[str, str] | None = None
                     ) -> tuple[PlannedInstances, ...]:
    """The plan's instance counts with each template's nodes and layer placement; `markets`
    names the spot columns (column id -> `spot`), every other column is on demand."""
    col_by_id = {c.id: c for c in columns}
    out: list[PlannedInstances] = []
    for (tid, region), count in sorted(plan.instances.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        col = col_by_id[tid]
        tpl = templates.get(tid)
        shape = tpl.shape if tpl is not None else None
        if tpl is not None and tpl.throughput > 0:
            rps = col.capacity * tpl.throughput_rps / tpl.throughput
            utilisation = col.capacity / tpl.throughput
        else:
            rps = col.capacity if col.mode == "aggregated" else 0.0
            utilisation = 1.0
        out.append(PlannedInstances(
            region=region, template_id=tid, model=col.model, mode=col.mode, count=int(count),
            node_counts=dict(col.node_counts), shape=shape, capacity=col.capacity,
            unit=tpl.unit if tpl is not None else "req/s", capacity_rps=rps,
            usd_per_hour=col.price_usd_per_hour[region],
            started=int(plan.started.get((tid, region), 0)), utilisation=utilisation,
            market=(markets or {}).get(tid, "on_demand"),
        ))
    return tuple(out)


def baseline_summary(result: Any) -> dict[str, Any]:
    """A baseline result's figures as plain JSON values."""
    plan = getattr(result, "plan", None)
    served = {m: float(f) for m, f in dict(result.served_fraction).items()}
    return {
        "cost_per_hour": float(result.cost_per_hour),
        "served_fraction": served,
        # the paper's scarcity rule: the uniform factor on every model's demand its plan
        # meets (1: the full demand), and the generated tokens/s it serves
        "demand_scale": float(getattr(result, "demand_scale", 1.0)),
        "goodput_tokens_per_s": finite(float(getattr(result, "goodput_tokens_per_s",
                                                     math.nan))),
        # only a plan serving all demand compares with Coral's on cost
        "meets_demand": bool(getattr(result, "meets_demand",
                                     all(f >= 1.0 - 1e-6 for f in served.values()))),
        # how far its cost may be from the best its restriction allows: null for a heuristic
        # plan (nothing proven); a plan stopped by the time limit may cost up to `gap` less
        "status": plan.status.value if plan is not None else None,
        "gap": finite(getattr(result, "gap", math.inf)),
        "goodput_gap": None if plan is None or getattr(result, "heuristic", False)
        else finite(plan.goodput_gap),
        "solve_seconds": float(plan.solve_s) if plan is not None else None,
        "solved": getattr(result, "solved", None),
        "notes": [str(n) for n in getattr(result, "notes", ())],
    }


def finite(x: float) -> float | None:
    """`x`, or None (JSON null) when it is not finite."""
    return float(x) if math.isfinite(x) else None
