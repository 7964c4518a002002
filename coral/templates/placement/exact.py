"""Front door of the placement solvers: the exact method of each topology.

* `flow` → the staged DP (`placement_chain`): the best split of the nodes into replicas, each
  a pipeline of data-parallel stages of identical nodes. Exact for that class.
* `chain` → the exact chain DP (one node per stage).
* `dag` → preprocessing, the staged DP as a warm start and lower bound, an upper bound (the
  smaller of the coverage bound and the path-LP bound); when they meet the staged answer is
  optimal for the DAG too and no MILP is built; otherwise the tightened MILP, warm-started and
  capped by the bound, within the time limit (status `time_limit` with the proven gap if it
  runs out).

A library's templates (one pipeline over every node, beating a floor) are not solved here but
by the step-model search (`placement_step`), under the model the instance runs by.

`method="ilp"` forces the tightened MILP (`chain` and `dag` only), `method="naive"` the
naive MILP of the DAG (a benchmark baseline).
"""

from __future__ import annotations

import time
from typing import Literal

from coral.errors import InputError
from coral.templates.placement.path_lp import path_lp_bound
from coral.templates.placement.chain import best_chain, best_replicas, solve_chain
from coral.templates.placement.ilp import solve_ilp
from coral.templates.placement.prep import (
    flow_upper_bound,
    infeasible_placement,
    prepare,
    to_placement,
)
from coral.templates.placement.node_memo import prepare_unfiltered
from coral.templates.types import Placement, PlacementProblem, SolveStatus

Method = Literal["auto", "ilp", "naive"]

_BOUND_RTOL = 1e-9


def solve_placement(problem: PlacementProblem, *, time_limit_s: float = 60.0,
                    method: Method = "auto") -> Placement:
    """Best placement of `problem`; `status` says whether it is proven optimal."""
    t0 = time.perf_counter()
    if method == "naive":
        if problem.topology == "flow":
            raise InputError("the naive MILP models the chain and dag topologies")
        return solve_ilp(problem, naive=True, time_limit_s=time_limit_s)
    if method not in ("auto", "ilp"):
        raise InputError(f"unknown placement method {method!r}")
    if method == "ilp" and problem.topology == "flow":
        raise InputError("the flow topology is solved exactly by the staged DP; "
                         "the MILP models the chain and dag topologies")
    if problem.topology == "dag" or method != "auto":
        prep = prepare(problem, path_filter=True)
    else:
        prep = prepare_unfiltered(problem)
    if prep.infeasible:
        return infeasible_placement(prep.infeasible, time.perf_counter() - t0, method)

    if problem.topology == "flow":
        best = best_replicas(prep)  # empty when nothing can serve: every node idle, flow 0
        return to_placement(prep, best, status=SolveStatus.OPTIMAL, gap=0.0,
                            solve_s=time.perf_counter() - t0, method="staged-dp")

    if problem.topology == "chain":
        if method == "auto":
            return solve_chain(problem, prep=prep)
        warm = None
        if all(u is not None for u in prep.usable):
            ch = best_chain(prep, require_all=True)
            warm = ch.assignment() if ch is not None else None
        left = max(0.01, time_limit_s - (time.perf_counter() - t0))
        return solve_ilp(problem, prep=prep, warm_start=warm, time_limit_s=left)

    replicas = best_replicas(prep)
    found = replicas.throughput
    ub = flow_upper_bound(prep)
    if found < ub * (1 - _BOUND_RTOL):
        ub = min(ub, path_lp_bound(prep, replicas))
    if method == "auto" and found >= ub * (1 - _BOUND_RTOL):
        return to_placement(prep, replicas, status=SolveStatus.OPTIMAL, gap=0.0,
                            solve_s=time.perf_counter() - t0, method="staged-dp",
                            notes=(f"the staged DP meets the DAG upper bound {ub:.6g}",))
    left = max(0.01, time_limit_s - (time.perf_counter() - t0))
    p = solve_ilp(problem, prep=prep, warm_start=replicas, upper_bound=ub, time_limit_s=left)
    if p.status is not SolveStatus.INFEASIBLE and p.throughput < found:
        # the MILP's answer is no better than its warm start: report the warm start
        bound = ub
        if p.status is SolveStatus.TIME_LIMIT and p.gap < 1:
            bound = min(bound, p.throughput / (1 - p.gap))
        gap = 0.0 if p.status is SolveStatus.OPTIMAL else max(0.0, (bound - found) / bound)
        p = to_placement(prep, replicas, status=p.status, gap=gap, solve_s=0.0,
                         method=p.method, notes=p.notes)
    return _with_time(p, time.perf_counter() - t0)


def _with_time(p: Placement, solve_s: float) -> Placement:
    return Placement(throughput=p.throughput, nodes=p.nodes, edges=p.edges, status=p.status,
                     gap=p.gap, solve_s=solve_s, method=p.method, notes=p.notes)
