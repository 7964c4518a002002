"""Plans robust to performance-model error: `coral plan --robust R` (issue 22).

Most catalog GPU types have no profile of their own, and the perf model's error on them is of
the order of tens of per cent. A robust plan keeps every model's demand covered if any **one**
GPU type is slower than modelled by the factor `F = 1 + R`: one scenario "g slow" per GPU type
`g` of the columns, in which each column's capacity is what it delivers within the SLO with
`g` slowed (`rating.py` says how it is re-rated, on the same placement).

The ILP is the allocation ILP (`core/formulation.py`: its variables, the nominal capacity rows, PD
pairing, availability and start-up rows) plus, for every scenario `g` and every model `m` whose
columns' capacity changes under it, the cover of `m` in that scenario::

    sum_{t in T_m^agg, r} cap^g_t x[t,r] + sum_r d^g[m,r] - s[m] >= 0
    sum_{t in T_m^prefill} cap^g_t x[t,r] - input_tokens_m  d^g[m,r] >= 0   (each PD pair m, r)
    sum_{t in T_m^decode}  cap^g_t x[t,r] - output_tokens_m d^g[m,r] >= 0

`d^g[m,r] >= 0` is the requests/s a region's prefill/decode pairs carry in scenario `g`, one
set per scenario: the slow GPU may sit in one half only, so a region's share moves with it.
So PD and mixed plans are covered as directly as aggregated ones (`add_scenario_rows` takes
any per-scenario capacity vector, not only slowdowns).

How it is solved (`solve_robust`): first the conservative plan (`starts.py`: every
column at its least capacity over the scenarios, a one-row-per-model cover that the nominal
solver's decomposition solves well in a share of the time), which covers every scenario;
then HiGHS on the whole ILP below the best plan known, for the rest of the time, which
returns a cheaper plan if it finds one and its proven bound either way. The gap reported is
HiGHS's bound against the plan returned. The decomposition paths of `solve/ilp.py` price one cover
row per model; a cover per (model, scenario) would need a multi-row ILP per model and
pricing round, which costs more than the time limit on `core`. Presolve keeps every template
(no dominance: a collection that beats a template nominally can lose to it when its own GPU
type is the slow one), and bounds each column by the instances its smallest positive
capacity over the scenarios needs alone (more of them would only cost more in every
scenario). Demand that cannot be covered robustly is reported as such (status infeasible,
proven by HiGHS); there is no goodput phase.

`robust_bruteforce` (`starts.py`) enumerates every instance vector of a tiny problem:
the tests' oracle.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any, Mapping, Sequence

import highspy
import numpy as np

from coral.allocator.core.formulation import (
    LpBuilder,
    Vars,
    add_plan_rows,
    add_variables,
)
from coral.allocator.core.highs_runs import plan_of_run, run_highs
from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.core.presolve import MODE_AGG, MODE_DECODE, MODE_PREFILL, Index, run_presolve
from coral.allocator.problem import (
    AllocationPlan,
    AllocationProblem,
    PlanStatus,
    TemplateColumn,
    TemplateRegion,
    make_plan,
)
from coral.allocator.robust.problem import (  # noqa: F401  (the robust API, one import away)
    MAX_ROBUST_R,
    RobustError,
    RobustProblem,
    capacity_rps_under,
    check_robust_r,
    robust_shortfall,
    scenario_capacity_rps,
)
from coral.allocator.robust.rating import (
    RatingStore,
    RobustColumn,
    robust_columns,
    scenario_capacities,
)
from coral.allocator.robust.starts import (  # noqa: F401
    conservative_problem,
    greedy_cover,
    robust_bruteforce,
    robust_start,
)
from coral.allocator.scenario.load import Scenario
from coral.perf.slowdown import PhaseSlowdown, Slowdown, simplest, slowdown_json
from coral.templates.template import Template

#: Share of the time limit the conservative plan's solve may take; HiGHS on the whole ILP
#: gets the rest (and the bound).
CONSERVATIVE_SHARE = 0.3

_INF = highspy.kHighsInf

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


def conservative_start(rp: RobustProblem, time_limit_s: float, *,
                       threads: int | None = None) -> tuple[AllocationPlan | None, str]:
    """The conservative plan (`robust_starts.conservative_problem`) by the nominal solver
    within `time_limit_s`, and a note; None when it finds no plan meeting demand."""
    t0 = time.perf_counter()
    cons = conservative_problem(rp)
    if not cons.templates:
        return None, "conservative plan: no column serves in every scenario"
    plan = solve_allocation(replace(cons, time_limit_s=max(time_limit_s, 1e-3)),
                            threads=threads)
    took = time.perf_counter() - t0
    if not plan.meets_demand:
        return None, f"conservative plan: none meeting demand ({took:.2f} s)"
    return plan, (f"conservative plan ${plan.cost_usd_per_hour:,.2f}/hour ({plan.proof}, "
                  f"{took:.2f} s)")


def solve_robust(rp: RobustProblem, *, threads: int | None = None,
                 starts: Sequence[Mapping[TemplateRegion, int]] = ()) -> AllocationPlan:
    """The cheapest plan covering every model's demand nominally and in every scenario, within
    `problem.time_limit_s` and `problem.mip_gap`: the conservative plan, then HiGHS on the
    whole ILP below the best plan known (the module docstring says why).

    `starts`: plans known beforehand (e.g. another serving mode's robust plan); the best that
    covers every scenario (`robust_start`), or the conservative plan where that is cheaper,
    bounds HiGHS's search from above (it looks only for cheaper plans) and is returned when
    HiGHS finds none.

    Status: `OPTIMAL` (within the gap), `TIME_LIMIT` (the best plan found and its gap, or no
    plan), `INFEASIBLE` (HiGHS proves that no plan covers every scenario; the plan is empty)."""
    t0 = time.perf_counter()
    problem = rp.problem
    ix = Index.build(problem)
    bounding = _bounding_problem(rp)
    cols = run_presolve(bounding, Index.build(bounding), dominance=False)
    notes = [cols.report.describe()]
    if not ix.models:
        return make_plan(problem, {}, status=PlanStatus.OPTIMAL, gap=0.0,
                         solve_s=time.perf_counter() - t0, notes=notes + ["no demand"])
    conservative, why = conservative_start(rp, CONSERVATIVE_SHARE * problem.time_limit_s,
                                           threads=threads)
    notes.append(why)
    start = robust_start(rp, list(starts) + ([dict(conservative.instances)]
                                             if conservative is not None else []))
    lp = LpBuilder()
    v = add_variables(lp, problem, ix, cols)
    rows = {
        **add_plan_rows(lp, ix, v),
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
    notes.append(f"HiGHS on the whole ILP: {run.detail}"
                 + (f", bound {run.bound:.6g}" if math.isfinite(run.bound) else ""))
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
# Planning a scenario robustly
# ---------------------------------------------------------------------------------------------


class RobustPlanner:
    """`plan_scenario`'s solve under `--robust R`, one serving mode at a time: the columns'
    capacities in every scenario (`robust_rating`, rated once per library and cached), the
    robust plan, and beside it the nominal plan of the same columns (the cost of robustness).
    """

    def __init__(self, r: float | Mapping[str, Slowdown], *, perf: Any, catalog: Any,
                 template_dirs: Mapping[str, str] | None = None,
                 threads: int | None = None, basis: Mapping[str, str] | None = None) -> None:
        """`r`: one R for every GPU type, or each type's own slowdown factor, one number or
        one per phase (`--robust auto`: how sure the perf model is of each,
        `coral.perf.uncertainty`; `basis` says why, per type)."""
        self._factors: dict[str, Slowdown] | None = None
        if isinstance(r, Mapping):
            def ok(v: Any) -> bool:
                if not isinstance(v, (int, float, PhaseSlowdown)):
                    return False
                s = PhaseSlowdown.of(v)
                return all(math.isfinite(f) and 1.0 <= f <= 1.0 + MAX_ROBUST_R
                           for f in (s.prefill, s.decode))
            bad = {g: v for g, v in r.items() if not ok(v)}
            if bad:
                raise RobustError(f"per-GPU slowdowns must be numbers in [1, "
                                  f"{1.0 + MAX_ROBUST_R:g}], got {bad}")
            self._factors = {g: simplest(v) for g, v in sorted(r.items())}
            self.r: float | None = None
        else:
            self.r = check_robust_r(r)
        self.basis = dict(basis or {})
        self.threads = threads
        self.store = RatingStore(perf, catalog, template_dirs)
        self.solved: dict[str, tuple[RobustProblem, AllocationPlan, AllocationPlan]] = {}
        self.deployed: dict[str, dict[str, RobustColumn]] = {}  # mode -> column id -> ...

    @property
    def factor(self) -> float | None:
        """The one slowdown of every GPU type (None: each has its own, `factors`)."""
        return None if self.r is None else 1.0 + self.r

    @property
    def factors(self) -> float | dict[str, Slowdown]:
        return self.factor if self._factors is None else dict(self._factors)

    def slow_text(self, gpus: Sequence[str]) -> str:
        """How slow the plan lets any one of `gpus` be, in words."""
        if self.factor is not None:
            return f"{self.factor:g}x slower than modelled"
        f = self.factors
        assert isinstance(f, dict)
        return ("slower than modelled by its own uncertainty (" + ", ".join(
            f"{g} {PhaseSlowdown.of(f.get(g, 1.0)).text()}" for g in gpus) + ")")

    def solve(self, scenario: Scenario, problem: AllocationProblem,
              chosen: Mapping[str, Template], *,
              starts: Sequence[Mapping[TemplateRegion, int]] = ()) -> AllocationPlan:
        """The robust plan of `problem` (the columns of `scenario`'s mode, `chosen` the
        template behind each), and the nominal one kept for `summary`. Columns whose
        template runs past TPOT with one of its GPU types slow are planned as deployed, at a
        smaller batch (`robust_rating.robust_column`), nominally too."""
        columns = robust_columns(scenario, chosen, self.factors, self.store)
        self.store.save()
        as_deployed = replace(problem, templates=tuple(
            replace(c, capacity=columns[c.id].nominal) if columns[c.id].micro_batch else c
            for c in problem.templates))
        rp = RobustProblem(as_deployed, scenario_capacities(columns))
        # the robust plans of the modes planned before (mode auto plans mixed last, whose
        # columns hold theirs) start this one
        # ... and so does the nominal plan with instances added until it covers every scenario
        earlier = [dict(p.instances) for _, p, _ in self.solved.values()]
        nominal = solve_allocation(problem, starts=starts, threads=self.threads)
        greedy = greedy_cover(rp, nominal.instances)
        plan = solve_robust(rp, threads=self.threads,
                            starts=earlier + ([greedy] if greedy is not None else []))
        self.solved[scenario.mode] = (rp, plan, nominal)
        self.deployed[scenario.mode] = columns
        return plan

    def columns(self, mode: str) -> tuple[list[TemplateColumn], dict[str, Template]]:
        """The columns of the plan of `mode` as planned and the template each deploys (the
        plan file's instances)."""
        rp = self.solved[mode][0]
        return (list(rp.problem.templates),
                {cid: col.deployed for cid, col in self.deployed[mode].items()})

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
        what = "auto" if self.r is None else f"{self.r:g}"
        lines = [f"--robust {what}: no plan keeps every model's demand covered with any "
                 f"one GPU type {self.slow_text(rp.scenarios)} ({why})."]
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
            "R": "auto" if self.r is None else self.r,
            "factor": self.factor,
            # each scenario's slowdown (a number, or one per phase), and why that much
            # (`--robust auto`): the cards the plan's SLO margin rests on
            "factors": {g: slowdown_json(self.factor if self._factors is None
                                       else self._factors.get(g, 1.0))
                        for g in rp.scenarios},
            "basis": {g: self.basis[g] for g in rp.scenarios if g in self.basis},
            "gpu_types": list(rp.scenarios),
            "cost_per_hour": plan.cost_usd_per_hour,
            "nominal_cost_per_hour": None if nominal is None else nominal.cost_usd_per_hour,
            "cost_of_robustness": (None if nominal is None or nominal.cost_usd_per_hour <= 0
                                   else plan.cost_usd_per_hour / nominal.cost_usd_per_hour
                                   - 1.0),
            "capacity_rps": {gpu: dict(sorted(c.items())) for gpu, c in caps.items()},
            # columns of the plan deployed at a smaller batch than their template's, so that
            # a slow GPU type of theirs cannot run them past TPOT: id -> sequences per stage
            "batch_cut": self.batch_cuts(mode, plan),
            "ratings_computed": self.store.computed,
        }

    def batch_cuts(self, mode: str, plan: AllocationPlan) -> dict[str, int]:
        """Column id -> sequences per stage, for the plan's columns deployed at a smaller
        batch than their template's."""
        used = {tid for tid, _ in plan.instances}
        return {cid: col.micro_batch for cid, col in sorted(self.deployed[mode].items())
                if col.micro_batch and cid in used}

    def note(self, mode: str) -> str:
        s = self.summary(mode)
        nominal = s["nominal_cost_per_hour"]
        beside = ("no nominal plan meets demand" if nominal is None else
                  f"the nominal plan ${nominal:,.2f}/hour, robustness "
                  f"{100 * s['cost_of_robustness']:+.1f}%")
        cut = (f"; {len(s['batch_cut'])} of its templates deployed at a smaller batch so that "
               "their slow GPU type cannot run them past TPOT" if s["batch_cut"] else "")
        return (f"robust to any one of {len(s['gpu_types'])} GPU types "
                f"{self.slow_text(s['gpu_types'])}: ${s['cost_per_hour']:,.2f}/hour; "
                f"{beside}{cut}")
