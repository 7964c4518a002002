"""The allocation ILP against the exhaustive oracle on random tiny problems."""

from __future__ import annotations

import pytest
from test_allocator_support import random_problem

from coral.allocator.problem import AllocationPlan, AllocationProblem, PlanStatus
from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.solve.bruteforce import solve_bruteforce

SEEDS = range(40)


def _check_plan_valid(problem: AllocationProblem, plan: AllocationPlan) -> None:
    for (g, r), n in plan.nodes_used.items():
        assert n <= problem.availability.get((g, r), 0), (g, r)
    by_id = {t.id: t for t in problem.templates}
    for (tid, r), n in plan.instances.items():
        assert n > 0 and r in by_id[tid].price_usd_per_hour


def _agree(problem: AllocationProblem) -> None:
    """Both solve paths (per-model covers first, and the ILP alone) match the oracle."""
    oracle = solve_bruteforce(problem)
    for decompose in (True, False):
        plan = solve_allocation(problem, decompose=decompose)
        _check_plan_valid(problem, plan)
        assert plan.status is oracle.status, decompose
        assert plan.goodput == pytest.approx(oracle.goodput, rel=1e-6, abs=1e-6)
        assert plan.objective == pytest.approx(oracle.objective, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_aggregated_cost_matches_oracle(seed: int) -> None:
    _agree(random_problem(seed))


@pytest.mark.parametrize("seed", SEEDS)
def test_pd_pairing_matches_oracle(seed: int) -> None:
    _agree(random_problem(1000 + seed, pd=True))


@pytest.mark.parametrize("seed", SEEDS)
def test_startup_penalty_matches_oracle(seed: int) -> None:
    # 2 h of loading: a penalty the size of two hours' price, so keeping instances matters
    _agree(random_problem(2000 + seed, with_current=True, startup_s=7200.0))


def test_random_instances_cover_both_outcomes() -> None:
    """Guards the factory: the oracle tests must see met demand and scarcity alike."""
    statuses = {solve_bruteforce(random_problem(s)).status for s in SEEDS}
    assert statuses == {PlanStatus.OPTIMAL, PlanStatus.INFEASIBLE}
    pd_statuses = {solve_bruteforce(random_problem(1000 + s, pd=True)).status for s in SEEDS}
    assert pd_statuses == {PlanStatus.OPTIMAL, PlanStatus.INFEASIBLE}


@pytest.mark.parametrize("seed", range(20))
def test_presolve_is_lossless(seed: int) -> None:
    problem = random_problem(3000 + seed, with_current=seed % 2 == 0, startup_s=3600.0,
                             n_templates=4)
    with_presolve = solve_allocation(problem, presolve=True)
    without = solve_allocation(problem, presolve=False)
    assert with_presolve.status is without.status
    assert with_presolve.goodput == pytest.approx(without.goodput, rel=1e-9, abs=1e-9)
    assert with_presolve.objective == pytest.approx(without.objective, rel=1e-9, abs=1e-9)
