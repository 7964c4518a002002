"""Benchmark: how fast the online allocation ILP re-plans, and how close to optimal it gets.

For each scenario size (`core`: 3 regions, 20 node types; `advanced`: 12 regions, all node
types; `paper-extended`: the paper's extended setup, 6 models on 20 configurations in 3
regions, PD) and availability level (default: every level of the scenario that changes
availability), it builds one template set over the scenario's models (synthetic unless
`--library real`), then re-plans `--draws` times: each draw perturbs every model's demand
(log-normal, sigma 0.25) and every (node type, region) availability (uniform x0.7-1.3,
rounded to the nearest node: rounding down took a one-node pool away on half the draws, and
`paper-extended`'s scarce level is mostly such pools), and takes the previous draw's plan as
the current deployment, as the online loop does. It prints per
(size, serving mode, level): templates, template-region columns kept by presolve, solve time
median / p95 / max (and the median CPU time of a solve, every thread's: on a shared machine
the wall time also holds the wait for a core), the largest proven gap, and how many plans met
every demand; then, per phase of the solve, the median / p95 seconds and the median / largest
proven gap (`met`: the cost problem of the draws whose demand is met; under scarcity the
phases of `problem.scarcity`, fair by default: `fairness`, `tokens`, `cost`). Each size plans
in its scenario's own serving mode unless `--modes` names others. `--modes pd`
plans prefill/decode deployments instead (each combination a prefill and a decode template,
halves paired per region), as `coral plan --mode pd` (and `auto`) does; `--modes mixed` gives
every combination all three templates, so each model may mix aggregated instances and PD pairs.

`--library real` plans on the real template libraries instead (built, or reused from
`out/templates`, as `coral plan --nmax N` builds them; `--nmax` defaults to 3 on `core` and
2 on `advanced`, the sizes `coral demo` and the README's figures use, and to 6 on
`paper-extended`, its own n_max, at which `coral evaluate --paper` builds it): what `coral
plan` solves. At the limited level real libraries are much harder than the synthetic ones:
many templates of a model cost almost the same per request/s, and on the two `core` problems
measured the Lagrangian root bound sat 0.6-0.7% below the best plan.

`--reference S` also solves each draw for up to S seconds at a 0.1% gap (`REFERENCE_GAP`)
and prints the median and largest of each timed plan's gap proven with that solve's bound as
well as its own: how far from the optimum the timed plans are where the timed solve could
not prove it. With `--time-limit 0.1` it says what a 0.1 s budget buys. It proves, never
estimates: a reference that also stops short leaves its own gap in the figure.

Synthetic templates stand in for real libraries at the solver level: random node multisets
of up to `n_max` nodes (mostly one or two node types) whose memory holds the weights and is at
most `rho` times them. Capacity comes from a roofline rule of thumb (`_roofline_rps`: the
largest decode batch that fits in memory and meets TPOT, time-shared with compute-bound
prefill), summed over the nodes, times 0.92 per extra pipeline stage and +-10% noise, then
raised to the best split into data-parallel parts (a flow placement can always do that). It
lands near the perf model's templates: 21 req/s of llama-3.1-8b on one H100 (perf model 21),
1.3 on one L4 (0.8), 22 of llama-3.3-70b on 8x H100 (15).

Each row is checked against the targets (issue 37): every plan's proven gap (cost, and each
scarcity phase's) at the time limit at most `TARGET_GAP`, and, with `--reference`, the time
to a plan within `NEAR` (1 %) of the reference (`time_to_near`: the shortest of the time
limits `LADDER_S`, then the default solve, whose plan is that close) at most
`TARGET_NEAR_P95_S` at the 95th percentile. Under the fair objective "within 1 %" is
lexicographic (`near`): the smallest served fraction at least 99 % of the reference's, and,
unless it is more than 1 % above it, the priority-weighted tokens/s likewise, then the cost
at most 1 % above. A solve stops at `--mip-gap` (the allocator's default,
`DEFAULT_MIP_GAP`, unless given).

    python benchmarks/allocator.py                       # both sizes, three levels, 20 draws
    python benchmarks/allocator.py --sizes core --draws 5
    python benchmarks/allocator.py --modes pd            # prefill/decode templates (PD plans)
    python benchmarks/allocator.py --json results.json
    python benchmarks/allocator.py --library real --sizes core --draws 10
    python benchmarks/allocator.py --library real --reference 120   # issue 37's targets
    python benchmarks/allocator.py --sizes paper-extended --library real --draws 5
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace

from coral.allocator.problem import AllocationPlan, AllocationProblem, TemplateColumn
from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.decomposition.branch_price import relative_gap
from coral.allocator.kernels.jit import warm_up
from coral.allocator.problem import DEFAULT_MIP_GAP, DEFAULT_TIME_LIMIT_S
from coral.allocator.scenario.load import Scenario, load_scenario
from coral.catalog import Catalog, default_catalog

#: Targets (issue 37): with `--reference`, the p95 time to a plan within `NEAR` of the
#: reference (s); at the default time limit, the largest proven gap of every phase.
TARGET_NEAR_P95_S = 10.0
TARGET_GAP = 0.02
#: A plan counts as near the reference within this share (cost; under scarcity each fair
#: phase's value in turn, or the goodput: `near`).
NEAR = 0.01
#: Time limits (s) tried, shortest first, for the time to a near plan (`time_to_near`).
LADDER_S = (0.25, 0.5, 1.0, 2.0, 5.0)
SIZES = ("core", "advanced", "paper-extended")
DEFAULT_TEMPLATES = {"core": 400, "advanced": 2000, "paper-extended": 1000}
#: n_max of the real libraries per size (`--library real`): as `coral demo` and the README
#: on core and advanced, the scenario's own (as `coral evaluate --paper`) on paper-extended.
DEFAULT_REAL_NMAX = {"core": 3, "advanced": 2, "paper-extended": 6}
#: Gap at which a reference solve (`--reference S`) stops: well inside the target, so that its
#: bound says how far from the optimum the timed plan really is.
REFERENCE_GAP = 1e-3


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    idx = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
    return values[idx]


# ---------------------------------------------------------------------------------------------
# Synthetic templates
# ---------------------------------------------------------------------------------------------


#: Shares of peak compute and memory bandwidth a serving engine reaches (rule of thumb).
COMPUTE_EFFICIENCY = 0.5
BANDWIDTH_EFFICIENCY = 0.7
#: Throughput lost per extra pipeline stage (activation transfers, bubbles).
STAGE_EFFICIENCY = 0.92


def _roofline_rps(flops: float, bandwidth: float, memory: float, weights: float,
                  active_params: float, kv_bytes_per_token: float, input_tokens: int,
                  output_tokens: int, tpot_s: float) -> float:
    """Requests/s of one replica: the largest decode batch that fits in memory and keeps an
    iteration under the TPOT target, time-shared with compute-bound prefill."""
    context = input_tokens + output_tokens
    free = memory - weights
    if free <= 0:
        return 0.0
    batch = min(free / (kv_bytes_per_token * context), 1024.0)
    per_seq_flops = 2.0 * active_params / (flops * COMPUTE_EFFICIENCY)
    base_s = weights / (bandwidth * BANDWIDTH_EFFICIENCY)
    per_seq_bytes_s = kv_bytes_per_token * context / 2 / (bandwidth * BANDWIDTH_EFFICIENCY)
    if base_s >= tpot_s:
        return 0.0
    batch = min(batch, tpot_s / per_seq_flops, (tpot_s - base_s) / per_seq_bytes_s)
    if batch < 1:
        return 0.0
    step_s = max(batch * per_seq_flops, base_s + batch * per_seq_bytes_s)
    decode_s = step_s * output_tokens / batch  # per request
    prefill_s = 2.0 * active_params * input_tokens / (flops * COMPUTE_EFFICIENCY)
    return 1.0 / (decode_s + prefill_s)


def _superadditive(caps: dict[tuple[str, ...], float]) -> dict[tuple[str, ...], float]:
    """Raise each combination's capacity to the best split of its nodes into combinations
    (data parallelism over the parts), which a real flow placement can always do."""
    out: dict[tuple[str, ...], float] = {}
    for combo in sorted(caps, key=len):
        best = caps[combo]
        n = len(combo)
        for mask in range(1, 2 ** n - 1):
            part = tuple(sorted(combo[i] for i in range(n) if mask >> i & 1))
            rest = tuple(sorted(combo[i] for i in range(n) if not mask >> i & 1))
            if part in out:
                best = max(best, out[part] + _best_fit(rest, out))
        out[combo] = best
    return out


def _best_fit(nodes: tuple[str, ...], caps: dict[tuple[str, ...], float]) -> float:
    """Most capacity of one known combination inside `nodes` (0 when none fits)."""
    best = 0.0
    n = len(nodes)
    for mask in range(1, 2 ** n):
        part = tuple(sorted(nodes[i] for i in range(n) if mask >> i & 1))
        best = max(best, caps.get(part, 0.0))
    return best


def synthetic_templates(scenario: Scenario, catalog: Catalog, per_model: int, seed: int
                        ) -> list[TemplateColumn]:
    """Up to `per_model` random feasible node multisets per model, with made-up capacities."""
    rng = random.Random(seed)
    nodes = [g for g in scenario.node_types
             if any((g, r) in scenario.node_prices for r in scenario.regions)]
    mem = {g: catalog.node_memory_bytes(g) for g in nodes}
    bw = {g: catalog.gpu_of(g).mem_bandwidth_gb_per_s * 1e9 * catalog.node_type(g).gpu_count
          for g in nodes}
    flops = {g: catalog.gpu_of(g).bf16_tflops * 1e12 * catalog.node_type(g).gpu_count
             for g in nodes}
    out: list[TemplateColumn] = []
    for m in scenario.models:
        arch = catalog.model(m.name)
        weights = arch.weight_bytes
        kv = arch.kv_bytes_per_token_per_layer * arch.num_layers
        caps: dict[tuple[str, ...], float] = {}
        tries = 0
        while len(caps) < per_model and tries < 200 * per_model:
            tries += 1
            k = rng.randint(1, scenario.spec.n_max)
            # mostly one or two node types per combination, as in real libraries
            kinds = rng.sample(nodes, min(len(nodes), rng.choice((1, 1, 2, 2, 3))))
            combo = tuple(sorted(rng.choice(kinds) for _ in range(k)))
            if combo in caps:
                continue
            total_mem = sum(mem[g] for g in combo)
            if total_mem > scenario.spec.rho * weights:
                continue
            rps = _roofline_rps(sum(flops[g] for g in combo), sum(bw[g] for g in combo),
                                total_mem, weights, arch.active_params, kv, m.input_tokens,
                                m.output_tokens, m.tpot_s)
            if rps > 0:
                caps[combo] = rps * STAGE_EFFICIENCY ** (len(combo) - 1) * rng.uniform(0.9, 1.1)
        for combo, rps in _superadditive(caps).items():
            counts = Counter(combo)
            tid = f"{m.name}/{'+'.join(combo)}"
            if scenario.mode in ("aggregated", "mixed"):
                out.append(scenario.column(tid, m.name, "aggregated", counts, round(rps, 4)))
            if scenario.mode in ("pd", "mixed"):
                # prefill is compute-bound: prompt tokens/s well above decode's share
                prefill = rps * m.input_tokens * rng.uniform(2.0, 3.0)
                decode = rps * m.output_tokens * rng.uniform(1.2, 1.6)
                out.append(scenario.column(f"{tid}#p", m.name, "prefill", counts,
                                           round(prefill, 2)))
                out.append(scenario.column(f"{tid}#d", m.name, "decode", counts,
                                           round(decode, 2)))
    return [t for t in out if t.price_usd_per_hour]


#: Real libraries loaded this run, by (scenario, mode, n_max): the levels of a scenario share
#: them, and reading an n_max-6 library set takes a minute even when nothing is rebuilt.
_LIBRARIES: dict[tuple[str, str, int], object] = {}


def real_templates(scenario: Scenario, catalog: Catalog, nmax: int) -> list[TemplateColumn]:
    """The scenario's columns from its real template libraries, as `coral plan` builds them
    (reused from `out/templates` when their inputs match)."""
    from coral.planning.columns import columns_from_templates
    from coral.planning.libraries import templates_for_scenario
    from coral.templates.builder.build_options import BuildOptions
    from coral.templates.builder.parallel import default_perf_factory

    perf = default_perf_factory(catalog)
    scenario = scenario.with_perf(perf, catalog)
    key = (scenario.name, scenario.mode, nmax)
    if key not in _LIBRARIES:
        _LIBRARIES[key] = templates_for_scenario(
            scenario, catalog, perf, out_root="out/templates",
            options=BuildOptions(workers=os.cpu_count() or 1), nmax=nmax)
    return columns_from_templates(scenario, _LIBRARIES[key])


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


def _cost_bound(plan: AllocationPlan) -> float:
    """The proven lower bound of the cost objective behind `plan.gap`."""
    if not math.isfinite(plan.gap):
        return -math.inf
    return plan.objective - plan.gap * abs(plan.objective)


def _goodput_bound(plan: AllocationPlan) -> float:
    """The proven upper bound of the goodput behind `plan.goodput_gap` (scarcity)."""
    if not math.isfinite(plan.goodput_gap):
        return math.inf
    return plan.goodput + plan.goodput_gap * abs(plan.goodput)


def gap_by_reference(plan: AllocationPlan, reference: AllocationPlan) -> float:
    """The timed plan's gap proven with the reference solve's bounds as well as its own.

    Demand met: the cost against the better of the two cost bounds. Demand short: the goodput
    against the better of the two goodput bounds, and the cost against the reference's cost
    bound only where the plan serves at least the reference's goodput (the reference's bound is
    for plans of at least its goodput, so it holds for plans of more)."""
    if plan.meets_demand:
        bound = _cost_bound(plan)
        if reference.meets_demand:
            bound = max(bound, _cost_bound(reference))
        return relative_gap(plan.objective, bound)
    if plan.scarcity == "fair":
        return _fair_gap_by_reference(plan, reference)
    # a reference that meets demand proves the plan's goodput short by the whole shortfall
    upper = min(_goodput_bound(plan),
                reference.goodput if reference.meets_demand else _goodput_bound(reference))
    goodput_gap = relative_gap(-plan.goodput, -upper)  # maximising: as the allocator's
    bound = _cost_bound(plan)
    if not reference.meets_demand and plan.goodput >= reference.goodput * (1 - 1e-9):
        bound = max(bound, _cost_bound(reference))
    return max(goodput_gap, relative_gap(plan.objective, bound))


def _fair_gap_by_reference(plan: AllocationPlan, reference: AllocationPlan) -> float:
    """The fair plan's largest phase gap with the fairness phase's bound the better of the
    two solves' (a bound on every plan's smallest served fraction; a reference meeting demand
    proves 1). The tokens and cost phases keep their own gaps: the reference's bounds hold at
    its own floors, not at the plan's."""
    own = plan.phase_gaps.get("fairness", math.inf)
    upper = plan.fair_level * (1.0 + own) if math.isfinite(own) else math.inf
    if reference.meets_demand:
        upper = min(upper, 1.0)
    else:
        theirs = reference.phase_gaps.get("fairness", math.inf)
        if math.isfinite(theirs):
            upper = min(upper, reference.fair_level * (1.0 + theirs))
    fairness = relative_gap(-plan.fair_level, -upper)
    rest = [g for name, g in plan.phase_gaps.items() if name != "fairness"]
    return max([fairness, *rest])


def near(plan: AllocationPlan, reference: AllocationPlan, share: float = NEAR) -> bool:
    """`plan` is within `share` of `reference`: demand met, it costs at most `share` more (a
    reference short of demand counts as beaten); short of demand, by the plan's scarcity
    objective, each value within `share` of the reference's in the objective's order (fair:
    smallest served fraction, priority-weighted tokens/s, cost; goodput: goodput, cost), and
    a value more than `share` better than the reference's settles it (the later phases of
    the reference are at a lower floor)."""
    if plan.meets_demand:
        return not reference.meets_demand or \
            plan.objective <= reference.objective * (1.0 + share) + 1e-9
    if reference.meets_demand:
        return False
    if plan.scarcity == "fair":
        larger = ((plan.fair_level, reference.fair_level),
                  (plan.priority_tokens_per_s, reference.priority_tokens_per_s))
    else:
        larger = ((plan.goodput, reference.goodput),)
    for mine, theirs in larger:
        if mine > theirs * (1.0 + share) + 1e-12:
            return True
        if mine < theirs * (1.0 - share) - 1e-12:
            return False
    return plan.objective <= reference.objective * (1.0 + share) + 1e-9


def time_to_near(problem, plan: AllocationPlan, reference: AllocationPlan) -> float:
    """Seconds the allocator takes to return a plan near the reference (`near`): the solve
    time of the first of `LADDER_S`, then the default solve itself, whose plan is near (a
    shorter limit that ends with a near plan is what `--time-limit` buys); inf when none
    is."""
    best = plan.solve_s if near(plan, reference) else math.inf
    for limit in LADDER_S:
        if limit >= min(best, problem.time_limit_s):
            break
        short = solve_allocation(replace(problem, time_limit_s=limit))
        if near(short, reference):
            return short.solve_s
    return best


@dataclass
class Row:
    size: str
    source: str  # the templates: synthetic or real
    mode: str
    level: str
    templates: int
    columns: int
    draws: int
    median_s: float
    p95_s: float
    max_s: float
    max_gap: float
    met: int
    statuses: dict[str, int]
    mean_cost: float
    #: with `--reference`: each plan's gap proven with the reference solve's bounds too
    reference_gaps: list[float] = field(default_factory=list)
    #: with `--reference`: seconds to a plan near the reference, per draw (`time_to_near`)
    near_s: list[float] = field(default_factory=list)
    #: median CPU seconds of a timed solve (all threads): on a loaded machine the wall time
    #: (`median_s`) is longer by the wait for a core
    cpu_median_s: float = math.nan
    #: per phase (`met`: the cost problem where demand is met; else the scarcity phases),
    #: the seconds and the proven gap of each draw that ran it
    phase_s: dict[str, list[float]] = field(default_factory=dict)
    phase_gaps: dict[str, list[float]] = field(default_factory=dict)

    @property
    def near_median_s(self) -> float:
        return statistics.median(self.near_s) if self.near_s else math.nan

    @property
    def near_p95_s(self) -> float:
        return _quantile(self.near_s, 0.95) if self.near_s else math.nan

    @property
    def median_ok(self) -> bool:
        """Time to a near plan within the target (no reference: not judged)."""
        return not self.near_s or self.near_p95_s <= TARGET_NEAR_P95_S

    @property
    def gap_ok(self) -> bool:
        return self.max_gap <= TARGET_GAP

    @property
    def target_met(self) -> bool:
        return self.median_ok and self.gap_ok


def draw_problem(base: AllocationProblem, rng: random.Random,
                 current: dict[tuple[str, str], int]) -> AllocationProblem:
    """One draw of the chain: every model's demand x exp(N(0, 0.25)), every pool's nodes x
    U(0.7, 1.3) rounded to the nearest node, `current` the deployment running."""
    demands = tuple(
        type(d)(d.model, d.requests_per_s * math.exp(rng.gauss(0.0, 0.25)),
                input_tokens=d.input_tokens, output_tokens=d.output_tokens,
                priority=d.priority)
        for d in base.demands
    )
    availability = {k: round(n * rng.uniform(0.7, 1.3)) for k, n in base.availability.items()}
    return type(base)(**{**base.__dict__, "demands": demands,
                         "availability": availability, "current": current})


def run_level(size: str, level: str, *, draws: int, per_model: int, seed: int,
              time_limit_s: float, mip_gap: float, catalog: Catalog,
              mode: str = "aggregated", source: str = "synthetic", nmax: int = 3,
              reference_s: float = 0.0) -> Row:
    scenario = load_scenario(size, level=level, catalog=catalog).in_mode(mode)
    if source == "real":
        templates = real_templates(scenario, catalog, nmax)
    else:
        templates = synthetic_templates(scenario, catalog, per_model, seed)
    rng = random.Random(seed + 1)
    times: list[float] = []
    cpu_s: list[float] = []  # CPU seconds of each timed solve (every thread's)
    gaps: list[float] = []
    costs: list[float] = []
    statuses: Counter[str] = Counter()
    reference_gaps: list[float] = []
    near_s: list[float] = []
    phase_s: dict[str, list[float]] = {}
    phase_gaps: dict[str, list[float]] = {}
    met = 0
    columns = 0
    current: dict[tuple[str, str], int] = {}
    base = scenario.problem(templates, time_limit_s=time_limit_s, mip_gap=mip_gap)
    warm_up()  # the compiled kernels load before the first solve's CPU clock, as its clock
    for _ in range(draws):
        problem = draw_problem(base, rng, current)
        cpu = time.process_time()
        plan: AllocationPlan = solve_allocation(problem)
        cpu_s.append(time.process_time() - cpu)
        if reference_s > 0:
            reference = solve_allocation(replace(problem, time_limit_s=reference_s,
                                                 mip_gap=REFERENCE_GAP))
            reference_gaps.append(gap_by_reference(plan, reference))
            near_s.append(time_to_near(problem, plan, reference))
        times.append(plan.solve_s)
        gaps.append(max(plan.gap, plan.goodput_gap, *plan.phase_gaps.values()))
        phases = (plan.phase_gaps.items() if not plan.meets_demand and plan.phase_gaps
                  else (("met", plan.gap),))
        for phase, gap in phases:
            phase_gaps.setdefault(phase, []).append(gap)
            phase_s.setdefault(phase, []).append(plan.phase_s.get(phase, plan.solve_s))
        costs.append(plan.cost_usd_per_hour)
        statuses[plan.status.value] += 1
        met += plan.meets_demand
        columns = int(plan.notes[0].split()[0])
        current = dict(plan.instances)
    return Row(size, source, mode, level, len(templates), columns, draws,
               statistics.median(times),
               _quantile(times, 0.95), max(times), max(gaps), met, dict(statuses),
               statistics.fmean(costs), reference_gaps, near_s, statistics.median(cpu_s),
               phase_s, phase_gaps)


def _reference_cell(row: Row) -> str:
    gaps = row.reference_gaps
    return f"{statistics.median(gaps):.2%} / {max(gaps):.2%}" if gaps else "-"


def _near_cell(row: Row) -> str:
    return f"{row.near_median_s:.2f} / {row.near_p95_s:.2f}" if row.near_s else "-"


def _phase_lines(row: Row) -> list[str]:
    """Per phase: draws, median / p95 seconds, median / largest proven gap."""
    def pct(x: float) -> str:
        return f"{x:.2%}" if math.isfinite(x) else "inf"

    out = []
    for phase, seconds in row.phase_s.items():
        gaps = row.phase_gaps[phase]
        out.append(f"    phase {phase:9} {len(seconds):>2} draws  s median "
                   f"{statistics.median(seconds):6.2f} p95 {_quantile(seconds, 0.95):6.2f}  "
                   f"gap median {pct(statistics.median(gaps)):>7} max {pct(max(gaps)):>7}")
    return out


def _levels(spec) -> list[str]:
    """The scenario's levels that change availability (not those that only move demand)."""
    return [name for name, level in spec.levels.items() if not level.demand_rps]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["core", "advanced"], choices=SIZES)
    ap.add_argument("--levels", nargs="+", default=None,
                    help="availability levels (default: every level the scenario defines "
                         "that changes availability)")
    ap.add_argument("--modes", nargs="+", default=None,
                    choices=["aggregated", "pd", "mixed"],
                    help="serving modes of the templates (default: the scenario's own; pd: "
                         "prefill and decode halves, paired per region; mixed: both, as "
                         "`coral plan --mode mixed`)")
    ap.add_argument("--library", dest="source", choices=["synthetic", "real"],
                    default="synthetic",
                    help="synthetic templates (default) or the scenario's real template "
                         "libraries, as `coral plan` builds them")
    ap.add_argument("--nmax", type=int, default=None,
                    help="n_max of the real libraries (default: 3 core, 2 advanced)")
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--templates", type=int, default=None,
                    help="templates per model (default: 400 core, 2000 advanced)")
    ap.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S)
    ap.add_argument("--mip-gap", type=float, default=DEFAULT_MIP_GAP)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", type=float, default=0.0, metavar="S",
                    help="also solve each draw for up to S seconds at a "
                         f"{REFERENCE_GAP * 100:.1f}%% gap, and print each timed plan's gap proven "
                         "with that solve's bound too: how far from the optimum the plans "
                         "are where the timed solve could not prove it")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)

    catalog = default_catalog()
    rows: list[Row] = []
    print(f"solver gap {args.mip_gap:g}, time limit {args.time_limit:g} s, {args.draws} draws; "
          f"targets (issue 37): time to a plan within {NEAR:.0%} of the reference, p95 <= "
          f"{TARGET_NEAR_P95_S:g} s; every phase's proven gap <= {TARGET_GAP:.0%}")
    header = (f"{'size':9} {'library':9} {'mode':10} {'level':9} {'templates':>9} "
              f"{'columns':>7} {'median_s':>9} {'cpu_med':>7} "
              f"{'p95_s':>7} {'max_s':>7} {'max_gap':>8} {'met':>5} {'$/h mean':>10}  "
              f"{'target':6}  "
              + (f"{'ref_gap median/max':>19}  {'near_s med/p95':>14}  " if args.reference > 0
                 else "") + "status")
    print(header)
    for size in args.sizes:
        spec = load_scenario(size, catalog=catalog).spec
        modes = args.modes or [spec.mode]
        levels = args.levels or _levels(spec)
        per_model = args.templates or DEFAULT_TEMPLATES[size]
        for mode, level in itertools.product(modes, levels):
            t0 = time.perf_counter()
            row = run_level(size, level, draws=args.draws, per_model=per_model,
                            seed=args.seed, time_limit_s=args.time_limit,
                            mip_gap=args.mip_gap, catalog=catalog, mode=mode,
                            source=args.source,
                            nmax=args.nmax or DEFAULT_REAL_NMAX[size],
                            reference_s=args.reference)
            rows.append(row)
            verdict = "yes" if row.target_met else "NO"
            print(f"{row.size:9} {row.source:9} {row.mode:10} {row.level:9} {row.templates:>9} "
                  f"{row.columns:>7} "
                  f"{row.median_s:>9.3f} {row.cpu_median_s:>7.3f} {row.p95_s:>7.3f} "
                  f"{row.max_s:>7.3f} "
                  f"{row.max_gap:>8.2%} {row.met:>2}/{row.draws:<2} {row.mean_cost:>10.0f}  "
                  f"{verdict:6}  " + (f"{_reference_cell(row):>19}  {_near_cell(row):>14}  "
                                      if args.reference > 0 else "")
                  + f"{row.statuses}  ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
            print("\n".join(_phase_lines(row)), flush=True)
    for row in rows:
        if not row.target_met:
            why = [] if row.median_ok else [
                f"time to a near plan p95 {row.near_p95_s:.2f} s (target "
                f"{TARGET_NEAR_P95_S:g} s)"]
            why += [] if row.gap_ok else [
                f"max gap {row.max_gap:.2%} > {TARGET_GAP:.0%} ("
                + ", ".join(f"{phase} {max(g):.2%}" for phase, g in row.phase_gaps.items())
                + ")"]
            print(f"target not met: {row.size} {row.source} {row.mode} {row.level}: "
                  + "; ".join(why))
    met = sum(row.target_met for row in rows)
    print(f"targets: {'met' if met == len(rows) else 'NOT met'} ({met} of {len(rows)} rows)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([{**row.__dict__, "target_met": row.target_met,
                        "near_median_s": row.near_median_s, "near_p95_s": row.near_p95_s}
                       for row in rows], fh, indent=2, default=str)
    return 0

if __name__ == "__main__":
    sys.exit(main())
