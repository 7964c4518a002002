"""The online allocation ILP, solved with HiGHS.

Variables (index sets after presolve, `core/presolve.py`; built in `core/formulation.py`):

- `x[t,r]` integer in `[0, u[t,r]]`: instances of template `t` in region `r`;
- `y[t,r] >= 0`: instances of `t` started in `r` beyond the current deployment (only where some
  run now; elsewhere every instance is new and its start-up penalty is folded into `x`'s cost);
- `d[m,r] >= 0`: requests/s of PD-mode model `m` served in region `r`;
- `s[m]`: requests/s of model `m` served, in `[demand_m, demand_m]` when demand must be met and
  in `[0, demand_m]` under scarcity.

Cost problem::

    minimise   sum_{t,r} price[t,r] x[t,r] + sum_{t,r} penalty[t,r] y[t,r]
    subject to capacity, PD pairing, availability and start-up rows (`core/formulation.py`)

When it is infeasible, the scarcity problem runs on the same rows by `problem.scarcity`:
`fair` (the default) in three phases, the smallest served fraction, then
priority-weighted generated tokens/s, then cost (`scarcity/fair.py`); `goodput` in two:
phase 1 maximises goodput `G = sum_m w_m s[m]` with `s[m]` free in `[0, demand_m]`; phase 2 adds
`G >= G1 (1 - 1e-9)` (G1: phase 1's best) and minimises the cost again. So the plan is the
cheapest among the plans of most priority-weighted goodput, and it names each model's
shortfall.

How it is solved
----------------
HiGHS on this ILP is slow whenever availability binds: each demand row is a knapsack over a
hundred columns of almost equal cost per request/s, the LP bound sits 1-2% below the optimum,
and neither HiGHS's cuts and tree nor its sub-MIP heuristics close that to 0.1% in seconds
(`decomposition/lagrange.py` says why in full). With PD models it is worse: the LP splits a
model's demand into fractions of instances in every region at once and lies 3-5% below the
optimum on `core`-size problems, and HiGHS stopped at its 10 s limit with 1-3% gaps. The cost
problem is therefore solved by decomposition instead (`decompose=True`, the default):

1. each model's cheapest cover on its own (`knapsack.knapsack_dp`; for a PD model the exact
   cover of `decomposition/pd_cover.py`, regions serving what both their halves carry); if their
   union fits within availability it is optimal;
2. else the LP relaxation: infeasible means the demand cannot be met; feasible, it gives a
   bound, node prices, and a first plan (its counts rounded down, each model's rest covered);
3. the Lagrangian bound by column generation, plans from mixing the patterns it meets, and
   branch and price until the gap target or `DECOMPOSED_SHARE` of the time limit
   (`branch_price.solve_decomposed`);
4. when that stops short of the gap (problems without PD models, whose ILPs HiGHS handles
   far worse), HiGHS for the rest of the time, below the plan found and stopping at the
   first plan the Lagrangian bound proves: first on the columns the root master and the plan
   use (cheaper plans fast), then on the whole ILP; the better plan and the better bound
   come back. Real libraries need it: many templates of a model cost almost
   the same per request/s, and on `benchmarks/allocator.py --library real` draws branch and
   price alone left one plan short of demand (no plan meeting it found in time, 16.8% gap)
   where HiGHS finds one.

The scarcity phases are in `scarcity/phases.py`. Those of PD problems, and PD problems whose
per-model covers are too large to solve exactly many times a solve (`PD_MAX_REGIONS`,
`PD_MAX_UNITS`: `advanced`-size), run on this ILP with HiGHS throughout (the cost problem's
first plan by rounding, `rounded_start.py`); `decompose=False` solves every phase with HiGHS
on the full ILP, as the reference the tests compare against.

Plans known beforehand (`starts`: the baselines' plans, another mode's plan) seed the search
and bound the answer from below (`starts.py`): the plan returned is never worse than them.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import highspy
import numpy as np

from coral.allocator.decomposition.branch_price import (
    relative_gap,
    round_and_repair,
    running_plan,
    solve_decomposed,
)
from coral.allocator.core.formulation import (
    LpBuilder,
    Vars,
    add_goodput_floor_row,
    add_plan_rows,
    add_variables,
    capacity_bound_short,
    decomposition_of,
)
from coral.allocator.scarcity.fair import add_fair_rows, scarcity_fair
from coral.allocator.core.highs_runs import (
    HighsRun,
    bound_with_limit,
    root_fits,
    highs_after_decomposition,
    lp_relaxation,
    run_highs,
    run_on_support,
    support_of,
)
from coral.allocator.kernels.jit import warm_up
from coral.allocator.decomposition.lagrange import Bounds, Decomposition, Pattern, Pricer
from coral.allocator.decomposition.pd_cover import AGG
from coral.allocator.core.presolve import Index, run_presolve
from coral.allocator.problem import (
    AllocationPlan,
    AllocationProblem,
    PlanStatus,
    TemplateRegion,
    make_plan,
)
from coral.allocator.scarcity.phases import (
    MIN_PHASE_S,
    Seed,
    phase_deadline,
    scarcity_bounded,
    scarcity_highs,
)
from coral.allocator.solve.rounded_start import rounded_start
from coral.allocator.solve.starts import adopt_start, best_start, better_plan, seed_of
from coral.errors import CoralError

log = logging.getLogger(__name__)


#: Share of the cost problem's time branch and price may take (without PD models) before
#: HiGHS gets the rest, below its plan and stopping at the first plan the Lagrangian bound
#: proves (`highs_runs.highs_after_decomposition`): branch and price alone can end without
#: a plan meeting demand where HiGHS finds one.
DECOMPOSED_SHARE = 0.4
#: Share of the time limit HiGHS may take on the whole cost problem (every demand met) when
#: scarcity phases would follow: with no plan by then, they get the rest, and where a plan
#: meeting every demand exists their first phase finds it too (its level reaches 1); with
#: one, a second run below its cost takes the rest.
DEMAND_SEARCH_SHARE = 0.5


_INF = highspy.kHighsInf


class InfeasiblePlanError(CoralError, RuntimeError):
    """Strict mode: the demand cannot be met; `plan` is the best scarcity plan found. The
    user's demand and availability cause it, so it is a `CoralError` (the CLI prints its
    message on one line); it stays a `RuntimeError` for callers catching the old base."""

    def __init__(self, message: str, plan: AllocationPlan) -> None:
        super().__init__(message)
        self.plan = plan


#: The decomposition prices a PD model by its exact per-model cover
#: (`decomposition/pd_cover.py`), whose frontiers grow with the regions it pairs in and the
#: instances its demand takes: measured on `core` (3 regions, up to ~43 instances of the median
#: template) 0.3-10 ms a cover; on `advanced` (12 regions, up to ~170) one round of pricing took
#: minutes. Beyond these sizes HiGHS solves the ILP alone (as every PD problem before).
PD_MAX_REGIONS = 4


PD_MAX_UNITS = 100.0


def _pd_covers_small(dec: Decomposition) -> bool:
    """Whether every PD model's cover is small enough to solve exactly, many times a solve."""
    for m in dec.pd_models:
        own = (dec.col_model == m) & (dec.col_half != AGG)
        if len(np.unique(dec.col_region[own])) > PD_MAX_REGIONS:
            return False
        if dec.demand[m] / float(np.median(dec.col_cap[own])) > PD_MAX_UNITS:
            return False
    return True


def _solve_by_model(dec: Decomposition, rel_gap: float
                    ) -> tuple[str, np.ndarray, list[Pattern], float]:
    """Solve each model's demand on its own (`knapsack.knapsack_dp`, to half the gap).

    The models share only the availability rows, so when the union of the
    per-model covers fits within availability it is a plan, and the sum of their proven
    bounds bounds every plan. Returns (outcome, counts per x column, the per-model covers,
    the bound): "optimal" when the union fits, "short" when some model cannot be served even
    alone, "coupled" when the union does not fit.
    """
    got = Pricer(dec).price(np.zeros(dec.n_rows), Bounds.root(dec),
                                       rel_gap=rel_gap / 2)
    if not got.patterns:
        return "short", np.zeros(dec.n_cols, dtype=np.int64), [], math.inf
    counts = np.sum([p.counts for p in got.patterns], axis=0)
    return ("optimal" if dec.fits(counts) else "coupled"), counts, got.patterns, got.bound


def solve_allocation(
    problem: AllocationProblem,
    *,
    strict: bool = False,
    presolve: bool = True,
    decompose: bool = True,
    threads: int | None = None,
    starts: Sequence[Mapping[TemplateRegion, int]] = (),
    scarcity_search: bool = True,
) -> AllocationPlan:
    """Cheapest deployment meeting every model's demand; under scarcity, the best plan by
    `problem.scarcity` (fair by default: `scarcity/fair.py`).

    Honours `problem.time_limit_s` over all phases (each scarcity phase gets at least
    `MIN_PHASE_S`) and returns the best plan found with its proven gap. With `strict`, a plan
    that does not meet every demand raises `InfeasiblePlanError` naming the models short.

    `starts` are plans known beforehand (instances per (column id, region) of this problem;
    ids it does not hold are ignored, and a start overdrawing availability is no plan): the
    best of them seeds the search, and the plan returned is never worse than it (demand met,
    then better by the scarcity objective, then cheaper), whatever the time limit cuts short.

    `scarcity_search=False` skips the scarcity phases where no plan meets demand (the plan
    returned is then the best start, or none): for callers that only ask whether demand can
    be met, such as the uniform scale-down rule's bisection.
    """
    warm_up()  # the kernels are compiled or loaded before the clock starts, not inside it
    t0 = time.perf_counter()
    plan = _solve(problem, presolve=presolve, decompose=decompose, threads=threads,
                  starts=starts, t0=t0, scarcity_search=scarcity_search)
    given = best_start(problem, starts)
    if given is not None and better_plan(given, plan):
        plan = adopt_start(problem, plan, given, solve_s=time.perf_counter() - t0)
    return _finish(problem, plan, strict)


def _solve(problem: AllocationProblem, *, presolve: bool, decompose: bool,
           threads: int | None, starts: Sequence[Mapping[TemplateRegion, int]], t0: float,
           scarcity_search: bool = True) -> AllocationPlan:
    ix = Index.build(problem)
    cols = run_presolve(problem, ix, dominance=presolve)
    notes = [cols.report.describe()]
    if not ix.models:
        plan = make_plan(problem, {}, status=PlanStatus.OPTIMAL, gap=0.0,
                         solve_s=time.perf_counter() - t0, notes=notes + ["no demand"])
        return plan

    lp = LpBuilder()
    v = add_variables(lp, problem, ix, cols)
    rows = {
        **add_plan_rows(lp, ix, v),
        "goodput_floor": add_goodput_floor_row(lp, ix, v),
    }
    arr = lp.arrays()
    floor_row = lp.n_row - 1
    notes.append(
        f"ilp: {len(v.x)} integer + {lp.n_col - len(v.x)} continuous columns, rows "
        + ", ".join(f"{k} {n}" for k, n in rows.items() if n)
    )
    log.debug("allocation %s", "; ".join(notes))

    def remaining() -> float:
        return problem.time_limit_s - (time.perf_counter() - t0)

    def to_instances(counts: np.ndarray) -> dict[tuple[str, str], int]:
        on = np.flatnonzero(counts > 0)
        return {
            (ix.templates[v.x_t[i]].id, ix.regions[v.x_r[i]]): int(counts[i]) for i in on
        }

    def x_of(values: np.ndarray) -> np.ndarray:
        return np.rint(values[v.x]).astype(np.int64)

    def plan_of(counts: np.ndarray, status: PlanStatus, gap: float,
                goodput_gap: float = 0.0, phase_gaps: dict[str, float] | None = None,
                phase_s: dict[str, float] | None = None) -> AllocationPlan:
        return make_plan(problem, to_instances(counts), status=status, gap=gap,
                         solve_s=time.perf_counter() - t0, goodput_gap=goodput_gap,
                         notes=notes, phase_gaps=phase_gaps, phase_s=phase_s)

    seed = seed_of(problem, ix, v, cols, starts)
    if seed is not None:
        notes.append(f"seeded with a given plan: goodput {seed.goodput:.6g}, cost "
                     f"{seed.objective:.6g}")
    dec = decomposition_of(ix, v, lp) if decompose else None
    large_pd = None  # PD models past exact covers: HiGHS, from a rounded LP plan
    if dec is not None and not _pd_covers_small(dec):
        notes.append("PD models too large for exact per-model covers: HiGHS from a rounded "
                     "LP plan")
        large_pd, dec = dec, None

    # ---- cost problem: every demand met
    proven_short = capacity_bound_short(ix, v)
    if proven_short:
        notes.append("demand cannot be met in full (capacity or per-model bound)")
    elif dec is not None:
        outcome, counts, covers, bound = _solve_by_model(dec, problem.mip_gap)
        notes.append(f"per-model covers: {outcome}")
        if outcome == "optimal":
            return plan_of(counts, PlanStatus.OPTIMAL, relative_gap(dec.cost(counts), bound))
        proven_short = outcome == "short"
    if not proven_short and dec is not None:
        relaxed = lp_relaxation(arr, arr.cost, arr.col_lb, arr.row_lb, lp, len(v.x))
        if relaxed is None:
            proven_short = True
            notes.append("demand cannot be met in full (LP relaxation infeasible)")
        else:
            # a first plan: the LP's counts rounded down, each model's rest covered
            first = round_and_repair(dec, relaxed.x)
            # a re-plan starts from the running plan where it (repaired) is the cheaper
            warm = running_plan(dec)
            if warm is not None and (first is None or dec.cost(warm) < dec.cost(first)):
                first = warm
                notes.append("started from the running plan")
            if seed is not None and seed.meets_demand and dec.fits(seed.x) \
                    and (first is None or dec.cost(seed.x) < dec.cost(first)):
                first = seed.x
                notes.append("started from a given plan")
            # PD models keep branch and price throughout: HiGHS on their ILPs is far behind
            # (real `core` limited: PD 10 s at a 1.8% gap, mixed 2.8%, where it proves 0.5%)
            share = 1.0 if dec.has_pd else DECOMPOSED_SHARE
            res = solve_decomposed(dec, deadline=phase_deadline(problem, t0, share),
                                   rel_gap=problem.mip_gap, start_price=relaxed.node_price,
                                   start_bound=relaxed.value, start_patterns=tuple(covers),
                                   incumbent=first)
            notes.extend(res.notes)
            counts, cost, bound = res.counts, res.objective, res.bound
            proven_short = res.finished and res.bound == math.inf
            if not proven_short and relative_gap(cost, bound) > problem.mip_gap \
                    and remaining() > MIN_PHASE_S:
                counts, cost, bound = highs_after_decomposition(
                    arr, v, dec, counts, cost, bound, mip_gap=problem.mip_gap,
                    time_limit_s=remaining(), threads=threads, notes=notes,
                    neighbourhood=res.root_support, min_run_s=MIN_PHASE_S)
                proven_short = bound == math.inf
            if counts is not None:
                gap = relative_gap(cost, bound)
                status = PlanStatus.OPTIMAL if gap <= problem.mip_gap else PlanStatus.TIME_LIMIT
                return plan_of(counts, status, gap)
            notes.append("demand cannot be met in full (Lagrangian bound)" if proven_short
                         else "no plan meeting every demand found in time")
    elif not proven_short:
        if large_pd is not None:
            relaxed, start = rounded_start(large_pd, arr, lp, v, mip_gap=problem.mip_gap,
                                           deadline=t0 + problem.time_limit_s,
                                           threads=threads, notes=notes, seed=seed)
            proven_short = relaxed is None
            if start is not None:
                return plan_of(start.counts, start.status, relative_gap(start.cost,
                                                                        start.bound))
    if not proven_short and dec is None:
        cost_lp = arr.highs_lp(arr.cost, arr.col_lb, arr.row_lb, maximise=False)
        limit = remaining()
        if scarcity_search:
            limit = min(limit, DEMAND_SEARCH_SHARE * problem.time_limit_s)
        if scarcity_search and not root_fits(len(v.x), limit):
            # its root would overrun the limit: the scarcity phases search instead, and find
            # a plan meeting every demand where their first phase reaches level 1
            run = None
            notes.append(f"no time for HiGHS on the whole cost ILP ({len(v.x)} columns)")
        else:
            run = run_highs(cost_lp, time_limit_s=limit, mip_gap=problem.mip_gap,
                            threads=threads)
        if run is not None and run.ok and not run.infeasible:
            assert run.values is not None
            x, gap = x_of(run.values), run.gap
            if not run.optimal and remaining() > MIN_PHASE_S:
                x, gap = _improve(cost_lp, run, x, remaining(), problem.mip_gap, threads,
                                  x_of, notes)
            elif not run.optimal:
                notes.append(f"HiGHS: {run.detail}")
            return plan_of(x, PlanStatus.OPTIMAL if gap <= problem.mip_gap
                           else PlanStatus.TIME_LIMIT, gap)
        if run is not None:
            proven_short = run.infeasible
            notes.append(f"demand cannot be met in full (HiGHS: {run.detail})"
                         if run.infeasible else
                         f"no plan meeting every demand found in time (HiGHS: {run.detail})")
    final_status = PlanStatus.INFEASIBLE if proven_short else PlanStatus.TIME_LIMIT
    if not scarcity_search:
        notes.append("scarcity phases skipped (asked only whether demand can be met)")
        return plan_of(np.zeros(len(v.x), dtype=np.int64) if seed is None else seed.x,
                       final_status, math.inf, math.inf)

    # ---- scarcity: most goodput (phase 1), then the cheapest plan at it (phase 2)
    col_lb = arr.col_lb.copy()
    col_lb[v.s] = 0.0
    # PD models past exact covers (`large_pd`) go to HiGHS on the whole ILP: measured on
    # `coral plan advanced --level scarce --mode pd --nmax 2`, it proves a 0.50 % gap in 8.5 s
    # where `scarcity_bounded` ends at the 10 s limit 1.3 % from its bound
    if problem.scarcity == "fair":
        return _fair_plan(problem, dec if dec is not None else large_pd, lp, ix, v, t0=t0,
                          notes=notes, threads=threads, seed=seed, status=final_status,
                          plan_of=plan_of)
    if dec is not None:
        best, gap, goodput_gap = scarcity_bounded(problem, dec, arr, lp, ix, v, col_lb,
                                                   floor_row, t0=t0, notes=notes,
                                                   threads=threads, seed=seed)
    else:
        best, gap, goodput_gap = scarcity_highs(problem, arr, lp, ix, v, col_lb, floor_row,
                                                 t0=t0, notes=notes, threads=threads,
                                                 seed=seed)
    phases = {"goodput": goodput_gap, "cost": gap}
    if best is None:
        plan = plan_of(np.zeros(len(v.x), dtype=np.int64), final_status, math.inf, math.inf,
                       phase_gaps={"goodput": math.inf, "cost": math.inf})
    else:
        plan = plan_of(best, final_status, gap, goodput_gap, phase_gaps=phases)
        if plan.meets_demand:  # the cost phase found no plan in time; the goodput phases did
            plan = plan_of(best, PlanStatus.TIME_LIMIT, gap, goodput_gap)
    return plan


def _improve(cost_lp: highspy.HighsLp, first: HighsRun, x: np.ndarray, time_limit_s: float,
             mip_gap: float, threads: int | None, x_of: Callable[[np.ndarray], np.ndarray],
             notes: list[str]) -> tuple[np.ndarray, float]:
    """A second HiGHS run on the cost problem, for the time left, looking only for plans
    cheaper than `first`'s (a cutoff, not a start: `run_highs` says why): its plan where it
    finds one; `first`'s, proven optimal where none exists, else with the better bound."""
    cutoff = first.objective
    run = run_highs(cost_lp, time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads,
                    cutoff=cutoff)
    if run.ok and run.values is not None and run.objective < cutoff:
        if not run.optimal:
            notes.append(f"HiGHS (second run, below the first plan's cost): {run.detail}")
        return x_of(run.values), run.gap
    if run.infeasible:  # nothing cheaper than the first plan exists
        notes.append("HiGHS: the first plan proven optimal by a second run below its cost")
        return x, 0.0
    bounds = [b for b in (first.bound, run.bound) if math.isfinite(b)]
    notes.append(f"HiGHS: {first.detail}; a second run found nothing cheaper ({run.detail})")
    if not bounds:
        return x, first.gap
    bound = min(max(bounds), cutoff)
    return x, relative_gap(cutoff, bound)


def _fair_plan(problem: AllocationProblem, dec: Decomposition | None, lp: LpBuilder, ix: Index,
               v: Vars, *, t0: float, notes: list[str], threads: int | None,
               seed: Seed | None, status: PlanStatus,
               plan_of: Callable[..., AllocationPlan]) -> AllocationPlan:
    """The fair scarcity phases (`scarcity/fair.py`) on the ILP with the fair objective's rows added
    (the cost problem solved before them runs without those)."""
    if dec is None:
        dec = decomposition_of(ix, v, lp)
    pd_covers = _pd_covers_small(dec)
    fair_rows = add_fair_rows(lp, problem, ix, v)
    arr = lp.arrays()
    col_lb = arr.col_lb.copy()
    col_lb[v.s] = 0.0
    got = scarcity_fair(problem, dec, arr, lp, v, fair_rows, col_lb, t0=t0, notes=notes,
                        threads=threads, seeds=() if seed is None else (seed.x,),
                        pd_covers=pd_covers)
    plan = plan_of(got.x, status, got.gaps["cost"],
                   max(got.gaps["fairness"], got.gaps["tokens"]), phase_gaps=got.gaps,
                   phase_s=got.seconds)
    if plan.meets_demand:  # the cost phase found no plan in time; the fair phases did
        plan = plan_of(got.x, PlanStatus.TIME_LIMIT, got.gaps["cost"],
                       max(got.gaps["fairness"], got.gaps["tokens"]), phase_gaps={})
    return plan


def _finish(problem: AllocationProblem, plan: AllocationPlan, strict: bool) -> AllocationPlan:
    if plan.meets_demand:
        return plan
    log.info("allocation short on %s", ", ".join(plan.short_models))
    if strict:
        raise InfeasiblePlanError(infeasibility_message(problem, plan), plan)
    return plan


def infeasibility_message(problem: AllocationProblem, plan: AllocationPlan) -> str:
    """Which models' demand cannot be met, and why, in words."""
    lines = []
    if plan.status is PlanStatus.INFEASIBLE:
        lines.append("the demand cannot be met with the availability given; the plan of most "
                     + ("even served fractions, then most priority-weighted tokens/s"
                        if problem.scarcity == "fair" else "priority-weighted goodput")
                     + " leaves these models short:")
    else:
        lines.append(f"no plan meeting every demand was found within the time limit "
                     f"({problem.time_limit_s:g} s); the best plan found leaves these models "
                     "short:")
    for model in plan.short_models:
        demand = plan.demand_rps[model]
        served = plan.served_rps[model]
        templates = [t for t in problem.templates if t.model == model]
        reason = ""
        if not templates:
            reason = " (no template serves it)"
        elif not any(
            all(problem.availability.get((g, r), 0) >= n for g, n in t.node_counts.items())
            for t in templates
            for r in t.price_usd_per_hour
            if r in problem.regions
        ):
            reason = (f" (none of its {len(templates)} templates can run: their node types "
                      "are not priced or not available together in any region)")
        lines.append(f"  {model}: {served:.4g} of {demand:.4g} req/s served, short by "
                     f"{demand - served:.4g}{reason}")
    lines.append("To fix: add availability of these models' node types or regions, lower their "
                 "demand, or raise their priority over the others.")
    return "\n".join(lines)
