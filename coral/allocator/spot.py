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

    minimise  sum_j (price_j + penalty_j + rate_j * penalty_j) x_j
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
every failure set). Where `K_m` is too large to enumerate, the sets with more than `d` pools
down are left out and counted as failures (`spot_risk.scenario_depth` picks the least `d`
whose left-out mass is at most a thousandth of the risk budget); the constraint is then a
conservative inner approximation, off by at most that mass, which the plan reports.
`penalty_j` is the start-up penalty (every instance counted as new); `rate_j`, the preemption
events per hour of a spot instance (the sum of its pools' rates), prices the replacements it
will need, so the objective is the expected $/hour plus the one-off start-up.

The solve is plain HiGHS on this whole ILP: the decomposition paths of `ilp.py` do not carry
the scenario rows. Prefill/decode (PD) columns are not planned on spot: `--spot` plans
aggregated serving. A risk target of 0 drops the scenario rows: the naive spot plan, the
cheapest capacity with every pool up and no risk model.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import highspy
import numpy as np

from coral.allocator.problem import (
    AllocationPlan,
    AllocationProblem,
    PlanStatus,
    TemplateColumn,
    make_plan,
)
from coral.allocator.spot_risk import (
    Holding,
    Pool,
    pool_down_probability,
    scenario_depth,
    scenarios,
    shortfall_probability,
)
from coral.errors import CoralError

SPOT_SUFFIX = "@spot"
SPOT, ON_DEMAND = "spot", "on_demand"
DEFAULT_RISK_TARGET = 0.99
DEFAULT_RISK_WINDOW_S = 3600.0
#: Most failure scenarios enumerated per model (beyond it, `scenario_depth` stops deeper).
MAX_SCENARIOS_PER_MODEL = 4096


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


def plan_spot(problem: AllocationProblem, market: SpotMarket, options: SpotOptions
              ) -> SpotPlan:
    """The cheapest plan (expected $/hour plus start-up) whose every model is covered over
    the window with probability at least `options.risk_target` (see the module).

    The plan without scenario rows (the naive spot plan) is solved first: it is the optimum
    of a relaxation, so where its own exact risk already meets the target it is the answer,
    with the relaxation's proven gap, and the scenario ILP is not needed."""
    if options.risk_target > 0.0:
        naive = plan_spot(problem, market, SpotOptions(0.0, options.window_s))
        if all(p == 0.0 for p in naive.p_unjudged.values()) and all(
                1.0 - p >= options.risk_target for p in naive.p_short.values()):
            return SpotPlan(**{**naive.__dict__, "options": options,
                               "notes": (*naive.notes, "the naive spot optimum already meets "
                                         "the risk target: no scenario rows needed")})
    t0 = time.perf_counter()
    cols = spot_columns(problem, market)
    full = cols.problem
    entries = [(t, r) for t in full.templates for r in t.price_usd_per_hour
               if t.model in {d.model for d in full.demands}]
    ub = np.array([_upper_bound(full, t, r) for t, r in entries], dtype=float)
    keep = [i for i in range(len(entries)) if ub[i] > 0]
    entries = [entries[i] for i in keep]
    ub = ub[keep]
    is_spot = [t.id in cols.base for t, _ in entries]
    pools = [instance_pools(t, r) if s else frozenset() for (t, r), s in zip(entries, is_spot)]
    price = np.array([t.price_usd_per_hour[r] for t, r in entries])
    rate = np.array([sum(market.rate_per_hour[p] for p in ps) for ps in pools])
    penalty = price * full.startup_s / 3600.0
    cost = price + penalty + rate * penalty

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    inf = highspy.kHighsInf
    n_x = len(entries)
    h.addVars(n_x, np.zeros(n_x), ub)
    h.changeColsCost(n_x, np.arange(n_x, dtype=np.int32), cost)
    h.changeColsIntegrality(n_x, np.arange(n_x, dtype=np.int32),
                            np.array([highspy.HighsVarType.kInteger] * n_x))
    n_col = n_x
    # availability rows, spot and on-demand together
    usage: dict[Pool, list[tuple[int, float]]] = {}
    for j, (t, r) in enumerate(entries):
        for g, n in t.node_counts.items():
            usage.setdefault((g, r), []).append((j, float(n)))
    for pool, uses in usage.items():
        idx = np.array([j for j, _ in uses], dtype=np.int32)
        h.addRow(-inf, float(full.availability.get(pool, 0)), len(idx), idx,
                 np.array([v for _, v in uses]))
    scenario_rows = 0
    notes: list[str] = []
    for d in full.demands:
        mine = [j for j, (t, _) in enumerate(entries) if t.model == d.model]
        caps = np.array([entries[j][0].capacity for j in mine])
        idx = np.array(mine, dtype=np.int32)
        h.addRow(d.requests_per_s, inf, len(idx), idx, caps)  # every pool up
        if options.risk_target <= 0.0 or d.requests_per_s <= 0:
            continue
        k_m = sorted({p for j in mine for p in pools[j]})
        if not k_m:
            continue
        probs = [market.prob_down[p] for p in k_m]
        budget = 1.0 - options.risk_target
        depth, left = scenario_depth(probs, 1e-3 * budget, MAX_SCENARIOS_PER_MODEL)
        pos = {p: i for i, p in enumerate(k_m)}
        masks = [sum(1 << pos[p] for p in pools[j]) for j in mine]
        sc = scenarios(probs, depth)
        up_prob = sc[0][1]
        z_idx, z_prob = [], []
        for down, prob in sc[1:]:
            dmask = sum(1 << i for i in down)
            alive = [k for k, m in enumerate(masks) if not m & dmask]
            z = n_col
            h.addVar(0.0, 1.0)
            h.changeColIntegrality(z, highspy.HighsVarType.kInteger)
            n_col += 1
            ridx = np.array([mine[k] for k in alive] + [z], dtype=np.int32)
            rval = np.concatenate([caps[alive], [-d.requests_per_s]])
            h.addRow(0.0, inf, len(ridx), ridx, rval)
            z_idx.append(z)
            z_prob.append(prob)
            scenario_rows += 1
        if up_prob + sum(z_prob) < options.risk_target:
            raise SpotPlanError(
                f"{d.model}: the risk target {options.risk_target} is out of reach: the "
                f"failure sets enumerated ({len(sc)}, up to {depth} of {len(k_m)} pools down) "
                f"weigh {up_prob + sum(z_prob):.6f}; lower --risk-target or shorten "
                f"--risk-window")
        if z_idx:
            h.addRow(options.risk_target - up_prob, inf, len(z_idx),
                     np.array(z_idx, dtype=np.int32), np.array(z_prob))
        if left > 0:
            notes.append(f"{d.model}: failure sets of more than {depth} of its {len(k_m)} spot "
                         f"pools (probability {left:.2e}) counted as short")
    h.setOptionValue("time_limit", float(full.time_limit_s))
    h.setOptionValue("mip_rel_gap", float(full.mip_gap))
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    if info.primal_solution_status != 2:  # no feasible solution
        raise SpotPlanError(f"no spot plan meets every demand within the availability "
                            f"(HiGHS: {h.modelStatusToString(status)})")
    x = np.round(np.asarray(h.getSolution().col_value[:n_x])).astype(int)
    counts: dict[tuple[str, str], int] = {}
    for j, (t, r) in enumerate(entries):
        if x[j] > 0:
            counts[(t.id, r)] = int(x[j])
    gap = float(info.mip_gap) if math.isfinite(info.mip_gap) else math.inf
    optimal = status == highspy.HighsModelStatus.kOptimal
    plan = make_plan(full, counts, status=PlanStatus.OPTIMAL if optimal else
                     PlanStatus.TIME_LIMIT, gap=max(gap, 0.0),
                     solve_s=time.perf_counter() - t0,
                     notes=("spot plan: HiGHS on the whole scenario ILP", *notes))
    return _judge(plan, cols, options, market, scenario_rows, tuple(notes))


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
        from coral.allocator.ilp import solve_allocation

        pools = sorted({(g, r) for t in problem.templates for g in t.node_counts
                        for r in t.price_usd_per_hour})
        market = SpotMarket.from_catalog(self.catalog, pools, self.options, problem.startup_s)
        if not market.price:
            raise SpotPlanError("no node type of this scenario has a spot price in its regions "
                                "(the catalog's spot_prices)")
        self.on_demand = solve_allocation(problem, starts=list(starts))
        self.result = plan_spot(problem, market, self.options)
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
        return (f"spot: {r.total_spot_share:.1%} of $/hour on spot, expected "
                f"${r.expected_usd_per_hour:,.2f}/hour with replacements{vs}; risk target "
                f"{r.options.risk_target:g} over {r.options.window_s:g} s, worst model short "
                f"with probability {worst:.2e}")
