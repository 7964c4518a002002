"""The paper's baselines and its scarcity rule: the greedy Homo against a hand-computed
answer, the uniform demand scale-down against a brute-force scan, and the bisection itself."""

from __future__ import annotations

import numpy as np
import pytest

from coral.allocator.problem import TemplateColumn
from coral.allocator.scenario.load import parse_scenario
from coral.allocator.scarcity.uniform_scale import SCALE_TOL, largest_scale
from coral.baselines import (
    TemplateBuilder,
    homo_greedy,
    homo_strategies,
    homogeneous_templates,
    scale_down,
    scaled_scenario,
)
from coral.baselines.common import columns_of
from coral.baselines.homo import greedy_replicas
from coral.catalog import default_catalog
from coral.perf.model import PerfModel
from coral.templates.space.operating_points import shared_tables
from test_baselines import SCENARIO_YAML  # the same small two-model scenario


@pytest.fixture(scope="module")
def small():
    """The small scenario and its homogeneous templates (k x one node type, k <= 2)."""
    catalog = default_catalog()
    perf = PerfModel(catalog)
    builder = TemplateBuilder(catalog, perf, shared_tables(perf, catalog))
    scenario = parse_scenario(SCENARIO_YAML, catalog=catalog)
    homo = {m.name: homogeneous_templates(m.name, [], builder, scenario)
            for m in scenario.models}
    return scenario, homo


def _col(id: str, nodes: dict[str, int], rps: float, prices: dict[str, float]) -> TemplateColumn:
    return TemplateColumn(id, "m", "aggregated", nodes, rps, prices)


def test_greedy_homo_replicates_the_best_strategy_then_the_next():
    """By hand: A (1 node a, 2 req/s, $1/h: 2 req/s per $) beats B (2 nodes b, 5 req/s,
    $3/h: 1.67) beats A in the dearer region r2 ($1.5/h: 1.33). 7 req/s: A wants 4 replicas,
    r1 holds 2 (4 req/s); B covers the last 3 req/s with 1 replica. A in r2 is never
    reached."""
    a = _col("a", {"a": 1}, 2.0, {"r1": 1.0, "r2": 1.5})
    b = _col("b", {"b": 2}, 5.0, {"r1": 3.0})
    strategies = homo_strategies([b, a], output_tokens=100.0)
    assert [(s.column.id, s.region) for s in strategies] == [("a", "r1"), ("b", "r1"),
                                                             ("a", "r2")]
    assert strategies[0].goodput_per_usd == pytest.approx(2.0 * 100.0 / 1.0)
    left = {("a", "r1"): 2, ("a", "r2"): 9, ("b", "r1"): 10}
    taken = greedy_replicas(strategies, 7.0, left)
    assert [(s.column.id, s.region, n) for s, n in taken] == [("a", "r1", 2), ("b", "r1", 1)]
    assert left == {("a", "r1"): 0, ("a", "r2"): 9, ("b", "r1"): 8}
    # with room for all four replicas of A, A alone: ceil(7 / 2) = 4, overshooting to 8 req/s
    left = {("a", "r1"): 5, ("b", "r1"): 10}
    taken = greedy_replicas(strategies, 7.0, left)
    assert [(s.column.id, n) for s, n in taken] == [("a", 4)]
    # nothing left anywhere: the model stays short, nothing taken
    assert greedy_replicas(strategies, 7.0, {}) == []


def test_greedy_homo_matches_a_brute_force_of_its_rule(small):
    """On the small scenario, the plan is what the rule gives when applied by hand over the
    same strategies: per model in file order, best goodput per USD first."""
    scenario, homo = small
    res = homo_greedy(scenario, homo)
    left = dict(scenario.availability)
    want: dict[tuple[str, str], int] = {}
    for m in scenario.models:
        cols = columns_of(scenario, homo[m.name], prefix="homo")
        ranked = sorted(((c.capacity * m.output_tokens / usd, -usd, c, r)
                         for c in cols for r, usd in c.price_usd_per_hour.items()),
                        key=lambda t: (-t[0], -t[1], t[2].id, t[3]))
        need = m.demand_rps
        for _, _, c, r in ranked:
            fit = min(left.get((g, r), 0) // n for g, n in c.node_counts.items())
            k = min(int(np.ceil(need / c.capacity - 1e-9)), fit)
            if need <= 1e-6 * max(1.0, m.demand_rps) or k <= 0:
                continue
            want[(c.id, r)] = want.get((c.id, r), 0) + k
            for g, n in c.node_counts.items():
                left[(g, r)] -= n * k
            need -= k * c.capacity
    assert dict(res.plan.instances) == want


def test_uniform_scale_down_finds_the_largest_factor(small):
    """The greedy Homo is short on the small scenario (qwen3-14b finds its only pairs taken);
    the bisected factor meets demand and is within the tolerance of the largest factor a
    scan in steps of 1e-4 finds met."""
    scenario, homo = small

    def run(sc):
        return homo_greedy(sc, homo)

    res = scale_down(run, scenario)
    assert 0 < res.demand_scale < 1
    assert run(scaled_scenario(scenario, res.demand_scale)).meets_demand
    grid = np.arange(1, 10_001) / 10_000
    met = [f for f in grid if run(scaled_scenario(scenario, float(f))).meets_demand]
    best = max(met)
    assert best - SCALE_TOL <= res.demand_scale <= best + 1e-12
    # reported against the full demand: every model served the factor, goodput to match
    assert res.served_fraction == pytest.approx({m.name: res.demand_scale
                                                 for m in scenario.models})
    assert res.goodput_tokens_per_s == pytest.approx(res.demand_scale * (5 + 1.2) * 256)
    assert any("scaled down uniformly" in n for n in res.notes)
    # a planner that meets the full demand is run once and left alone
    full = scale_down(run, scaled_scenario(scenario, 0.5))
    assert full.demand_scale == 1.0 and full.meets_demand


def test_largest_scale_brackets_a_threshold_and_handles_the_edges():
    calls = []

    def attempt(f):
        calls.append(f)
        return f <= 0.3141, f

    found = largest_scale(attempt, tol=1e-3)
    assert found.factor <= 0.3141 < found.upper and found.upper - found.factor <= 1e-3
    assert found.result == found.factor and found.runs == len(calls)
    # a hint met starts the bracket there; one short of demand closes it from above
    for hint in (0.3, 0.5):
        hinted = largest_scale(attempt, tol=1e-3, hint=hint)
        assert hinted.factor <= 0.3141 < hinted.upper
        assert hinted.upper - hinted.factor <= 1e-3
    assert largest_scale(lambda f: (True, f)).factor == 1.0
    never = largest_scale(lambda f: (False, f))
    assert never.factor == 0.0 and never.result == 1.0
    with pytest.raises(ValueError, match="tol"):
        largest_scale(attempt, tol=0.0)
