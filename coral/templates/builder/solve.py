"""Solve one combination: `build_template`, and a library's unit of work (`solve_task`).

`build_template` solves (model, node combination, SLO, mode, topology) exactly and wraps the
answer in a `Template`: one pipeline over every node by the step-model search
(`placement_step`) when a library asks (a floor) or for vLLM, otherwise the placement problem
of the memoised operating points by `placement.solve_placement`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Sequence

from coral.catalog.loader import Catalog
from coral.catalog.schema import ModelArch
from coral.errors import InputError
from coral.templates.space.engines import (
    DEFAULT_ENGINE,
    check_engine,
    engine_topology,
    max_nodes,
    same_gpu_count,
)
from coral.templates.space.enumerate import Combo
from coral.templates.space.operating_points import (
    DEFAULT_BATCHES,
    OperatingPointTables,
    PerfLike,
    check_mode,
    check_topology,
    input_embedding_bytes,
    shared_tables,
)
from coral.templates.step.search import BELOW_FLOOR_NOTE, solve_step
from coral.templates.step.bound import work_bound
from coral.templates.slo import SloSpec
from coral.templates.template import Template, infeasible_template, template_from_placement
from coral.templates.types import Mode, Placement, Topology

#: Relative tolerance of the dominance test (the solver's own feasibility tolerance is of
#: this order, so two throughputs closer than this are the same).
DOMINANCE_RTOL = 1e-6

#: Default time limit of one placement solve, s.
DEFAULT_TIME_LIMIT_S = 60.0

Solver = Callable[..., Placement]


def _default_solver() -> Solver:
    from coral.templates.placement.exact import solve_placement

    return solve_placement


def canonical_combo(catalog: Catalog, combo: Iterable[str]) -> Combo:
    names = [str(n).strip() for n in combo]
    if not names:
        raise InputError("a combination needs at least one node type")
    for name in names:
        catalog.node_type(name)  # unknown names raise with suggestions
    return tuple(sorted(names))


def build_template(
    model: str | ModelArch,
    combo: Iterable[str],
    slo: SloSpec,
    mode: Mode,
    topology: Topology,
    perf: PerfLike,
    catalog: Catalog,
    *,
    tables: OperatingPointTables | None = None,
    batches: Sequence[int] = DEFAULT_BATCHES,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    method: str = "auto",
    solver: Solver | None = None,
    floor: float | None = None,
    engine: str = DEFAULT_ENGINE,
) -> Template:
    """Solve one combination: the best SLO-feasible placement of `model` on its nodes.

    With `floor` (library builds, `flow` and `chain` topologies) only a single pipeline over
    every node that beats `floor` is sought, under the step model it runs by; when there is
    none the template has throughput 0 and `upper_bound` = `floor` (the combination is
    dominated by its parts). A custom `solver` or `method` is never given the floor.

    `engine` restricts the space to what that engine runs (`coral.templates.space.engines`): `vllm`
    needs topology `chain` and node types of one GPU count (else the template is infeasible),
    and its template is always one pipeline over every node (one node per stage).
    """
    arch = catalog.model(model) if isinstance(model, str) else model
    mode = check_mode(mode)
    engine = check_engine(engine)
    topology = check_topology(topology)
    if engine != "coral":
        topology = engine_topology(engine, topology)
    names = canonical_combo(catalog, combo)
    if engine == "vllm" and not same_gpu_count(catalog, names):
        return infeasible_template(
            arch, names, slo, mode, topology, catalog,
            "vLLM runs one tensor-parallel size per pipeline: these node types have "
            "different GPU counts",
        )
    limit = max_nodes(engine, mode)
    if limit is not None and len(names) > limit:
        return infeasible_template(
            arch, names, slo, mode, topology, catalog,
            f"a {engine} {mode} instance runs on at most {limit} node(s) (vLLM's KV connector "
            "runs no pipeline parallelism on the decode side)",
        )
    tables = tables or shared_tables(perf, catalog, batches)
    start = time.perf_counter()
    if uses_step_search(engine, topology, method, solver, floor):
        # one pipeline over every node, exact under the step model it runs by; vLLM (and the
        # chain topology) runs one node per stage
        placement = solve_step(tables.perf, catalog, arch, names, slo, mode,
                               max_group=None if topology == "flow" else 1, floor=floor,
                               batches=tables.batches)
    elif engine == "vllm":
        raise InputError("vLLM templates are searched under the step model (one pipeline over "
                         "every node); a custom solver or method does not apply")
    else:
        # the placement problem of the memoised operating points (not needed by the search)
        problem = tables.problem(arch, names, slo, mode, topology)
        if not any(node.options for node in problem.nodes):
            return infeasible_template(
                arch, names, slo, mode, topology, catalog,
                "no node has an operating point that fits its memory and meets the SLO",
            )
        placement = (solver or _default_solver())(problem, time_limit_s=time_limit_s,
                                                   method=method)
    wall = time.perf_counter() - start
    # the wall time of the whole call (the solver's own figure may leave out its presolve)
    tpl = template_from_placement(
        arch, names, slo, mode, topology, input_embedding_bytes(arch), placement, catalog,
        solve_s=wall
    )
    if floor is not None and any(n.startswith(BELOW_FLOOR_NOTE) for n in placement.notes):
        tpl = replace(tpl, upper_bound=float(floor))
    return tpl


def uses_step_search(engine: str, topology: str, method: str, solver: Solver | None,
                     floor: float | None) -> bool:
    """Whether `build_template` answers with the step-model search (`placement_step`): a
    single pipeline over every node (a floor given, or vLLM, which runs nothing else), with
    the default solver."""
    if solver is not None or method != "auto" or topology not in ("flow", "chain"):
        return False
    return check_engine(engine) == "vllm" or floor is not None


def explain_infeasible(
    model: str | ModelArch,
    combo: Iterable[str],
    slo: SloSpec,
    mode: Mode,
    tables: OperatingPointTables,
) -> str:
    """Why a combination has no placement, in words (for the CLI)."""
    arch = tables.catalog.model(model) if isinstance(model, str) else model
    names = canonical_combo(tables.catalog, combo)
    n = len(names)
    total_usable = sum(tables.usable_bytes(x) for x in names)
    parts: list[str] = []
    if total_usable < arch.weight_bytes:
        parts.append(
            f"the nodes' usable memory ({total_usable / 1e9:.1f} GB) is below the weights "
            f"({arch.weight_bytes / 1e9:.1f} GB)"
        )
    for name in dict.fromkeys(names):
        spec = tables.node_spec(arch, name, slo, mode, n)
        if not spec.options:
            t1 = tables.time_table(arch, name, slo, mode)
            fastest = float(t1.t[0].min())
            parts.append(
                f"{name} has no operating point (even one layer at batch "
                f"{t1.batches[0]} takes {fastest * 1e3:.1f} ms per iteration; "
                f"TPOT target {slo.tpot_s * 1e3:g} ms, TTFT target {slo.ttft_s:g} s)"
            )
    if not parts:
        parts.append(
            "no split of the layers over these nodes meets both memory and the SLO on every "
            "path (try more nodes, faster node types or a looser --tpot/--ttft)"
        )
    return "; ".join(parts)


@dataclass(frozen=True)
class Task:
    """One combination to solve, with the best throughput its proper sub-multisets reach,
    alone or side by side (two disjoint parts whose templates run next to each other)."""

    combo: Combo
    best_sub: float


@dataclass(frozen=True)
class Outcome:
    """What solving (or skipping) one combination gave."""

    combo: Combo
    template: Template | None  # None when skipped by the bound
    bound: float  # the a-priori upper bound on its throughput
    wall_s: float


def solve_task(
    task: Task,
    *,
    model: ModelArch,
    slo: SloSpec,
    mode: Mode,
    topology: Topology,
    perf: PerfLike,
    catalog: Catalog,
    tables: OperatingPointTables,
    time_limit_s: float,
    method: str,
    bound_skip: bool,
    solver: Solver | None = None,
    engine: str = DEFAULT_ENGINE,
) -> Outcome:
    start = time.perf_counter()
    floor = task.best_sub if bound_skip else _one_pipeline_floor(topology)
    by_steps = uses_step_search(engine, topology, method, solver, floor)
    if by_steps:
        bound = work_bound(tables.perf, catalog,
                           catalog.model(model) if isinstance(model, str) else model,
                           task.combo, slo, mode, batches=tables.batches)
    else:
        bound = tables.throughput_bound(model, task.combo, slo, mode)
    if bound_skip and task.best_sub > 0 and bound <= task.best_sub * (1 + DOMINANCE_RTOL):
        return Outcome(task.combo, None, bound, time.perf_counter() - start)
    tpl = build_template(
        model, task.combo, slo, mode, topology, perf, catalog, tables=tables,
        time_limit_s=time_limit_s, method=method, solver=solver,
        floor=floor, engine=engine,
    )
    if math.isfinite(bound) and tpl.upper_bound > bound:
        tpl = replace(tpl, upper_bound=bound)
    return Outcome(task.combo, tpl, bound, time.perf_counter() - start)


def _one_pipeline_floor(topology: Topology) -> float | None:
    """The floor that asks for one pipeline over every node and nothing more: a library's
    templates are single pipelines (one instance each) even without the dominance cut."""
    return 0.0 if topology in ("flow", "chain") else None


