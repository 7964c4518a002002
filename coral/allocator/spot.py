"""Spot capacity (`coral plan --spot`): plans that mix spot and on-demand instances of any
template and keep every model's demand covered with a stated probability.

Columns
-------
Every aggregated template column runs on demand at its price; where every node type of it
has a spot price in a region (`NodeType.spot_price_in`), a copy of it runs there on spot at
the sum of its nodes' spot prices. A spot copy's id is the template's id plus `@spot`, and it
belongs to the pools (node type, region) of its nodes. Spot and on-demand nodes of one type
and region draw on that region's one availability count.

The chance constraint (scenario-based ILP)
-----------------------------------------
Risk is modelled per pool (`spot_risk`): a pool is down in the window with probability
`p = 1 - exp(-lambda (W + max(startup - notice, 0)))`, pools independent, every spot node of a
down pool lost. For each model `m`, let `K_m` be the pools of its spot columns, and `S` a set
of pools of `K_m` down, of probability `pi_S`. The ILP is::

    minimise  sum_j price_j x_j + penalty_j max(x_j - current_j, 0)
    s.t.      sum_{j in m} cap_j x_j                       >= demand_m         (all pools up)
              sum_{j in m, pools_j disjoint from S} cap_j x_j >= demand_m z_{m,S}  (each S)
              pi_{} + sum_S pi_S z_{m,S}                      >= target
              sum_j nodes_{j,g} x_j                          <= avail_{g,r}
              x_j integer >= 0,  z_{m,S} in {0, 1}

`z_{m,S}` may be 1 only where the plan covers `m` with the pools of `S` down, so the left side
of the probability row is the probability of the enumerated scenarios in which `m` is
covered. With every subset of `K_m` enumerated this is *exact*: a plan is feasible if and only
if each model is covered with probability at least the target, and the optimum is the
cheapest such plan (`tests/test_spot.py` checks it against brute force over every plan and
every failure set). A model of `core` has 24 spot pools, 2^24 failure sets: the sets are
generated as plans need them (`spot_ilp`), never all enumerated.
`penalty_j` is the start-up of an instance beyond the current deployment (keeping a running
one is free, as on demand) and `price_j` a spot instance's expected $/hour with the
replacements its preemptions start (`spot_ilp`'s objective).

How it is solved: the naive spot problem (no scenario rows) by the allocator's decomposition
(`ilp.solve_allocation`, spot columns at their expected price); where its exact risk meets
the target it is the answer. Otherwise the naive plan is repaired greedily
(`spot_repair`), each model is re-planned alone (the chance constraint is per model: only
availability ties the models), and the whole ILP is solved by scenario generation
(`spot_ilp`): relaxations holding a growing family of failure sets, every plan checked
against every failure set of the pools it uses. The plan returned always meets the target
exactly (or conservatively beyond `spot_risk.EXACT_POOLS` pools, as reported); its gap is
proven against the naive optimum's bound or the relaxation's, whichever is higher. Prefill/
decode (PD) columns are not planned on spot: `--spot` plans aggregated serving. A risk target
of 0 is the naive spot plan, the cheapest capacity with every pool up and no risk model.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from coral.allocator.ilp import solve_allocation
from coral.allocator.problem import (
    AllocationPlan,
    AllocationProblem,
    PlanStatus,
    TemplateColumn,
    make_plan,
)
from coral.allocator.spot_ilp import ScenarioFamily, SpotArrays, gap_of, scenario_generation
from coral.allocator.spot_repair import ModelRisk, local_search, repair, uncovered
from coral.allocator.spot_risk import (
    Holding,
    Pool,
    pool_down_probability,
    shortfall_probability,
)
from coral.errors import CoralError

SPOT_SUFFIX = "@spot"
SPOT, ON_DEMAND = "spot", "on_demand"
DEFAULT_RISK_TARGET = 0.99
DEFAULT_RISK_WINDOW_S = 3600.0
#: Most failure sets the repair judges a model on (beyond it, `scenario_depth` stops deeper).
MAX_SCENARIOS_PER_MODEL = 4096
#: Share of the risk budget the repair's table may leave out (counted as short).
SCENARIO_TOLERANCE = 1e-3
#: Share of the time limit the naive spot plan gets when a risk target follows it.
NAIVE_SHARE = 0.3
#: Share of the time limit by which the models re-planned alone are done (the whole ILP's
#: scenario generation has the rest).
BY_MODEL_SHARE = 0.9


class SpotPlanError(CoralError, ValueError):
    """A spot plan cannot be made as asked (bad option, no spot price, target out of reach)."""


@dataclass(frozen=True)
class SpotOptions:
    """`coral plan --spot [--risk-target P] [--risk-window S]`."""

    risk_target: float = DEFAULT_RISK_TARGET
    window_s: float = DEFAULT_RISK_WINDOW_S

    def __post_init__(self) -> None:
        if not (isinstance(self.risk_target, (int, float)) and 0.0 <= self.risk_target < 1.0):
            raise SpotPlanError(f"--risk-target must be in [0, 1), got {self.risk_target!r}")
        if not (isinstance(self.window_s, (int, float)) and math.isfinite(self.window_s)
                and self.window_s > 0):
            raise SpotPlanError(f"--risk-window must be a number of seconds > 0, got "
                                f"{self.window_s!r}")


@dataclass(frozen=True)
class SpotMarket:
    """The spot figures of the pools a problem can use: price, rate, probability down."""

    price: Mapping[Pool, float]  # $/hour of one spot node
    rate_per_hour: Mapping[Pool, float]  # preemption events per node-hour
    prob_down: Mapping[Pool, float]  # probability down over the window (`spot_risk`)

    @classmethod
    def from_catalog(cls, catalog: Any, pools: Sequence[Pool], options: SpotOptions,
                     startup_s: float) -> "SpotMarket":
        price, rate, prob = {}, {}, {}
        for node_type, region in pools:
            spot = catalog.node_type(node_type).spot_price_in(region)
            if spot is None:
                continue
            key = (node_type, region)
            price[key] = float(spot)
            rate[key] = float(catalog.preemption_rate_per_hour(node_type, region))
            prob[key] = pool_down_probability(rate[key], options.window_s, startup_s,
                                              float(catalog.preemption_notice_s(region)))
        return cls(price, rate, prob)


@dataclass(frozen=True)
class SpotColumns:
    """The problem with spot copies added, and what each copy stands for."""

    problem: AllocationProblem
    base: Mapping[str, str]  # spot column id -> the template column it copies


def spot_columns(problem: AllocationProblem, market: SpotMarket) -> SpotColumns:
    """`problem` with a spot copy of every aggregated column in each region where all its
    node types have a spot price (see the module)."""
    bad = sorted({t.mode for t in problem.templates if t.mode != "aggregated"})
    if bad:
        raise SpotPlanError(f"--spot plans aggregated serving only; the problem holds {bad} "
                            f"columns (use --mode aggregated)")
    extra: list[TemplateColumn] = []
    base: dict[str, str] = {}
    for t in problem.templates:
        prices: dict[str, float] = {}
        for region in t.price_usd_per_hour:
            each = [market.price.get((g, region)) for g in t.node_counts]
            if all(p is not None for p in each):
                prices[region] = sum(n * p for n, p in zip(t.node_counts.values(), each))
        if not prices:
            continue
        sid = t.id + SPOT_SUFFIX
        extra.append(TemplateColumn(sid, t.model, t.mode, dict(t.node_counts), t.capacity,
                                    prices))
        base[sid] = t.id
    full = AllocationProblem(
        demands=problem.demands, templates=(*problem.templates, *extra),
        regions=problem.regions, availability=problem.availability, current=problem.current,
        startup_s=problem.startup_s, time_limit_s=problem.time_limit_s,
        mip_gap=problem.mip_gap)
    return SpotColumns(full, base)


def instance_pools(col: TemplateColumn, region: str) -> frozenset[Pool]:
    return frozenset((g, region) for g in col.node_counts)


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

    @property
    def spot_usd_per_hour(self) -> float:
        by_id = {t.id: t for t in self.columns.problem.templates}
        return sum(n * by_id[tid].price_usd_per_hour[r]
                   for (tid, r), n in self.plan.instances.items() if tid in self.columns.base)

    @property
    def total_spot_share(self) -> float:
        cost = self.plan.cost_usd_per_hour
        return self.spot_usd_per_hour / cost if cost > 0 else 0.0

    def market_of(self, column_id: str) -> str:
        return SPOT if column_id in self.columns.base else ON_DEMAND

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
            "model": ("scenario ILP over pool failure sets (node type x region, correlated "
                      "inside a pool, independent across pools); p_short is exact where "
                      "p_unjudged is 0, else an upper bound within it"),
        }


def plan_spot(problem: AllocationProblem, market: SpotMarket, options: SpotOptions,
              starts: Sequence[Mapping[tuple[str, str], int]] = ()) -> SpotPlan:
    """The cheapest plan (expected $/hour plus start-ups beyond `problem.current`) whose
    every model is covered over the window with probability at least `options.risk_target`
    (see the module). `starts`: plans known beforehand (the on-demand plan): any of them that
    meets the target bounds the search from above.

    The naive spot plan (no risk rows) is solved first by `ilp.solve_allocation`: it is the
    optimum of a relaxation, so where its exact risk meets the target it is the answer, and
    otherwise its bound bounds the answer from below. Then the naive plan repaired
    (`spot_repair.repair`, `local_search`) and the starts meeting the target cut off the scenario
    generation of `spot_ilp`, which returns the best plan known and the proven gap."""
    t0 = time.perf_counter()
    deadline = t0 + float(problem.time_limit_s)
    cols = spot_columns(problem, market)
    a = spot_arrays(cols, market)
    risky = options.risk_target > 0.0
    naive_problem = replace(expected_price_problem(cols, market),
                            time_limit_s=problem.time_limit_s * (NAIVE_SHARE if risky else 1.0))
    naive = solve_allocation(naive_problem, starts=list(starts))
    if not naive.meets_demand:
        raise SpotPlanError("no spot plan meets every demand within the availability (short: "
                            + ", ".join(naive.short_models) + ")")
    x_naive = a.vector(naive.instances)
    assert x_naive is not None
    naive_bound = naive.objective * (1.0 - naive.gap) if math.isfinite(naive.gap) else -math.inf
    judged_naive = _judge(_plan_of(cols.problem, a, x_naive, naive.status, naive.gap, t0,
                                   ("spot plan: the naive spot problem by the allocator's "
                                    "decomposition",)), cols, options, market, 0, ())
    if not risky:
        return judged_naive
    budget = 1.0 - options.risk_target
    if all(p == 0.0 for p in judged_naive.p_unjudged.values()) and all(
            p <= budget for p in judged_naive.p_short.values()):
        return replace(judged_naive, options=options, notes=(
            *judged_naive.notes, "the naive spot optimum already meets the risk target"))
    k_pools = [a.spot_pools_of(m) if a.demand[m] > 0 else [] for m in range(len(a.models))]
    risks = [ModelRisk(a, m, market.prob_down, SCENARIO_TOLERANCE * budget,
                       MAX_SCENARIOS_PER_MODEL) if k else None for m, k in enumerate(k_pools)]
    notes: list[str] = []
    best, best_from = None, ""
    running = a.vector(cols.problem.current)
    repaired = repair(a, risks, x_naive, budget)
    if repaired is not None:
        repaired = local_search(a, risks, repaired, budget, deadline)
    # after a preemption the survivors are short: topped up, they move the fewest instances
    topped = repair(a, risks, running, budget) if running is not None and running.any() else None
    if topped is not None:
        topped = local_search(a, risks, topped, budget, deadline)
    candidates = [("the naive plan repaired", repaired),
                  ("the running deployment kept", running),
                  ("the running deployment topped up", topped)] + [
        ("a given start", a.vector(s)) for s in starts]
    for name, x in candidates:
        if x is None or not a.fits(x) or (a.capacity(x) < a.demand * (1 - 1e-9)).any():
            continue
        if uncovered(a, x, market.prob_down, budget, k_pools):
            continue
        if best is None or a.objective(x) < a.objective(best):
            best, best_from = x, name
    families = [ScenarioFamily.singles(k, market.prob_down) if k else None for k in k_pools]
    if best is not None:
        better = improve_by_model(a, families, budget, best, market, k_pools,
                                  deadline=t0 + (deadline - t0) * BY_MODEL_SHARE,
                                  mip_gap=float(problem.mip_gap))
        if a.objective(better) < a.objective(best) - 1e-9:
            best, best_from = better, best_from + ", each model re-planned alone"
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
    plan = _plan_of(cols.problem, a, gen.x, status, gap, t0, tuple(notes))
    return _judge(plan, cols, options, market, gen.scenario_rows, tuple(notes))


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


def spot_arrays(cols: SpotColumns, market: SpotMarket) -> SpotArrays:
    """The entries (column, region) of the spot problem that availability allows and whose
    model has demand, as `spot_ilp.SpotArrays`."""
    full = cols.problem
    models = tuple(d.model for d in full.demands)
    m_of = {m: i for i, m in enumerate(models)}
    entries = [(t, r) for t in full.templates for r in t.price_usd_per_hour
               if t.model in m_of and _upper_bound(full, t, r) > 0]
    pools = tuple(instance_pools(t, r) if t.id in cols.base else frozenset()
                  for t, r in entries)
    price = np.array([t.price_usd_per_hour[r] for t, r in entries])
    rate = np.array([sum(market.rate_per_hour[p] for p in ps) for ps in pools])
    hourly = price * (1.0 + rate * full.startup_s / 3600.0)
    usage: dict[Pool, list[tuple[int, float]]] = {}
    for j, (t, r) in enumerate(entries):
        for g, n in t.node_counts.items():
            usage.setdefault((g, r), []).append((j, float(n)))
    rows = sorted(usage)
    return SpotArrays(
        keys=tuple((t.id, r) for t, r in entries),
        model=np.array([m_of[t.model] for t, _ in entries], dtype=int),
        cap=np.array([t.capacity for t, _ in entries], dtype=float),
        hourly=hourly,
        penalty=hourly * full.startup_s / 3600.0,
        current=np.array([full.current.get((t.id, r), 0) for t, r in entries], dtype=float),
        ub=np.array([_upper_bound(full, t, r) for t, r in entries]),
        pools=pools,
        usage=tuple((p, np.array([j for j, _ in usage[p]], dtype=int),
                     np.array([n for _, n in usage[p]])) for p in rows),
        avail=np.array([float(full.availability.get(p, 0)) for p in rows]),
        models=models,
        demand=np.array([d.requests_per_s for d in full.demands]),
    )


def expected_price_problem(cols: SpotColumns, market: SpotMarket) -> AllocationProblem:
    """The spot problem as the allocator's problem: every spot column priced at its expected
    $/hour with replacements (`spot_ilp`), so that `solve_allocation`'s objective (price and
    start-ups beyond the current deployment) is the spot planner's."""
    full = cols.problem
    share = full.startup_s / 3600.0
    templates = []
    for t in full.templates:
        if t.id in cols.base:
            t = replace(t, price_usd_per_hour={
                r: p * (1.0 + share * sum(market.rate_per_hour[(g, r)] for g in t.node_counts))
                for r, p in t.price_usd_per_hour.items()})
        templates.append(t)
    return replace(full, templates=tuple(templates))


def _plan_of(problem: AllocationProblem, a: SpotArrays, x: np.ndarray, status: PlanStatus,
             gap: float, t0: float, notes: tuple[str, ...]) -> AllocationPlan:
    return make_plan(problem, a.counts(x), status=status, gap=max(gap, 0.0),
                     solve_s=time.perf_counter() - t0, notes=notes)


def _upper_bound(problem: AllocationProblem, t: TemplateColumn, region: str) -> float:
    most = math.inf
    for g, n in t.node_counts.items():
        most = min(most, problem.availability.get((g, region), 0) // n)
    return float(most)


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
            holdings.append(Holding(n * t.capacity, ps))
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
    """`coral plan --spot` inside `plan_scenario`: solves the scenario's aggregated problem as
    a spot plan, and the same problem on demand only, for the comparison in the plan file."""

    def __init__(self, options: SpotOptions, catalog: Any) -> None:
        self.options = options
        self.catalog = catalog
        self.result: SpotPlan | None = None
        self.on_demand: AllocationPlan | None = None

    def solve(self, problem: AllocationProblem, starts: Sequence[Mapping[Any, int]] = ()
              ) -> AllocationPlan:
        pools = sorted({(g, r) for t in problem.templates for g in t.node_counts
                        for r in t.price_usd_per_hour})
        market = SpotMarket.from_catalog(self.catalog, pools, self.options, problem.startup_s)
        if not market.price:
            raise SpotPlanError("no node type of this scenario has a spot price in its regions "
                                "(the catalog's spot_prices)")
        self.on_demand = solve_allocation(problem, starts=list(starts))
        known = [*starts, dict(self.on_demand.instances)] if self.on_demand.meets_demand \
            else list(starts)
        self.result = plan_spot(problem, market, self.options, starts=known)
        return self.result.plan

    def columns(self, columns: Sequence[TemplateColumn], templates: Mapping[str, Any]
                ) -> tuple[list[TemplateColumn], dict[str, Any]]:
        """The columns and templates `decode_instances` needs, spot copies included."""
        assert self.result is not None
        base = self.result.columns.base
        cols = list(self.result.columns.problem.templates)
        tpls = dict(templates)
        tpls.update({sid: templates[b] for sid, b in base.items() if b in templates})
        return cols, tpls

    def markets(self) -> dict[str, str]:
        assert self.result is not None
        return {sid: SPOT for sid in self.result.columns.base}

    def summary(self) -> dict[str, Any]:
        assert self.result is not None
        out = self.result.summary()
        od = self.on_demand
        out["on_demand_usd_per_hour"] = (od.cost_usd_per_hour if od is not None
                                         and od.meets_demand else None)
        out["scenario_rows"] = self.result.scenario_rows
        return out

    def note(self) -> str:
        assert self.result is not None
        r, od = self.result, self.on_demand
        worst = max(r.p_short.values(), default=0.0)
        vs = (f"; on demand only ${od.cost_usd_per_hour:,.2f}/hour"
              if od is not None and od.meets_demand else "")
        return (f"spot (aggregated serving: --spot plans no prefill/decode pairs): "
                f"{r.total_spot_share:.1%} of $/hour on spot, expected "
                f"${r.expected_usd_per_hour:,.2f}/hour with replacements{vs}; risk target "
                f"{r.options.risk_target:g} over {r.options.window_s:g} s, worst model short "
                f"with probability {worst:.2e}")
