"""The PD cover (`pd_cover`), one model's cheapest units when regions serve what both their
prefill and decode halves carry, against exhaustive enumeration on small random instances:
aggregated items beside PD halves in two regions, least units (`lo`) as branching sets them,
free items (cost 0), hints good and bad, demands nothing can meet."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from coral.allocator.decomposition.pd_cover import (
    AGG,
    DECODE,
    PREFILL,
    pd_cover,
    pd_cover_rest,
    served,
)


def _instance(seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7))
    half = rng.choice([AGG, PREFILL, DECODE], n)
    region = rng.integers(0, 2, n)
    cap = np.round(rng.uniform(0.5, 5.0, n), int(rng.choice([1, 3])))
    cost = np.round(cap * rng.uniform(0.8, 1.5, n), 2)
    if rng.random() < 0.2:
        cost[rng.integers(n)] = 0.0
    hi = rng.integers(0, 4, n)
    lo = np.minimum(np.where(rng.random(n) < 0.2, rng.integers(0, 2, n), 0), hi)
    reach = served(cap, half, region, hi)
    demand = float(rng.uniform(0.1, 1.0) * max(1.0, reach))
    if rng.random() < 0.1:
        demand = reach + 1.0  # nothing serves it
    return cost, cap, lo, hi, half, region, np.array([demand])


def _cheapest(cost, cap, lo, hi, half, region, demand) -> float:
    best = math.inf
    for units in itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi)]):
        x = np.array(units, dtype=np.int64)
        if served(cap, half, region, x) >= demand - 1e-9 * max(1.0, demand):
            best = min(best, float(cost @ x))
    return best


@pytest.mark.parametrize("seed", range(60))
def test_pd_cover_is_the_cheapest_cover(seed: int) -> None:
    cost, cap, lo, hi, half, region, (demand,) = _instance(seed)
    best = _cheapest(cost, cap, lo, hi, half, region, demand)
    sol = pd_cover(cost, cap, lo, hi, half, region, float(demand))
    if math.isinf(best):
        assert sol.x is None and math.isinf(sol.value)
        return
    assert sol.x is not None
    assert sol.value == pytest.approx(best, rel=1e-9, abs=1e-9)
    assert sol.lower_bound == sol.value  # exact
    assert (sol.x >= lo).all() and (sol.x <= hi).all()
    assert served(cap, half, region, sol.x) >= demand * (1.0 - 1e-9)
    assert float(cost @ sol.x) == pytest.approx(sol.value)


@pytest.mark.parametrize("seed", range(60, 90))
def test_hints_do_not_change_the_answer(seed: int) -> None:
    """A feasible hint only prunes (the optimum is still found); one out of bounds or short
    of the demand is ignored."""
    cost, cap, lo, hi, half, region, (demand,) = _instance(seed)
    plain = pd_cover(cost, cap, lo, hi, half, region, float(demand))
    hints = (hi.copy(), lo.copy(), hi + 1)
    hinted = pd_cover(cost, cap, lo, hi, half, region, float(demand), hints=hints)
    assert hinted.value == pytest.approx(plain.value, rel=1e-12) or (
        math.isinf(hinted.value) and math.isinf(plain.value))


def test_a_region_serves_the_lesser_half() -> None:
    """Prefill for 10 req/s and decode for 4 in one region serve 4; the cheapest cover of 7
    adds decode there rather than a second region's pair."""
    cap = np.array([10.0, 4.0, 3.0, 10.0, 10.0])
    cost = np.array([5.0, 2.0, 1.5, 5.0, 5.0])
    half = np.array([PREFILL, DECODE, DECODE, PREFILL, DECODE])
    region = np.array([0, 0, 0, 1, 1])
    lo = np.zeros(5, dtype=np.int64)
    hi = np.array([1, 1, 1, 1, 1])
    assert served(cap, half, region, np.array([1, 1, 0, 0, 0])) == 4.0
    sol = pd_cover(cost, cap, lo, hi, half, region, 7.0)
    assert list(sol.x) == [1, 1, 1, 0, 0] and sol.value == 8.5


@pytest.mark.parametrize("seed", range(150, 170))
def test_a_state_cap_keeps_the_bound_proven(seed: int, monkeypatch) -> None:
    """With frontiers cut to a couple of states the answer may be worse, never infeasible,
    and its lower bound still holds for the true optimum."""
    from coral.allocator.decomposition import pd_cover as module

    cost, cap, lo, hi, half, region, (demand,) = _instance(seed)
    best = _cheapest(cost, cap, lo, hi, half, region, demand)
    monkeypatch.setattr(module, "MAX_STATES", 2)
    sol = pd_cover(cost, cap, lo, hi, half, region, float(demand))
    if math.isinf(best):
        assert sol.x is None
        return
    assert sol.x is not None and served(cap, half, region, sol.x) >= demand * (1 - 1e-9)
    assert sol.lower_bound <= best + 1e-9 <= sol.value + 2e-9


@pytest.mark.parametrize("seed", range(170, 230))
def test_pd_cover_rest_covers_whenever_the_units_can(seed: int) -> None:
    """The quick cover for large models: a cover within lo..hi whenever hi serves the demand
    (each group in turn may take all it can), never cheaper than the exact one."""
    cost, cap, lo, hi, half, region, (demand,) = _instance(seed)
    sol = pd_cover_rest(cost, cap, lo, hi, half, region, float(demand))
    if served(cap, half, region, hi) < demand - 1e-9 * max(1.0, demand):
        assert sol.x is None
        return
    assert sol.x is not None
    assert (sol.x >= lo).all() and (sol.x <= hi).all()
    assert served(cap, half, region, sol.x) >= demand - 1e-9 * max(1.0, demand)
    assert sol.value == pytest.approx(float(cost @ sol.x))
    assert sol.lower_bound <= _cheapest(cost, cap, lo, hi, half, region, demand) + 1e-9
    assert sol.value >= _cheapest(cost, cap, lo, hi, half, region, demand) - 1e-9
