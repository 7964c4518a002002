"""The spot solve within its time limit: wherever the deadline falls, the repair returns a
plan meeting the risk target exactly or none, and `plan_spot` a plan meeting it exactly or a
`SpotPlanError`, with no phase working on past the deadline. Time is a counter that ticks at
every reading of the clock, so the tests do not depend on the machine's speed."""

from __future__ import annotations

import time
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Iterator

import numpy as np
import pytest
from test_spot import _exact_p_short, _instance, _pd_instance

from coral.allocator.spot import planner as spot, ilp as spot_ilp, repair as spot_repair
from coral.allocator.spot.planner import (
    SpotOptions,
    SpotPlanError,
    plan_spot,
    spot_arrays,
    spot_columns,
)
from coral.allocator.spot.repair import ModelRisk, exact_table, repair


class TickingClock:
    """`time.perf_counter` as a counter: each reading is one tick later than the last."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class SilentPhases:
    """`spot.PhaseClock` without clock readings, so that the ticks count the solve's own."""

    rows: list = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield


@pytest.fixture
def clock(monkeypatch) -> TickingClock:
    tick = TickingClock()
    fake = SimpleNamespace(perf_counter=tick, process_time=time.process_time)
    for module in (spot, spot_ilp, spot_repair):
        monkeypatch.setattr(module, "time", fake)
    monkeypatch.setattr(spot, "PhaseClock", SilentPhases)
    return tick


def _meets_target(a, x: np.ndarray, prob_down, budget: float) -> bool:
    for m in range(len(a.models)):
        exact = exact_table(a, m, x, prob_down)
        if exact is not None:
            table, cap, need = exact
            if cap[0] < need or float(table.prob @ (cap < need)) + table.left > budget + 1e-12:
                return False
    return bool((a.capacity(x) >= a.demand * (1 - 1e-9)).all())


@pytest.mark.parametrize("instance", [_instance, _pd_instance], ids=["aggregated", "pd"])
def test_the_repair_stops_at_its_deadline_with_a_plan_meeting_the_target_or_none(
        instance, clock: TickingClock) -> None:
    budget = 0.01
    cut_short = completed = 0
    for seed in range(12):
        problem, market = instance(seed)
        a = spot_arrays(spot_columns(problem, market), market)
        naive = plan_spot(problem, market, SpotOptions(risk_target=0.0))
        x0 = a.vector(naive.plan.instances)
        risks = [ModelRisk(a, m, market.prob_down, 0.0, 10_000) if a.spot_pools_of(m) else None
                 for m in range(len(a.models))]
        if _meets_target(a, x0, market.prob_down, budget):
            continue
        free = repair(a, risks, x0, budget)
        for ticks in range(40):
            clock.now = 0.0
            x = repair(a, risks, x0, budget, deadline=float(ticks))
            if x is None:
                cut_short += 1
                continue
            assert a.fits(x) and _meets_target(a, x, market.prob_down, budget)
            completed += free is not None and np.array_equal(x, free)
    assert cut_short >= 1 and completed >= 1  # the deadline fell before and after the end


@pytest.mark.parametrize("instance", [_instance, _pd_instance], ids=["aggregated", "pd"])
@pytest.mark.parametrize("limit", [2, 8, 40])
def test_plan_spot_honours_its_time_limit(instance, limit: int, clock: TickingClock,
                                          monkeypatch) -> None:
    """Every phase ends by the deadline: no solve, relaxation or repair move (each taking a
    tick) starts once the clock is past it, the clock is read a few times at most after it (the phases left
    each read it once to find it has passed, and the plan its solve time), and what comes
    back meets the target exactly, whatever the limit cut short."""
    late: list[str] = []

    def watched(name, fn):
        """`fn` taking a tick of time, noted when it starts past the deadline."""
        def call(*args, **kw):
            if clock.now > 1.0 + limit:  # plan_spot's first reading is tick 1
                late.append(name)
            try:
                return fn(*args, **kw)
            finally:
                clock.now += 1.0
        return call

    monkeypatch.setattr(spot, "solve_allocation", watched("naive", spot.solve_allocation))
    monkeypatch.setattr(spot_ilp, "solve_round", watched("relaxation", spot_ilp.solve_round))
    monkeypatch.setattr(ModelRisk, "after", watched("repair move", ModelRisk.after))
    for seed in range(6):
        problem, market = instance(seed)
        problem = problem.__class__(**{**problem.__dict__, "time_limit_s": float(limit)})
        clock.now = 0.0
        try:
            sp = plan_spot(problem, market, SpotOptions(risk_target=0.99))
        except SpotPlanError:
            continue
        finally:
            assert clock.now <= limit + 8, clock.now
            assert not late, late
        for d in problem.demands:
            assert 1.0 - _exact_p_short(sp, d.model) >= 0.99 - 1e-9
            assert sp.plan.capacity_rps[d.model] >= d.requests_per_s * (1 - 1e-9)
