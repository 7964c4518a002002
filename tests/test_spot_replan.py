"""Re-planning a spot plan with a deployment running: keeping an instance is free, and
starting or stopping one costs its start-up (a stopped instance serves until those taking
over have started). The plan returned is the cheapest meeting the target by that measure,
checked against brute force over every plan and every failure set."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from test_spot import _brute_force, _cost, _exact_p_short, _instance, _pd_instance

from coral.allocator.spot.planner import SpotOptions, SpotPlanError, plan_spot, spot_columns


def _running(problem, market, seed: int) -> dict:
    """A deployment within availability: some entries (on demand or spot) at one instance."""
    rng = random.Random(seed)
    full = spot_columns(problem, market).problem
    used: dict = {}
    current = {}
    for t in full.templates:
        for r in t.price_usd_per_hour:
            if rng.random() < 0.4 and all(
                    used.get((g, r), 0) + n <= problem.availability.get((g, r), 0)
                    for g, n in t.node_counts.items()):
                current[(t.id, r)] = 1
                for g, n in t.node_counts.items():
                    used[(g, r)] = used.get((g, r), 0) + n
    if not current:  # one instance of the first column (at most 2 nodes: within availability)
        t = full.templates[0]
        current[(t.id, next(iter(t.price_usd_per_hour)))] = 1
    return current


def _replan_cost(sp, problem, market) -> float:
    by_id = {t.id: t for t in sp.columns.problem.templates}
    total = 0.0
    for key in set(sp.plan.instances) | set(problem.current):
        tid, r = key
        t = by_id[tid]
        rate = (sum(market.rate_per_hour[(g, r)] for g in t.node_counts)
                if tid in sp.columns.base else 0.0)
        total += _cost(t.price_usd_per_hour[r], rate, sp.plan.instances.get(key, 0),
                       problem.current.get(key, 0))
    return total


#: Seeds 16 and 38 of the PD instances: deployments where counting the stops changes the
#: cheapest plan (`test_counting_the_stops_changes_the_plan_somewhere`).
SEEDS = [*range(8), 16, 38]


@pytest.mark.parametrize("instance", [_instance, _pd_instance], ids=["aggregated", "pd"])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_replan_against_a_running_deployment_matches_brute_force(instance, seed: int) -> None:
    problem, market = instance(seed)
    running = dataclasses.replace(problem, current=_running(problem, market, seed))
    assert running.current  # the seeds give a deployment to re-plan from
    best, best_x = _brute_force(running, market, 0.99)
    if not math.isfinite(best):
        with pytest.raises(SpotPlanError):
            plan_spot(running, market, SpotOptions(risk_target=0.99))
        return
    sp = plan_spot(running, market, SpotOptions(risk_target=0.99))
    assert _replan_cost(sp, running, market) == pytest.approx(best, rel=1e-9, abs=1e-9), (
        sp.plan.instances, best_x, running.current)
    for d in problem.demands:
        assert 1.0 - _exact_p_short(sp, d.model) >= 0.99 - 1e-9


def test_counting_the_stops_changes_the_plan_somewhere(monkeypatch) -> None:
    """The brute force above can tell the objectives apart: with stops free (as before), the
    cheapest re-plan of some deployments moves more instances."""
    import test_spot

    def stops_free(price: float, rate: float, n: int, running: int) -> float:
        hourly = price * (1 + rate * test_spot.STARTUP_S / 3600.0)
        return n * hourly + max(n - running, 0) * hourly * test_spot.STARTUP_S / 3600.0

    differ = 0
    for seed in (16, 38):
        problem, market = _pd_instance(seed)
        running = dataclasses.replace(problem, current=_running(problem, market, seed))
        _, counted = _brute_force(running, market, 0.99)
        with monkeypatch.context() as m:
            m.setattr(test_spot, "_cost", stops_free)
            _, free = _brute_force(running, market, 0.99)
        moved = [sum(abs(x.get(k, 0) - running.current.get(k, 0))
                     for k in set(x) | set(running.current)) for x in (counted, free)]
        differ += moved[0] < moved[1]
    assert differ == 2


def test_the_replanner_starts_each_replan_from_the_last_plan(monkeypatch) -> None:
    """The plan file's plan starts the first re-plan, and each re-plan's plan the next one:
    restarting what was lost is always a candidate."""
    from types import SimpleNamespace

    from coral.planning import preemption_replan
    from coral.planning.options import PlanOptions
    from coral.planning.preemption_replan import AllocatorReplanner

    seen: list = []
    plans = iter([{("c", "r1"): 4}, {("b", "r1"): 1}])

    def fake_plan(scenario, **kw):
        seen.append(kw["starts"])
        counts = next(plans)
        rows = [SimpleNamespace(template_id=k[0], region=k[1], count=n)
                for k, n in counts.items()]
        return SimpleNamespace(instances=rows, cost_per_hour=1.0, status="optimal")

    monkeypatch.setattr(preemption_replan, "plan_scenario", fake_plan)
    replanner = AllocatorReplanner.__new__(AllocatorReplanner)
    replanner.scenario = replanner.catalog = replanner.perf = replanner.templates = None
    replanner.options, replanner.spot = PlanOptions(time_limit_s=10.0), None
    replanner.last = preemption_replan._counts([
        SimpleNamespace(template_id="a@spot", region="r1", count=2),
        SimpleNamespace(template_id="a@spot", region="r1", count=1)])
    replanner({("a@spot", "r1"): 1}, 10.0)
    replanner({("a@spot", "r1"): 2}, 20.0)
    assert seen == [[{("a@spot", "r1"): 3}], [{("c", "r1"): 4}]]
    assert replanner.last == {("b", "r1"): 1}
