"""Plans robust to performance-model error: `coral plan --robust R` (issue 22).

Most catalog GPU types have no profile of their own, and the perf model's error on them is of
the order of tens of per cent. A robust plan keeps every model's demand covered if any **one**
GPU type is slower than modelled by the factor `F = 1 + R`: one scenario "g slow" per GPU type
`g` of the columns, in which each column's capacity is what it delivers within the SLO with
`g` slowed (`robust_rating.py` says how it is re-rated, on the same placement).

The ILP is the allocation ILP (`formulation.py`: its variables, the nominal capacity rows, PD
pairing, availability and start-up rows) plus, for every scenario `g` and every model `m` whose
columns' capacity changes under it, the cover of `m` in that scenario::

    sum_{t in T_m^agg, r} cap^g_t x[t,r] + sum_r d^g[m,r] - s[m] >= 0
    sum_{t in T_m^prefill} cap^g_t x[t,r] - input_tokens_m  d^g[m,r] >= 0   (each PD pair m, r)
    sum_{t in T_m^decode}  cap^g_t x[t,r] - output_tokens_m d^g[m,r] >= 0

`d^g[m,r] >= 0` is the requests/s a region's prefill/decode pairs carry in scenario `g`, one
set per scenario: the slow GPU may sit in one half only, so a region's share moves with it.
So PD and mixed plans are covered as directly as aggregated ones (`add_scenario_rows` takes
any per-scenario capacity vector, not only slowdowns).

How it is solved: HiGHS on the whole ILP. The decomposition paths of `ilp.py` (per-model
covers, the Lagrangian bound, branch and price) price one cover row per model and would need
a cover per (model, scenario); they are not used here. Presolve keeps every template (no
dominance: a collection that beats a template nominally can lose to it when its own GPU type
is the slow one), and bounds each column by the instances its smallest positive capacity
over the scenarios needs alone (more of them would only cost more in every scenario).
Demand that cannot be covered robustly is reported as such (status infeasible, proven by
HiGHS); there is no goodput phase.

`robust_bruteforce` enumerates every instance vector of a tiny problem: the tests' oracle.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import highspy
import numpy as np

from coral.allocator.formulation import (
    LpBuilder,
    Vars,
    add_availability_rows,
    add_capacity_rows,
    add_pd_pairing_rows,
    add_startup_rows,
    add_variables,
)
from coral.allocator.highs_runs import plan_of_run, run_highs
from coral.allocator.ilp import solve_allocation
from coral.allocator.presolve import MODE_AGG, MODE_DECODE, MODE_PREFILL, Index, run_presolve
from coral.allocator.problem import (
    DEMAND_REL_TOL,
    AllocationPlan,
    AllocationProblem,
    PlanStatus,
    TemplateRegion,
    make_plan,
)
from coral.allocator.robust_rating import RatingStore, SlowedPerfFactory, scenario_capacities
from coral.allocator.scenario import Scenario
from coral.errors import CoralError
from coral.templates.template import Template

_INF = highspy.kHighsInf

#: Largest `R` `--robust` takes: a GPU type 11x slower than modelled is no model error.
MAX_ROBUST_R = 10.0


class RobustError(CoralError, ValueError):
    """A `--robust` request that cannot be planned (the message says why and what to do)."""


def check_robust_r(r: float) -> float:
    """`R` of `--robust R` as a float, or `RobustError`."""
    if not (isinstance(r, (int, float)) and math.isfinite(r) and 0.0 < r <= MAX_ROBUST_R):
        raise RobustError(f"--robust must be a number in (0, {MAX_ROBUST_R:g}] (0.2: any one "
                          f"GPU type 20 % slower than modelled), got {r!r}")
    return float(r)


@dataclass(frozen=True)
class RobustProblem:
    """An allocation problem and its scenarios: scenario name (a GPU type) -> column id ->
    that column's capacity in the scenario (its unit; columns not listed keep their nominal
    capacity)."""

    problem: AllocationProblem
    scenario_capacity: Mapping[str, Mapping[str, float]]

    def __post_init__(self) -> None:
        ids = {t.id for t in self.problem.templates}
        for name, caps in self.scenario_capacity.items():
            for cid, cap in caps.items():
                if cid not in ids:
                    raise ValueError(f"scenario {name!r}: no column {cid!r} in the problem")
                if not (math.isfinite(cap) and cap >= 0):
                    raise ValueError(f"scenario {name!r}: capacity of {cid!r} must be a finite "
                                     f"number >= 0, got {cap!r}")

    @property
    def scenarios(self) -> tuple[str, ...]:
        return tuple(sorted(self.scenario_capacity))

    def capacity_matrix(self) -> np.ndarray:
        """(scenarios, templates): each column's capacity in each scenario, in problem order."""
        nominal = np.array([t.capacity for t in self.problem.templates], dtype=float)
        out = np.tile(nominal, (len(self.scenarios), 1))
        pos = {t.id: i for i, t in enumerate(self.problem.templates)}
        for k, name in enumerate(self.scenarios):
            for cid, cap in self.scenario_capacity[name].items():
                out[k, pos[cid]] = cap
        return out


def capacity_rps_under(problem: AllocationProblem, capacity: Mapping[str, float],
                       instances: Mapping[TemplateRegion, int]) -> dict[str, float]:
    """Requests/s each model serves with `instances` when column `id` has `capacity[id]`
    (its nominal capacity where absent): aggregated capacity plus, per region, the PD halves
    paired (`problem.model_capacity_rps` with other capacities)."""
    by_id = {t.id: t for t in problem.templates}
    agg: dict[str, float] = {}
    pd: dict[tuple[str, str, str], float] = {}
    for (tid, region), n in instances.items():
        t = by_id[tid]
        cap = n * capacity.get(tid, t.capacity)
        if t.mode == "aggregated":
            agg[t.model] = agg.get(t.model, 0.0) + cap
        else:
            pd[(t.model, t.mode, region)] = pd.get((t.model, t.mode, region), 0.0) + cap
    out = {}
    for d in problem.demands:
        total = agg.get(d.model, 0.0)
        for region in problem.regions:
            total += min(pd.get((d.model, "prefill", region), 0.0) / d.input_tokens,
                         pd.get((d.model, "decode", region), 0.0) / d.output_tokens)
        out[d.model] = total
    return out


def scenario_capacity_rps(rp: RobustProblem, instances: Mapping[TemplateRegion, int]
                          ) -> dict[str, dict[str, float]]:
    """Scenario -> model -> requests/s the plan `instances` serves in that scenario."""
    return {name: capacity_rps_under(rp.problem, rp.scenario_capacity[name], instances)
            for name in rp.scenarios}


def robust_shortfall(rp: RobustProblem, instances: Mapping[TemplateRegion, int]
                     ) -> dict[tuple[str, str], float]:
    """(scenario, model) -> requests/s short of demand in that scenario (only those short
    beyond the solver's tolerance)."""
    out = {}
    for name, caps in scenario_capacity_rps(rp, instances).items():
        for d in rp.problem.demands:
            short = d.requests_per_s - caps[d.model]
            if short > DEMAND_REL_TOL * max(1.0, d.requests_per_s):
                out[(name, d.model)] = short
    return out


# ---------------------------------------------------------------------------------------------
# The ILP
# ---------------------------------------------------------------------------------------------


def add_scenario_rows(lp: LpBuilder, ix: Index, v: Vars, scenario_cap: np.ndarray) -> int:
    """Each model's cover in each scenario, where some column of the model has another
    capacity there (`scenario_cap`: (scenarios, templates)); the module docstring gives the
    rows. Adds the scenario's own PD shares `d^g[m,r]`; returns the rows added."""
    n_m, n_r = len(ix.models), len(ix.regions)
    col_model = ix.t_model[v.x_t]
    col_mode = ix.t_mode[v.x_t]
    added = 0
    for cap in scenario_cap:
        col_cap = cap[v.x_t]
        changed = np.abs(col_cap - ix.cap[v.x_t]) > 1e-12 * np.maximum(1.0, ix.cap[v.x_t])
        models = np.unique(col_model[changed])
        if not len(models):
            continue
        in_scenario = np.isin(col_model, models) & (col_cap > 0)
        cover = lp.add_rows(np.zeros(len(models)), np.full(len(models), _INF))
        row_of_model = np.full(n_m, -1, dtype=np.int64)
        row_of_model[models] = cover
        agg = np.flatnonzero(in_scenario & (col_mode == MODE_AGG))
        lp.add_entries(row_of_model[col_model[agg]], v.x[agg], col_cap[agg])
        lp.add_entries(cover, v.s[models], -np.ones(len(models)))
        added += len(models)
        pairs = np.isin(v.d_m, models)
        dm, dr = v.d_m[pairs], v.d_r[pairs]
        if not len(dm):
            continue
        d = lp.add_cols(np.zeros(len(dm)), ix.demand[dm], np.zeros(len(dm)), integer=False)
        lp.add_entries(row_of_model[dm], d, np.ones(len(dm)))
        pair_rows = lp.add_rows(np.zeros(2 * len(dm)), np.full(2 * len(dm), _INF))
        row_of = np.full((n_m, 2, n_r), -1, dtype=np.int64)
        row_of[dm, 0, dr] = pair_rows[:len(dm)]
        row_of[dm, 1, dr] = pair_rows[len(dm):]
        for half, mode in ((0, MODE_PREFILL), (1, MODE_DECODE)):
            sel = np.flatnonzero(in_scenario & (col_mode == mode))
            target = row_of[col_model[sel], half, v.x_r[sel]]
            assert (target >= 0).all(), "presolve left a PD half without its pair"
            lp.add_entries(target, v.x[sel], col_cap[sel])
            lp.add_entries(row_of[dm, half, dr], d, -ix.tokens[dm, mode])
        added += 2 * len(dm)
    return added


def _bounding_problem(rp: RobustProblem) -> AllocationProblem:
    """The problem with each column at its smallest positive capacity over the nominal case
    and the scenarios: presolve's demand bound on it holds for the robust ILP."""
    caps = rp.capacity_matrix()
    templates = []
    for i, t in enumerate(rp.problem.templates):
        column = caps[:, i]
        low = float(column[column > 0].min()) if (column > 0).any() else t.capacity
        templates.append(t if low >= t.capacity else replace(t, capacity=low))
    return replace(rp.problem, templates=tuple(templates))


def robust_start(rp: RobustProblem, starts: Sequence[Mapping[TemplateRegion, int]]
                 ) -> AllocationPlan | None:
    """The cheapest of `starts` (instances per (column id, region); ids the problem lacks are
    dropped) that covers every scenario within availability, as a plan; None when none does."""
    ids = {t.id for t in rp.problem.templates}
    best = None
    for start in starts:
        kept = {(tid, r): int(n) for (tid, r), n in start.items()
                if tid in ids and r in rp.problem.regions and int(n) > 0}
        if not kept:
            continue
        plan = make_plan(rp.problem, kept, status=PlanStatus.TIME_LIMIT, gap=math.inf,
                         solve_s=0.0)
        fits = all(n <= rp.problem.availability.get(key, 0)
                   for key, n in plan.nodes_used.items())
        if fits and plan.meets_demand and not robust_shortfall(rp, plan.instances) \
                and (best is None or plan.objective < best.objective):
            best = plan
    return best


def greedy_cover(rp: RobustProblem, base: Mapping[TemplateRegion, int], *,
                 max_added: int = 2_000) -> dict[TemplateRegion, int] | None:
    """`base` (e.g. the nominal plan) with aggregated instances added one at a time until
    every scenario is covered: each time the (column, region) with room for one more instance
    that covers the most of the shortfalls of its model (each scenario's capped at what is
    short) per $/hour. A start for `solve_robust`, not an optimum; None when it gets stuck
    (no room left, or a short model without aggregated columns)."""
    p = rp.problem
    counts = {k: int(n) for k, n in base.items() if int(n) > 0}
    scenario_caps = [{}] + [rp.scenario_capacity[s] for s in rp.scenarios]
    used: dict[tuple[str, str], int] = {}
    for (tid, region), n in counts.items():
        for g, k in p.template(tid).node_counts.items():
            used[(g, region)] = used.get((g, region), 0) + n * k
    if any(n > p.availability.get(key, 0) for key, n in used.items()):
        return None
    candidates = [(t, r) for t in p.templates if t.mode == "aggregated"
                  for r in p.regions if r in t.price_usd_per_hour]
    for _ in range(max_added):
        short = [[max(0.0, d.requests_per_s - got[d.model]) for d in p.demands]
                 for got in (capacity_rps_under(p, caps, counts) for caps in scenario_caps)]
        need = {d.model: [row[j] for row in short] for j, d in enumerate(p.demands)}
        if not any(v > DEMAND_REL_TOL * max(1.0, d.requests_per_s)
                   for d in p.demands for v in need[d.model]):
            return counts
        best, best_score = None, 0.0
        for t, r in candidates:
            gaps = need.get(t.model)
            if not gaps or not any(gaps):
                continue
            if any(used.get((g, r), 0) + k > p.availability.get((g, r), 0)
                   for g, k in t.node_counts.items()):
                continue
            gain = sum(min(caps.get(t.id, t.capacity), gap)
                       for caps, gap in zip(scenario_caps, gaps))
            score = gain / t.price_usd_per_hour[r]
            if score > best_score:
                best, best_score = (t, r), score
        if best is None:
            return None
        t, r = best
        counts[(t.id, r)] = counts.get((t.id, r), 0) + 1
        for g, k in t.node_counts.items():
            used[(g, r)] = used.get((g, r), 0) + k
    return None


def solve_robust(rp: RobustProblem, *, threads: int | None = None,
                 starts: Sequence[Mapping[TemplateRegion, int]] = ()) -> AllocationPlan:
    """The cheapest plan covering every model's demand nominally and in every scenario, by
    HiGHS on the whole ILP within `problem.time_limit_s` and `problem.mip_gap`.

    `starts`: plans known beforehand (e.g. another serving mode's robust plan); the best that
    covers every scenario (`robust_start`) bounds HiGHS's search from above (it looks only for
    cheaper plans) and is returned when HiGHS finds none.

    Status: `OPTIMAL` (within the gap), `TIME_LIMIT` (the best plan found and its gap, or no
    plan), `INFEASIBLE` (HiGHS proves that no plan covers every scenario; the plan is empty)."""
    t0 = time.perf_counter()
    problem = rp.problem
    start = robust_start(rp, starts)
    ix = Index.build(problem)
    bounding = _bounding_problem(rp)
    cols = run_presolve(bounding, Index.build(bounding), dominance=False)
    notes = [cols.report.describe(), "robust: HiGHS on the whole ILP"]
    if not ix.models:
        return make_plan(problem, {}, status=PlanStatus.OPTIMAL, gap=0.0,
                         solve_s=time.perf_counter() - t0, notes=notes + ["no demand"])
    lp = LpBuilder()
    v = add_variables(lp, problem, ix, cols)
    rows = {
        "capacity": add_capacity_rows(lp, ix, v),
        "pd_pairing": add_pd_pairing_rows(lp, ix, v),
        "availability": add_availability_rows(lp, ix, v),
        "startup": add_startup_rows(lp, ix, v),
        "scenario": add_scenario_rows(lp, ix, v, rp.capacity_matrix()),
    }
    notes.append(f"ilp: {len(v.x)} integer + {lp.n_col - len(v.x)} continuous columns, rows "
                 + ", ".join(f"{k} {n}" for k, n in rows.items() if n)
                 + f"; {len(rp.scenarios)} scenarios")
    arr = lp.arrays()
    left = problem.time_limit_s - (time.perf_counter() - t0)
    cutoff = math.inf if start is None else start.objective * (1.0 + 1e-9)
    run = run_highs(arr.highs_lp(arr.cost, arr.col_lb, arr.row_lb, maximise=False),
                    time_limit_s=max(left, 1e-3), mip_gap=problem.mip_gap, threads=threads,
                    cutoff=cutoff)
    notes.append(f"HiGHS: {run.detail}")
    counts = plan_of_run(run, v)
    if counts is None and start is not None:
        # nothing cheaper found: the start stands, optimal when HiGHS proves nothing cheaper
        bound = start.objective if run.infeasible else run.bound
        gap = (0.0 if run.infeasible else
               max(0.0, 1.0 - bound / start.objective) if math.isfinite(bound)
               and start.objective > 0 else math.inf)
        notes.append(f"the best given plan stands ({start.objective:.6g})")
        return make_plan(problem, start.instances,
                         status=PlanStatus.OPTIMAL if gap <= problem.mip_gap
                         else PlanStatus.TIME_LIMIT, gap=gap,
                         solve_s=time.perf_counter() - t0, notes=notes)
    if run.infeasible or counts is None:
        status = PlanStatus.INFEASIBLE if run.infeasible else PlanStatus.TIME_LIMIT
        return make_plan(problem, {}, status=status, gap=math.inf,
                         solve_s=time.perf_counter() - t0, goodput_gap=math.inf, notes=notes)
    on = np.flatnonzero(counts > 0)
    instances = {(ix.templates[v.x_t[i]].id, ix.regions[v.x_r[i]]): int(counts[i]) for i in on}
    status = PlanStatus.OPTIMAL if run.optimal else PlanStatus.TIME_LIMIT
    return make_plan(problem, instances, status=status, gap=run.gap,
                     solve_s=time.perf_counter() - t0, notes=notes)


# ---------------------------------------------------------------------------------------------
# The exhaustive oracle
# ---------------------------------------------------------------------------------------------


def robust_bruteforce(rp: RobustProblem, *, max_vectors: int = 200_000
                      ) -> AllocationPlan | None:
    """The cheapest plan (price plus start-up penalty) covering every demand nominally and in
    every scenario, by enumerating every instance vector within availability; None when no
    vector does. From the definitions alone (no presolve, no bounds but availability): for
    tiny problems only (`max_vectors`)."""
    t0 = time.perf_counter()
    p = rp.problem
    pairs: list[tuple[Any, str, int]] = []
    for t in p.templates:
        for region in p.regions:
            if region in t.price_usd_per_hour:
                most = min(p.availability.get((g, region), 0) // n
                           for g, n in t.node_counts.items())
                if most > 0:
                    pairs.append((t, region, most))
    total = math.prod(most + 1 for _, _, most in pairs)
    if total > max_vectors:
        raise ValueError(f"{total} instance vectors exceed the oracle's limit of {max_vectors}")
    best: tuple[float, dict[TemplateRegion, int]] | None = None
    scenarios = [{}] + [dict(rp.scenario_capacity[s]) for s in rp.scenarios]
    for counts in itertools.product(*[range(most + 1) for _, _, most in pairs]):
        used: dict[tuple[str, str], int] = {}
        for (t, region, _), n in zip(pairs, counts):
            for g, k in t.node_counts.items():
                used[(g, region)] = used.get((g, region), 0) + n * k
        if any(n > p.availability.get(key, 0) for key, n in used.items()):
            continue
        instances = {(t.id, region): n for (t, region, _), n in zip(pairs, counts) if n}
        covered = all(
            capacity_rps_under(p, caps, instances)[d.model]
            >= d.requests_per_s - 1e-9 * max(1.0, d.requests_per_s)
            for caps in scenarios for d in p.demands)
        if not covered:
            continue
        cost = sum(n * (t.price_usd_per_hour[region]
                        + max(0, n - p.current.get((t.id, region), 0)) / n
                        * p.penalty_usd(t, region))
                   for (t, region, _), n in zip(pairs, counts) if n)
        if best is None or cost < best[0] - 1e-9:
            best = (cost, instances)
    if best is None:
        return None
    return make_plan(p, best[1], status=PlanStatus.OPTIMAL, gap=0.0,
                     solve_s=time.perf_counter() - t0, notes=("robust bruteforce",))


# ---------------------------------------------------------------------------------------------
# Planning a scenario robustly
# ---------------------------------------------------------------------------------------------


class RobustPlanner:
    """`plan_scenario`'s solve under `--robust R`, one serving mode at a time: the columns'
    capacities in every scenario (`robust_rating`, rated once per library and cached), the
    robust plan, and beside it the nominal plan of the same columns (the cost of robustness).
    """

    def __init__(self, r: float, *, perf: Any, catalog: Any, slowed_perf: SlowedPerfFactory,
                 library_dirs: Mapping[str, str] | None = None,
                 threads: int | None = None) -> None:
        self.r = check_robust_r(r)
        self.threads = threads
        self.store = RatingStore(perf, catalog, slowed_perf, library_dirs)
        self.solved: dict[str, tuple[RobustProblem, AllocationPlan, AllocationPlan]] = {}

    @property
    def factor(self) -> float:
        return 1.0 + self.r

    def solve(self, scenario: Scenario, problem: AllocationProblem,
              chosen: Mapping[str, Template], *,
              starts: Sequence[Mapping[TemplateRegion, int]] = ()) -> AllocationPlan:
        """The robust plan of `problem` (the columns of `scenario`'s mode, `chosen` the
        template behind each), and the nominal one kept for `summary`."""
        caps = scenario_capacities(scenario, chosen, self.factor, self.store)
        self.store.save()
        rp = RobustProblem(problem, caps)
        # the robust plans of the modes planned before (mode auto plans mixed last, whose
        # columns hold theirs) start this one
        # ... and so does the nominal plan with instances added until it covers every scenario
        earlier = [dict(p.instances) for _, p, _ in self.solved.values()]
        nominal = solve_allocation(problem, starts=starts, threads=self.threads)
        greedy = greedy_cover(rp, nominal.instances)
        plan = solve_robust(rp, threads=self.threads,
                            starts=earlier + ([greedy] if greedy is not None else []))
        self.solved[scenario.mode] = (rp, plan, nominal)
        return plan

    def nominal_plan(self) -> AllocationPlan | None:
        """The cheapest nominal plan meeting demand over the modes solved (what `coral plan`
        without `--robust` gives), else None."""
        full = [n for _, _, n in self.solved.values() if n.meets_demand]
        return min(full, key=lambda n: n.cost_usd_per_hour) if full else None

    def check(self, mode: str, plan: AllocationPlan) -> None:
        """`RobustError` unless `plan` (mode `mode`) covers every demand in every scenario."""
        rp = self.solved[mode][0]
        short = robust_shortfall(rp, plan.instances) if plan.meets_demand else {}
        if plan.meets_demand and not short:
            return
        why = ("proven: no plan covers them (HiGHS)" if plan.status is PlanStatus.INFEASIBLE
               else "no plan covering them was found within the time limit")
        lines = [f"--robust {self.r:g}: no plan keeps every model's demand covered with any "
                 f"one GPU type {self.factor:g}x slower than modelled ({why})."]
        for (gpu, model), rps in sorted(short.items()):
            lines.append(f"  {model} with {gpu} slow: short by {rps:.4g} req/s")
        lines.append("To fix: lower R, plan at a level of more availability (--level), or "
                     "raise --time-limit.")
        raise RobustError("\n".join(lines))

    def summary(self, mode: str) -> dict[str, Any]:
        """The plan file's `robust` entry for the plan of `mode`: R, the scenarios (GPU types),
        the nominal plan's cost beside the robust one's, and each model's capacity in each
        scenario."""
        rp, plan, _ = self.solved[mode]
        nominal = self.nominal_plan()
        caps = scenario_capacity_rps(rp, plan.instances)
        return {
            "R": self.r,
            "factor": self.factor,
            "gpu_types": list(rp.scenarios),
            "cost_per_hour": plan.cost_usd_per_hour,
            "nominal_cost_per_hour": None if nominal is None else nominal.cost_usd_per_hour,
            "cost_of_robustness": (None if nominal is None or nominal.cost_usd_per_hour <= 0
                                   else plan.cost_usd_per_hour / nominal.cost_usd_per_hour
                                   - 1.0),
            "capacity_rps": {gpu: dict(sorted(c.items())) for gpu, c in caps.items()},
            "ratings_computed": self.store.computed,
        }

    def note(self, mode: str) -> str:
        s = self.summary(mode)
        nominal = s["nominal_cost_per_hour"]
        beside = ("no nominal plan meets demand" if nominal is None else
                  f"the nominal plan ${nominal:,.2f}/hour, robustness "
                  f"{100 * s['cost_of_robustness']:+.1f}%")
        return (f"robust to any one of {len(s['gpu_types'])} GPU types {self.factor:g}x slower "
                f"than modelled: ${s['cost_per_hour']:,.2f}/hour; {beside}")
