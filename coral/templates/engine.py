"""Serving engines as restrictions of the template space (DESIGN.md, "Engines constrain the
shape").

* `coral`: Coral's own runtime runs every instance shape — a pipeline of stages, each stage
  one or more identical nodes on one layer range — so nothing is restricted.
* `vllm`: vLLM's pipeline parallelism runs one node per stage (topology `chain`), the same
  tensor-parallel size (GPUs per node) on every node of a pipeline, any GPU type per stage,
  and data parallelism only as separate instances. It runs one `max-num-seqs` (one prompt
  token budget) for the whole instance and sizes every worker's KV cache by the smallest one,
  so a pipeline's concurrency is the minimum over its stages: a vLLM template runs one common
  operating-point batch on every node.

`solve_common_batch` solves the chain problem once per batch value with every node's options
filtered to that batch and keeps the best. That is exact for the restricted space: every
common-batch chain is a chain of one of the filtered problems, and every chain of a filtered
problem runs one batch. It needs each node's options *before* the cross-batch dominance cut
of `operating_points` (a point dominated by another batch of the same node is still what that
node runs when the pipeline's batch is that one): `OperatingPointTables.problem(...,
per_batch=True)` gives them.

Prefill/decode pairs may differ in TP and GPU type between their prefill and their decode
instance (the KV connector moves the cache); each half is its own template, so the rule above
applies to each half alone.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from enum import Enum
from typing import Any, Callable, Iterable, Literal

from coral.catalog.loader import Catalog
from coral.templates.types import (
    NodeSpec,
    Placement,
    PlacementProblem,
    SolveStatus,
    Topology,
    upper_bound_of,
)

Engine = Literal["coral", "vllm"]
ENGINES: tuple[str, ...] = ("coral", "vllm")
DEFAULT_ENGINE: Engine = "coral"

#: What a common-batch placement's notes say (with the batch), so a reader can tell.
COMMON_BATCH_NOTE = "vllm: one batch on every node"
#: Version of the rules a restricted engine's libraries were built under (in their digest):
#: 2 adds the step-model bounds of `problem_at_batch` and single-node decode instances.
ENGINE_RULES_VERSION = 2


def max_nodes(engine: str, mode: str) -> int | None:
    """Most nodes one instance of `engine` may have in `mode` (None: no limit of its own).

    vLLM's NixlConnector runs no pipeline parallelism on the decode side (its
    `kv_connector/v1/nixl` worker refuses a decode instance with pipeline-parallel size > 1),
    so a vLLM decode instance is one node; prefill instances may be pipelines."""
    return 1 if check_engine(engine) == "vllm" and mode == "decode" else None


def check_engine(engine: str) -> Engine:
    value = engine.value if isinstance(engine, Enum) else engine
    if value not in ENGINES:
        raise ValueError(f"unknown engine {value!r}; choose one of {', '.join(ENGINES)}")
    return value  # type: ignore[return-value]


def engine_topology(engine: str, topology: str | None = None) -> Topology:
    """The topology templates for `engine` are solved in: `topology` (default `flow`) for
    Coral; `chain` for vLLM, which runs nothing else (asking it for another is an error)."""
    engine = check_engine(engine)
    if engine == "vllm":
        if topology not in (None, "chain"):
            raise ValueError(f"engine vllm runs one node per pipeline stage (topology chain); "
                             f"topology {topology!r} is not deployable on it")
        return "chain"
    return (topology or "flow")  # type: ignore[return-value]


def same_gpu_count(catalog: Catalog, combo: Iterable[str]) -> bool:
    """Whether every node type of `combo` has the same number of GPUs (vLLM runs one tensor
    parallel size over a whole pipeline)."""
    return len({catalog.node_type(n).gpu_count for n in combo}) <= 1


def deployable_combo(engine: str, catalog: Catalog, combo: Iterable[str],
                     mode: str | None = None) -> bool:
    """Whether `engine` can run a template on `combo` at all (before placement); with
    `mode`, also within the engine's node limit of that mode (`max_nodes`)."""
    if check_engine(engine) == "coral":
        return True
    names = list(combo)
    limit = max_nodes(engine, mode) if mode is not None else None
    return same_gpu_count(catalog, names) and (limit is None or len(names) <= limit)


def engine_violations(engine: str, template: Any, catalog: Catalog) -> list[str]:
    """Why one instance of `template` is not deployable on `engine`, in words (empty: it is).
    `template` is a `coral.templates.build.Template` that is one pipeline."""
    if check_engine(engine) == "coral":
        return []
    out: list[str] = []
    try:
        shape = template.shape
    except ValueError as exc:
        return [f"not one pipeline ({exc})"]
    if not shape.is_chain:
        out.append("a stage has several nodes (vLLM runs data parallelism only as separate "
                   "instances)")
    gpus = sorted({catalog.node_type(s.node_type).gpu_count for s in shape.stages})
    if len(gpus) > 1:
        out.append(f"nodes with different GPU counts {gpus} (vLLM runs one TP size per pipeline)")
    limit = max_nodes(engine, getattr(template, "mode", ""))
    if limit is not None and shape.num_nodes > limit:
        out.append(f"a {template.mode} instance of {shape.num_nodes} nodes (vLLM's KV connector "
                   f"runs no pipeline parallelism on the decode side)")
    batches = sorted({s.batch for s in shape.stages})
    if len(batches) > 1:
        out.append(f"stages at different batches {batches} (vLLM runs one max-num-seqs per "
                   "instance)")
    return out


# ---------------------------------------------------------------------------------------------
# The common-batch chain solver
# ---------------------------------------------------------------------------------------------

#: Filtered node specs, by (id of the full spec, batch), holding the full spec so that its id
#: is not reused while the entry lives. The filtered spec keeps one identity across the
#: combinations of a library, which is what `node_memo`'s per-node memo is keyed by.
_FILTERED: dict[tuple[int, int, float, float], tuple[NodeSpec, NodeSpec]] = {}
_FILTERED_SIZE = 8192


def spec_at_batch(spec: NodeSpec, batch: int, max_step_s: float = math.inf,
                  max_prefill_s: float = math.inf) -> NodeSpec:
    """`spec` with only its operating points at `batch` whose step (prefill) time is at most
    `max_step_s` (`max_prefill_s`) (memoised by identity)."""
    key = (id(spec), int(batch), max_step_s, max_prefill_s)
    hit = _FILTERED.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    out = replace(spec, options=tuple(
        op for op in spec.options
        if op.batch == batch and op.step_s <= max_step_s and op.prefill_s <= max_prefill_s))
    if len(_FILTERED) >= _FILTERED_SIZE:
        _FILTERED.clear()
    _FILTERED[key] = (spec, out)
    return out


def common_batches(problem: PlacementProblem) -> list[int]:
    """The batch values every node has an operating point at (a chain uses every node)."""
    sets = [{op.batch for op in node.options} for node in problem.nodes]
    if not sets:
        return []
    return sorted(set.intersection(*sets))


def problem_at_batch(problem: PlacementProblem, batch: int) -> PlacementProblem:
    """`problem` with every node at `batch`, and each node's step bounded so that the chain
    meets the SLO under the pipeline step model it runs by (`coral.perf.step`).

    A chain of `n` nodes at one batch runs `n` micro-batches of `batch` sequences; a step
    (every micro-batch one token further) lasts `n x` its slowest node's time (send
    included), and that is every sequence's TPOT; a prompt's step likewise. So the chain meets
    TPOT (TTFT) exactly when every node's step (prefill) time is at most `TPOT / n` (`TTFT /
    n`): the per-path sums the chain DP bounds are then implied. Its rate, `batch /` the
    slowest node's time, is what the DP maximises, and each node's KV memory already holds
    `n x batch` resident sequences (`operating_points`, Little's law at depth `n`), so the DP
    optimises what the simulator runs."""
    n = max(1, len(problem.nodes))
    step = math.inf if problem.tpot_s is None else problem.tpot_s / n
    prefill = math.inf if problem.ttft_s is None else problem.ttft_s / n
    return replace(problem, nodes=tuple(spec_at_batch(x, batch, step, prefill)
                                        for x in problem.nodes))


PlacementSolver = Callable[..., Placement]


def solve_common_batch(problem: PlacementProblem, *, time_limit_s: float = 60.0,
                       method: str = "auto", floor: float | None = None,
                       solver: PlacementSolver | None = None) -> Placement:
    """The best chain over every node of `problem` with one batch on all of its nodes.

    Solves the chain problem once per common batch value (options filtered to it) with
    `solver` (default `placement.solve_placement`) and keeps the best. With `floor` (library
    builds, default solver, method `auto`) only a pipeline beating `floor` is sought, and the
    batch values are tried in decreasing order of their pipeline bound, each solve's floor
    raised to the best found so far, so that most values are cut by their bound alone; the
    answer is then the best such pipeline, or a zero-throughput placement saying nothing
    beats the floor (as `solve_placement` with a floor). A custom `solver` is not given the
    floor.
    """
    from coral.templates.node_memo import pipeline_bound
    from coral.templates.placement import BELOW_FLOOR_NOTE, solve_placement
    from coral.templates.placement_ilp import infeasible_placement

    if problem.topology != "chain":
        raise ValueError(f"the common-batch solver solves chain problems, got topology "
                         f"{problem.topology!r}")
    t0 = time.perf_counter()
    solve = solver or solve_placement
    use_floor = floor is not None and solver is None and method == "auto"
    batches = common_batches(problem)
    if not batches:
        return infeasible_placement("no batch value at which every node has an operating "
                                    "point (vLLM runs one batch on every node)",
                                    time.perf_counter() - t0, "chain-dp")
    subs = [(b, problem_at_batch(problem, b)) for b in batches]
    if use_floor:
        bounds = {b: pipeline_bound(p) for b, p in subs}
        subs.sort(key=lambda bp: (-bounds[bp[0]], bp[0]))
    best: tuple[int, Placement] | None = None
    below = False  # the floor cut some batch value (its pipelines, if any, do not beat it)
    time_limited: list[Placement] = []
    reasons: list[str] = []
    for b, sub in subs:
        left = max(0.01, time_limit_s - (time.perf_counter() - t0))
        if use_floor:
            assert floor is not None
            at = floor if best is None else max(floor, best[1].throughput)
            if at > 0 and bounds[b] <= at:
                below = True
                break  # the others' bounds are no higher
            p = solve(sub, time_limit_s=left, method=method, floor=at)
        else:
            p = solve(sub, time_limit_s=left, method=method)
        if p.status is SolveStatus.INFEASIBLE:
            reasons.extend(p.notes[:1])
            continue
        if any(n.startswith(BELOW_FLOOR_NOTE) for n in p.notes):
            below = True
            continue
        if p.status is SolveStatus.TIME_LIMIT:
            time_limited.append(p)
        if p.throughput > 0 and (best is None or p.throughput > best[1].throughput):
            best = (b, p)
    wall = time.perf_counter() - t0
    if best is None:
        if below:
            assert floor is not None
            return Placement(throughput=0.0, nodes=(), edges=(), status=SolveStatus.OPTIMAL,
                             gap=0.0, solve_s=wall, method="chain-dp",
                             notes=(f"{BELOW_FLOOR_NOTE} {floor:.6g}",))
        why = "; ".join(dict.fromkeys(reasons)) or "no chain meets memory and SLO"
        return infeasible_placement(f"no common batch: {why}", wall, "chain-dp")
    b, p = best
    status, gap = p.status, p.gap
    if time_limited:
        # a value solved only to its time limit may hide a better chain: the proven bound is
        # the largest of every value's bound
        ub = max([p.throughput] + [upper_bound_of(q.throughput, q.status, q.gap)
                                     for q in time_limited])
        status = SolveStatus.TIME_LIMIT
        gap = 0.0 if ub <= p.throughput else (1.0 if not math.isfinite(ub)
                                              else (ub - p.throughput) / ub)
    return Placement(throughput=p.throughput, nodes=p.nodes, edges=p.edges, status=status,
                     gap=gap, solve_s=wall, method=p.method,
                     notes=(f"{COMMON_BATCH_NOTE} (batch {b})", *p.notes))


__all__ = [
    "COMMON_BATCH_NOTE",
    "DEFAULT_ENGINE",
    "ENGINES",
    "Engine",
    "check_engine",
    "common_batches",
    "deployable_combo",
    "engine_topology",
    "engine_violations",
    "ENGINE_RULES_VERSION",
    "max_nodes",
    "problem_at_batch",
    "same_gpu_count",
    "solve_common_batch",
    "spec_at_batch",
]
