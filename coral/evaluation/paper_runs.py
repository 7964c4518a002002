"""One case of `coral evaluate --paper` run as the paper runs it: a scenario at one level,
re-planned every epoch, every method's plan of every epoch simulated.

Per epoch Coral re-plans against its previous deployment with the paper's initialization
penalty: a started instance costs `price * K` in the objective, with `K` = start-up time /
epoch length (the scenario's `startup_s` is rescaled to that, as the allocator charges
`price * startup_s / 3600`). The baselines (`homo`, `homo-joint`, `cauchy`, and `helix`
where asked) plan each epoch on the same templates (they keep no state, so an epoch whose
inputs repeat the last one's keeps their plan); their start-ups are counted against their
own previous epoch. Every method runs under the paper's scarcity rule: short of
demand, every model's rate is scaled down uniformly to the largest factor its planning meets,
and its plan is simulated at that rate (Coral's at the rule too, not its goodput-maximising
plan, so that every method is judged alike).

Cost, as the paper counts it: the time-weighted $/hour of the rented nodes plus the start-up
cost (each started instance's price over its start-up time) amortised over 60 minutes.
Goodput: generated tokens/s of the simulated requests that meet their SLO, over the run.
Demand is the scenario's mean in every epoch (Poisson arrivals, a fresh seed per epoch): the
paper scales each trace uniformly to its rate, and the traces are not shipped with Coral.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from coral.allocator.scenario.load import Scenario
from coral.baselines.scale import scaled_scenario

log = logging.getLogger(__name__)

#: Baselines of the paper's cost and goodput claims, in the order they run.
PAPER_BASELINES: tuple[str, ...] = ("homo", "homo-joint", "cauchy")
#: The paper amortises start-up cost over this many seconds.
AMORTISE_S = 3600.0


@dataclass(frozen=True)
class EpochRun:
    """One method in one epoch: what it rented, started, served and how the simulation went."""

    index: int
    cost_usd_per_hour: float  # the rented nodes
    startup_usd: float  # start-up cost of the instances started at the epoch's start
    started: int
    demand_scale: float  # the uniform factor its plan meets (1: all demand)
    solve_s: float  # Coral: the allocation solve of its plan; a baseline: all baselines' planning
    sim: Mapping[str, Any]  # `coral.sim.summarize` of the epoch
    plan_s: float = math.nan  # Coral: wall time of the epoch's planning (every mode, the rule)


@dataclass
class MethodRun:
    """A method over the run's epochs."""

    name: str
    epochs: list[EpochRun] = field(default_factory=list)
    instances: tuple = ()  # the last epoch's `PlanRow`, for the plan's description

    @property
    def provisioning_usd_per_hour(self) -> float:
        return _mean(e.cost_usd_per_hour for e in self.epochs)

    @property
    def init_usd_per_hour(self) -> float:
        """Start-up cost of the whole run amortised over 60 minutes."""
        return sum(e.startup_usd for e in self.epochs) * 3600.0 / AMORTISE_S

    @property
    def cost_usd_per_hour(self) -> float:
        return self.provisioning_usd_per_hour + self.init_usd_per_hour

    @property
    def init_share(self) -> float:
        c = self.cost_usd_per_hour
        return self.init_usd_per_hour / c if c > 0 else math.nan

    @property
    def replan_init_share(self) -> float:
        """The same share counting only the start-ups of re-plans (epochs after the first)."""
        c = self.cost_usd_per_hour
        return (sum(e.startup_usd for e in self.epochs[1:]) / c) if c > 0 else math.nan

    @property
    def demand_scale(self) -> float:
        return min((e.demand_scale for e in self.epochs), default=math.nan)

    @property
    def goodput_tokens_per_s(self) -> float:
        return _mean(float(e.sim.get("goodput_tokens_per_s") or 0.0) for e in self.epochs)

    @property
    def solve_s(self) -> list[float]:
        return [e.solve_s for e in self.epochs]

    @property
    def plan_s(self) -> list[float]:
        return [e.plan_s for e in self.epochs]

    def attainment(self) -> dict[str, float]:
        """Per model: simulated requests meeting the SLO over all requests of the run."""
        met: dict[str, float] = {}
        total: dict[str, int] = {}
        for e in self.epochs:
            for m, v in (e.sim.get("models") or {}).items():
                met[m] = met.get(m, 0.0) + v["slo_attainment"] * v["requests"]
                total[m] = total.get(m, 0) + int(v["requests"])
        return {m: met[m] / total[m] for m in sorted(total) if total[m]}

    @property
    def min_attainment(self) -> float:
        return min(self.attainment().values(), default=math.nan)

    @property
    def simulated(self) -> bool:
        """Whether its plans ran in the simulator (Helix's placement has no instances to run)."""
        return all(not e.sim.get("not_simulated") for e in self.epochs)

    @property
    def served_under_slo(self) -> float:
        """An unsimulated method: the least share of a model's demand its plan serves under the
        SLO by its own account, over the epochs (nan for a simulated one)."""
        shares = [float(e.sim["served_under_slo"]) for e in self.epochs
                  if e.sim.get("not_simulated")]
        return min(shares, default=math.nan)


@dataclass
class CaseRun:
    """Every method on one (scenario, level), and how long the case took."""

    scenario: str
    level: str
    epochs: int
    epoch_s: float
    methods: dict[str, MethodRun]
    coral_mode: str
    seconds: float
    notes: list[str] = field(default_factory=list)
    #: model -> GPU family (or "mixed") -> least $/hour per req/s of one aggregated instance
    value: dict[str, dict[str, float]] = field(default_factory=dict)

    def ratio(self, baseline: str, what: str = "cost") -> float:
        """Baseline / Coral of cost ($/hour) or goodput (tokens/s); NaN when missing."""
        b, c = self.methods.get(baseline), self.methods.get("coral")
        if b is None or c is None:
            return math.nan
        x, y = ((b.cost_usd_per_hour, c.cost_usd_per_hour) if what == "cost"
                else (b.goodput_tokens_per_s, c.goodput_tokens_per_s))
        return x / y if y > 0 else math.nan


def _mean(xs: Any) -> float:
    vals = list(xs)
    return sum(vals) / len(vals) if vals else math.nan


def with_penalty_k(scenario: Scenario, epoch_s: float) -> Scenario:
    """`scenario` whose allocation charges a started instance `price * K`, K = startup_s /
    epoch_s (the paper's initialization penalty), in place of `price * startup_s / 3600`."""
    k = scenario.spec.startup_s / epoch_s
    return replace(scenario, spec=scenario.spec.model_copy(update={"startup_s": k * 3600.0}))


def _starts(prev: Mapping[tuple[str, str], int], instances: Sequence[Any], startup_s: float
            ) -> tuple[int, float]:
    """Instances started against `prev` ((template id, region) -> count), and their start-up
    cost: each one's $/hour over `startup_s`."""
    n, usd = 0, 0.0
    for inst in instances:
        new = max(0, int(inst.count) - int(prev.get((inst.template_id, inst.region), 0)))
        n += new
        usd += new * float(inst.usd_per_hour) * startup_s / 3600.0
    return n, usd


def _counts(instances: Sequence[Any]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for inst in instances:
        key = (inst.template_id, inst.region)
        out[key] = out.get(key, 0) + int(inst.count)
    return out


def best_value(templates: Mapping[str, Sequence[Any]]) -> dict[str, dict[str, float]]:
    """Per model, the least $/hour per req/s of one aggregated template by the GPU family
    its nodes hold (`1x-l40s` -> `l40s`), "mixed" for templates of several families: where
    one family is the best value for every model, heterogeneity has little to gain."""
    out: dict[str, dict[str, float]] = {}
    for model, tpls in templates.items():
        row: dict[str, float] = {}
        for t in tpls:
            usd = t.min_usd_per_hour() if t.mode == "aggregated" and t.feasible else None
            if not usd or not t.throughput_rps > 0:
                continue
            fams = {g.split("-", 1)[-1] for g in t.combo}
            key = fams.pop() if len(fams) == 1 else "mixed"
            row[key] = min(row.get(key, math.inf), usd / t.throughput_rps)
        out[model] = row
    return out


def run_case(ctx: Any, name: str, level: str, *, epochs: int, epoch_s: float,
             baselines: Sequence[str] = PAPER_BASELINES, seed: int = 0,
             say: Callable[[str], None] = lambda _m: None) -> CaseRun:
    """Run `name` at `level` for `epochs` epochs of `epoch_s` seconds; see the module."""
    from coral.baselines import run_baselines
    from coral.baselines.common import TemplateBuilder
    from coral.evaluation.common import simulate_plan
    from coral.planning.baseline_runs import baseline_start
    from coral.templates.space.operating_points import shared_tables

    t_case = time.perf_counter()
    base = ctx.scenario(name, level).in_mode("auto").with_perf(ctx.perf, ctx.catalog)
    startup_s = float(base.spec.startup_s)
    planned = with_penalty_k(base, epoch_s)
    tpl = ctx.templates(base)
    flow = {m: [t for t in ts if t.topology == "flow"] for m, ts in tpl.items()}
    builder = TemplateBuilder(ctx.catalog, ctx.perf, shared_tables(ctx.perf, ctx.catalog))
    runs = {n: MethodRun(n) for n in ("coral", *baselines)}
    prev: dict[str, dict[tuple[str, str], int]] = {n: {} for n in runs}
    current: dict[tuple[str, str], int] = {}
    mode = "-"
    last_factor = 1.0
    # every epoch runs the scenario's mean demand (see the module)
    same_inputs = True
    notes: list[str] = []
    for e in range(epochs):
        t0 = time.perf_counter()
        # the baselines keep no state between epochs: the same inputs plan the same plan, so
        # an epoch whose demand, availability and prices are the last one's reuses it
        if e == 0 or not same_inputs:
            found = run_baselines(planned, flow, catalog=ctx.catalog, perf=ctx.perf,
                                  time_limit_s=ctx.cfg.time_limit_s, baselines=list(baselines),
                                  n_max=tpl.nmax, builder=builder) if baselines else {}
        t_base = time.perf_counter() - t0
        starts = [s for s in (baseline_start(b) for b in found.values()) if s]
        t0 = time.perf_counter()
        res, factor = coral_at_rule(ctx, planned, tpl, current, starts, last_factor)
        last_factor = factor
        solve = time.perf_counter() - t0
        mode = res.mode
        n_new, usd = _starts(prev["coral"], res.instances, startup_s)
        sim = simulate_plan(ctx, base, res, epoch_s, seed=seed + 7919 * e)
        runs["coral"].epochs.append(EpochRun(e, res.cost_per_hour, usd, n_new, factor,
                                             res.solve_seconds, sim, solve))
        runs["coral"].instances = res.instances
        current = dict(res.plan.instances)
        prev["coral"] = _counts(res.instances)
        for bname, b in found.items():
            n_new, usd = _starts(prev[bname], b.instances, startup_s)
            sim = (simulate_plan(ctx, base, b, epoch_s, seed=seed + 7919 * e)
                   if b.instances and b.plan is not None else _not_simulated(b))
            runs[bname].epochs.append(EpochRun(e, b.cost_per_hour, usd, n_new, b.demand_scale,
                                               t_base, sim))
            runs[bname].instances = b.instances
            prev[bname] = _counts(b.instances)
        say(f"[paper] {name} {level} epoch {e + 1}/{epochs}: Coral ${res.cost_per_hour:,.2f}"
            f"/hour x{factor:.3f} ({mode}), baselines {t_base:.1f} s, Coral {solve:.1f} s")
    for bname, b in found.items():
        if bname == "helix":
            notes += [f"helix: {n}" for n in b.notes]
    return CaseRun(name, level, epochs, epoch_s, runs, mode, time.perf_counter() - t_case,
                   notes, best_value(tpl))


def _not_simulated(result: Any) -> dict[str, Any]:
    """What stands for the simulation of a plan that cannot run (no instances): no goodput,
    and the least share of a model's demand it serves under the SLO by its own account."""
    served = min(result.served_fraction.values(), default=0.0)
    return {"goodput_tokens_per_s": 0.0, "not_simulated": True, "served_under_slo": served}


def coral_at_rule(ctx: Any, planned: Scenario, templates: Any,
                  current: Mapping[tuple[str, str], int], starts: Sequence[Any],
                  last_factor: float) -> tuple[Any, float]:
    """Coral's plan under the paper's scarcity rule and the factor it meets: the full demand
    when it can, else the largest uniform factor its allocation meets (bisected to
    `SCALE_TOL`), re-planned at that factor so that the plan can be simulated.

    `last_factor` is the previous epoch's: when it is still met and `SCALE_TOL` more is
    not, the bracket the bisection would end on is already proven, in two plans."""
    from coral.allocator.scarcity.uniform_scale import SCALE_TOL

    if 0 < last_factor < 1:
        at = ctx_plan(ctx, scaled_scenario(planned, last_factor), templates, current, starts)
        if at.plan.meets_demand:
            up = min(1.0, last_factor + SCALE_TOL)
            above = ctx_plan(ctx, scaled_scenario(planned, up), templates, current, starts)
            if not above.plan.meets_demand:
                return at, last_factor
            if up >= 1.0:
                return above, 1.0
    res = ctx_plan(ctx, planned, templates, current, starts)
    if res.plan.meets_demand:
        return res, 1.0
    factor = float(res.extras.get("uniform_scale", {}).get("factor", 0.0))
    if factor > 0:
        res = ctx_plan(ctx, scaled_scenario(planned, factor), templates, current, starts)
    return res, factor


def ctx_plan(ctx: Any, scenario: Scenario, templates: Any,
             current: Mapping[tuple[str, str], int], starts: Sequence[Any]) -> Any:
    """Coral's plan of `scenario` against the `current` deployment, its search started from
    the baselines' plans (so it is never worse than one of them)."""
    from coral.planning.plan import plan_scenario

    return plan_scenario(scenario, catalog=ctx.catalog, options=ctx.options(), perf=ctx.perf,
                         templates=templates, baselines=False, current=current, starts=starts)
