"""Run every baseline of a scenario on the same catalog, perf model, templates and allocator.

`run_baselines` takes what the planner built (each model's aggregated templates) and returns
one `BaselineResult` per baseline, plus `coral` itself: the allocation ILP over all of the
given templates, so that every figure of a comparison comes from one call with one set of
prices and availability.

Every method but Helix runs under the paper's scarcity rule (`coral.baselines.scale`): one
that cannot meet the demand is re-run with every model's demand scaled down uniformly to the
largest factor it meets, and reported at that factor (its $/hour, every model served that
share, its goodput in tokens/s). Helix is the exception: its plan is sized by throughput
without the SLO and judged by the share that meets it, a share no demand factor changes, so
it is reported as planned (with its goodput).
"""

from __future__ import annotations

import logging
import time
from typing import Mapping, Sequence

from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.problem import DEFAULT_MIP_GAP, DEFAULT_TIME_LIMIT_S
from coral.allocator.scenario.load import Scenario
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
from coral.baselines.homo import homo_greedy, homo_joint, homogeneous_templates
from coral.baselines.melange import melange
from coral.baselines.scale import scale_down, with_goodput
from coral.catalog.loader import Catalog
from coral.errors import InputError
from coral.templates.builder.build import Solver, Template
from coral.templates.space.operating_points import OperatingPointTables, PerfLike
from coral.templates.types import Mode, Topology

log = logging.getLogger(__name__)

#: Every baseline `run_baselines` knows, in the order it runs them.
BASELINES: tuple[str, ...] = ("coral", "homo", "homo-joint", "melange", "cauchy", "helix")


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
    if {"homo", "homo-joint", "melange", "helix"} & set(names):
        homo_sets = homogeneous("aggregated")
    pd_sets: tuple[dict[str, list[Template]], dict[str, list[Template]]] | None = None
    if "cauchy" in names:
        pd_sets = (homogeneous("prefill"), homogeneous("decode"))

    def coral(sc: Scenario) -> BaselineResult:
        columns = [c for tpls in given.values() for c in columns_of(sc, tpls, prefix="coral")]
        plan = solve_allocation(scenario_problem(sc, columns, time_limit_s=time_limit_s,
                                                 mip_gap=mip_gap))
        return result_of("coral", plan, (
            f"Coral's allocation ILP over the {len(columns)} given templates",),
            instances=deployment_of(sc, plan, (t for tpls in given.values() for t in tpls),
                                    prefix="coral"))

    for name in names:
        start = time.perf_counter()
        if name == "coral":
            out[name] = scale_down(coral, scenario)
        elif name == "homo":
            assert homo_sets is not None
            out[name] = scale_down(lambda sc: homo_greedy(sc, homo_sets), scenario)
        elif name == "homo-joint":
            assert homo_sets is not None
            out[name] = scale_down(lambda sc: homo_joint(sc, homo_sets, time_limit_s=time_limit_s,
                                                         mip_gap=mip_gap), scenario)
        elif name == "melange":
            assert homo_sets is not None
            out[name] = scale_down(lambda sc: melange(sc, homo_sets, time_limit_s=time_limit_s,
                                                      mip_gap=mip_gap), scenario)
        elif name == "cauchy":
            assert pd_sets is not None
            out[name] = scale_down(lambda sc: cauchy(sc, *pd_sets, time_limit_s=time_limit_s,
                                                     mip_gap=mip_gap), scenario)
        elif name == "helix":
            assert homo_sets is not None
            candidates = {m: [t.combo for t in given[m]] + [t.combo for t in homo_sets[m]]
                          for m in given}
            res, _ = helix(scenario, candidates, builder, time_limit_s=time_limit_s,
                           mip_gap=mip_gap)
            out[name] = with_goodput(res, scenario)
        log.info("baseline %s: $%.2f/hour at demand x%.4f in %.2f s", name,
                 out[name].cost_per_hour, out[name].demand_scale, time.perf_counter() - start)
    log.info("baselines of %s: %d placements solved, %.1f s", scenario.name, builder.solved,
             time.perf_counter() - t0)
    return out
