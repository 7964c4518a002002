"""Plans given as starts (`solve_allocation(starts=...)`): the plan returned is never worse
than the best of them, whatever the time limit cuts short, on every solve path (the
decomposition's and HiGHS's on the whole ILP), in the cost problem and under scarcity. This
is what keeps `coral plan`'s default plan at least as good as any baseline whose plan lies in
Coral's columns (`coral.planning.plan` hands their plans in as starts)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from test_allocator_scarcity import scarce_problem

from coral.allocator.problem import AllocationPlan, ModelDemand
from coral.allocator.core import highs_runs
from coral.allocator.solve import ilp
from coral.allocator.scarcity import phases as scarcity
from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.solve.starts import best_start


def _no_worse(plan: AllocationPlan, start: AllocationPlan) -> None:
    if start.meets_demand:
        assert plan.meets_demand
        assert plan.objective <= start.objective * (1 + 1e-9)
    else:
        assert plan.goodput >= start.goodput * (1 - 1e-9)
        if plan.goodput <= start.goodput * (1 + 1e-9):
            assert plan.objective <= start.objective * (1 + 1e-9)


def _abundant(seed: int):
    problem = scarce_problem(seed, mip_gap=0.0)
    low = tuple(ModelDemand(d.model, d.requests_per_s / 8, priority=d.priority)
                for d in problem.demands)
    return dataclasses.replace(problem, demands=low)


@pytest.mark.parametrize("decompose", [True, False])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ["scarce", "abundant"])
def test_a_plan_given_as_start_is_never_beaten_by_the_result(kind, seed, decompose):
    problem = scarce_problem(seed, mip_gap=0.0) if kind == "scarce" else _abundant(seed)
    best = solve_allocation(problem, decompose=False)  # the optimum, as the start
    # a time limit that stops every phase at once: the start alone must carry the result
    hurried = dataclasses.replace(problem, time_limit_s=1e-6)
    plan = solve_allocation(hurried, decompose=decompose, starts=[dict(best.instances)])
    _no_worse(plan, best)
    assert plan.meets_demand == (kind == "abundant")
    for (g, r), n in plan.nodes_used.items():
        assert n <= problem.availability.get((g, r), 0)
    # the gaps still bound the optimum
    assert best.objective >= plan.objective * (1 - plan.gap) - 1e-6
    if kind == "scarce":
        assert best.goodput <= plan.goodput * (1 + plan.goodput_gap) + 1e-6


def test_starts_outside_the_problem_or_its_availability_are_not_plans():
    problem = scarce_problem(0, mip_gap=0.0)
    plan = solve_allocation(problem, decompose=False)
    (tid, region), n = next(iter(plan.instances.items()))
    assert best_start(problem, [{("no-such-column", region): 3}]).instances == {}
    too_many = {(tid, region): 10_000}
    assert best_start(problem, [too_many]) is None
    given = best_start(problem, [too_many, dict(plan.instances)])
    assert given is not None and given.instances == plan.instances


@pytest.mark.parametrize("kind", ["scarce", "abundant"])
def test_the_start_survives_a_search_that_finds_nothing(kind, monkeypatch):
    """HiGHS stopped before its first plan in every run (as a loaded machine's time limit
    does on large problems): the start is what comes back, not an empty plan."""
    problem = scarce_problem(1, mip_gap=0.0) if kind == "scarce" else _abundant(1)
    best = solve_allocation(problem, decompose=False)

    def nothing(*args, **kwargs):
        return highs_runs.HighsRun(ok=False, infeasible=False, optimal=False, values=None,
                                   objective=math.nan, bound=math.nan, gap=math.inf,
                                   detail="Time limit reached")

    for module in (highs_runs, scarcity, ilp):
        monkeypatch.setattr(module, "run_highs", nothing)
    assert solve_allocation(problem, decompose=False).goodput < best.goodput * 0.5
    plan = solve_allocation(problem, decompose=False, starts=[dict(best.instances)])
    _no_worse(plan, best)
    assert any("seeded with a given plan" in n for n in plan.notes)
