"""The fair scarcity objective against the exhaustive oracle on small scarce pools: the
fairness level (max-min of the served fraction) first, then priority-weighted generated
tokens/s, then cost; and what it changes against the goodput objective."""

from __future__ import annotations

import math
import random
import re
import time
from dataclasses import replace

import numpy as np
import pytest
from test_allocator_support import column

from coral.allocator.problem import AllocationProblem, ModelDemand, PlanStatus
from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.solve.bruteforce import solve_bruteforce
from coral.allocator.scarcity import fair, fair_search
from coral.allocator.core import formulation, highs_runs, presolve
from coral.allocator.problem import fair_levels, fair_weights

NODES = ("g1", "g2")
REGIONS = ("r1", "r2")


def scarce_pool(seed: int) -> AllocationProblem:
    """Three models of different output lengths and priorities, five single-type templates
    over one or two regions, a few nodes each: demand beyond what the pool serves."""
    rng = random.Random(seed)
    regions = REGIONS[: rng.choice((1, 2))]
    node_price = {(g, r): round(rng.uniform(0.5, 4.0), 2) for g in NODES for r in regions}
    models = ("m1", "m2", "m3")
    templates = []
    for i in range(5):
        g = rng.choice(NODES)
        n = rng.choice((1, 1, 2))
        prices = {r: round(n * node_price[(g, r)], 4) for r in regions}
        templates.append(column(f"t{i}", models[i % 3], {g: n},
                                round(rng.uniform(1.0, 5.0) * n, 2), prices))
    availability = {(g, r): rng.randint(1, 3) for g in NODES for r in regions}
    demands = tuple(ModelDemand(m, round(rng.uniform(6.0, 20.0), 2),
                                output_tokens=rng.choice((50.0, 200.0, 800.0)),
                                priority=rng.choice((1.0, 1.0, 2.0)))
                    for m in models)
    return AllocationProblem(demands=demands, templates=tuple(templates), regions=regions,
                             availability=availability, time_limit_s=20.0, mip_gap=0.0)


def fair_ilp(problem: AllocationProblem) -> tuple:
    """The fair objective's ILP of `problem` as `solve_allocation` builds it: (builder,
    variables, decomposition, fair rows, arrays, column lower bounds with the slack free)."""
    ix = presolve.Index.build(problem)
    cols = presolve.run_presolve(problem, ix, dominance=True)
    lp = formulation.LpBuilder()
    v = formulation.add_variables(lp, problem, ix, cols)
    formulation.add_plan_rows(lp, ix, v)
    dec = formulation.decomposition_of(ix, v, lp)
    fr = fair.add_fair_rows(lp, problem, ix, v)
    arr = lp.arrays()
    col_lb = arr.col_lb.copy()
    col_lb[v.s] = 0.0
    return lp, v, dec, fr, arr, col_lb


def fairness_phase(seed: int) -> tuple:
    """(the oracle's plan, `fair_ilp`'s tuple, the fairness phase's objective (minimise -t),
    its LP relaxation) of `scarce_pool(seed)`."""
    problem = scarce_pool(seed)
    oracle = solve_bruteforce(problem)
    ilp = fair_ilp(problem)
    lp, v, _, fr, arr, col_lb = ilp
    objective = np.zeros(lp.n_col)
    objective[fr.t] = -1.0
    relaxed = highs_runs.lp_relaxation(arr, objective, col_lb, arr.row_lb, lp, len(v.x))
    assert relaxed is not None
    return oracle, ilp, objective, relaxed


def solved_against_oracle(seed: int) -> tuple:
    """(problem, brute-force optimum, `solve_allocation`'s plan) of `scarce_pool(seed)`, the
    plan checked to fit the pools and to claim no higher level than the optimum's."""
    problem = scarce_pool(seed)
    oracle = solve_bruteforce(problem)
    plan = solve_allocation(problem)
    for (g, r), n in plan.nodes_used.items():
        assert n <= problem.availability.get((g, r), 0)
    assert plan.fair_level <= oracle.fair_level + 1e-9
    return problem, oracle, plan




SEEDS = range(16)


@pytest.mark.parametrize("seed", SEEDS)
def test_fair_matches_oracle(seed: int) -> None:
    problem = scarce_pool(seed)
    oracle = solve_bruteforce(problem)
    plan = solve_allocation(problem)
    assert plan.status is oracle.status is PlanStatus.INFEASIBLE
    for (g, r), n in plan.nodes_used.items():
        assert n <= problem.availability.get((g, r), 0)
    assert plan.scarcity == "fair"
    assert plan.fair_level == pytest.approx(oracle.fair_level, rel=1e-6, abs=1e-9)
    assert plan.tokens_per_s == pytest.approx(oracle.tokens_per_s, rel=1e-6, abs=1e-6)
    assert plan.objective == pytest.approx(oracle.objective, rel=1e-6, abs=1e-6)
    assert set(plan.phase_gaps) == {"fairness", "tokens", "cost"}
    # the floors held a hair (`fair.FAIR_REL_TOL`) below the phase before leave as much gap
    assert all(g <= 1e-5 for g in plan.phase_gaps.values()), plan.phase_gaps



@pytest.mark.parametrize("seed", SEEDS)
def test_neighbourhoods_in_place_of_the_whole_run_prove_only_what_holds(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # as on large problems: no time for HiGHS on the columns reduced costs leave, so each
    # phase ends on the LP's neighbourhoods; its plan and the gap it claims hold against
    # the oracle
    monkeypatch.setattr(fair, "WHOLE_RUN_COLUMNS_PER_S", 0.0)
    monkeypatch.setattr(fair, "WHOLE_RUN_MIN_COLUMNS", 0)
    problem, oracle, plan = solved_against_oracle(seed)
    # the whole run (its note: "HiGHS on N of M columns (status)") is never made
    assert not any(re.search(r"HiGHS on \d+ of \d+ columns \(", note) for note in plan.notes)
    gap = plan.phase_gaps["fairness"]
    assert plan.fair_level * (1.0 + gap) >= oracle.fair_level * (1.0 - 1e-6) - 1e-9


@pytest.mark.parametrize("seed", (0, 1, 2, 4, 5))  # a phase's gap open after the LP's columns
def test_neighbourhoods_take_columns_of_every_model(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # the neighbourhoods after the LP's and the plan's columns hold each model's columns of
    # least reduced cost, so no model is left only its LP columns, and what they find still
    # holds against the oracle
    monkeypatch.setattr(fair, "WHOLE_RUN_COLUMNS_PER_S", 0.0)
    monkeypatch.setattr(fair, "WHOLE_RUN_MIN_COLUMNS", 0)
    monkeypatch.setattr(fair, "NEIGHBOURHOODS", (1,))
    neighbourhoods: list[tuple] = []
    near = fair.near_columns

    def spy(dec, relaxed, v, x, per_model):
        support = near(dec, relaxed, v, x, per_model=per_model)
        neighbourhoods.append((dec, support))
        return support

    monkeypatch.setattr(fair, "near_columns", spy)
    problem, oracle, plan = solved_against_oracle(seed)
    assert neighbourhoods
    for dec, support in neighbourhoods:
        assert set(np.unique(dec.col_model[support])) == set(np.unique(dec.col_model))
    for name, gap in plan.phase_gaps.items():
        assert gap >= 0.0, name
    assert plan.fair_level * (1.0 + plan.phase_gaps["fairness"]) \
        >= oracle.fair_level * (1.0 - 1e-6) - 1e-9


def test_oracle_orders_fairness_before_tokens_before_cost() -> None:
    """The oracle's fair plan is never below any other vector's fairness level, nor below
    the goodput objective's plan on it, and the goodput plan serves no fewer weighted req/s."""
    for seed in SEEDS:
        problem = scarce_pool(seed)
        fair = solve_bruteforce(problem)
        greedy = solve_bruteforce(replace(problem, scarcity="goodput"))
        assert fair.fair_level >= greedy.fair_level - 1e-9
        assert greedy.goodput >= fair.goodput - 1e-9
        if fair.fair_level == pytest.approx(greedy.fair_level, abs=1e-12):
            assert fair.tokens_per_s >= greedy.tokens_per_s - 1e-6


def test_fair_does_not_starve_the_expensive_model() -> None:
    """One cheap model and one whose requests take four times the nodes: the goodput
    objective gives every node to the cheap one and none to the other; the fair one serves
    both the same share, then spends the rest on tokens."""
    templates = (column("cheap", "small", {"g1": 1}, 4.0, {"r1": 1.0}),
                 column("dear", "large", {"g1": 4}, 4.0, {"r1": 4.0}))
    demands = (ModelDemand("small", 40.0, output_tokens=100.0),
               ModelDemand("large", 40.0, output_tokens=100.0))
    base = AllocationProblem(demands=demands, templates=templates, regions=("r1",),
                             availability={("g1", "r1"): 10}, mip_gap=0.0)
    greedy = solve_allocation(replace(base, scarcity="goodput"))
    assert greedy.served_rps["large"] == 0.0 and greedy.served_rps["small"] == 40.0
    fair = solve_allocation(base)
    # 10 nodes: 2 dear (8 nodes) + 2 cheap serve 8 req/s each, the most equal split
    assert fair.served_rps == {"small": 8.0, "large": 8.0}
    assert fair.fair_level == pytest.approx(0.2)
    assert fair.min_served_fraction == pytest.approx(0.2)
    assert fair.tokens_per_s == pytest.approx(1600.0)
    assert fair.proof.startswith("demand short, fair: fairness gap 0.00%")


def test_priority_orders_what_is_left_above_an_equal_floor() -> None:
    """Priority never lowers a model's floor (every model gets the same served fraction `t`
    first, so none falls below what the uniform scale-down gives every model); what the floor
    leaves goes to the model of higher priority."""
    demands = (ModelDemand("a", 10.0, priority=1.0), ModelDemand("b", 10.0, priority=2.0))
    assert fair_weights(demands) == {"a": 1.0, "b": 1.0}
    levels = fair_levels(demands, {"a": 4.0, "b": 3.0})
    assert levels == {"a": pytest.approx(0.4), "b": pytest.approx(0.3)}
    assert fair_levels(demands, {"a": 10.0, "b": 10.0}) == {"a": 1.0, "b": 1.0}
    templates = (column("ta", "a", {"g1": 1}, 1.0, {"r1": 1.0}),
                 column("tb", "b", {"g1": 1}, 1.0, {"r1": 1.0}))
    problem = AllocationProblem(demands=demands, templates=templates, regions=("r1",),
                                availability={("g1", "r1"): 7}, mip_gap=0.0)
    plan = solve_allocation(problem)
    # the floor: 3 req/s each (t = 0.3); the seventh node goes to b, of twice a's priority
    assert plan.fair_level == pytest.approx(0.3)
    assert plan.served_rps["a"] == pytest.approx(3.0)
    assert plan.served_rps["b"] == pytest.approx(4.0)
    assert plan.served_rps == solve_bruteforce(problem).served_rps


def test_scarcity_objective_is_checked() -> None:
    with pytest.raises(ValueError, match="scarcity must be one of fair, goodput"):
        replace(scarce_pool(0), scarcity="fairest")  # type: ignore[arg-type]


def test_fair_gaps_are_finite_under_a_time_limit() -> None:
    plan = solve_allocation(replace(scarce_pool(3), time_limit_s=0.5, mip_gap=0.005))
    assert all(math.isfinite(g) for g in plan.phase_gaps.values())


@pytest.mark.parametrize("seed", SEEDS)
def test_level_bound_and_water_filling_hold_against_the_oracle(seed: int) -> None:
    """The covers' bound on the fairness level is never below the best plan's level, and a
    water-filled plan fits and is never above it."""
    oracle, (lp, v, dec, fr, arr, col_lb), objective, relaxed = fairness_phase(seed)
    x = fair_search.level_fill(dec, fr.weight, np.zeros(len(v.x), dtype=np.int64),
                               relaxed.node_price)
    assert dec.fits(x)
    level = fair.fair_level(dec, fr, x)
    assert level <= oracle.fair_level + 1e-9
    bound = fair_search.level_bound(dec, fr.weight, relaxed.node_price, level, -relaxed.value,
                                    deadline=time.perf_counter() + 5.0)
    assert oracle.fair_level <= bound + 1e-9 <= -relaxed.value + 2e-9


def test_plans_of_one_floor_rank_by_priority_weighted_tokens() -> None:
    """Between two fair plans of the same floor, `coral plan` keeps the one with more
    priority-weighted tokens/s, the quantity the tokens phase maximises, even when the
    other serves more tokens in all."""
    from coral.planning.plan import _plan_rank

    demands = (ModelDemand("a", 10.0, output_tokens=100.0, priority=1.0),
               ModelDemand("b", 10.0, output_tokens=60.0, priority=2.0))
    templates = (column("ta", "a", {"g1": 1}, 1.0, {"r1": 1.0}),
                 column("tb", "b", {"g1": 1}, 1.0, {"r1": 1.0}))
    problem = AllocationProblem(demands=demands, templates=templates, regions=("r1",),
                                availability={("g1", "r1"): 7}, mip_gap=0.0)
    plan = solve_allocation(problem)
    # floor 3 req/s each; the seventh node to b: 60 x 2 = 120 > 100 x 1 weighted tokens
    assert plan.served_rps == {"a": pytest.approx(3.0), "b": pytest.approx(4.0)}
    assert plan.priority_tokens_per_s == pytest.approx(3 * 100 + 2 * 4 * 60)
    to_a = replace(plan, served_rps={"a": 4.0, "b": 3.0}, tokens_per_s=580.0,
                   priority_tokens_per_s=4 * 100 + 2 * 3 * 60)
    assert to_a.tokens_per_s > plan.tokens_per_s
    assert _plan_rank(plan) < _plan_rank(to_a)
