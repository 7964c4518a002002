"""Front door of the placement solvers: the fastest exact method for a problem.

* `chain` topology → the exact chain DP (`placement_chain`).
* `flow` topology → preprocessing, the replica heuristic (best split of the nodes into
  pipelines of data-parallel stages) and an upper bound (the smaller of the coverage bound
  and the path-LP bound); when the heuristic reaches the bound it is optimal and no MILP is
  built; otherwise the tightened MILP, warm-started with the heuristic and capped by the
  bound, within the time limit (status `time_limit` with the proven gap if it runs out).

`method="ilp"` forces the tightened MILP (also for chains), `method="naive"` the naive MILP
(a benchmark baseline).
"""

from __future__ import annotations

import time
from typing import Literal

from coral.templates.placement_chain import best_chain, best_replicas, path_lp_bound, solve_chain
from coral.templates.placement_ilp import (
    flow_upper_bound,
    infeasible_placement,
    prepare,
    solve_ilp,
    to_placement,
)
from coral.templates.types import Placement, PlacementProblem, SolveStatus

Method = Literal["auto", "ilp", "naive"]

_BOUND_RTOL = 1e-9


def solve_placement(problem: PlacementProblem, *, time_limit_s: float = 60.0,
                    method: Method = "auto") -> Placement:
    """Best placement of `problem`; `status` says whether it is proven optimal."""
    t0 = time.perf_counter()
    if method == "naive":
        return solve_ilp(problem, naive=True, time_limit_s=time_limit_s)
    if method not in ("auto", "ilp"):
        raise ValueError(f"unknown placement method {method!r}")
    prep = prepare(problem)
    if prep.infeasible:
        return infeasible_placement(prep.infeasible, time.perf_counter() - t0, method)
    if problem.topology == "chain":
        if method == "auto":
            return solve_chain(problem, prep=prep)
        warm = None
        if all(u is not None for u in prep.usable):
            ch = best_chain(prep, require_all=True)
            warm = ch.assignment() if ch is not None else None
        left = max(0.01, time_limit_s - (time.perf_counter() - t0))
        return solve_ilp(problem, prep=prep, warm_start=warm, time_limit_s=left)

    heuristic = best_replicas(prep)
    found = heuristic.throughput
    ub = flow_upper_bound(prep)
    if found < ub * (1 - _BOUND_RTOL):
        ub = min(ub, path_lp_bound(prep, heuristic))
    if method == "auto" and found >= ub * (1 - _BOUND_RTOL):
        return to_placement(prep, heuristic, status=SolveStatus.OPTIMAL, gap=0.0,
                            solve_s=time.perf_counter() - t0, method="heuristic",
                            notes=(f"replica heuristic meets the upper bound {ub:.6g}",))
    left = max(0.01, time_limit_s - (time.perf_counter() - t0))
    p = solve_ilp(problem, prep=prep, warm_start=heuristic, upper_bound=ub, time_limit_s=left)
    if p.status is not SolveStatus.INFEASIBLE and p.throughput < found:
        # the MILP's answer is no better than its warm start: report the warm start
        bound = ub
        if p.status is SolveStatus.TIME_LIMIT and p.gap < 1:
            bound = min(bound, p.throughput / (1 - p.gap))
        gap = 0.0 if p.status is SolveStatus.OPTIMAL else max(0.0, (bound - found) / bound)
        p = to_placement(prep, heuristic, status=p.status, gap=gap, solve_s=0.0,
                         method=p.method, notes=p.notes)
    return _with_time(p, time.perf_counter() - t0)


def _with_time(p: Placement, solve_s: float) -> Placement:
    return Placement(throughput=p.throughput, nodes=p.nodes, edges=p.edges, status=p.status,
                     gap=p.gap, solve_s=solve_s, method=p.method, notes=p.notes)
