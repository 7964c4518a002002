"""`coral plan --robust R`: re-rating columns with one GPU type slowed, and the robust ILP.

A tiny scenario (llama-3.1-8b, three cheap node types, one region, n_max 2; templates built
once per module, in well under a second) for the ratings and the end-to-end plan; hand-made
problems (aggregated and PD columns) for the ILP against the exhaustive oracle.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coral.allocator.scenario.headroom import planned_capacity
from coral.planning.columns import columns_and_templates
from coral.planning.libraries import templates_for_scenario
from coral.planning.options import PlanOptions
from coral.planning.plan import plan_scenario
from coral.allocator.problem import AllocationProblem, ModelDemand, PlanStatus, TemplateColumn
from coral.allocator.robust.planner import (
    RobustError,
    RobustPlanner,
    RobustProblem,
    conservative_start,
    greedy_cover,
    robust_bruteforce,
    robust_shortfall,
    robust_start,
    scenario_capacity_rps,
    solve_robust,
)
from coral.allocator.robust.starts import conservative_problem
from coral.allocator.robust.rating import (
    RATINGS_FILE,
    RatingStore,
    gpu_types_of,
    robust_columns,
    scenario_capacities,
    slowdown_key,
    step_rating,
)
from coral.allocator.scenario.load import load_scenario
from coral.catalog import default_catalog
from coral.cli.main import app
from coral.perf.pipeline import PipelineShape
from coral.perf.step import (
    Saturation,
    build_step_model,
    busy_steps,
    saturation,
    stages_from_shape,
)
from coral.perf.slowdown import PhaseSlowdown, SlowedPerf
from coral.templates.builder.parallel import default_perf_factory

MODEL = "llama-3.1-8b"
REGION = "aws-us-east-1"

SCENARIO = """\
schema_version: 1
name: tiny-robust
mode: {mode}
n_max: 2
rho: 12
startup_s: 0
node_types: [1x-l4, 1x-a10g, 1x-l40s]
models:
  - {{name: llama-3.1-8b, demand_rps: 12, input_tokens: 1024, output_tokens: 256,
     tpot_s: 0.10, ttft_s: 2.0}}
regions:
  - {{name: aws-us-east-1}}
base_availability: {{1x-l4: 12, 1x-a10g: 12, 1x-l40s: 6}}
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("robust")
    catalog = default_catalog()
    perf = default_perf_factory(catalog)
    paths = {}
    for mode in ("aggregated", "mixed"):
        paths[mode] = folder / f"tiny-{mode}.yaml"
        paths[mode].write_text(SCENARIO.format(mode=mode))
    mixed = load_scenario(paths["mixed"], catalog=catalog).with_perf(perf, catalog)
    templates = templates_for_scenario(mixed, catalog, perf, out_root=folder / "templates")
    return folder, catalog, perf, paths, mixed, templates


# ---------------------------------------------------------------------------------------------
# Ratings
# ---------------------------------------------------------------------------------------------


def test_unslowed_ratings_are_the_planned_capacities(tiny):
    """At factor 1 the re-rating is the planner's own rating of every column, in every mode."""
    _, catalog, perf, _, mixed, templates = tiny
    cols, chosen = columns_and_templates(mixed, templates)
    assert {c.mode for c in cols} == {"aggregated", "prefill", "decode"}
    caps = scenario_capacities(robust_columns(mixed, chosen, 1.0,
                                               RatingStore(perf, catalog)))
    for col in cols:
        gpus = gpu_types_of(chosen[col.id], catalog)
        assert gpus
        for gpu in gpus:
            assert caps[gpu][col.id] == pytest.approx(col.capacity, rel=1e-12), (col.id, gpu)


def test_a_one_node_template_slows_by_exactly_the_factor(tiny):
    """One stage, no activation send: its busy step is the node's iteration, so slowing the
    node's GPU type by F lengthens the step by exactly F and cuts the rate by F."""
    _, catalog, perf, _, mixed, templates = tiny
    _, chosen = columns_and_templates(mixed, templates)
    one = [t for t in chosen.values() if len(t.combo) == 1 and t.mode == "decode"][0]
    gpu = gpu_types_of(one, catalog)[0]
    nominal = step_rating(one, perf, catalog)
    slowed = step_rating(one, SlowedPerf(perf, catalog, {gpu: 1.3}), catalog)
    assert slowed.step_s == pytest.approx(1.3 * nominal.step_s, rel=1e-12)
    assert slowed.rps == pytest.approx(nominal.rps / 1.3, rel=1e-12)
    other = "t4" if gpu != "t4" else "l4"
    assert step_rating(one, SlowedPerf(perf, catalog, {other: 1.3}), catalog) == nominal


def _full_tpot(template, s: Saturation) -> float:
    """TPOT of a request on the instance run full: its busy step; a decode half's KV transfer
    and a backlog of the router's slack + 1 requests at its full rate, over the output."""
    if template.mode != "decode":
        return s.step_s
    return s.step_s + (s.kv_transfer_s + 5 / s.rps) / (template.slo.output_tokens - 1)


def _largest_micro_batch(template, p, catalog, target: float) -> int:
    """The largest micro-batch (scanned one by one) at which the instance run full on `p`
    meets `target` (0: none; the template's own when it does)."""
    full = min(st.count * st.batch for st in template.shape.stages)
    for micro in range(full, 0, -1):
        if _full_tpot(template, _rated(template, p, catalog, micro)[0]) <= target:
            return micro
    return 0


def _rated(template, p, catalog, micro: int | None) -> tuple[Saturation, float]:
    slo = template.slo
    shape = template.shape
    if micro is not None:
        shape = PipelineShape(tuple(replace(st, batch=max(1, min(st.batch, -(-micro // st.count))))
                                    for st in shape.stages))
    s = saturation(template.model, template.mode, shape, input_tokens=slo.input_tokens,
                   output_tokens=slo.output_tokens, perf=p, catalog=catalog)
    if template.mode != "aggregated":
        return s, s.step_s
    layout = build_step_model(template.model, stages_from_shape(shape), p, catalog)
    steps = busy_steps("aggregated", layout.n_stages, layout.max_seqs, slo.input_tokens,
                       slo.output_tokens)
    return s, max(layout.step_cost(*step)[0] for _, step in steps)


def _independent_capacity(template, scenario, perf, catalog, gpu: str, factor
                          ) -> float:
    """A column's capacity with `gpu` slowed, from `coral.perf.step` and the headroom rule
    directly: deployed at the largest micro-batch (scanned one by one) whose busy step meets
    TPOT with each of its GPU types slowed in turn, the template's figures scaled by what
    that batch and the slowdown do to the step model's, never above its nominal rating at
    that batch. `factor`: one slowdown for every GPU type, or each type's own (a number or
    a `PhaseSlowdown`)."""
    factors = factor if isinstance(factor, dict) else {
        g: factor for g in gpu_types_of(template, catalog)}
    slo = template.slo
    target = slo.tpot_s * (1 + 1e-9)
    full = min(st.count * st.batch for st in template.shape.stages)
    deployed = None
    if template.mode != "prefill":
        for g in gpu_types_of(template, catalog):
            m = _largest_micro_batch(template, SlowedPerf(perf, catalog, {g: factors.get(g, 1.0)}),
                                     catalog, target)
            if 0 < m < full:
                deployed = m if deployed is None else min(deployed, m)
    nominal, nominal_ttft = _rated(template, perf, catalog, None)
    own, own_ttft = _rated(template, perf, catalog, deployed)
    slowed, slowed_ttft = _rated(template, SlowedPerf(perf, catalog, {gpu: factors.get(gpu, 1.0)}),
                                 catalog, deployed)
    spec = scenario.model_spec(template.model)

    def rate(s: Saturation, ttft: float) -> float:
        # figures times ratios, in the module's order: the rating's slot count rounds down,
        # and another rounding of the same product can flip it at a whole number
        q = s.rps / nominal.rps
        t = replace(template, throughput=template.throughput * q,
                    throughput_rps=template.throughput_rps * q,
                    throughput_tokens_per_s=template.throughput_tokens_per_s * q,
                    ttft_s=None if template.ttft_s is None
                    else template.ttft_s * (ttft / nominal_ttft),
                    tpot_s=None if template.tpot_s is None
                    else template.tpot_s * (s.step_s / nominal.step_s))
        return planned_capacity(t, arrival_cv=spec.arrival_cv,
                                output_cv=spec.output_tokens_cv, saturation=s)

    return min(rate(slowed, slowed_ttft), rate(own, own_ttft))


def test_robust_plan_holds_demand_in_every_scenario_rerated_independently(tiny):
    """The robust plan's instances, re-rated one by one with each GPU type slowed, cover
    demand in every scenario; the nominal plan does not (so the check can fail)."""
    _, catalog, perf, paths, _, templates = tiny
    scenario = load_scenario(paths["aggregated"], catalog=catalog)
    result = plan_scenario(scenario, catalog=catalog, perf=perf, templates=templates,
                           baselines=False, options=PlanOptions(robust=0.2, mip_gap=0.0))
    nominal = plan_scenario(scenario, catalog=catalog, perf=perf, templates=templates,
                            baselines=False, options=PlanOptions(mip_gap=0.0))
    rated = scenario.with_perf(perf, catalog)
    _, chosen = columns_and_templates(rated, templates)
    gpus = sorted({g for t in chosen.values() for g in gpu_types_of(t, catalog)})
    assert result.extras["robust"]["gpu_types"] == gpus
    demand = scenario.model_spec(MODEL).demand_rps

    def covered(plan) -> dict[str, float]:
        out = {}
        for gpu in gpus:
            out[gpu] = sum(n * _independent_capacity(chosen[tid], rated, perf, catalog, gpu,
                                                     1.2)
                           for (tid, _), n in plan.instances.items())
        return out

    robust = covered(result.plan)
    assert all(cap >= demand * (1 - 1e-6) for cap in robust.values()), robust
    assert any(cap < demand * (1 - 1e-6) for cap in covered(nominal.plan).values())
    assert result.cost_per_hour >= nominal.cost_per_hour
    entry = result.extras["robust"]
    assert entry["nominal_cost_per_hour"] == pytest.approx(nominal.cost_per_hour)
    for gpu in gpus:
        assert entry["capacity_rps"][gpu][MODEL] == pytest.approx(robust[gpu], rel=1e-9)


def test_ratings_are_stored_beside_each_library(tiny):
    """A second store over the same libraries reads every rating back, computing none."""
    _, catalog, perf, _, mixed, templates = tiny
    _, chosen = columns_and_templates(mixed, templates)
    first = RatingStore(perf, catalog, templates.template_dirs)
    caps = scenario_capacities(robust_columns(mixed, chosen, 1.35, first))
    first.save()
    assert first.computed > 0
    for folder in templates.template_dirs.values():
        assert (Path(folder) / RATINGS_FILE).exists()
    again = RatingStore(perf, catalog, templates.template_dirs)
    assert scenario_capacities(robust_columns(mixed, chosen, 1.35, again)) == caps
    assert again.computed == 0


# ---------------------------------------------------------------------------------------------
# The ILP against the oracle
# ---------------------------------------------------------------------------------------------


def _random_problem(seed: int, pd: bool) -> RobustProblem:
    """Two models, two regions, four node types (one per GPU type "g0".."g3"), four columns
    (with `pd`, model "a" as a prefill and a decode column beside an aggregated one); each
    scenario "gK" cuts the columns on node type K to a random share (0 for some)."""
    rng = random.Random(seed)
    regions = ("r0", "r1")
    node_types = [f"n{k}" for k in range(4)]
    node_prices = {(g, r): round(rng.uniform(1, 4), 2) for g in node_types for r in regions}
    demands = (ModelDemand("a", rng.uniform(1.5, 3), input_tokens=4, output_tokens=2),
               ModelDemand("b", rng.uniform(1, 3), input_tokens=4, output_tokens=2))
    shapes = ([("a", "aggregated"), ("b", "aggregated"), ("a", "prefill"), ("a", "decode")]
              if pd else [("a", "aggregated"), ("b", "aggregated")] * 2)
    cols: list[TemplateColumn] = []
    for i, (model, mode) in enumerate(shapes):
        counts = {rng.choice(node_types): 1}
        if rng.random() < 0.4:
            other = rng.choice(node_types)
            counts[other] = counts.get(other, 0) + 1
        # a PD half serves more requests/s than an aggregated node, as prefill and decode
        # apart batch better: both kinds are worth using
        unit = {"aggregated": 1.0, "prefill": 8.0, "decode": 4.0}[mode]
        price = {r: sum(n * node_prices[(g, r)] for g, n in counts.items()) for r in regions}
        cols.append(TemplateColumn(f"c{i}", model, mode, counts,
                                   round(rng.uniform(1.5, 3.5), 2) * unit, price))
    availability = {(g, r): rng.randint(1, 2) for g in node_types for r in regions}
    problem = AllocationProblem(demands, tuple(cols), regions, availability, mip_gap=0.0,
                                time_limit_s=30.0)
    scenarios: dict[str, dict[str, float]] = {}
    for k, g in enumerate(node_types):
        share = rng.choice([0.0, 0.5, 0.7, 0.9])
        scenarios[f"g{k}"] = {c.id: c.capacity * share for c in cols if g in c.node_counts}
    return RobustProblem(problem, scenarios)


@pytest.mark.parametrize("pd", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_robust_ilp_is_the_cheapest_plan_covering_every_scenario(seed, pd):
    rp = _random_problem(seed, pd)
    oracle = robust_bruteforce(rp)
    plan = solve_robust(rp)
    if oracle is None:
        assert plan.status is PlanStatus.INFEASIBLE
        assert not plan.instances
        return
    assert plan.status is PlanStatus.OPTIMAL, plan.notes
    assert plan.cost_usd_per_hour == pytest.approx(oracle.cost_usd_per_hour, abs=1e-6)
    assert plan.meets_demand
    assert not robust_shortfall(rp, plan.instances)
    for name, caps in scenario_capacity_rps(rp, plan.instances).items():
        for d in rp.problem.demands:
            assert caps[d.model] >= d.requests_per_s * (1 - 1e-6), (name, d.model)


def test_the_oracle_problems_do_bind():
    """Some of those problems' robust optimum costs more than their nominal one (else the
    comparison above would not test the scenario rows)."""
    from coral.allocator.solve.bruteforce import solve_bruteforce

    dearer = pd_used = 0
    for pd in (False, True):
        for seed in range(12):
            rp = _random_problem(seed, pd)
            robust = robust_bruteforce(rp)
            nominal = solve_bruteforce(rp.problem)
            if robust is not None and nominal.meets_demand:
                dearer += robust.cost_usd_per_hour > nominal.cost_usd_per_hour + 1e-6
                pd_used += any(rp.problem.template(t).mode != "aggregated"
                               for t, _ in robust.instances)
    assert dearer >= 3
    assert pd_used >= 2


def test_no_robust_plan_is_a_clear_error(tiny):
    """Every column rated 0 in a scenario: proven infeasible, and planning says why."""
    _, catalog, perf, paths, _, templates = tiny
    rp = _random_problem(0, False)
    dead = {c.id: 0.0 for c in rp.problem.templates}
    plan = solve_robust(RobustProblem(rp.problem, {"g0": dead}))
    assert plan.status is PlanStatus.INFEASIBLE and not plan.instances
    only_l4 = paths["aggregated"].with_name("only-l4.yaml")
    only_l4.write_text(SCENARIO.format(mode="aggregated").replace(
        "{1x-l4: 12, 1x-a10g: 12, 1x-l40s: 6}", "{1x-l4: 40}"))
    scenario = load_scenario(only_l4, catalog=catalog)
    assert plan_scenario(scenario, catalog=catalog, perf=perf, templates=templates,
                         baselines=False).plan.meets_demand
    with pytest.raises(RobustError, match="To fix"):
        plan_scenario(scenario, catalog=catalog, perf=perf, templates=templates,
                      baselines=False, options=PlanOptions(robust=10.0))


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------


def _plan_cli(tiny, robust: str) -> tuple[str, dict]:
    """`coral plan` of the tiny aggregated scenario with `--robust robust`: its output and the
    plan file's `robust` entry."""
    folder, _, _, paths, _, _ = tiny
    out = folder / f"plan-{robust}.json"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, [
        "plan", str(paths["aggregated"]), "--robust", robust, "--no-baselines",
        "--no-progress", "--templates-dir", str(folder / "templates"), "--mode", "aggregated",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    return result.output, json.loads(out.read_text())["robust"]


def test_plan_cli_robust_writes_its_entry(tiny):
    output, entry = _plan_cli(tiny, "0.2")
    assert "robust: every demand covered" in output
    assert entry["R"] == 0.2 and entry["factor"] == pytest.approx(1.2)
    assert entry["gpu_types"] == ["a10g", "l4", "l40s"]
    assert math.isfinite(entry["nominal_cost_per_hour"])


def test_plan_cli_robust_auto_plans_each_card_against_its_own_uncertainty(tiny):
    """`--robust auto`: every GPU type slowed by its measured uncertainty (the tiny scenario's
    cards are all borrowers), the plan file naming each card's factor and why; the plan's
    instances, re-rated independently at those factors, cover demand in every scenario."""
    from coral.perf.uncertainty import card_uncertainty

    _, catalog, perf, paths, _, templates = tiny
    output, entry = _plan_cli(tiny, "auto")
    assert "slower than modelled by its own uncertainty" in output
    cards = card_uncertainty(catalog, perf)
    assert entry["R"] == "auto" and entry["factor"] is None
    assert entry["gpu_types"] == ["a10g", "l4", "l40s"]
    for gpu in entry["gpu_types"]:
        # each phase slowed by its own factor, both named with why
        phases = cards[gpu].phases or {}
        assert entry["factors"][gpu] == pytest.approx(
            phases if len(set(phases.values())) > 1 else cards[gpu].factor)
        assert "borrowed from" in entry["basis"][gpu]
        assert all(f"{ph} {f:.3g}x" in entry["basis"][gpu]
                   for ph, f in phases.items()), entry["basis"][gpu]
    scenario = load_scenario(paths["aggregated"], catalog=catalog)
    plan = plan_scenario(scenario, catalog=catalog, perf=perf, templates=templates,
                         baselines=False, options=PlanOptions(robust="auto", mip_gap=0.0))
    rated = scenario.with_perf(perf, catalog)
    _, chosen = columns_and_templates(rated, templates)
    demand = scenario.model_spec(MODEL).demand_rps
    for gpu in entry["gpu_types"]:
        cap = sum(n * _independent_capacity(chosen[tid], rated, perf, catalog, gpu,
                                            {g: c.slowdown for g, c in cards.items()})
                  for (tid, _), n in plan.plan.instances.items())
        assert cap >= demand * (1 - 1e-6), (gpu, cap)
        # the planner's own rating of each slowed card, per phase, is the independent one
        assert plan.extras["robust"]["capacity_rps"][gpu][MODEL] == pytest.approx(cap,
                                                                                  rel=1e-9)


@pytest.mark.parametrize("value", ["0", "-0.1", "nan", "11", "sometimes"])
def test_plan_cli_refuses_a_bad_robust(tiny, value):
    folder, _, _, paths, _, _ = tiny
    result = CliRunner().invoke(app, ["plan", str(paths["aggregated"]), "--robust", value,
                                      "--no-baselines", "--templates-dir",
                                      str(folder / "templates")])
    assert result.exit_code == 2
    assert "--robust must be a number in (0, 10]" in result.output


def test_planner_summary_names_each_scenario(tiny):
    _, catalog, perf, paths, _, templates = tiny
    scenario = load_scenario(paths["aggregated"], catalog=catalog).with_perf(perf, catalog)
    cols, chosen = columns_and_templates(scenario, templates)
    planner = RobustPlanner(0.35, perf=perf, catalog=catalog)
    plan = planner.solve(scenario, scenario.problem(cols), chosen)
    planner.check("aggregated", plan)
    s = planner.summary("aggregated")
    assert s["factor"] == pytest.approx(1.35)
    assert set(s["capacity_rps"]) == set(s["gpu_types"])
    assert s["cost_of_robustness"] >= 0


def test_a_given_robust_plan_stands_when_nothing_cheaper_is_found():
    """A start that covers every scenario bounds the search: with almost no time the plan
    returned is no dearer than it; a start that does not cover them is ignored."""
    rp = _random_problem(0, False)
    oracle = robust_bruteforce(rp)
    assert oracle is not None
    hurried = RobustProblem(replace(rp.problem, time_limit_s=1e-3), rp.scenario_capacity)
    plan = solve_robust(hurried, starts=[dict(oracle.instances)])
    assert plan.meets_demand and not robust_shortfall(rp, plan.instances)
    assert plan.cost_usd_per_hour <= oracle.cost_usd_per_hour + 1e-9
    short = {key: n for key, n in oracle.instances.items() if key != min(oracle.instances)}
    assert robust_shortfall(rp, short)
    assert robust_start(rp, [short]) is None


@pytest.mark.parametrize("seed", range(12))
def test_greedy_cover_covers_every_scenario_or_says_it_cannot(seed):
    rp = _random_problem(seed, False)
    got = greedy_cover(rp, {})
    oracle = robust_bruteforce(rp)
    if got is None:
        return
    assert oracle is not None  # a cover exists, so the oracle finds one
    assert not robust_shortfall(rp, got)
    plan = robust_start(rp, [got])
    assert plan is not None and plan.cost_usd_per_hour >= oracle.cost_usd_per_hour - 1e-9


@pytest.mark.parametrize("pd", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_the_conservative_plan_covers_every_scenario_and_bounds_the_optimum(seed, pd):
    """Every column at its least capacity over the scenarios: its plan (by the nominal solver)
    covers every scenario and costs no less than the robust optimum; where no plan covers
    them, it finds none either."""
    rp = _random_problem(seed, pd)
    cons = conservative_problem(rp)
    caps = rp.capacity_matrix()
    for t in cons.templates:
        i = [c.id for c in rp.problem.templates].index(t.id)
        assert t.capacity == pytest.approx(min(rp.problem.templates[i].capacity,
                                               caps[:, i].min()))
    plan, why = conservative_start(rp, 10.0)
    oracle = robust_bruteforce(rp)
    if plan is None:
        assert "conservative plan" in why
        return
    assert oracle is not None
    assert plan.meets_demand and not robust_shortfall(rp, plan.instances)
    assert plan.cost_usd_per_hour >= oracle.cost_usd_per_hour - 1e-6


def test_the_conservative_plan_is_found_where_it_is_the_only_one():
    """Columns of one GPU type each, each scenario derating its own: only more of every
    column covers all three scenarios, and the conservative problem finds that plan (the
    robust solve then starts below it)."""
    demands = (ModelDemand("a", 3.0, input_tokens=4, output_tokens=2),)
    cols = tuple(TemplateColumn(f"c{k}", "a", "aggregated", {f"n{k}": 1}, 1.0, {"r0": 1.0 + k})
                 for k in range(3))
    problem = AllocationProblem(demands, cols, ("r0",), {(f"n{k}", "r0"): 4 for k in range(3)},
                                mip_gap=0.0)
    rp = RobustProblem(problem, {f"g{k}": {f"c{k}": 0.5} for k in range(3)})
    plan, _ = conservative_start(rp, 10.0)
    assert plan is not None and not robust_shortfall(rp, plan.instances)
    # every column at 0.5: six instances of the cheapest
    assert plan.instances == {("c0", "r0"): 4, ("c1", "r0"): 2}
    robust = solve_robust(rp)
    oracle = robust_bruteforce(rp)
    assert robust.status is PlanStatus.OPTIMAL
    assert robust.cost_usd_per_hour == pytest.approx(oracle.cost_usd_per_hour)
    assert robust.cost_usd_per_hour < plan.cost_usd_per_hour


# ---------------------------------------------------------------------------------------------
# One slowed instance, one rating: the simulator runs what the robust plan rates
# ---------------------------------------------------------------------------------------------


def _simulated(template, perf, catalog, rate_rps: float, duration_s: float = 900):
    from coral.sim import instance_from_template, simulate, summarize, synthetic

    slo = template.slo
    reqs = synthetic(MODEL, rate_rps=rate_rps, duration_s=duration_s, seed=3,
                     prompt_tokens=slo.input_tokens, output_tokens=slo.output_tokens)
    res = simulate([instance_from_template(template)], reqs, perf=perf, catalog=catalog)
    return summarize(res, {MODEL: slo})["models"][MODEL]


@pytest.mark.parametrize("factor", [1.2, PhaseSlowdown(1.1, 1.2)], ids=["both", "per-phase"])
def test_the_slowed_instance_the_simulator_runs_is_the_one_rated(tiny, factor):
    """Every aggregated column whose busy step would miss TPOT with its GPU type 1.2x slower
    (in decode; its prefill as slow or less) is deployed at a smaller batch; the simulator,
    running that deployed instance with the same GPU type slowed (`SlowedPerf`, as `coral
    simulate --slowdown` does), sees the rated busy step when saturated (TPOT within
    target), and holds the SLO at the rated capacity. The template's own batch, run the same
    way, misses TPOT: the cut is what holds it."""
    _, catalog, perf, _, mixed, templates = tiny
    _, chosen = columns_and_templates(mixed, templates)
    store = RatingStore(perf, catalog)
    columns = robust_columns(mixed, chosen, {g: factor for g in catalog.gpus}, store)
    cut = {cid: col for cid, col in columns.items()
           if col.micro_batch and col.deployed.mode == "aggregated"}
    assert len(cut) >= 2
    for cid, col in sorted(cut.items())[:2]:
        template, deployed = chosen[cid], col.deployed
        assert deployed.shape != template.shape
        for gpu in gpu_types_of(template, catalog):
            slowed = SlowedPerf(perf, catalog, {gpu: factor})
            rating = store.rating(deployed, slowdown_key(gpu, factor), cut_batch=False)
            # one computation: the stored rating is the step model's on the slowed perf
            assert rating == step_rating(deployed, slowed, catalog)
            busy = _simulated(deployed, slowed, catalog, 2.0 * rating.rps, 300)
            assert busy["tpot_s_at_percentile"] == pytest.approx(
                rating.saturation().tail_step_s, rel=0.05), (cid, gpu)
            assert busy["tpot_s_at_percentile"] <= template.slo.tpot_s * 1.01, (cid, gpu)
            own = _simulated(template, slowed, catalog, 2.0 * rating.rps, 300)
            assert own["tpot_s_at_percentile"] > template.slo.tpot_s, (cid, gpu)
            rps = col.slowed[gpu] * template.throughput_rps / template.throughput
            at = _simulated(deployed, slowed, catalog, rps)
            assert at["slo_met"], (cid, gpu, at)
