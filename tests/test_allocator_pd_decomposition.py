"""PD plans by the decomposition (per-model exact PD covers priced in column generation)
against HiGHS on the whole ILP, on random problems too large for the exhaustive oracle:
three PD models and an aggregated one, prefill and decode templates in two regions, limited
availability, some instances running now."""

from __future__ import annotations

from dataclasses import replace

import random

import numpy as np
import pytest
from test_allocator_scarcity import _bounds_hold, _internals
from test_allocator_support import column

from coral.allocator.problem import AllocationProblem, ModelDemand, PlanStatus
from coral.allocator.solve import ilp
from coral.allocator.solve.ilp import solve_allocation

NODES = ("g1", "g2", "g3")
REGIONS = ("r1", "r2")


def pd_problem(seed: int, *, mip_gap: float, nodes_per_type: tuple[int, int] = (3, 9)
               ) -> AllocationProblem:
    rng = random.Random(seed)
    node_price = {(g, r): round(rng.uniform(0.5, 4.0), 2) for g in NODES for r in REGIONS}
    templates = []
    demands = []
    for m in ("m1", "m2", "m3", "m4"):
        pd = m != "m4"
        demands.append(ModelDemand(m, round(rng.uniform(2.0, 6.0), 3),
                                   input_tokens=1000.0 if pd else 1.0,
                                   output_tokens=100.0 if pd else 1.0))
        for i in range(4):
            mode = ("prefill", "decode")[i % 2] if pd else "aggregated"
            nodes = {g: rng.choice((1, 1, 2)) for g in rng.sample(NODES, rng.choice((1, 1, 2)))}
            per_node = {"prefill": 2000.0, "decode": 150.0, "aggregated": 1.2}[mode]
            prices = {r: round(sum(n * node_price[(g, r)] for g, n in nodes.items()), 4)
                      for r in REGIONS if rng.random() < 0.85}
            if not prices:
                continue
            capacity = round(per_node * sum(nodes.values()) * rng.uniform(0.7, 1.3), 2)
            templates.append(column(f"{m}-t{i}", m, nodes, capacity, prices, mode=mode))
    availability = {(g, r): rng.randint(*nodes_per_type) for g in NODES for r in REGIONS}
    current = {(t.id, r): 1 for t in templates for r in t.price_usd_per_hour
               if rng.random() < 0.15}
    return AllocationProblem(demands=tuple(demands), templates=tuple(templates),
                             regions=REGIONS, availability=availability, current=current,
                             startup_s=600.0, time_limit_s=20.0, mip_gap=mip_gap)


@pytest.mark.parametrize("seed", range(16))
def test_pd_decomposition_matches_highs(seed: int) -> None:
    problem = pd_problem(seed, mip_gap=0.0)
    plan = solve_allocation(problem)
    reference = solve_allocation(problem, decompose=False)
    assert plan.status is reference.status
    if plan.status is PlanStatus.OPTIMAL:
        assert any("per-model covers" in n for n in plan.notes)
        assert plan.meets_demand
        assert plan.objective == pytest.approx(reference.objective, rel=1e-6)
        for (g, r), n in plan.nodes_used.items():
            assert n <= problem.availability.get((g, r), 0)


@pytest.mark.parametrize("seed", range(3, 9))
def test_large_pd_models_go_to_highs_from_a_rounded_plan(seed: int, monkeypatch) -> None:
    """Past the size limits HiGHS solves the ILP, with a rounded LP plan as its cutoff, and
    the plan says so; the optimum is HiGHS's alone."""
    problem = pd_problem(seed, mip_gap=0.0)
    monkeypatch.setattr(ilp, "PD_MAX_REGIONS", 1)
    plan = solve_allocation(problem)
    reference = solve_allocation(problem, decompose=False)
    assert plan.status is reference.status
    if plan.status is PlanStatus.OPTIMAL:
        assert any("HiGHS from a rounded LP plan" in n for n in plan.notes)
        assert any(n.startswith("rounded LP plan") for n in plan.notes)
        assert plan.objective == pytest.approx(reference.objective, rel=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_pd_scarcity_matches_highs_within_the_gap(seed: int) -> None:
    """Scarcity with PD models by the decomposition's path (LP bound, heuristic plan, HiGHS
    near them) against HiGHS on the whole ILP: each one's proven bounds hold for the other's
    plan."""
    gap = 0.005
    problem = replace(pd_problem(seed, mip_gap=gap, nodes_per_type=(0, 2)), scarcity="goodput")
    plan = solve_allocation(problem)
    reference = solve_allocation(problem, decompose=False)
    assert plan.status is reference.status is PlanStatus.INFEASIBLE
    assert any(n.startswith("scarcity phase 1") for n in plan.notes)
    for p in (plan, reference):
        assert p.gap <= gap + 1e-12 and p.goodput_gap <= gap + 1e-12
        for (g, r), n in p.nodes_used.items():
            assert n <= problem.availability.get((g, r), 0)
    _bounds_hold(plan, reference)
    _bounds_hold(reference, plan)


def test_capacity_of_pd_columns_is_the_lesser_half_per_region() -> None:
    *_, dec, _ = _internals(pd_problem(5, mip_gap=0.0))
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 3, dec.n_cols)
    got = dec.capacity(counts)
    for m in range(dec.n_models):
        own = dec.col_model == m
        agg = own & (dec.col_half == -1)
        want = float(dec.col_cap[agg] @ counts[agg])
        for r in range(len(REGIONS)):
            halves = [float(dec.col_cap[own & (dec.col_half == h) & (dec.col_region == r)]
                            @ counts[own & (dec.col_half == h) & (dec.col_region == r)])
                      for h in (0, 1)]
            want += min(halves)
        assert got[m] == pytest.approx(want)


@pytest.mark.parametrize("seed", range(4))
def test_pd_models_keep_branch_and_price_throughout(seed: int, monkeypatch) -> None:
    """HiGHS takes over from branch and price only without PD models (it is far behind on
    PD ILPs): held to no share at all, a PD solve still never hands over, and still agrees
    with HiGHS on the whole ILP."""
    monkeypatch.setattr(ilp, "DECOMPOSED_SHARE", 0.0)
    problem = pd_problem(seed, mip_gap=0.0)
    plan = solve_allocation(problem)
    assert not any(n.startswith("HiGHS after branch and price") for n in plan.notes)
    reference = solve_allocation(problem, decompose=False)
    assert plan.status is reference.status
    if plan.status is PlanStatus.OPTIMAL:
        assert plan.objective == pytest.approx(reference.objective, rel=1e-6)


def test_unpaired_halves_are_left_out_of_a_plan() -> None:
    """A prefill (decode) instance in a region without a decode (prefill) instance of its model
    serves nothing: the decoded plan leaves it out, costs less and serves the same."""
    from coral.allocator.problem import make_plan

    problem = pd_problem(5, mip_gap=0.0)
    by_model: dict[tuple[str, str], dict[str, str]] = {}
    for t in problem.templates:
        for r in t.price_usd_per_hour:
            by_model.setdefault((t.model, r), {}).setdefault(t.mode, t.id)
    paired = next(k for k, v in by_model.items() if {"prefill", "decode"} <= set(v))
    lone = next((k, v["prefill"]) for k, v in by_model.items() if "prefill" in v)
    counts = {(by_model[paired]["prefill"], paired[1]): 2,
              (by_model[paired]["decode"], paired[1]): 3}
    with_lone = dict(counts)
    key = (lone[1], lone[0][1])
    if key in with_lone:  # the only prefill column is the paired one: drop its decode instead
        del with_lone[(by_model[paired]["decode"], paired[1])]
        counts = {}
    else:
        with_lone[key] = 4
    full = make_plan(problem, with_lone, status=PlanStatus.FEASIBLE, gap=1.0, solve_s=0.0)
    clean = make_plan(problem, counts, status=PlanStatus.FEASIBLE, gap=1.0, solve_s=0.0)
    assert full.instances == clean.instances
    assert full.cost_usd_per_hour == pytest.approx(clean.cost_usd_per_hour)
    assert full.served_rps == clean.served_rps
    assert any("unpaired" in n for n in full.notes)
