"""The first plan of a cost solve whose PD models are past exact per-model covers
(`ilp.PD_MAX_REGIONS`, `ilp.PD_MAX_UNITS`: `advanced`-size PD problems): the LP optimum
rounded down and repaired, then HiGHS on growing neighbourhoods of that plan and the LP's
support, the whole ILP last where it is small enough.

Its own module because it is one search with its own constants, called once by
`ilp._solve`; the rest of the solve does not read them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from coral.allocator.decomposition.branch_price import relative_gap, round_and_repair
from coral.allocator.core.formulation import LpArrays, LpBuilder, Vars
from coral.allocator.core.highs_runs import (
    Relaxation,
    bound_with_limit,
    lp_relaxation,
    run_on_support,
    support_of,
)
from coral.allocator.core.relax_fix import relax_and_fix
from coral.allocator.decomposition.lagrange import Decomposition
from coral.allocator.problem import PlanStatus
from coral.allocator.scarcity.phases import MIN_PHASE_S, Seed

#: Columns of least reduced cost added to the LP's support, one HiGHS run each, when
#: searching near a rounded PD plan (`rounded_start`).
SUPPORT_GROWTH = (0, 100, 300, 1000)


#: Up to this many columns the search near a rounded PD plan ends with HiGHS on the whole
#: ILP, whose bound then holds; beyond it HiGHS's root cuts alone outrun the time limit.
WHOLE_ILP_MAX_COLUMNS = 5_000


#: Share of the time left that relax-and-fix by model (`core/relax_fix.py`) may take,
#: before the runs near its plan and the LP take the rest.
RELAX_FIX_SHARE = 0.85


#: Where the whole ILP follows, the share of the time left each search near the rounded plan
#: may take, so that the whole ILP (which brings the bound) always runs.
NEIGHBOURHOOD_SHARE = 0.25


@dataclass
class RoundedStart:
    """A plan meeting every demand found by rounding the LP optimum."""
    counts: np.ndarray
    cost: float
    bound: float  # proven: the LP relaxation's value, or HiGHS's on the whole ILP
    status: PlanStatus


def rounded_start(dec: Decomposition, arr: LpArrays, lp: LpBuilder, v: Vars, *,
                  mip_gap: float, deadline: float, threads: int | None, notes: list[str],
                  seed: Seed | None = None
                  ) -> tuple[Relaxation | None, RoundedStart | None]:
    """A plan for problems whose PD models are past exact covers: the LP optimum rounded
    down, each model's rest covered by one group at a time (`round_and_repair` without
    exact PD covers), then, where the whole ILP does not follow, relax-and-fix by model
    (`core/relax_fix.py`, for `RELAX_FIX_SHARE` of the time left), then HiGHS on the
    columns that plan or the LP use (the LP's support, a few dozen columns) and on more of
    those of least reduced cost (`SUPPORT_GROWTH`), the whole ILP last when it has at most
    `WHOLE_ILP_MAX_COLUMNS`.

    Past that HiGHS on the whole ILP is not run: on synthetic `advanced`-size PD problems
    (15,000 columns) it found no plan in 10 s, and its root cut rounds, which nothing
    interrupts, ran 20-36 s against a 10 s limit; measured on 3 of those draws at the limited
    level: rounding 5 % above the LP bound, the support 3.1-3.6 %, 1,000 more columns
    2.8-3.2 %, the gap then proven against the LP bound alone. Returns (the LP relaxation,
    None when infeasible; the plan, None when rounding found none)."""
    relaxed = lp_relaxation(arr, arr.cost, arr.col_lb, arr.row_lb, lp, len(v.x))
    if relaxed is None:
        notes.append("demand cannot be met in full (LP relaxation infeasible)")
        return None, None
    x = round_and_repair(dec, relaxed.x, exact_pd=False)
    if x is None:  # HiGHS near the LP optimum may still find one, without a cutoff
        x, cost = np.zeros(len(v.x), dtype=np.int64), math.inf
        how = ["rounding: none (the nodes left after rounding down fall short)"]
    else:
        cost = dec.cost(x)
        how = ["rounded down, rest covered"]
    if seed is not None and seed.meets_demand and dec.fits(seed.x) \
            and dec.cost(seed.x) < cost:
        x, cost = seed.x.copy(), dec.cost(seed.x)
        how = ["a given plan"]
    bound, stopped = relaxed.value, False
    left = deadline - time.perf_counter()
    # where the whole ILP follows, its run finds plans and the bound: it keeps the time
    if len(v.x) > WHOLE_ILP_MAX_COLUMNS and relative_gap(cost, bound) > mip_gap \
            and left > MIN_PHASE_S:
        fixed = relax_and_fix(arr, v, dec, relaxed, objective=arr.cost,
                              col_lb=arr.col_lb, row_lb=arr.row_lb,
                              deadline=time.perf_counter() + RELAX_FIX_SHARE * left,
                              threads=threads, cutoff=cost,
                              plan=x if math.isfinite(cost) else None)
        if fixed is not None and dec.fits(fixed) and dec.covers(fixed) \
                and dec.cost(fixed) < cost:
            x, cost = fixed, dec.cost(fixed)
            how.append(f"relax-and-fix by model: {cost:.6g}")
    cheapest = np.argsort(relaxed.col_dual[v.x], kind="stable")
    growth = SUPPORT_GROWTH + ((len(v.x),) if len(v.x) <= WHOLE_ILP_MAX_COLUMNS else ())
    for extra in growth:
        left = deadline - time.perf_counter()
        if relative_gap(cost, bound) <= mip_gap or left <= MIN_PHASE_S:
            stopped = left <= MIN_PHASE_S
            break
        support = support_of(relaxed, x, cheapest[:extra])
        # a neighbourhood may not take the time of the whole ILP that follows it
        share = 1.0 if support.all() or len(growth) == len(SUPPORT_GROWTH) \
            else NEIGHBOURHOOD_SHARE
        run, better = run_on_support(arr, v, arr.cost, arr.col_lb, arr.row_lb, support,
                                      cutoff=cost, time_limit_s=share * left,
                                      mip_gap=mip_gap, threads=threads)
        if support.all():  # the whole ILP: HiGHS's bound holds for every plan
            bound = max(bound, bound_with_limit(run, cost, relaxed.value))
        if better is not None and dec.fits(better) and dec.covers(better) \
                and dec.cost(better) < cost:
            x, cost = better, dec.cost(better)
            how.append(f"HiGHS on {int(support.sum())} columns: {cost:.6g} ({run.detail})")
        stopped = not (run.optimal or run.infeasible)
        if support.all():
            break
    if not math.isfinite(cost):
        notes.append("rounded LP plan: none (" + "; ".join(how) + ")")
        return relaxed, None
    gap = relative_gap(cost, bound)
    notes.append(f"rounded LP plan: cost {cost:.6g}, bound {bound:.6g} ("
                 + "; ".join(how) + ")")
    status = (PlanStatus.OPTIMAL if gap <= mip_gap else
              PlanStatus.TIME_LIMIT if stopped else PlanStatus.FEASIBLE)
    return relaxed, RoundedStart(x, cost, bound, status)
