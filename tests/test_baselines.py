"""Baselines: each on a small scenario (llama-3.1-8b and qwen3-14b on three cheap node types,
at most two nodes per template), and the joint exhaustive optimum against templates + allocator
on small node pools (the check that the two-stage decomposition loses nothing)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from coral.allocator.problem import (
    AllocationPlan,
    AllocationProblem,
    ModelDemand,
    PlanStatus,
    TemplateColumn,
    priced_column,
)
from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.scenario.load import parse_scenario
from coral.baselines import (
    MAX_DECODE_PER_PREFILL,
    BaselineResult,
    JointInfeasibleError,
    TemplateBuilder,
    UnitTable,
    helix_placement,
    homogeneous_templates,
    is_homogeneous,
    joint_optimum,
    no_slo,
    run_baselines,
    slo_share,
)
from coral.baselines.cauchy import allocate
from coral.allocator.scenario.load import scenario_slo
from coral.templates.space.enumerate import combo_key
from coral.catalog import default_catalog
from coral.perf.model import PerfModel
from coral.templates.builder.solve import build_template
from coral.templates.template import TemplateNode
from coral.templates.space.enumerate import enumerate_combinations
from coral.templates.space.operating_points import shared_tables
from coral.templates.slo import default_slo

NODE_TYPES = ("1x-l4", "1x-a10g", "1x-t4")
MODELS = ("llama-3.1-8b", "qwen3-14b")

SCENARIO_YAML = """
schema_version: 1
name: small
n_max: 2
startup_s: 0
node_types: [1x-l4, 1x-a10g, 1x-t4]
models:
  - {name: llama-3.1-8b, demand_rps: 5, input_tokens: 1024, output_tokens: 256,
     tpot_s: 0.10, ttft_s: 2.0}
  - {name: qwen3-14b, demand_rps: 1.2, input_tokens: 1024, output_tokens: 256,
     tpot_s: 0.10, ttft_s: 2.5}
regions:
  - {name: aws-us-east-1}
  - {name: gcp-us-central1}
base_availability: {1x-l4: 8, 1x-a10g: 8, 1x-t4: 8}
"""

SCARCE_AVAILABILITY = "base_availability: {1x-l4: 1, 1x-a10g: 2, 1x-t4: 1}"


@pytest.fixture(scope="module")
def parts():
    catalog = default_catalog()
    perf = PerfModel(catalog)
    tables = shared_tables(perf, catalog)
    return catalog, perf, tables


@pytest.fixture(scope="module")
def builder(parts):
    catalog, perf, tables = parts
    return TemplateBuilder(catalog, perf, tables)


@pytest.fixture(scope="module")
def scenario(parts):
    return parse_scenario(SCENARIO_YAML, catalog=parts[0])


@pytest.fixture(scope="module")
def coral_templates(parts, scenario):
    """Coral's templates of the scenario: every enumerated combination, solved as a library
    solves it (one pipeline under the step model, `floor=0`)."""
    catalog, perf, tables = parts
    out = {}
    for m in scenario.models:
        slo = scenario_slo(scenario, m.name)
        combos = enumerate_combinations(m.name, catalog, nmax=2, node_types=NODE_TYPES).combos
        out[m.name] = [t for t in (build_template(m.name, c, slo, "aggregated", "flow", perf,
                                                  catalog, tables=tables, floor=0.0)
                                   for c in combos)
                       if t.feasible]
    return out


@pytest.fixture(scope="module")
def results(parts, scenario, coral_templates, builder):
    catalog, perf, tables = parts
    return run_baselines(scenario, coral_templates, catalog=catalog, perf=perf, tables=tables,
                         mip_gap=1e-9, builder=builder)


def _combo_of(template_id: str) -> str:
    return template_id.split(":", 3)[-1]


# ------------------------------------------------------------------------- run_baselines


def test_every_baseline_reports_cost_and_served_share(results):
    assert set(results) == {"coral", "homo", "homo-joint", "melange", "cauchy", "helix"}
    for name, r in results.items():
        assert isinstance(r, BaselineResult) and r.name == name
        assert set(r.served_fraction) == set(MODELS)
        assert all(0.0 <= f <= 1.0 for f in r.served_fraction.values())
        assert r.cost_per_hour >= 0 and r.notes
        assert r.plan is not None and r.cost_per_hour == pytest.approx(r.plan.cost_usd_per_hour)


def test_every_baseline_says_how_its_plan_was_reached(results):
    """A comparison is only as fair as its baselines' plans: the allocation baselines carry
    their status and proven gap, the heuristic ones say that nothing bounds their cost."""
    for name in ("homo", "cauchy"):
        r = results[name]
        assert r.heuristic and r.gap == float("inf") and r.solved == "heuristic, no bound"
    for name in ("coral", "homo-joint", "melange"):
        r = results[name]
        assert not r.heuristic and r.gap == r.plan.gap and r.gap < float("inf")
        assert r.solved == r.plan.proof and r.solved.endswith(f"gap {r.gap:.2%}")


def test_plan_proof_names_both_gaps_under_scarcity():
    plan = AllocationPlan(
        status=PlanStatus.INFEASIBLE, instances={}, cost_usd_per_hour=0.0, penalty_usd=0.0,
        demand_rps={"m": 1.0}, capacity_rps={"m": 0.0}, served_rps={"m": 0.0}, goodput=0.0,
        nodes_used={}, started={}, stopped={}, gap=0.002, solve_s=0.0, goodput_gap=0.001)
    assert plan.proof == "demand short, goodput gap 0.10%, cost gap 0.20%"
    stopped = replace(plan, status=PlanStatus.TIME_LIMIT, gap=float("inf"))
    assert stopped.proof == "time limit, gap no bound"


def test_baseline_deployments_decode_their_plans(results):
    """Every baseline with templates hands back its plan's instances with their placement,
    count for count, so that it can be simulated like Coral's plan."""
    for name, r in results.items():
        if name == "helix":  # a no-SLO placement on a fixed cluster: not a template plan
            assert r.instances == ()
            continue
        assert {(i.template_id, i.region): i.count for i in r.instances} == dict(r.plan.instances)
        for inst in r.instances:
            assert inst.shape is not None, (name, inst.template_id)
            assert inst.shape.num_layers >= 1
            assert inst.mode in ("aggregated", "prefill", "decode")
            assert inst.usd_per_hour > 0 and inst.capacity_rps >= 0


def test_homo_never_cheaper_than_coral(results):
    coral, joint, greedy = results["coral"], results["homo-joint"], results["homo"]
    assert coral.meets_demand and joint.meets_demand
    assert joint.cost_per_hour >= coral.cost_per_hour * (1 - 1e-9)
    # homo replicas are k copies of one node type
    for r in (joint, greedy):
        for tid, _region in r.plan.instances:
            assert "+" not in _combo_of(tid)
    assert joint.demand_scale == 1.0 and coral.demand_scale == 1.0
    # the greedy takes llama-3.1-8b's best strategy (2 x 1x-a10g) first, which leaves
    # qwen3-14b (on nothing but 1x-a10g pairs here) short: the joint ILP shares the nodes
    assert not greedy.meets_demand and 0 < greedy.demand_scale < 1
    assert greedy.served_fraction == pytest.approx(
        {m: greedy.demand_scale for m in MODELS})
    # goodput: served req/s times 256 output tokens per request
    assert greedy.goodput_tokens_per_s == pytest.approx(greedy.demand_scale * (5 + 1.2) * 256)
    assert joint.goodput_tokens_per_s == pytest.approx((5 + 1.2) * 256)


def test_melange_uses_single_node_replicas_only(results):
    melange = results["melange"]
    plan = melange.plan
    assert plan.instances, "llama-3.1-8b fits on one node"
    # one node per instance
    assert sum(plan.instances.values()) == sum(plan.nodes_used.values())
    assert all("*" not in _combo_of(t) and "+" not in _combo_of(t) for t, _ in plan.instances)
    # qwen3-14b (about 30 GB of weights) fits on none of these single 24 GB GPUs
    assert melange.served_fraction["qwen3-14b"] == 0.0
    assert melange.served_fraction["llama-3.1-8b"] == pytest.approx(1.0)
    assert any("qwen3-14b" in n for n in melange.notes)


def test_cauchy_pairs_prefill_and_decode_in_one_region(results, scenario):
    cauchy = results["cauchy"]
    modes = {}
    for (tid, region), n in cauchy.plan.instances.items():
        model, mode = tid.split(":")[1:3]
        assert mode in ("prefill", "decode") and n > 0
        assert is_homogeneous(_combo_of(tid).split("*")[0].split("+"))
        modes.setdefault((model, region), set()).add(mode)
    assert modes and all(m == {"prefill", "decode"} for m in modes.values())
    assert cauchy.meets_demand  # availability is ample


def test_helix_entry_judges_no_slo_throughput_under_the_slo(results):
    helix = results["helix"]
    assert helix.plan is not None
    # the plan is sized by the no-SLO capacity; what meets the SLO can only be less
    for model, f in helix.served_fraction.items():
        assert f <= min(1.0, helix.plan.capacity_rps[model] / helix.plan.demand_rps[model]) + 1e-9
    assert any("without SLO" in n for n in helix.notes)


def test_scarce_availability_gives_partial_service(parts, scenario, coral_templates, builder):
    catalog, perf, tables = parts
    scarce = parse_scenario(
        SCENARIO_YAML.replace("base_availability: {1x-l4: 8, 1x-a10g: 8, 1x-t4: 8}",
                              SCARCE_AVAILABILITY), catalog=catalog)
    res = run_baselines(scarce, coral_templates, catalog=catalog, perf=perf, tables=tables,
                        baselines=["coral", "homo", "homo-joint", "melange", "cauchy"],
                        builder=builder)
    assert set(res) == {"coral", "homo", "homo-joint", "melange", "cauchy"}
    assert not res["coral"].meets_demand
    # the scarcity rule: every method is judged at one demand factor for all models
    assert 0 < res["coral"].demand_scale < 1
    assert res["coral"].served_fraction == pytest.approx(
        {m: res["coral"].demand_scale for m in MODELS})
    # qwen3-14b's prefill and decode halves each need a pair of 1x-a10g, and a region has
    # two: no combo of Cauchy's serves it, so no uniform share of the demand can be met
    assert res["cauchy"].demand_scale == 0.0
    assert any("meets no uniform share" in n for n in res["cauchy"].notes)
    for r in res.values():
        assert all(0.0 <= f <= 1.0 for f in r.served_fraction.values())
        assert all(n <= scarce.availability.get(key, 0) for key, n in r.plan.nodes_used.items())


def test_homogeneous_templates_fill_in_what_the_library_lacks(scenario, builder):
    # given nothing, every k x g combination (k <= n_max) that can hold the model is solved
    tpls = homogeneous_templates("llama-3.1-8b", [], builder, scenario)
    combos = {t.combo for t in tpls}
    assert ("1x-l4",) in combos and ("1x-a10g", "1x-a10g") in combos
    assert all(is_homogeneous(c) and len(c) <= 2 for c in combos)
    assert ("1x-t4",) not in combos  # 16 GB: the weights alone do not leave room for a request


def test_cauchy_combos_feed_several_decodes_from_one_prefill():
    # one prefill instance serves 1 req/s (1000 prompt tokens), one decode instance 0.5 req/s
    pre = TemplateColumn("p", "m", "prefill", {"a": 1}, 1000.0, {"r": 1.0})
    dec = TemplateColumn("d", "m", "decode", {"b": 1}, 100.0, {"r": 1.0})
    table = UnitTable(ModelDemand("m", 2.5, input_tokens=1000, output_tokens=200), [pre], [dec],
                      ["r"])
    assert len(table) == MAX_DECODE_PER_PREFILL
    units = [table.unit(i) for i in range(len(table))]
    assert all(u.n_prefill == 1 for u in units)
    assert sorted(u.n_decode for u in units) == list(range(1, MAX_DECODE_PER_PREFILL + 1))
    best = units[0]
    assert best.n_decode == 2  # balanced, and the smallest such combo
    assert best.rps == pytest.approx(1.0) and best.usd_per_hour == pytest.approx(3.0)
    assert best.tokens_per_usd == pytest.approx(1.0 * 1200 * 3600 / 3.0)
    # 2.5 req/s needs 3 prefill and 5 decode instances at least: $8, e.g. 2 x (1:2) + (1:1)
    found = allocate([table], {("a", "r"): 10, ("b", "r"): 10}, mip_gap=1e-9)
    assert found.solved
    taken = found.units["m"]
    assert sum(u.usd_per_hour * n for u, n in taken) == pytest.approx(8.0)
    assert sum(u.rps * n for u, n in taken) >= 2.5 - 1e-9
    assert sum(n for _, n in taken) == 3  # three prefill instances, one per combo
    # one node of each: no plan meets 2.5 req/s, nothing is deployed
    short = allocate([table], {("a", "r"): 1, ("b", "r"): 1})
    assert not short.solved and short.units == {}


def test_cauchy_plan_respects_its_prefill_decode_ratios(results):
    """Every (model, region) of the plan holds whole combos: one prefill instance per combo,
    1 to MAX_DECODE_PER_PREFILL decode instances each."""
    per: dict[tuple[str, str], dict[str, int]] = {}
    for (tid, region), n in results["cauchy"].plan.instances.items():
        model, mode = tid.split(":")[1:3]
        per.setdefault((model, region), {"prefill": 0, "decode": 0})[mode] += n
    assert per
    for counts in per.values():
        assert counts["prefill"] <= counts["decode"] <= MAX_DECODE_PER_PREFILL * counts["prefill"]
    assert any("combos: " in n and "1 x " in n for n in results["cauchy"].notes)


# ------------------------------------------------------------------------- helix placement


def test_helix_placement_with_and_without_slo(parts, builder):
    catalog, perf, tables = parts
    slo = default_slo(catalog.model("llama-3.1-8b"))
    hp = helix_placement("llama-3.1-8b", ["1x-l4", "1x-l4"], slo=slo, catalog=catalog,
                         perf=perf, builder=builder)
    assert hp.combo == ("1x-l4", "1x-l4")
    assert hp.no_slo.slo == no_slo(slo) and hp.with_slo.slo == slo
    assert 0.0 <= hp.slo_share <= 1.0
    assert hp.served_under_slo_rps <= hp.throughput_no_slo_rps + 1e-12
    # the no-SLO placement is at least as fast in throughput as the SLO-bound one on a node
    # whose memory does not bind, and Coral's own SLO placement meets the SLO in full
    assert slo_share(hp.with_slo, slo) == pytest.approx(1.0)
    if hp.no_slo.tpot_s > slo.tpot_s:
        assert hp.slo_share < 1.0


def test_slo_share_routes_flow_over_paths_that_meet_the_slo(parts, builder):
    catalog, _, _ = parts
    slo = default_slo(catalog.model("llama-3.1-8b"))  # TPOT 0.1 s
    base = builder.get("llama-3.1-8b", ["1x-l4"], slo, "aggregated")

    def node(first, layers, step_s):
        return TemplateNode("1x-l4", first, layers, 16, 1, 1.0, step_s, 0.1, 1e9)

    # two first stages (fast 0 and slow 1) feed one last stage 2: path 0-2 takes 0.08 s,
    # path 1-2 takes 0.25 s; half the flow meets TPOT
    tpl = replace(base, nodes=(node(0, 16, 0.03), node(0, 16, 0.2), node(16, 16, 0.05)),
                  edges=((-1, 0, 1.0), (-1, 1, 1.0), (0, 2, 1.0), (1, 2, 1.0), (2, -2, 2.0)),
                  throughput=2.0)
    assert slo_share(tpl, slo) == pytest.approx(0.5)
    assert slo_share(tpl, slo.with_overrides(tpot_s=0.3)) == pytest.approx(1.0)
    assert slo_share(tpl, slo.with_overrides(tpot_s=0.05, ttft_s=2.0)) == 0.0


# ------------------------------------------------------------------------- joint optimum

POOLS = [
    # (pool, demand per model in req/s)
    # qwen3-14b sized for perf model 4: an A10G + L4 pipeline rates 0.16 req/s under TPOT
    # 0.1 s (decode batches stop below a matmul row tile)
    ({"1x-l4": 2, "1x-a10g": 2}, {"llama-3.1-8b": 1.2, "qwen3-14b": 0.15}),
    # T4 pools: demands sized for perf model 3 (a T4 sustains ~24 of its 65 TFLOP/s)
    ({"1x-l4": 1, "1x-a10g": 2, "1x-t4": 2}, {"llama-3.1-8b": 0.8, "qwen3-14b": 0.15}),
    ({"1x-a10g": 3, "1x-t4": 2}, {"llama-3.1-8b": 1.0, "qwen3-14b": 0.6}),
    ({"1x-l4": 3, "1x-a10g": 3}, {"llama-3.1-8b": 1.8, "qwen3-14b": 0.7}),
    ({"1x-l4": 1, "1x-a10g": 4}, {"llama-3.1-8b": 2.6, "qwen3-14b": 0.6}),
]
PRICES = {"1x-l4": 0.8048, "1x-a10g": 1.006, "1x-t4": 0.526}


def _allocator_cost(pool, demands, prices, builder):
    """Templates on every sub-multiset of the pool + the allocation ILP (availability = pool)."""
    types = sorted(pool)
    columns = []
    for model in demands:
        slo = default_slo(builder.catalog.model(model))
        for vec in itertools.product(*(range(pool[g] + 1) for g in types)):
            combo = [g for g, n in zip(types, vec) for _ in range(n)]
            if not combo:
                continue
            t = builder.get(model, combo, slo, "aggregated")
            if t.feasible:
                counts = {g: n for g, n in zip(types, vec) if n}
                columns.append(priced_column(
                    f"{model}:{combo_key(combo)}", model, "aggregated", counts, t.throughput,
                    {(g, "pool"): prices[g] for g in types}, ("pool",)))
    problem = AllocationProblem(
        demands=tuple(ModelDemand(m, d) for m, d in demands.items()),
        templates=tuple(columns), regions=("pool",),
        availability={(g, "pool"): n for g, n in pool.items()}, mip_gap=1e-9,
    )
    return solve_allocation(problem)


@pytest.mark.parametrize("pool,demands", POOLS, ids=[combo_key(
    [g for g, n in p.items() for _ in range(n)]) for p, _ in POOLS])
def test_joint_optimum_equals_templates_plus_allocator(parts, builder, pool, demands):
    catalog, perf, _ = parts
    prices = PRICES
    joint = joint_optimum(demands, pool, catalog=catalog, perf=perf, node_prices=prices,
                          builder=builder)
    assert joint.method == "joint exhaustive"
    for model, d in demands.items():
        assert joint.capacity_rps[model] >= d * (1 - 1e-9)
        assert sum(t.throughput for t in joint.replicas[model]) == pytest.approx(
            joint.capacity_rps[model])
    used = {g: sum(n.get(g, 0) for n in joint.nodes.values()) for g in pool}
    assert all(used[g] <= pool[g] for g in pool)
    assert joint.cost_usd_per_hour == pytest.approx(sum(prices[g] * n for g, n in used.items()))

    plan = _allocator_cost(pool, demands, prices, builder)
    assert plan.meets_demand
    assert plan.cost_usd_per_hour == pytest.approx(joint.cost_usd_per_hour, rel=1e-9)


def test_joint_leaves_nodes_idle_and_splits_node_sets_when_cheaper(parts, builder):
    catalog, perf, _ = parts
    # one 1x-l4 stays idle: llama on one 1x-a10g, qwen3-14b on 1x-a10g + 1x-l4
    joint = joint_optimum(*POOLS[0][::-1], catalog=catalog, perf=perf, node_prices=PRICES,
                          builder=builder)
    assert joint.nodes == {"llama-3.1-8b": {"1x-a10g": 1},
                           "qwen3-14b": {"1x-a10g": 1, "1x-l4": 1}}
    assert joint.cost_usd_per_hour == pytest.approx(2 * PRICES["1x-a10g"] + PRICES["1x-l4"])
    # two 1x-a10g serve llama more as two replicas than as one placement over both
    joint = joint_optimum(*POOLS[-1][::-1], catalog=catalog, perf=perf, node_prices=PRICES,
                          builder=builder)
    assert joint.nodes["llama-3.1-8b"] == {"1x-a10g": 2}
    assert [t.combo for t in joint.replicas["llama-3.1-8b"]] == [("1x-a10g",), ("1x-a10g",)]
    pair = builder.get("llama-3.1-8b", ["1x-a10g"] * 2,
                       default_slo(catalog.model("llama-3.1-8b")), "aggregated")
    # (perf model 4: the pair as one placement rates within 1 % of the two replicas)
    assert pair.throughput <= joint.capacity_rps["llama-3.1-8b"]
    assert 2.6 <= joint.capacity_rps["llama-3.1-8b"]


def test_joint_infeasible_names_the_models(parts, builder):
    catalog, perf, _ = parts
    with pytest.raises(JointInfeasibleError, match="qwen3-14b"):
        joint_optimum({"llama-3.1-8b": 1.0, "qwen3-14b": 50.0}, {"1x-l4": 2, "1x-a10g": 2},
                      catalog=catalog, perf=perf, builder=builder)


# ------------------------------------------------------------------------- bad input


def test_unknown_model_is_a_clear_value_error(parts, scenario, builder):
    catalog, perf, tables = parts
    with pytest.raises(ValueError, match="unknown model 'llama-3.1-9b'.*llama-3.1-8b"):
        run_baselines(scenario, {"llama-3.1-9b": []}, catalog=catalog, perf=perf)
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        joint_optimum({"nope": 1.0}, {"1x-l4": 1}, catalog=catalog, perf=perf, builder=builder)
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        helix_placement("nope", ["1x-l4"], slo=default_slo(catalog.model("llama-3.1-8b")),
                        catalog=catalog, perf=perf)
    with pytest.raises(ValueError, match="unknown node type '1x-l5'.*1x-l4"):
        joint_optimum({"llama-3.1-8b": 1.0}, {"1x-l5": 1}, catalog=catalog, perf=perf)
    with pytest.raises(ValueError, match="unknown baseline 'homogeneous'"):
        run_baselines(scenario, {}, catalog=catalog, perf=perf, baselines=["homogeneous"])


def test_templates_of_another_slo_are_refused(parts, scenario, coral_templates):
    catalog, perf, tables = parts
    other = coral_templates["llama-3.1-8b"][0]
    stale = build_template("llama-3.1-8b", other.combo, other.slo.with_overrides(tpot_s=0.2),
                           "aggregated", "flow", perf, catalog, tables=tables)
    with pytest.raises(ValueError, match="rebuild the templates"):
        run_baselines(scenario, {"llama-3.1-8b": [stale]}, catalog=catalog, perf=perf)
