"""The per-model knapsack (`knapsack_dp`) against enumeration on random small instances."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from coral.allocator.decomposition.knapsack import cover_dp, knapsack_dp


def _random(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 6))
    cap = np.round(rng.uniform(0.5, 10.0, n), 2)
    if rng.random() < 0.5:  # equal capacities: one template in several regions
        cap = rng.choice(cap[: max(1, n // 2)], n)
    cost = np.round(cap * rng.uniform(0.8, 1.2, n) + rng.uniform(0.0, 1.0, n), 2)
    if rng.random() < 0.2:
        cost[rng.integers(n)] = 0.0  # a node priced at nothing (goodput pricing)
    return {
        "cost": cost,
        "cap": cap,
        "ub": rng.integers(0, 5, n),
        "demand": float(np.round(rng.uniform(0.5, 30.0), 2)),
        "lo": np.minimum(rng.integers(0, 5, n), rng.integers(0, 2, n))
        if rng.random() < 0.3 else None,
    }


def _enumerate(cost, cap, ub, demand, lo) -> float:
    best = math.inf
    ranges = [range(0 if lo is None else int(lo[i]), int(k) + 1) for i, k in enumerate(ub)]
    for x in itertools.product(*ranges):
        x = np.array(x)
        if cap @ x < demand - 1e-9:
            continue
        best = min(best, float(cost @ x))
    return best


def _value(case: dict, x: np.ndarray) -> float:
    return float(case["cost"] @ x)


def _valid(case: dict, x: np.ndarray) -> bool:
    lo = 0 if case["lo"] is None else case["lo"]
    return bool((x >= lo).all() and (x <= case["ub"]).all()
                and case["cap"] @ x >= case["demand"] - 1e-9)


@pytest.mark.parametrize("seed", range(300))
def test_exact_optimum_and_bound(seed: int) -> None:
    case = _random(seed)
    best = _enumerate(**case)
    sol = knapsack_dp(**case, pool=3)
    if best == math.inf:
        assert sol.x is None and sol.lower_bound == math.inf
        return
    assert sol.x is not None and _valid(case, sol.x)
    assert sol.value == pytest.approx(best, abs=1e-9)
    assert _value(case, sol.x) == pytest.approx(sol.value, abs=1e-9)
    assert sol.lower_bound == pytest.approx(best, abs=1e-9)
    assert sol.complete
    for value, x in sol.pool:  # the other solutions are valid and priced right
        assert _valid(case, x) and _value(case, x) == pytest.approx(value, abs=1e-9)


@pytest.mark.parametrize("seed", range(150))
@pytest.mark.parametrize("rel_gap", [1e-3, 0.05])
def test_gap_keeps_a_valid_bound(seed: int, rel_gap: float) -> None:
    case = _random(seed)
    best = _enumerate(**case)
    sol = knapsack_dp(**case, rel_gap=rel_gap)
    if best == math.inf:
        assert sol.x is None
        return
    assert _valid(case, sol.x)
    assert sol.lower_bound <= best + 1e-9 <= sol.value + 2e-9
    assert sol.value - sol.lower_bound <= rel_gap * abs(sol.value) + 1e-9


def test_state_cap_keeps_a_valid_bound() -> None:
    """Many near-identical items: the capped programme still brackets the optimum."""
    rng = np.random.default_rng(7)
    cap = np.round(rng.uniform(1.0, 40.0, 120), 4)
    cost = np.round(cap * rng.uniform(0.40, 0.41, 120), 4)
    ub = rng.integers(1, 60, 120)
    exact = cover_dp(cost, cap, ub, 413.98)
    capped = cover_dp(cost, cap, ub, 413.98, max_states=5)
    assert exact.complete
    assert capped.lower_bound <= exact.value + 1e-9 <= capped.value + 2e-9


def test_hints_start_the_search() -> None:
    cost = np.array([3.0, 2.1, 1.0])
    cap = np.array([3.0, 2.0, 1.0])
    ub = np.array([5, 5, 5])
    plain = cover_dp(cost, cap, ub, 7.0)
    hinted = cover_dp(cost, cap, ub, 7.0, hints=(np.array([0, 0, 7]), np.array([9, 0, 0])))
    assert hinted.value == pytest.approx(plain.value) == pytest.approx(7.0)


def test_infeasible_cover() -> None:
    sol = cover_dp(np.array([1.0]), np.array([1.0]), np.array([2]), 3.0)
    assert sol.x is None and sol.value == math.inf and sol.complete
