"""Run every baseline of a scenario on the same catalog, perf model, templates and allocator.

`run_baselines` takes what the planner built (each model's aggregated templates) and returns
one `BaselineResult` per baseline, plus `coral` itself: the allocation ILP over all of the
given templates, so that every figure of a comparison comes from one call with one set of
prices and availability.
"""

from __future__ import annotations

import logging
import time
from typing import Mapping, Sequence

from coral.allocator.ilp import solve_allocation
from coral.allocator.problem import DEFAULT_MIP_GAP, DEFAULT_TIME_LIMIT_S
from coral.allocator.scenario import Scenario
from coral.baselines.cauchy import cauchy
from coral.baselines.common import (
    BaselineResult,
    TemplateBuilder,
    check_node_types,
    check_templates,
    columns_of,
    deployment_of,
    did_you_mean,
    result_of,
    scenario_problem,
)
from coral.baselines.helix import helix
from coral.baselines.homo import homo_independent, homo_joint, homogeneous_templates
from coral.baselines.melange import melange
from coral.catalog.loader import Catalog
from coral.errors import InputError
from coral.templates.build import Solver, Template
from coral.templates.operating_points import OperatingPointTables, PerfLike
from coral.templates.types import Mode, Topology

log = logging.getLogger(__name__)

#: Every baseline `run_baselines` knows, in the order it runs them.
BASELINES: tuple[str, ...] = ("coral", "homo", "homo-independent", "melange", "cauchy", "helix")


def _check_names(names: Sequence[str]) -> tuple[str, ...]:
    for name in names:
        if name not in BASELINES:
            raise InputError(f"unknown baseline {name!r}; choose among {', '.join(BASELINES)}."
                             f"{did_you_mean(name, BASELINES)}")
    return tuple(n for n in BASELINES if n in names)


def run_baselines(
    scenario: Scenario,
    templates: Mapping[str, Sequence[Template]],
    *,
    catalog: Catalog,
    perf: PerfLike,
    tables: OperatingPointTables | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    mip_gap: float = DEFAULT_MIP_GAP,
    baselines: Sequence[str] | None = None,
    n_max: int | None = None,
    node_types: Sequence[str] | None = None,
    topology: Topology = "flow",
    solver: Solver | None = None,
    builder: TemplateBuilder | None = None,
) -> dict[str, BaselineResult]:
    """Every baseline (or those named in `baselines`) on `scenario`, by name.

    `templates`: model -> that model's templates as the planner kept them (aggregated; any
    mode is accepted for `coral`). Templates the baselines need and the planner did not keep
    (homogeneous ones, PD halves, no-SLO placements) are solved with the same catalog, perf
    model and operating-point `tables`, with up to `n_max` nodes of `node_types` (defaults: the
    scenario's). `time_limit_s` and `mip_gap` apply to each allocation solve.
    Pass a `builder` to reuse solved placements across calls (e.g. re-running the baselines
    as availability changes); it fixes the catalog, perf model, tables, topology and solver.
    Raises `ValueError` for a model the scenario does not serve or templates of another SLO.
    """
    names = _check_names(BASELINES if baselines is None else list(baselines))
    given = check_templates(scenario, templates)
    if n_max is not None and n_max < 1:
        raise InputError(f"n_max must be >= 1, got {n_max}")
    if node_types is not None:
        check_node_types(catalog, node_types)
    if builder is None:
        builder = TemplateBuilder(catalog, perf, tables, topology=topology, solver=solver)
    elif builder.catalog is not catalog:
        raise ValueError("the template builder was made for another catalog")
    for tpls in given.values():
        builder.seed(tpls)
    t0 = time.perf_counter()
    out: dict[str, BaselineResult] = {}

    def homogeneous(mode: Mode) -> dict[str, list[Template]]:
        return {m: homogeneous_templates(m, [t for t in tpls if t.mode == mode], builder,
                                         scenario, mode=mode, n_max=n_max,
                                         node_types=node_types)
                for m, tpls in given.items()}

    homo_sets: dict[str, list[Template]] | None = None
    if {"homo", "homo-independent", "melange", "helix"} & set(names):
        homo_sets = homogeneous("aggregated")

    for name in names:
        start = time.perf_counter()
        if name == "coral":
            columns = [c for tpls in given.values() for c in columns_of(scenario, tpls,
                                                                       prefix="coral")]
            plan = solve_allocation(scenario_problem(scenario, columns, time_limit_s=time_limit_s,
                                                     mip_gap=mip_gap))
            out[name] = result_of(name, plan, (
                f"Coral's allocation ILP over the {len(columns)} given templates",),
                instances=deployment_of(scenario, plan,
                                        (t for tpls in given.values() for t in tpls),
                                        prefix="coral"))
        elif name == "homo":
            assert homo_sets is not None
            out[name] = homo_joint(scenario, homo_sets, time_limit_s=time_limit_s,
                                   mip_gap=mip_gap)
        elif name == "homo-independent":
            assert homo_sets is not None
            out[name] = homo_independent(scenario, homo_sets)
        elif name == "melange":
            assert homo_sets is not None
            out[name] = melange(scenario, homo_sets, time_limit_s=time_limit_s, mip_gap=mip_gap)
        elif name == "cauchy":
            out[name] = cauchy(scenario, homogeneous("prefill"), homogeneous("decode"))
        elif name == "helix":
            assert homo_sets is not None
            candidates = {m: [t.combo for t in given[m]] + [t.combo for t in homo_sets[m]]
                          for m in given}
            out[name], _ = helix(scenario, candidates, builder, time_limit_s=time_limit_s,
                                 mip_gap=mip_gap)
        log.info("baseline %s: $%.2f/hour in %.2f s", name, out[name].cost_per_hour,
                 time.perf_counter() - start)
    log.info("baselines of %s: %d placements solved, %.1f s", scenario.name, builder.solved,
             time.perf_counter() - t0)
    return out
