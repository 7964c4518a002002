"""Relax-and-fix by model (`core/relax_fix.py`) on random PD problems: its plans meet every
demand within availability (checked on the plan `make_plan` builds, not on the ILP), cost no
less than HiGHS's proven optimum, and respect the cutoff."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from test_allocator_pd_decomposition import pd_problem
from test_allocator_scarcity import _internals

from coral.allocator.core.highs_runs import lp_relaxation
from coral.allocator.problem import PlanStatus, make_plan
from coral.allocator.solve import ilp, rounded_start
from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.core.relax_fix import near_columns, relax_and_fix, rounding_order


def _fixed(problem, cutoff: float = math.inf):
    ix, v, lp, arr, dec, _ = _internals(problem)
    relaxed = lp_relaxation(arr, arr.cost, arr.col_lb, arr.row_lb, lp, len(v.x))
    if relaxed is None:
        return ix, v, dec, None, None
    x = relax_and_fix(arr, v, dec, relaxed, objective=arr.cost, col_lb=arr.col_lb,
                      row_lb=arr.row_lb, deadline=time.perf_counter() + 5.0, threads=1,
                      cutoff=cutoff)
    return ix, v, dec, relaxed, x


@pytest.mark.parametrize("seed", range(10))
def test_plans_meet_demand_and_cost_no_less_than_the_optimum(seed: int) -> None:
    problem = pd_problem(seed, mip_gap=0.0)
    reference = solve_allocation(problem, decompose=False)
    ix, v, dec, relaxed, x = _fixed(problem)
    if reference.status is not PlanStatus.OPTIMAL:
        assert x is None  # no plan meets demand, so none is made
        return
    assert relaxed is not None and x is not None
    instances = {(ix.templates[v.x_t[i]].id, ix.regions[v.x_r[i]]): int(x[i])
                 for i in np.flatnonzero(x > 0)}
    plan = make_plan(problem, instances, status=PlanStatus.FEASIBLE, gap=math.inf,
                     solve_s=0.0)
    assert plan.meets_demand
    for key, n in plan.nodes_used.items():
        assert n <= problem.availability.get(key, 0)
    assert plan.objective == pytest.approx(dec.cost(x), rel=1e-9)
    assert relaxed.value - 1e-6 <= reference.objective <= plan.objective + 1e-6


@pytest.mark.parametrize("seed", range(10))
def test_no_plan_below_a_cutoff_under_the_optimum(seed: int) -> None:
    problem = pd_problem(seed, mip_gap=0.0)
    reference = solve_allocation(problem, decompose=False)
    if reference.status is not PlanStatus.OPTIMAL:
        return
    *_, x = _fixed(problem, cutoff=reference.objective * (1.0 - 1e-6) - 1e-9)
    assert x is None


def test_lumpiest_models_first_and_their_columns_kept() -> None:
    problem = pd_problem(4, mip_gap=0.0)
    ix, v, lp, arr, dec, _ = _internals(problem)
    relaxed = lp_relaxation(arr, arr.cost, arr.col_lb, arr.row_lb, lp, len(v.x))
    assert relaxed is not None
    order = rounding_order(dec, relaxed.x)
    up = np.ceil(relaxed.x - 1e-6) - relaxed.x
    up = np.where(up > 1e-6, up, 0.0)
    rounding = [float((up * dec.col_price)[dec.col_model == m].sum()) for m in order]
    assert sorted(order.tolist()) == sorted(set(dec.col_model.tolist()))
    assert rounding == sorted(rounding, reverse=True)
    near = near_columns(dec, relaxed, v, None, per_model=1)
    assert near[relaxed.x > 1e-6].all()
    for m in order:  # each model keeps at least its column of least reduced cost
        assert near[dec.col_model == m].any()


@pytest.mark.parametrize("seed", (1, 4, 8, 11))
def test_rounded_start_takes_relax_and_fix_where_the_whole_ilp_does_not_follow(
        seed: int, monkeypatch) -> None:
    """Past exact PD covers and past the whole ILP's size (both limits lowered here), the
    cost solve's plan comes from relax-and-fix or the runs after it: it meets demand within
    availability, and its proven gap holds against HiGHS's optimum."""
    problem = pd_problem(seed, mip_gap=0.0)
    reference = solve_allocation(problem, decompose=False)
    monkeypatch.setattr(ilp, "PD_MAX_REGIONS", 1)
    monkeypatch.setattr(rounded_start, "WHOLE_ILP_MAX_COLUMNS", 0)
    plan = solve_allocation(problem)
    assert reference.status is PlanStatus.OPTIMAL and plan.meets_demand
    assert any("relax-and-fix by model" in n for n in plan.notes)
    for key, n in plan.nodes_used.items():
        assert n <= problem.availability.get(key, 0)
    assert plan.objective >= reference.objective - 1e-6
    assert reference.objective >= plan.objective * (1.0 - plan.gap) - 1e-6
