"""Spot capacity (`coral plan --spot`): plans that mix spot and on-demand instances of any
template and keep every model's demand covered with a stated probability.

Columns
-------
Every template column (aggregated, prefill or decode) runs on demand at its price; where
every node type of it has a spot price in a region (`NodeType.spot_price_in`), a copy of it
runs there on spot at the sum of its nodes' spot prices. A spot copy's id is the template's
id plus `@spot`, and it belongs to the pools (node type, region) of its nodes. Spot and
on-demand nodes of one type and region draw on that region's one availability count. A
prefill half pairs with any decode half of its region, spot or on demand.

The chance constraint (scenario-based ILP)
-----------------------------------------
Risk is modelled per pool (`spot_risk`): a pool is down in the window with probability
`p = 1 - exp(-lambda (W + max(startup - notice, 0)))`, pools independent, every spot node of a
down pool lost. For each model `m`, let `K_m` be the pools of its spot columns, and `S` a set
of pools of `K_m` down, of probability `pi_S`. `cap_j` is in requests/s (a PD half's tokens/s
over the tokens a request takes); `A_m`, `P_{m,r}`, `D_{m,r}` are the model's aggregated,
prefill and decode entries (of region `r`), and `alive(S)` the entries whose pools avoid `S`::

    minimise  sum_j price_j x_j + penalty_j |x_j - current_j|
    s.t.      serve_m(S) = sum_{j in A_m, alive(S)} cap_j x_j + sum_r d_{m,r,S}
              sum_{j in P_{m,r}, alive(S)} cap_j x_j >= d_{m,r,S},  likewise D_{m,r}
              serve_m({})                                 >= demand_m         (all pools up)
              serve_m(S)                                  >= demand_m z_{m,S}  (each S)
              pi_{} + sum_S pi_S z_{m,S}                  >= target
              sum_j nodes_{j,g} x_j                       <= avail_{g,r}
              x_j integer >= 0,  d >= 0,  z_{m,S} in {0, 1}

Each failure set has its own pairing variables `d_{m,r,S}` (the on-demand ILP's pairing rows,
`formulation.add_pd_pairing_rows`, written per set): at best they equal the lesser surviving
half, so `serve_m(S)` reaches exactly what the plan serves with `S` down. `z_{m,S}` may be 1
only where the plan covers `m` with the pools of `S` down, so the left side of the
probability row is the probability of the enumerated scenarios in which `m` is covered.
With every subset of `K_m` enumerated this is *exact*, for aggregated, PD and mixed columns
alike: a plan is feasible if and only if each model is covered with probability at least the
target, and the optimum is the cheapest such plan (`tests/test_spot.py` checks it against
brute force over every plan and every failure set, on aggregated and on PD instances). A
model of `core` has 24 spot pools, 2^24 failure sets: the sets are generated as plans need
them (`spot_ilp`), never all enumerated. A plan's own risk is judged in closed form on every
failure set of the pools it uses (`spot_risk.shortfall_probability`: per region the lesser of
the two surviving halves), exactly up to `spot_risk.EXACT_POOLS` pools and as an upper bound
beyond. `penalty_j` is the start-up of an instance beyond the current deployment, and as
much for a running one stopped, which serves until the instances taking over have started
(keeping a running one is free, as on demand), and `price_j` a spot instance's expected
$/hour with the replacements its preemptions start (`spot_ilp`'s objective).

What is approximated: the pool model itself (independent pools, a whole pool lost at once,
the replacement time added to the window; `spot_risk`), and, where the search stops at the
time limit, optimality (the plan returned meets the target; its gap is reported). The
repair's moves for PD models (`spot_repair`) are heuristics: a single instance or a prefill
and decode pair of one region; they only find starting plans, judged exactly.

How it is solved: the naive spot problem (no scenario rows) by the allocator's decomposition
(`ilp.solve_allocation`, spot columns at their expected price); where its exact risk meets
the target it is the answer. Otherwise the naive plan is repaired greedily
(`spot_repair`), each model is re-planned alone (the chance constraint is per model: only
availability ties the models), and the whole ILP is solved by scenario generation
(`spot_ilp`): relaxations holding a growing family of failure sets, every plan checked
against every failure set of the pools it uses. The plan returned always meets the target
exactly (or conservatively beyond `spot_risk.EXACT_POOLS` pools, as reported); its gap is
proven against the naive optimum's bound or the relaxation's, whichever is higher. A risk
target of 0 is the naive spot plan, the cheapest capacity with every pool up and no risk
model. Modes: `coral plan --spot --mode aggregated|pd|mixed|auto` plans the mode's columns
(auto: each mode, the cheapest plan kept, as on demand).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.problem import (
    AllocationPlan,
    AllocationProblem,
    PlanStatus,
    TemplateColumn,
    make_plan,
)
from coral.allocator.spot.ilp import ScenarioFamily, SpotArrays, gap_of, scenario_generation
from coral.allocator.spot.market import (  # noqa: F401  (the spot planner's API, re-exported)
    DEFAULT_RISK_TARGET,
    DEFAULT_RISK_WINDOW_S,
    HALF,
    SPOT_SUFFIX,
    SpotColumns,
    SpotMarket,
    SpotOptions,
    SpotPlanError,
    expected_price_problem,
    instance_pools,
    spot_arrays,
    spot_columns,
)
from coral.allocator.spot.repair import (
    ModelRisk,
    best_candidate,
    local_search,
    repair,
    uncovered,
)
from coral.allocator.spot.risk import Holding, Pool, shortfall_probability

SPOT, ON_DEMAND = "spot", "on_demand"
#: Most failure sets the repair judges a model on (beyond it, `scenario_depth` stops deeper).
MAX_SCENARIOS_PER_MODEL = 4096
#: Share of the risk budget the repair's table may leave out (counted as short).
SCENARIO_TOLERANCE = 1e-3
#: Share of a mode's time limit the on-demand plan beside the spot plan gets (the plan
#: file's comparison, and a start that meets any risk target); the spot solve has the rest.
ON_DEMAND_SHARE = 0.25
#: Share of the spot solve's time the naive spot plan gets when a risk target follows it.
NAIVE_SHARE = 0.3
#: Shares of the time left when they start that the later phases get: the local search of
#: the repaired naive plan, the running deployment topped up, and the models
#: re-planned alone (the whole ILP's scenario generation has the rest). Shares of what is
#: left, so that a phase that overran (a loaded machine) does not starve the next, and one
#: that ends early leaves its time to the next.
REPAIR_SHARE = 0.5
TOPPED_SHARE = 0.3
BY_MODEL_SHARE = 0.8


class PhaseClock:
    """Wall and CPU seconds per phase of a spot solve: the time limit is on wall time, and on a
    loaded machine CPU time says which phase does the work."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float]] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.rows.append((name, time.perf_counter() - wall, time.process_time() - cpu))


@dataclass(frozen=True)
class SpotPlan:
    """A spot plan: the allocation, its columns, and the risk it takes per model."""

    plan: AllocationPlan
    columns: SpotColumns
    options: SpotOptions
    market: SpotMarket
    p_short: Mapping[str, float]  # model -> probability it is short in the window
    p_unjudged: Mapping[str, float]  # model -> probability of failure sets not enumerated
    spot_share: Mapping[str, float]  # model -> spot share of its $/hour
    expected_usd_per_hour: float
    scenario_rows: int
    notes: tuple[str, ...] = field(default=())
    phases: tuple[tuple[str, float, float], ...] = field(default=())  # (phase, wall s, CPU s)
    # the plan's objective (expected $/hour plus start-ups and stops) and its proven lower
    # bound, and where the bound comes from ("naive plan" or "relaxation")
    objective: float = math.nan
    bound: float = -math.inf
    bound_from: str = ""

    @property
    def spot_usd_per_hour(self) -> float:
        by_id = {t.id: t for t in self.columns.problem.templates}
        return sum(n * by_id[tid].price_usd_per_hour[r]
                   for (tid, r), n in self.plan.instances.items() if tid in self.columns.base)

    @property
    def total_spot_share(self) -> float:
        cost = self.plan.cost_usd_per_hour
        return self.spot_usd_per_hour / cost if cost > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """The plan file's top-level `spot` object."""
        return {
            "risk_target": self.options.risk_target,
            "window_s": self.options.window_s,
            "spot_share": self.total_spot_share,
            "expected_usd_per_hour": self.expected_usd_per_hour,
            "per_model": {m: {"p_short": self.p_short[m], "spot_share": self.spot_share[m],
                              "p_unjudged": self.p_unjudged[m]}
                          for m in sorted(self.p_short)},
            "phases": [{"phase": name, "wall_s": wall, "cpu_s": cpu}
                       for name, wall, cpu in self.phases],
            "objective": self.objective if math.isfinite(self.objective) else None,
            "bound": self.bound if math.isfinite(self.bound) else None,
            "bound_from": self.bound_from or None,
            "model": ("scenario ILP over pool failure sets (node type x region, correlated "
                      "inside a pool, independent across pools; prefill/decode halves paired "
                      "per region in each set); p_short is exact where p_unjudged is 0, else "
                      "an upper bound within it"),
        }


def plan_spot(problem: AllocationProblem, market: SpotMarket, options: SpotOptions,
              starts: Sequence[Mapping[tuple[str, str], int]] = (),
              clock: PhaseClock | None = None, deadline: float | None = None) -> SpotPlan:
    """The cheapest plan (expected $/hour plus start-ups beyond `problem.current`) whose
    every model is covered over the window with probability at least `options.risk_target`
    (see the module). `starts`: plans known beforehand (the on-demand plan): any of them that
    meets the target bounds the search from above.

    The naive spot plan (no risk rows) is solved first by `ilp.solve_allocation`: it is the
    optimum of a relaxation, so where its exact risk meets the target it is the answer, and
    otherwise its bound bounds the answer from below. Then the naive plan repaired
    (`spot_repair.repair`, `local_search`) and the starts meeting the target cut off the scenario
    generation of `spot_ilp`, which returns the best plan known and the proven gap.

    Every phase ends by `deadline` (a `time.perf_counter()` instant; default
    `problem.time_limit_s` from now), each by its share of the time (`NAIVE_SHARE`...), except
    the exact judging of the plan returned, which is short (closed form)."""
    t0 = time.perf_counter()
    deadline = t0 + float(problem.time_limit_s) if deadline is None else deadline
    span = max(deadline - t0, 0.0)
    clock = clock if clock is not None else PhaseClock()
    with clock.phase("spot columns"):
        cols = spot_columns(problem, market)
        a = spot_arrays(cols, market)
    risky = options.risk_target > 0.0
    naive_problem = replace(expected_price_problem(cols, market),
                            time_limit_s=max(span * (NAIVE_SHARE if risky else 1.0), 1e-3))
    with clock.phase("naive"):
        naive = solve_allocation(naive_problem, starts=list(starts))
    if not naive.meets_demand and naive.status is PlanStatus.INFEASIBLE:
        raise SpotPlanError("no spot plan meets every demand within the availability (short: "
                            + ", ".join(naive.short_models) + ")")
    if not naive.meets_demand and not risky:
        raise SpotPlanError(f"no spot plan meeting every demand was found within the time "
                            f"limit ({problem.time_limit_s:g} s); raise --time-limit")
    # cut short before it met demand, the naive plan is only a start for the repair
    x_naive = a.vector(naive.instances)
    assert x_naive is not None
    naive_bound = (naive.objective * (1.0 - naive.gap)
                   if naive.meets_demand and math.isfinite(naive.gap) else -math.inf)
    naive_proof = {"objective": a.objective(x_naive), "bound": naive_bound,
                   "bound_from": "naive plan"}
    with clock.phase("judge naive"):
        judged_naive = _judge(_plan_of(cols.problem, a, x_naive, naive.status, naive.gap, t0,
                                       ("spot plan: the naive spot problem by the allocator's "
                                        "decomposition",)), cols, options, market, 0, ())
    if not risky:
        return replace(judged_naive, phases=tuple(clock.rows), **naive_proof)
    budget = 1.0 - options.risk_target
    # with a deployment running, the naive plan's objective leaves its stops out: it is one
    # candidate among the others then
    if naive.meets_demand and not a.current.any() and all(
            p == 0.0 for p in judged_naive.p_unjudged.values()) and all(
            p <= budget for p in judged_naive.p_short.values()):
        return replace(judged_naive, options=options, phases=tuple(clock.rows), notes=(
            *judged_naive.notes, "the naive spot optimum already meets the risk target"),
            **naive_proof)
    k_pools = [a.spot_pools_of(m) if a.demand[m] > 0 else [] for m in range(len(a.models))]
    with clock.phase("risk tables"):
        risks = [ModelRisk(a, m, market.prob_down, SCENARIO_TOLERANCE * budget,
                           MAX_SCENARIOS_PER_MODEL) if k else None
                 for m, k in enumerate(k_pools)]
    notes: list[str] = []
    best, best_from = None, ""
    running = a.vector(cols.problem.current)
    with clock.phase("repair"):
        # the repair is what gives PD and mixed problems a plan below the on-demand one:
        # it may take the time left, the local search after it its share
        repaired = repair(a, risks, x_naive, budget, deadline)
    if repaired is None:
        notes.append("repair of the naive plan: no plan meeting the target ("
                     + ("stopped at the time limit" if time.perf_counter() > deadline
                        else "no instance that fits helps") + ")")
    else:
        with clock.phase("local search"):
            repaired = local_search(a, risks, repaired, budget,
                                    _share_of_left(deadline, REPAIR_SHARE))
    # after a preemption the survivors are short: topped up, they move the fewest instances
    with clock.phase("running topped up"):
        phase_end = _share_of_left(deadline, TOPPED_SHARE)
        topped = (repair(a, risks, running, budget, phase_end)
                  if running is not None and running.any() else None)
        if topped is not None:
            topped = local_search(a, risks, topped, budget, phase_end)
    candidates = [("the naive plan", x_naive), ("the naive plan repaired", repaired),
                  ("the running deployment kept", running),
                  ("the running deployment topped up", topped)] + [
        ("a given start", a.vector(s)) for s in starts]
    with clock.phase("candidates judged"):
        best, best_from = best_candidate(a, candidates, market.prob_down, budget, k_pools)
    families = [ScenarioFamily.singles(k, market.prob_down) if k else None for k in k_pools]
    if best is not None:
        with clock.phase("each model alone"):
            better = improve_by_model(a, families, budget, best, market, k_pools,
                                      deadline=_share_of_left(deadline, BY_MODEL_SHARE),
                                      mip_gap=float(problem.mip_gap))
        if a.objective(better) < a.objective(best) - 1e-9:
            best, best_from = better, best_from + ", each model re-planned alone"
    with clock.phase("scenario generation"):
        gen = scenario_generation(
            a, families, budget, best,
            lambda x: uncovered(a, x, market.prob_down, budget, k_pools),
            deadline=deadline, mip_gap=float(problem.mip_gap))
    if gen.x is None:
        raise SpotPlanError(
            f"no plan meeting the risk target {options.risk_target} was found within the "
            f"time limit ({problem.time_limit_s:g} s); lower --risk-target, shorten "
            "--risk-window or raise --time-limit")
    came_from = ("scenario generation" if best is None or a.objective(gen.x) < a.objective(best)
                 else best_from)
    bound = max(gen.bound, naive_bound)
    gap = gap_of(a.objective(gen.x), bound)
    status = PlanStatus.OPTIMAL if gap <= problem.mip_gap else PlanStatus.TIME_LIMIT
    notes.extend(gen.notes)
    notes.append(f"spot plan: {came_from}; {gen.rounds} relaxation round(s) over "
                 f"{gen.scenario_rows} failure sets; bound from the "
                 + ("naive plan" if naive_bound >= gen.bound else "relaxation"))
    if a.current.any():
        stopped = np.maximum(a.current - gen.x, 0)
        notes.append(f"re-plan: {int(np.maximum(gen.x - a.current, 0).sum())} instance(s) "
                     f"started, {int(stopped.sum())} stopped; a stopped one serves until those "
                     f"taking over have started, ${float(a.penalty @ stopped):,.2f} in all, "
                     "counted beside the start-ups")
    plan = _plan_of(cols.problem, a, gen.x, status, gap, t0, tuple(notes))
    with clock.phase("judge plan"):
        judged = _judge(plan, cols, options, market, gen.scenario_rows, tuple(notes))
    return replace(judged, phases=tuple(clock.rows), objective=a.objective(gen.x), bound=bound,
                   bound_from="naive plan" if naive_bound >= gen.bound else "relaxation")


def _share_of_left(deadline: float, share: float) -> float:
    """The instant by which a phase starting now that gets `share` of the time left ends."""
    now = time.perf_counter()
    return now + max(deadline - now, 0.0) * share


def improve_by_model(a: SpotArrays, families: Sequence[ScenarioFamily | None], budget: float,
                     x: np.ndarray, market: SpotMarket, k_pools: Sequence[Sequence[Pool]],
                     *, deadline: float, mip_gap: float) -> np.ndarray:
    """Plan `x` (meeting the target) with each model's instances re-planned in turn by the
    scenario generation on that model alone, the other models' nodes held: the chance
    constraint is per model, so each of these ILPs holds one model's columns and failure
    sets, and HiGHS solves it far faster than the whole ILP. The dearest models go first,
    in passes until a pass changes nothing or time runs out; every step keeps the target and
    lowers the cost or keeps the plan."""
    x = x.copy()
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        order = sorted(range(len(a.models)),
                       key=lambda m: -float(a.hourly[a.model == m] @ x[a.model == m]))
        for i, m in enumerate(order):
            left = deadline - time.perf_counter()
            if left <= 0 or families[m] is None:
                continue
            sub, mine = a.one_model(m, x)
            k_m = [k_pools[m]]
            gen = scenario_generation(
                sub, [families[m]], budget, x[mine].copy(),
                lambda y: uncovered(sub, y, market.prob_down, budget, k_m),
                deadline=time.perf_counter() + left / (len(order) - i), mip_gap=mip_gap)
            if gen.x is not None and sub.objective(gen.x) < sub.objective(x[mine]) - 1e-9:
                x[mine] = gen.x
                improved = True
    return x


def _plan_of(problem: AllocationProblem, a: SpotArrays, x: np.ndarray, status: PlanStatus,
             gap: float, t0: float, notes: tuple[str, ...]) -> AllocationPlan:
    return make_plan(problem, a.counts(x), status=status, gap=max(gap, 0.0),
                     solve_s=time.perf_counter() - t0, notes=notes)


def _judge(plan: AllocationPlan, cols: SpotColumns, options: SpotOptions, market: SpotMarket,
           scenario_rows: int, notes: tuple[str, ...]) -> SpotPlan:
    """The plan's risk per model, recomputed from its instances (`shortfall_probability`)."""
    by_id = {t.id: t for t in cols.problem.templates}
    p_short: dict[str, float] = {}
    p_left: dict[str, float] = {}
    share: dict[str, float] = {}
    expected = plan.cost_usd_per_hour
    for d in cols.problem.demands:
        holdings, spot_cost, cost = [], 0.0, 0.0
        for (tid, region), n in plan.instances.items():
            t = by_id[tid]
            if t.model != d.model:
                continue
            spot = tid in cols.base
            ps = instance_pools(t, region) if spot else frozenset()
            holdings.append(Holding(n * t.capacity / d.tokens_per_request(t.mode), ps,
                                    HALF[t.mode], region))
            c = n * t.price_usd_per_hour[region]
            cost += c
            if spot:
                spot_cost += c
                rate = sum(market.rate_per_hour[p] for p in ps)
                expected += c * rate * cols.problem.startup_s / 3600.0
        p, left = shortfall_probability(holdings, d.requests_per_s, market.prob_down)
        p_short[d.model] = p
        p_left[d.model] = left
        share[d.model] = spot_cost / cost if cost > 0 else 0.0
    return SpotPlan(plan=plan, columns=cols, options=options, market=market, p_short=p_short,
                    p_unjudged=p_left, spot_share=share, expected_usd_per_hour=expected,
                    scenario_rows=scenario_rows, notes=notes)


class SpotPlanner:
    """`coral plan --spot` inside `plan_scenario`: solves each mode's problem as a spot plan,
    and the same problem on demand only, for the comparison in the plan file. Mode `auto`
    solves one problem per mode; the planner keeps each, and `columns` takes up the one
    of the mode chosen."""

    def __init__(self, options: SpotOptions, catalog: Any) -> None:
        self.options = options
        self.catalog = catalog
        self.result: SpotPlan | None = None
        self.on_demand: AllocationPlan | None = None
        self.runs: list[tuple[frozenset[str], SpotPlan, AllocationPlan]] = []

    def solve(self, problem: AllocationProblem, starts: Sequence[Mapping[Any, int]] = ()
              ) -> AllocationPlan:
        """The spot plan of `problem` within its time limit: the on-demand plan beside it
        gets `ON_DEMAND_SHARE` of it, the spot solve (`plan_spot`) the rest; the plan's
        solve time counts both."""
        pools = sorted({(g, r) for t in problem.templates for g in t.node_counts
                        for r in t.price_usd_per_hour})
        market = SpotMarket.from_catalog(self.catalog, pools, self.options, problem.startup_s)
        if not market.price:
            raise SpotPlanError("no node type of this scenario has a spot price in its regions "
                                "(the catalog's spot_prices)")
        clock = PhaseClock()
        start = time.perf_counter()
        deadline = start + float(problem.time_limit_s)
        with clock.phase("on demand"):
            on_demand = solve_allocation(
                replace(problem, time_limit_s=problem.time_limit_s * ON_DEMAND_SHARE),
                starts=[s for s in starts if not any(
                    str(tid).endswith(SPOT_SUFFIX) for tid, _ in s)])
        known = [*starts, dict(on_demand.instances)] if on_demand.meets_demand \
            else list(starts)
        result = plan_spot(problem, market, self.options, starts=known, clock=clock,
                           deadline=deadline)
        result = replace(result, plan=replace(result.plan,
                                              solve_s=time.perf_counter() - start))
        self.runs.append((frozenset(t.id for t in problem.templates), result, on_demand))
        self.result, self.on_demand = result, on_demand
        return result.plan

    def columns(self, columns: Sequence[TemplateColumn], templates: Mapping[str, Any]
                ) -> tuple[list[TemplateColumn], dict[str, Any]]:
        """The columns and templates `decode_instances` needs, spot copies included, of the
        problem whose columns are `columns` (the mode chosen)."""
        ids = frozenset(c.id for c in columns)
        for run_ids, result, on_demand in self.runs:
            if run_ids == ids:
                self.result, self.on_demand = result, on_demand
        assert self.result is not None
        base = self.result.columns.base
        cols = list(self.result.columns.problem.templates)
        tpls = dict(templates)
        tpls.update({sid: templates[b] for sid, b in base.items() if b in templates})
        return cols, tpls

    def markets(self) -> dict[str, str]:
        assert self.result is not None
        return {sid: SPOT for sid in self.result.columns.base}

    def best_on_demand(self) -> AllocationPlan | None:
        """The cheapest on-demand plan meeting demand over the modes solved."""
        plans = [od for _, _, od in self.runs if od.meets_demand]
        return min(plans, key=lambda p: p.cost_usd_per_hour) if plans else None

    def summary(self) -> dict[str, Any]:
        assert self.result is not None
        out = self.result.summary()
        od = self.best_on_demand()
        out["on_demand_usd_per_hour"] = od.cost_usd_per_hour if od is not None else None
        out["scenario_rows"] = self.result.scenario_rows
        return out

    def note(self) -> str:
        assert self.result is not None
        r, od = self.result, self.best_on_demand()
        worst = max(r.p_short.values(), default=0.0)
        modes = sorted({t.mode for t in r.columns.problem.templates})
        vs = (f"; on demand only ${od.cost_usd_per_hour:,.2f}/hour" if od is not None else "")
        return (f"spot ({', '.join(modes)} columns): "
                f"{r.total_spot_share:.1%} of $/hour on spot, expected "
                f"${r.expected_usd_per_hour:,.2f}/hour with replacements{vs}; risk target "
                f"{r.options.risk_target:g} over {r.options.window_s:g} s, worst model short "
                f"with probability {worst:.2e}")
