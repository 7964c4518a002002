"""Spot plans: the scenario ILP against brute force over every plan and every failure set of
the pools, the risk model's formulas, and `coral plan --spot` end to end."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coral.allocator.problem import AllocationProblem, ModelDemand, TemplateColumn
from coral.allocator.spot.planner import (
    SPOT_SUFFIX,
    SpotMarket,
    SpotOptions,
    SpotPlanError,
    plan_spot,
    spot_arrays,
    spot_columns,
)
from coral.allocator.spot.ilp import ScenarioFamily
from coral.allocator.spot.repair import ModelRisk, exact_table, repair
from coral.allocator.spot.risk import mass_beyond, pool_down_probability, scenario_depth
from coral.catalog import default_catalog
from coral.cli.main import app

STARTUP_S = 300.0


def _instance(seed: int) -> tuple[AllocationProblem, SpotMarket]:
    """1-2 models, 2 templates each (one region each), 2 regions, 3 node types, at most 2
    nodes of a type per region: at most 4 spot pools and 3^8 plans."""
    rng = random.Random(seed)
    regions = ("r1", "r2")
    node_types = ("g1", "g2", "g3")
    spot_pools = rng.sample([(g, r) for g in node_types for r in regions], 4)
    models = [f"m{i}" for i in range(rng.choice((1, 2)))]
    cols: list[TemplateColumn] = []
    for m in models:
        for k in range(2):
            nodes = {rng.choice(node_types): 1}
            if rng.random() < 0.3:
                nodes[rng.choice(node_types)] = 1
            price = {rng.choice(regions): round(rng.uniform(0.5, 2.0) * sum(nodes.values()), 3)}
            cols.append(TemplateColumn(f"{m}-t{k}", m, "aggregated", nodes,
                                       round(rng.uniform(0.5, 2.0), 2), price))
    demands = tuple(ModelDemand(m, round(rng.uniform(1.0, 3.0), 2)) for m in models)
    avail = {(g, r): 2 for g in node_types for r in regions}
    problem = AllocationProblem(demands=demands, templates=tuple(cols), regions=regions,
                                availability=avail, startup_s=STARTUP_S, mip_gap=0.0,
                                time_limit_s=30.0)
    price = {p: round(rng.uniform(0.2, 0.6), 3) for p in spot_pools}
    rate = {p: rng.uniform(0.01, 0.2) for p in spot_pools}
    prob = {p: pool_down_probability(rate[p], 3600.0, STARTUP_S, 120.0) for p in spot_pools}
    return problem, SpotMarket(price, rate, prob)


def _pd_instance(seed: int) -> tuple[AllocationProblem, SpotMarket]:
    """One model served by a prefill and a decode template in region r1 and two more
    templates of any mode (aggregated, prefill, decode) in either region, tokens per request
    unequal: PD and mixed serving, each plan's capacity a per-region minimum of its halves.
    Same sizes as `_instance` (at most 4 spot pools, 3^8 plans)."""
    rng = random.Random(1000 + seed)
    regions = ("r1", "r2")
    node_types = ("g1", "g2", "g3")
    spot_pools = rng.sample([(g, r) for g in node_types for r in regions], 4)
    demand = ModelDemand("m0", round(rng.uniform(0.5, 1.5), 2), input_tokens=3.0,
                         output_tokens=2.0)
    shapes = [("prefill", "r1"), ("decode", "r1")] + [
        (rng.choice(("aggregated", "prefill", "decode", "decode")), rng.choice(regions))
        for _ in range(2)]
    cols = []
    for k, (mode, region) in enumerate(shapes):
        nodes = {rng.choice(node_types): 1}
        price = {region: round(rng.uniform(0.5, 2.0), 3)}
        cap = round(rng.uniform(0.5, 2.0), 2) * demand.tokens_per_request(mode)
        cols.append(TemplateColumn(f"m0-{mode}-t{k}", "m0", mode, nodes, cap, price))
    avail = {(g, r): 2 for g in node_types for r in regions}
    problem = AllocationProblem(demands=(demand,), templates=tuple(cols), regions=regions,
                                availability=avail, startup_s=STARTUP_S, mip_gap=0.0,
                                time_limit_s=30.0)
    price = {p: round(rng.uniform(0.2, 0.6), 3) for p in spot_pools}
    rate = {p: rng.uniform(0.001, 0.03) for p in spot_pools}
    prob = {p: pool_down_probability(rate[p], 3600.0, STARTUP_S, 120.0) for p in spot_pools}
    return problem, SpotMarket(price, rate, prob)


def _served(demand: ModelDemand, held: list[tuple[TemplateColumn, str, int]]) -> float:
    """Requests/s `held` (column, region, count) serve: aggregated capacity plus, per
    region, the lesser of the prefill and decode halves in requests/s."""
    agg, half = 0.0, {}
    for t, r, n in held:
        if t.mode == "aggregated":
            agg += n * t.capacity
        else:
            key = (t.mode, r)
            half[key] = half.get(key, 0.0) + n * t.capacity / demand.tokens_per_request(t.mode)
    regions = {r for _, r in half}
    return agg + sum(min(half.get(("prefill", r), 0.0), half.get(("decode", r), 0.0))
                     for r in regions)


def _brute_force(problem: AllocationProblem, market: SpotMarket, target: float
                 ) -> tuple[float, dict]:
    """The cheapest plan meeting the target, by trying every plan and every failure set
    (against `problem.current`: keeping a running instance is free, starting or stopping
    one costs its start-up)."""
    full = spot_columns(problem, market).problem
    entries = [(t, r) for t in full.templates for r in t.price_usd_per_hour]
    ubs = [min(problem.availability.get((g, r), 0) // n for g, n in t.node_counts.items())
           for t, r in entries]
    pools_of = [frozenset((g, r) for g in t.node_counts) if t.id.endswith(SPOT_SUFFIX)
                else frozenset() for t, r in entries]
    all_pools = sorted(market.prob_down)
    failure_sets = []
    for k in range(len(all_pools) + 1):
        for down in itertools.combinations(all_pools, k):
            prob = math.prod(market.prob_down[p] if p in down else 1 - market.prob_down[p]
                             for p in all_pools)
            failure_sets.append((set(down), prob))
    best, best_x = math.inf, {}
    for x in itertools.product(*(range(u + 1) for u in ubs)):
        used: dict = {}
        for (t, r), n in zip(entries, x):
            for g, k in t.node_counts.items():
                used[(g, r)] = used.get((g, r), 0) + k * n
        if any(v > problem.availability.get(key, 0) for key, v in used.items()):
            continue
        cost = sum(_cost(t.price_usd_per_hour[r], sum(market.rate_per_hour[p] for p in ps),
                         n, problem.current.get((t.id, r), 0))
                   for (t, r), n, ps in zip(entries, x, pools_of))
        if cost >= best - 1e-12:
            continue
        ok = True
        for d in problem.demands:
            def cap(down: set) -> float:
                return _served(d, [(t, r, n) for (t, r), n, ps in zip(entries, x, pools_of)
                                   if t.model == d.model and not (ps & down)])
            if cap(set()) < d.requests_per_s * (1 - 1e-9):
                ok = False
                break
            covered = sum(p for down, p in failure_sets if cap(down) >= d.requests_per_s * (1 - 1e-9))
            if covered < target - 1e-12:
                ok = False
                break
        if ok:
            best, best_x = cost, {(t.id, r): n for (t, r), n in zip(entries, x) if n}
    return best, best_x


def _unit_cost(price: float, rate: float) -> float:
    """One new instance: its expected $/hour (a replacement's start-up per preemption) and
    its own start-up at that rate, as `spot_ilp` states the objective."""
    hourly = price * (1 + rate * STARTUP_S / 3600.0)
    return hourly * (1 + STARTUP_S / 3600.0)


def _cost(price: float, rate: float, n: int, running: int) -> float:
    """`n` instances against `running` ones: expected $/hour, and a start-up for each one
    started or stopped (a stopped one serves until its replacements have started)."""
    hourly = price * (1 + rate * STARTUP_S / 3600.0)
    return n * hourly + abs(n - running) * hourly * STARTUP_S / 3600.0


def _objective(sp) -> float:
    by_id = {t.id: t for t in sp.columns.problem.templates}
    total = 0.0
    for (tid, r), n in sp.plan.instances.items():
        t = by_id[tid]
        rate = (sum(sp.market.rate_per_hour[(g, r)] for g in t.node_counts)
                if tid in sp.columns.base else 0.0)
        total += n * _unit_cost(t.price_usd_per_hour[r], rate)
    return total


def _exact_p_short(sp, model: str) -> float:
    by_id = {t.id: t for t in sp.columns.problem.templates}
    pools = sorted(sp.market.prob_down)
    demand = sp.plan.demand_rps[model]
    short = 0.0
    for k in range(len(pools) + 1):
        for down in itertools.combinations(pools, k):
            prob = math.prod(sp.market.prob_down[p] if p in down else 1 - sp.market.prob_down[p]
                             for p in pools)
            cap = _served(sp.columns.problem.demand_of(model), [
                (by_id[tid], r, n) for (tid, r), n in sp.plan.instances.items()
                if by_id[tid].model == model and not (
                    tid in sp.columns.base
                    and any((g, r) in down for g in by_id[tid].node_counts))])
            if cap < demand * (1 - 1e-9):
                short += prob
    return short


@pytest.mark.parametrize("instance", [_instance, _pd_instance], ids=["aggregated", "pd"])
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("target", [0.0, 0.9, 0.99])
def test_scenario_ilp_matches_brute_force(instance, seed: int, target: float) -> None:
    problem, market = instance(seed)
    best, best_x = _brute_force(problem, market, target)
    if not math.isfinite(best):
        with pytest.raises(SpotPlanError):
            plan_spot(problem, market, SpotOptions(risk_target=target))
        return
    sp = plan_spot(problem, market, SpotOptions(risk_target=target))
    assert _objective(sp) == pytest.approx(best, rel=1e-9, abs=1e-9), (sp.plan.instances, best_x)
    # the plan file's objective and bound: the bound is a lower bound of the optimum
    assert sp.objective == pytest.approx(best, rel=1e-9, abs=1e-9)
    assert sp.bound <= best * (1 + 1e-6) and sp.bound_from in ("naive plan", "relaxation")
    for d in problem.demands:
        exact = _exact_p_short(sp, d.model)
        assert sp.p_short[d.model] == pytest.approx(exact, rel=1e-9, abs=1e-15)
        assert sp.p_unjudged[d.model] == 0.0
        assert 1.0 - exact >= target - 1e-9
        assert sp.plan.capacity_rps[d.model] >= d.requests_per_s * (1 - 1e-9)


@pytest.mark.parametrize("instance", [_instance, _pd_instance], ids=["aggregated", "pd"])
def test_risk_target_changes_the_plan_somewhere(instance) -> None:
    """The brute-force instances are not all trivial: on some, the risk model makes the
    cheapest plan dearer than the naive one (so the comparison above can fail)."""
    dearer = 0
    for seed in range(12):
        problem, market = instance(seed)
        naive, _ = _brute_force(problem, market, 0.0)
        safe, _ = _brute_force(problem, market, 0.99)
        dearer += math.isfinite(naive) and safe > naive + 1e-9
    assert dearer >= 1


def test_pd_instances_pair_their_halves() -> None:
    """The PD instances are PD where it matters: on some, the cheapest plan at 0.99 holds
    prefill and decode halves together, spot among them, so a lost half strands the other."""
    paired = 0
    for seed in range(12):
        problem, market = _pd_instance(seed)
        best, x = _brute_force(problem, market, 0.99)
        modes = {tid.split("-")[1] for tid, _ in x}
        paired += math.isfinite(best) and {"prefill", "decode"} <= modes and any(
            tid.endswith(SPOT_SUFFIX) and tid.split("-")[1] != "aggregated" for tid, _ in x)
    assert paired >= 1


def test_pool_down_probability_counts_the_replacement_time() -> None:
    rate = 0.1
    assert pool_down_probability(rate, 3600, 300, 120) == pytest.approx(
        1 - math.exp(-rate * (3600 + 180) / 3600))
    # a notice longer than the start-up leaves no gap after the kill
    assert pool_down_probability(rate, 3600, 60, 120) == pytest.approx(1 - math.exp(-rate))


def test_scenario_depth_bounds_what_it_leaves_out() -> None:
    probs = [0.01] * 20
    depth, left = scenario_depth(probs, 1e-5, 10_000)
    assert left <= 1e-5 and left == pytest.approx(mass_beyond(probs, depth))
    assert mass_beyond(probs, depth - 1) > 1e-5
    assert scenario_depth([0.3] * 3, 0.0, 10_000) == (3, 0.0)


def test_spot_options_are_checked() -> None:
    for bad in (1.0, -0.1):
        with pytest.raises(SpotPlanError, match="risk-target"):
            SpotOptions(risk_target=bad)
    with pytest.raises(SpotPlanError, match="risk-window"):
        SpotOptions(window_s=0)


def test_plan_spot_end_to_end(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_planning import _write_scenario

    scenario = _write_scenario(tmp_path)
    runner = CliRunner(env={"COLUMNS": "200"})
    plans = {}
    for target in ("0.99", "0"):
        out = tmp_path / f"plan-{target}.json"
        result = runner.invoke(app, [
            "plan", str(scenario), "--spot", "--risk-target", target, "--no-baselines",
            "--workers", "1", "--templates-dir", str(tmp_path / "templates"), "--json",
            "--out", str(out)])
        assert result.exit_code == 0, result.output
        plans[target] = payload = json.loads(out.read_text())
        spot = payload["spot"]
        assert spot["risk_target"] == float(target) and spot["window_s"] == 3600.0
        cost = sum(i["usd_per_hour"] * i["count"] for i in payload["instances"])
        on_spot = sum(i["usd_per_hour"] * i["count"] for i in payload["instances"]
                      if i["market"] == "spot")
        assert cost == pytest.approx(payload["cost_per_hour"])
        assert spot["spot_share"] == pytest.approx(on_spot / cost)
        assert spot["expected_usd_per_hour"] >= cost
        assert {i["market"] for i in payload["instances"]} <= {"spot", "on_demand"}
        risk = spot["per_model"]["llama-3.1-8b"]
        assert 1 - risk["p_short"] >= float(target)
        assert spot["on_demand_usd_per_hour"] > cost  # spot is cheaper here
    # the risk model never makes the plan cheaper than the naive one
    assert plans["0.99"]["cost_per_hour"] >= plans["0"]["cost_per_hour"] - 1e-9
    # a plan file's readers take it as it is
    from coral.plans.file import read_plan

    assert read_plan(tmp_path / "plan-0.99.json").spot.risk_target == 0.99


@pytest.mark.parametrize("mode", ["pd", "mixed"])
def test_plan_spot_in_pd_and_mixed_modes(tmp_path: Path, mode: str) -> None:
    """`--spot` plans prefill/decode columns too: the plan file's risk per model is the exact
    one of its instances (PD halves paired per region), recomputed here over every failure
    set of the pools it uses, and within the target."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_planning import _write_scenario

    scenario = _write_scenario(tmp_path)
    out = tmp_path / f"plan-{mode}.json"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, [
        "plan", str(scenario), "--spot", "--mode", mode, "--no-baselines", "--workers", "1",
        "--templates-dir", str(tmp_path / "templates"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    assert payload["mode"] == mode
    rows = payload["instances"]
    if mode == "pd":
        assert {r["mode"] for r in rows} <= {"prefill", "decode"}
    prob = {}
    catalog = default_catalog()
    startup = 300.0
    for r in rows:
        if r["market"] == "spot":
            for g in r["nodes"]:
                rate = catalog.preemption_rate_per_hour(g, r["region"])
                prob[(g, r["region"])] = pool_down_probability(
                    rate, 3600.0, startup, catalog.preemption_notice_s(r["region"]))
    pools = sorted(prob)
    for model, risk in payload["spot"]["per_model"].items():
        slo = payload["slos"][model]
        demand = ModelDemand(model, payload["demand_rps"][model],
                             input_tokens=slo["input_tokens"], output_tokens=slo["output_tokens"])
        mine = [r for r in rows if r["model"] == model]
        short = 0.0
        for k in range(len(pools) + 1):
            for down in itertools.combinations(pools, k):
                p = math.prod(prob[q] if q in down else 1 - prob[q] for q in pools)
                cols = [(TemplateColumn(f"{r['mode']}-{i}", model, r["mode"], {"g": 1},
                                        r["capacity"], {r["region"]: 1.0}),
                         r["region"], r["count"]) for i, r in enumerate(mine)
                        if not (r["market"] == "spot" and any(
                            (g, r["region"]) in down for g in r["nodes"]))]
                if _served(demand, cols) < demand.requests_per_s * (1 - 1e-9):
                    short += p
        assert risk["p_short"] == pytest.approx(short, rel=1e-6, abs=1e-12)
        assert risk["p_short"] <= 1 - 0.99 + 1e-12


@pytest.mark.parametrize("seed", range(6))
def test_replanning_the_running_plan_keeps_it(seed: int) -> None:
    """Regression: the objective charged every instance as new, so re-planning a running
    spot plan moved instances for cents. Keeping an instance is free: a plan that was
    optimal stays optimal with itself running, and nothing is started or stopped."""
    problem, market = _instance(seed)
    try:
        first = plan_spot(problem, market, SpotOptions(risk_target=0.9))
    except SpotPlanError:
        return
    running = dataclasses.replace(problem, current=dict(first.plan.instances))
    again = plan_spot(running, market, SpotOptions(risk_target=0.9))
    assert again.plan.started == {} and again.plan.stopped == {}
    assert again.plan.instances == first.plan.instances


def test_repair_meets_the_target_where_the_naive_plan_does_not() -> None:
    repaired = 0
    for seed in range(12):
        problem, market = _instance(seed)
        cols = spot_columns(problem, market)
        a = spot_arrays(cols, market)
        naive = plan_spot(problem, market, SpotOptions(risk_target=0.0))
        x = a.vector(naive.plan.instances)
        budget = 0.01
        risks = [ModelRisk(a, m, market.prob_down, 0.0, 10_000) if a.spot_pools_of(m) else None
                 for m in range(len(a.models))]
        if all(p <= budget for p in naive.p_short.values()):
            continue
        fixed = repair(a, risks, x, budget)
        if fixed is None:
            continue
        repaired += 1
        assert a.fits(fixed)
        assert (a.capacity(fixed) >= a.demand * (1 - 1e-9)).all()
        for m in range(len(a.models)):
            exact = exact_table(a, m, fixed, market.prob_down)
            if exact is not None:
                table, cap, need = exact
                assert float(table.prob @ (cap < need)) + table.left <= budget + 1e-12
    assert repaired >= 1


def test_a_cut_excludes_the_plan_that_failed() -> None:
    """A plan that the single-pool relaxation accepts but whose exact risk is over budget
    (short whenever pool 0 is down, whatever the others do) is no longer accepted once
    `ScenarioFamily.cut` has added its failure sets."""
    pools = [("g", f"r{k}") for k in range(3)]
    prob = {pools[0]: 0.105, pools[1]: 0.17, pools[2]: 0.2}
    fam = ScenarioFamily.singles(pools, prob)
    budget = 0.1
    assert fam.sets[(0,)] <= budget < prob[pools[0]]  # the relaxation accepts it
    fam.cut([(0,)], [0], budget)
    assert sum(p for s, p in fam.sets.items() if 0 in s) > budget
    # every set holds its exact probability (those pools down, the rest up)
    for s, p in fam.sets.items():
        assert p == pytest.approx(math.prod(prob[q] if k in s else 1 - prob[q]
                                            for k, q in enumerate(pools)))
