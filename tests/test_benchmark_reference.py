"""The allocator benchmark's `--reference` gap: a timed plan's gap proven with a longer
solve's bounds as well as its own, and never with a bound that does not hold for it."""

from __future__ import annotations

import math

import pytest
from conftest import benchmark_module

from coral.allocator.problem import AllocationPlan
from coral.allocator.problem import PlanStatus



@pytest.fixture(scope="module")
def bench():
    with benchmark_module("allocator.py", "allocator_benchmark") as module:
        yield module


def _plan(cost: float, gap: float, served: float, *, goodput_gap: float = 0.0,
          demand: float = 10.0) -> AllocationPlan:
    """A plan sought by the goodput objective (a fair plan's gaps are per phase, below)."""
    return AllocationPlan(
        status=PlanStatus.OPTIMAL if served >= demand else PlanStatus.INFEASIBLE,
        instances={}, cost_usd_per_hour=cost, penalty_usd=0.0,
        demand_rps={"m": demand}, capacity_rps={"m": served}, served_rps={"m": served},
        goodput=served, nodes_used={}, started={}, stopped={}, gap=gap, solve_s=0.1,
        goodput_gap=goodput_gap, scarcity="goodput",
    )


def test_a_tighter_reference_bound_proves_the_timed_plan_closer(bench):
    timed = _plan(100.0, 0.02, 10.0)  # bound 98
    reference = _plan(99.5, 0.001, 10.0)  # bound 99.4005
    assert bench.gap_by_reference(timed, reference) == pytest.approx(0.005995)


def test_a_looser_reference_bound_leaves_the_timed_gap(bench):
    timed = _plan(100.0, 0.002, 10.0)
    reference = _plan(100.0, 0.05, 10.0)
    assert bench.gap_by_reference(timed, reference) == pytest.approx(0.002)


def test_a_reference_meeting_demand_proves_a_short_plan_short_by_its_shortfall(bench):
    timed = _plan(50.0, 0.0, 8.0, goodput_gap=0.5)
    reference = _plan(80.0, 0.0, 10.0)
    assert bench.gap_by_reference(timed, reference) == pytest.approx(0.25)  # 10 vs 8


def test_a_reference_cost_bound_holds_only_at_its_goodput_or_more(bench):
    # the reference serves more: its cost bound is for plans of that goodput, not the timed one's
    timed = _plan(50.0, 0.01, 8.0, goodput_gap=0.02)  # goodput bound 8.16
    reference = _plan(60.0, 0.0, 8.1, goodput_gap=0.001)  # goodput bound 8.1081, cost 60
    assert bench.gap_by_reference(timed, reference) == pytest.approx(0.1081 / 8.0)
    # the timed plan serves as much as the reference: its cost bound holds too
    level = _plan(50.0, 0.05, 8.0, goodput_gap=0.0)
    cheaper_bound = _plan(49.9, 0.0, 8.0)
    assert bench.gap_by_reference(level, cheaper_bound) == pytest.approx(0.1 / 50.0)


def test_nothing_proven_reads_infinite(bench):
    timed = _plan(100.0, math.inf, 10.0)
    reference = _plan(100.0, math.inf, 10.0)
    assert bench.gap_by_reference(timed, reference) == math.inf


def test_a_fair_plan_is_proven_by_the_better_fairness_bound_and_its_own_later_phases(bench):
    """A fair plan short of demand: its smallest served fraction against the better of the
    two solves' fairness bounds (a reference meeting demand proves 1); the tokens and cost
    phases keep their own gaps, as the reference's hold at its own floors."""
    from dataclasses import replace

    fair = replace(_plan(50.0, 0.0, 8.0), scarcity="fair", fair_level=0.8,
                   phase_gaps={"fairness": 0.10, "tokens": 0.01, "cost": 0.03})
    # own bound 0.88; a reference at 0.82 proven within 2 % bounds it by 0.8364
    ref = replace(_plan(60.0, 0.0, 8.2), scarcity="fair", fair_level=0.82,
                  phase_gaps={"fairness": 0.02})
    assert bench.gap_by_reference(fair, ref) == pytest.approx(0.8364 / 0.8 - 1.0)
    # a reference meeting demand bounds the level by 1; the cost phase's 3 % is larger
    assert bench.gap_by_reference(fair, _plan(80.0, 0.0, 10.0)) == pytest.approx(0.10)
    tight = replace(fair, phase_gaps={"fairness": 0.0, "tokens": 0.01, "cost": 0.03})
    assert bench.gap_by_reference(tight, ref) == pytest.approx(0.03)
