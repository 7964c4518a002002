"""Plans given to `solve_allocation` as starts: the best of them as a plan of the problem
(`best_start`), as counts of the ILP's columns (`seed_of`, which the search starts from), and
kept in place of the search's plan when that ends worse (`adopt_start`, with the gaps the
search's bounds prove for it). So a solve never returns a plan worse than one handed in,
whatever its time limit cuts short.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from coral.allocator.decomposition.branch_price import relative_gap
from coral.allocator.core.formulation import Vars
from coral.allocator.core.presolve import Columns, Index
from coral.allocator.problem import (
    AllocationPlan,
    AllocationProblem,
    PlanStatus,
    TemplateRegion,
    make_plan,
)
from coral.allocator.scarcity.phases import GOODPUT_REL_TOL, Seed

def best_start(problem: AllocationProblem, starts: Sequence[Mapping[TemplateRegion, int]]
               ) -> AllocationPlan | None:
    """The best of `starts` as a plan of `problem` (None when none is a plan): instances of
    ids or regions the problem lacks are dropped, and a start that needs more nodes than
    are available is left out."""
    ids = {t.id: t for t in problem.templates}
    best = None
    for start in starts:
        counts = {(tid, r): int(n) for (tid, r), n in start.items()
                  if int(n) > 0 and tid in ids and r in ids[tid].price_usd_per_hour
                  and r in problem.regions}
        plan = make_plan(problem, counts, status=PlanStatus.TIME_LIMIT, gap=math.inf,
                         solve_s=0.0, goodput_gap=math.inf)
        if any(n > problem.availability.get(key, 0) for key, n in plan.nodes_used.items()):
            continue
        if best is None or better_plan(plan, best):
            best = plan
    return best


def better_plan(a: AllocationPlan, b: AllocationPlan) -> bool:
    """`a` is the better plan of one problem: it meets demand where `b` does not, or, both
    short, is better by the scarcity objective (fair: a higher fairness level, then more
    tokens/s; goodput: more priority-weighted goodput), or as good at a lower cost."""
    if a.meets_demand != b.meets_demand:
        return a.meets_demand
    if not a.meets_demand:
        if a.scarcity == "fair":
            for mine, theirs in ((a.fair_level, b.fair_level), (a.tokens_per_s, b.tokens_per_s)):
                if abs(mine - theirs) > GOODPUT_REL_TOL * max(1.0, abs(theirs)):
                    return mine > theirs
        else:
            tol = GOODPUT_REL_TOL * max(1.0, abs(b.goodput))
            if abs(a.goodput - b.goodput) > tol:
                return a.goodput > b.goodput
    return a.objective < b.objective * (1.0 - 1e-9)


def adopt_start(problem: AllocationProblem, solved: AllocationPlan, given: AllocationPlan, *,
           solve_s: float) -> AllocationPlan:
    """`given` (better than `solved`) with the gaps the solve's bounds prove for it: the cost
    bound `solved` was proven against holds for every plan of at least its goodput, and the
    goodput bound for every plan (fair: the fairness bound for every plan, the tokens bound
    for every plan at least as fair, the cost bound for those of at least its tokens/s)."""
    def bound_of(value: float, gap: float, sign: float) -> float:
        return value * (1.0 - sign * gap) if math.isfinite(gap) else -sign * math.inf

    note = "a plan given as a start is better than the search's: kept"
    if given.meets_demand and not solved.meets_demand:
        return make_plan(problem, given.instances, status=PlanStatus.TIME_LIMIT, gap=math.inf,
                         solve_s=solve_s, notes=solved.notes + (note,))
    cost_bound = bound_of(solved.objective, solved.gap, 1.0)
    gap = relative_gap(given.objective, cost_bound)
    if given.meets_demand:
        status = PlanStatus.OPTIMAL if gap <= problem.mip_gap else PlanStatus.TIME_LIMIT
        return make_plan(problem, given.instances, status=status, gap=gap, solve_s=solve_s,
                         notes=solved.notes + (note,))
    if solved.scarcity == "fair" and "fairness" in solved.phase_gaps:
        if given.tokens_per_s < solved.tokens_per_s * (1.0 - GOODPUT_REL_TOL):
            gap = math.inf  # fairer with fewer tokens/s: the cost bound is not for it
        phases = {
            "fairness": relative_gap(-given.fair_level, -bound_of(
                solved.fair_level, solved.phase_gaps["fairness"], -1.0)),
            "tokens": relative_gap(-given.tokens_per_s, -bound_of(
                solved.tokens_per_s, solved.phase_gaps["tokens"], -1.0)),
            "cost": gap,
        }
        return make_plan(problem, given.instances, status=solved.status, gap=gap,
                         solve_s=solve_s, goodput_gap=max(phases["fairness"], phases["tokens"]),
                         notes=solved.notes + (note,), phase_gaps=phases)
    goodput_bound = bound_of(solved.goodput, solved.goodput_gap, -1.0)
    goodput_gap = relative_gap(-given.goodput, -goodput_bound)
    return make_plan(problem, given.instances, status=solved.status, gap=gap,
                     solve_s=solve_s, goodput_gap=goodput_gap, notes=solved.notes + (note,),
                     phase_gaps={"goodput": goodput_gap, "cost": gap})


def seed_of(problem: AllocationProblem, ix: Index, v: Vars, cols: Columns,
             starts: Sequence[Mapping[TemplateRegion, int]]) -> Seed | None:
    """The best start on the columns presolve kept: a dominated column becomes the columns
    that dominate it (no more nodes, no dearer, as much capacity), counts are held to their
    bounds (which lose nothing), and columns presolve found useless are dropped."""
    if not starts or not len(v.x):
        return None
    t_of = {t.id: i for i, t in enumerate(ix.templates)}
    r_of = {r: i for i, r in enumerate(ix.regions)}
    pos = {(int(t), int(r)): i for i, (t, r) in enumerate(zip(v.x_t, v.x_r))}
    dominated = cols.report.dominated_by
    best = None
    for start in starts:
        x = np.zeros(len(v.x), dtype=np.int64)

        def put(tid: str, r: int, n: int, depth: int = 0) -> None:
            i = pos.get((t_of[tid], r))
            if i is not None:
                x[i] += n
            elif tid in dominated and depth < 8:
                for part in dominated[tid]:
                    put(part, r, n, depth + 1)

        for (tid, region), n in start.items():
            if tid in t_of and region in r_of and int(n) > 0:
                put(tid, r_of[region], int(n))
        x = np.minimum(x, v.x_ub.astype(np.int64))
        used = np.zeros_like(ix.avail)
        for i in np.flatnonzero(x):
            used[:, v.x_r[i]] += ix.counts[v.x_t[i]] * x[i]
        if (used > ix.avail).any():
            continue
        instances = {(ix.templates[v.x_t[i]].id, ix.regions[v.x_r[i]]): int(x[i])
                     for i in np.flatnonzero(x)}
        plan = make_plan(problem, instances, status=PlanStatus.TIME_LIMIT, gap=math.inf,
                         solve_s=0.0)
        if best is None or better_plan(plan, best[1]):
            best = (x, plan)
    if best is None:
        return None
    x, plan = best
    return Seed(x, plan.goodput, plan.objective, plan.meets_demand)
