"""The scarcity phases of the allocation ILP, when the demand cannot be met in full: phase 1
the most priority-weighted goodput, phase 2 the cheapest plan at it (the rows are `solve/ilp.py`'s).
`scarcity_highs` runs HiGHS on the whole ILP in both phases (PD problems, and
`decompose=False`). Both start from a plan given beforehand (`Seed`) when it serves more than
what they find. `scarcity_bounded` (problems without PD models) starts from the LP and a plan
of its own, and calls HiGHS only for the gap those leave:

1. phase 1: the goodput LP bounds the goodput (it is within 0.5% of the best plan on most
   benchmark problems); its counts rounded down and the nodes left filled, most goodput per
   shadow price first, then a local search (`branch_price.goodput_plan`), give a plan. When
   the LP bound does not prove it within the gap, HiGHS searches the columns that reduced
   costs allow a better plan to use (`fix_by_reduced_cost`), for plans better than it, and
   stops at the gap from the LP bound or from its own;
2. phase 2: the same on the cost LP with the goodput floor, from phase 1's plan. Its LP bound
   is weak (1-5% below the best plan on core, where HiGHS's cuts and tree do the rest), so
   HiGHS runs on nearly every draw; a cutoff at phase 1's cost and the columns fixed by
   reduced cost are what it is given. The bound is what takes the time, not the search:
   handed the optimal plan, HiGHS still needs a median 0.24 s (0.01-0.9 s) to prove 0.5% on
   the synthetic core scarce draws. The LP's slack is phase 1's (its goodput bound up to 0.7%
   above the best plan, which the cost LP spends on leaving nodes unused), and bounds by
   region blocks do not remove it (column generation over each region's integer plans:
   280.28 against the LP's 279.95 and an optimum of 292.36 on one draw).

Phase 1 may take `PHASE1_SHARE` of the time left, so that phase 2 always gets some.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from coral.allocator.decomposition.branch_price import goodput_plan, relative_gap
from coral.allocator.core.formulation import LpArrays, LpBuilder, Vars
from coral.allocator.core.highs_runs import (
    INSIDE,
    bound_with_limit,
    fix_by_reduced_cost,
    free_columns,
    lp_relaxation,
    plan_of_run,
    run_highs,
    run_on_support,
    support_of,
)
from coral.allocator.decomposition.lagrange import Decomposition
from coral.allocator.core.presolve import Index
from coral.allocator.problem import AllocationProblem

#: Phase 2 keeps goodput within this relative distance of phase 1's.
GOODPUT_REL_TOL = 1e-9


#: Least time given to a scarcity phase even when the budget is spent (seconds).
MIN_PHASE_S = 0.05


#: Share of the time left that scarcity phase 1 may take (phase 2 gets the rest).
PHASE1_SHARE = 0.5


#: Share of a scarcity phase's time HiGHS may take on the columns the LP and the plan so far
#: use, before the run on every column reduced costs leave (which brings the bound).
SUPPORT_SHARE = 0.5


#: Scarcity phase 2 on problems of at least this many columns: HiGHS on the LP's and phase
#: 1's columns, then on them and these shares of all columns (least reduced cost first), each
#: run stopping at the first plan the LP bound proves, before the run on every column reduced
#: costs leave. On large problems the gap is the plan's, on small ones the bound's (where
#: these runs only add time).
PHASE2_GROWTH_MIN_COLUMNS = 2_000


PHASE2_GROWTH = (0.03, 0.15)


#: Share of phase 2's time left that each of those runs may take.
GROWTH_TIME_SHARE = 0.25


#: Share of scarcity phase 1's time the goodput heuristic may take.
HEURISTIC_SHARE = 0.1


#: Where the demand is nearly met (the LP bound serves at least `NEAR_FULL` of the
#: priority-weighted demand), scarcity phase 1 keeps its heuristic plan only within this
#: share of the gap target, else HiGHS looks for a better one (to the gap target): a plan
#: 0.5% short of the best goodput leaves phase 2 so many plans at its floor that HiGHS runs
#: out the clock. Elsewhere a plan within the gap target is kept.
ACCEPT_SHARE_NEAR_FULL = 0.02


NEAR_FULL = 0.9


@dataclass
class Seed:
    """The best start as counts of the ILP's x columns, with what it serves and costs."""
    x: np.ndarray
    goodput: float
    objective: float
    meets_demand: bool


def phase_deadline(problem: AllocationProblem, t0: float, share: float) -> float:
    """When a scarcity phase must stop: `share` of the time left (at least `MIN_PHASE_S`)."""
    now = time.perf_counter()
    left = t0 + problem.time_limit_s - now
    return now + max(share * left, MIN_PHASE_S)


def scarcity_highs(problem: AllocationProblem, arr: "LpArrays", lp: LpBuilder, ix: Index,
                    v: Vars, col_lb: np.ndarray, floor_row: int, *, t0: float,
                    notes: list[str], threads: int | None, seed: Seed | None = None
                    ) -> tuple[np.ndarray | None, float, float]:
    """Both scarcity phases by HiGHS on the full ILP, phase 1's plan the better of HiGHS's
    and `seed`. Returns (counts, cost gap, goodput gap); counts None when neither phase 1 nor
    the seed gives a plan."""
    goodput_cost = np.zeros(lp.n_col)
    goodput_cost[v.s] = ix.priority
    end = phase_deadline(problem, t0, PHASE1_SHARE)
    run1 = run_highs(arr.highs_lp(goodput_cost, col_lb, arr.row_lb, maximise=True),
                      time_limit_s=end - time.perf_counter(), mip_gap=problem.mip_gap,
                      threads=threads)
    x1, g1, cutoff, gap1 = None, -math.inf, math.inf, math.inf
    if run1.ok:
        assert run1.values is not None
        x1 = np.rint(run1.values[v.x]).astype(np.int64)
        g1 = float(np.dot(ix.priority, run1.values[v.s]))
        gap1 = run1.gap
        if not run1.optimal:
            notes.append(f"scarcity phase 1: HiGHS {run1.detail}")
    if seed is not None and seed.goodput > g1 * (1.0 + GOODPUT_REL_TOL) + 1e-12:
        # HiGHS's bound still holds: it bounds every plan, the seed's too
        bound1 = g1 * (1.0 + gap1) if run1.ok and math.isfinite(gap1) else math.inf
        gap1 = relative_gap(-seed.goodput, -bound1)
        x1, g1, cutoff = seed.x.copy(), seed.goodput, seed.objective
        notes.append(f"scarcity phase 1: the given plan serves more (goodput {g1:.6g})")
    if x1 is None:
        notes.append(f"scarcity phase 1 found no plan (HiGHS: {run1.detail})")
        return None, math.inf, math.inf
    row_lb = arr.row_lb.copy()
    row_lb[floor_row] = g1 * (1.0 - GOODPUT_REL_TOL)
    end = phase_deadline(problem, t0, 1.0)
    run2 = run_highs(arr.highs_lp(arr.cost, col_lb, row_lb, maximise=False),
                      time_limit_s=end - time.perf_counter(), mip_gap=problem.mip_gap,
                      threads=threads, cutoff=cutoff)
    if not run2.optimal:
        notes.append(f"scarcity phase 2: HiGHS {run2.detail}")
    if run2.ok and not run2.infeasible:
        assert run2.values is not None
        return np.rint(run2.values[v.x]).astype(np.int64), run2.gap, gap1
    # phase 1's plan keeps its goodput; phase 2's bound (HiGHS's, else its LP relaxation's)
    # still says how far its cost may be from the cheapest at that goodput
    cost = float(v.price @ x1 + v.penalty @ np.maximum(x1 - ix.current[v.x_t, v.x_r], 0))
    bound = cost if run2.infeasible and math.isfinite(cutoff) else run2.bound
    if not math.isfinite(bound):
        relaxed = lp_relaxation(arr, arr.cost, col_lb, row_lb, lp, len(v.x))
        bound = relaxed.value if relaxed is not None else math.inf
    return x1, relative_gap(cost, bound), gap1


def scarcity_bounded(problem: AllocationProblem, dec: Decomposition, arr: "LpArrays",
                      lp: LpBuilder, ix: Index, v: Vars, col_lb: np.ndarray, floor_row: int,
                      *, t0: float, notes: list[str], threads: int | None,
                      seed: Seed | None = None
                      ) -> tuple[np.ndarray | None, float, float]:
    """Both scarcity phases from the LP bound and a heuristic plan, with HiGHS only where
    they leave the gap open: first on the columns the LP and the plan use, then on those that
    can still matter (`fix_by_reduced_cost`).
    Returns (counts, cost gap, goodput gap) as `scarcity_highs`."""
    gap = problem.mip_gap
    # ---- phase 1: most goodput, minimising -goodput
    end = phase_deadline(problem, t0, PHASE1_SHARE)
    neg_goodput = np.zeros(lp.n_col)
    neg_goodput[v.s] = -ix.priority
    relaxed = lp_relaxation(arr, neg_goodput, col_lb, arr.row_lb, lp, len(v.x))
    if relaxed is None or relaxed.col_value is None:
        notes.append("scarcity: no LP optimum; HiGHS on the full ILP")
        return scarcity_highs(problem, arr, lp, ix, v, col_lb, floor_row, t0=t0, notes=notes,
                               threads=threads, seed=seed)
    heuristic_end = time.perf_counter() + HEURISTIC_SHARE * max(0.0, end - time.perf_counter())
    x1 = goodput_plan(dec, relaxed.x, relaxed.node_price, deadline=heuristic_end)
    f1, bound1 = -dec.goodput(x1), relaxed.value
    how = "heuristic plan, LP bound"
    if seed is not None and dec.fits(seed.x) and dec.goodput(seed.x) > -f1:
        x1, f1 = seed.x.copy(), -dec.goodput(seed.x)
        how = "the given plan, LP bound"
    near_full = -bound1 >= NEAR_FULL * float(ix.priority @ ix.demand)
    accept = ACCEPT_SHARE_NEAR_FULL if near_full else 1.0
    if relative_gap(f1, bound1) > accept * gap:
        # first the columns the LP and the heuristic use: a better plan to cut off by, and so
        # more columns fixed below (the heuristic's PD plans are far from the bound)
        run, x = run_on_support(arr, v, neg_goodput, col_lb, arr.row_lb,
                                 support_of(relaxed, x1, np.zeros(0, dtype=np.int64)),
                                 cutoff=f1,
                                 time_limit_s=SUPPORT_SHARE * (end - time.perf_counter()),
                                 mip_gap=gap, threads=threads)
        if x is not None and dec.fits(x) and -dec.goodput(x) < f1:
            x1, f1 = x, -dec.goodput(x)
            how = "HiGHS on the LP's and the heuristic's columns, LP bound"
    if relative_gap(f1, bound1) > accept * gap:
        # every plan of goodput above g1 (1 + share gap) keeps to the LP's reduced-cost limits
        # (a hair inside the gap, so that the gap proven is within the target after rounding)
        limit = min(f1 * (1.0 + accept * gap * INSIDE), f1 - 1e-9 * max(1.0, abs(f1)))
        lo, hi = fix_by_reduced_cost(arr, relaxed, col_lb, limit)
        run = run_highs(arr.highs_lp(neg_goodput, lo, arr.row_lb, maximise=False, col_ub=hi),
                         time_limit_s=end - time.perf_counter(), mip_gap=gap, threads=threads,
                         cutoff=f1, target=bound1 / (1.0 + accept * gap * INSIDE))
        x = plan_of_run(run, v)
        if x is not None and dec.fits(x) and -dec.goodput(x) < f1:
            x1, f1 = x, -dec.goodput(x)
        bound1 = bound_with_limit(run, limit, bound1)
        how = f"HiGHS on {free_columns(lo, hi, v)} of {len(v.x)} columns ({run.detail})"
    gap1 = relative_gap(f1, bound1)
    notes.append(f"scarcity phase 1: goodput {-f1:.6g}, bound {-bound1:.6g} ({how})")

    # ---- phase 2: the cheapest plan of at least that goodput
    floor = -f1 * (1.0 - GOODPUT_REL_TOL)
    row_lb = arr.row_lb.copy()
    row_lb[floor_row] = floor
    end = phase_deadline(problem, t0, 1.0)
    relaxed = lp_relaxation(arr, arr.cost, col_lb, row_lb, lp, len(v.x))
    x2, c2 = x1, dec.cost(x1)
    bound2 = -math.inf if relaxed is None else relaxed.value
    how = "phase 1's plan, LP bound"
    if relative_gap(c2, bound2) > gap and relaxed is not None:
        # first the columns the LP and phase 1's plan use: fast, and a lower cutoff below.
        # Measured (benchmarks/allocator.py, scarce, 20 draws, gap 0.5%): core median
        # 0.25 -> 0.21 s; advanced 8.1 -> 3.4 s, largest gap 3.1 -> 0.9%
        run, x = run_on_support(arr, v, arr.cost, col_lb, row_lb,
                                 support_of(relaxed, x2, np.zeros(0, dtype=np.int64)),
                                 cutoff=c2,
                                 time_limit_s=SUPPORT_SHARE * (end - time.perf_counter()),
                                 mip_gap=gap, threads=threads)
        if _cheaper_at_floor(dec, x, floor, c2):
            x2, c2 = x, dec.cost(x)
            how = "HiGHS on the LP's and phase 1's columns, LP bound"
        if len(v.x) >= PHASE2_GROWTH_MIN_COLUMNS and relaxed.col_dual is not None:
            cheapest = np.argsort(relaxed.col_dual[v.x], kind="stable")
            for share in PHASE2_GROWTH:
                if relative_gap(c2, bound2) <= gap:
                    break
                # a plan the LP bound proves ends the run at once
                run, x = run_on_support(
                    arr, v, arr.cost, col_lb, row_lb,
                    support_of(relaxed, x2, cheapest[:int(share * len(v.x))]),
                    cutoff=c2, time_limit_s=GROWTH_TIME_SHARE * (end - time.perf_counter()),
                    mip_gap=gap, threads=threads, target=bound2 / (1.0 - gap * INSIDE))
                if _cheaper_at_floor(dec, x, floor, c2):
                    x2, c2 = x, dec.cost(x)
                    how = (f"HiGHS on the LP's and phase 1's columns and {share:.0%} more, "
                           "LP bound")
    if relative_gap(c2, bound2) > gap:
        limit = c2 * (1.0 - gap * INSIDE)
        if relaxed is not None and relaxed.col_value is not None:
            lo, hi = fix_by_reduced_cost(arr, relaxed, col_lb, limit)
        else:  # no LP optimum (not expected: phase 1's plan is feasible)
            lo, hi, limit = col_lb, arr.col_ub, math.inf
        run = run_highs(arr.highs_lp(arr.cost, lo, row_lb, maximise=False, col_ub=hi),
                         time_limit_s=end - time.perf_counter(), mip_gap=gap, threads=threads,
                         cutoff=c2)
        x = plan_of_run(run, v)
        if _cheaper_at_floor(dec, x, floor, c2):
            x2, c2 = x, dec.cost(x)
        bound2 = bound_with_limit(run, limit, bound2)
        how = f"HiGHS on {free_columns(lo, hi, v)} of {len(v.x)} columns ({run.detail})"
    notes.append(f"scarcity phase 2: cost {c2:.6g}, bound {bound2:.6g} ({how})")
    return x2, relative_gap(c2, bound2), gap1


def _cheaper_at_floor(dec: Decomposition, x: np.ndarray | None, floor: float,
                      cost: float) -> bool:
    """`x` is a plan that fits, keeps the goodput floor (up to rounding) and costs less."""
    return x is not None and dec.fits(x) and dec.goodput(x) >= floor - 1e-9 * max(1.0, floor) \
        and dec.cost(x) < cost
