"""The compiled knapsack (`knapsack_dp`) against the array code it replaced
(`knapsack_reference.py`), on random instances of every kind it is called with: covers with
least units, hints, gaps, pools, and state caps small enough to bind.

Both compute the same sums in the same order, so everything must agree exactly: the solution,
its value, the proven bound and the pool (ties included)."""

from __future__ import annotations

import math

import knapsack_reference
import numpy as np
import pytest

from coral.allocator.decomposition.knapsack import knapsack_dp


def _instance(seed: int) -> tuple[tuple, dict]:
    """Small to allocator-sized instances: many items whose cost per capacity differ by a
    few percent, groups of equal capacity, costs rounded or small integers (ties) or not."""
    rng = np.random.default_rng(seed)
    n = int(rng.choice([1, 3, 8, 20, 60, 140]))
    shapes = max(1, n // int(rng.choice([1, 2, 4])))
    cap = np.round(rng.uniform(0.5, 40.0, shapes), int(rng.choice([1, 4])))
    cap = rng.choice(cap, n)  # equal capacities: one template in several regions
    spread = float(rng.choice([0.002, 0.02, 0.3]))
    cost = cap * rng.uniform(1.0, 1.0 + spread, n) * float(rng.uniform(0.5, 3.0))
    if rng.random() < 0.5:
        cost = np.round(cost, 2)
    if rng.random() < 0.2:  # small integers: many solutions of equal value
        cap = rng.integers(1, 5, n).astype(float)
        cost = cap * float(rng.integers(1, 3)) + rng.integers(0, 2, n)
    if rng.random() < 0.15:
        cost[rng.integers(n)] = 0.0  # a node priced at nothing (goodput pricing)
    ub = rng.integers(0, int(rng.choice([2, 6, 40])), n)
    total = float(cap @ ub)
    demand = float(rng.uniform(0.05, 1.1) * max(total, 1.0))
    if rng.random() < 0.1:
        demand = float(rng.uniform(0.0, 1e-9))  # nothing to cover
    kw: dict = {}
    if rng.random() < 0.3:
        kw["lo"] = np.minimum(ub, rng.integers(0, 3, n) * (rng.random(n) < 0.2))
    if rng.random() < 0.3:
        kw["hints"] = tuple(rng.integers(-1, 5, n) if rng.random() < 0.2
                            else np.minimum(ub, rng.integers(0, 4, n)) for _ in range(2))
    if rng.random() < 0.4:
        kw["rel_gap"] = float(rng.choice([1e-6, 1e-3, 0.02]))
    if rng.random() < 0.5:
        kw["pool"] = int(rng.choice([1, 3, 8]))
    if rng.random() < 0.3:
        kw["max_states"] = int(rng.choice([1, 3, 20]))
    return (cost, cap, ub, demand), kw


def _check(args: tuple, kw: dict) -> None:
    got = knapsack_dp(*args, **kw)
    want = knapsack_reference.knapsack_dp(*args, **kw)
    if want.x is None:
        assert got.x is None and got.value == want.value == math.inf
        assert got.lower_bound == want.lower_bound
        return
    assert got.x is not None and np.array_equal(got.x, want.x)
    assert got.value == want.value
    assert got.lower_bound == want.lower_bound
    assert len(got.pool) == len(want.pool)
    for (v_got, x_got), (v_want, x_want) in zip(got.pool, want.pool):
        assert v_got == v_want and np.array_equal(x_got, x_want)


@pytest.mark.parametrize("block", range(8))
def test_kernel_matches_array_code(block: int) -> None:
    for seed in range(50 * block, 50 * (block + 1)):
        args, kw = _instance(seed)
        _check(args, kw)


def test_state_cap_binds() -> None:
    """Near-identical items and a cap of a few states: the cap folds bounds into the lower
    bound alike."""
    rng = np.random.default_rng(7)
    cap = np.round(rng.uniform(1.0, 40.0, 120), 4)
    cost = np.round(cap * rng.uniform(0.40, 0.41, 120), 4)
    ub = rng.integers(1, 60, 120)
    for max_states in (1, 2, 5, 50):
        for kw in ({}, {"pool": 4}):
            _check((cost, cap, ub, 413.98), {"max_states": max_states, **kw})
            capped = knapsack_dp(cost, cap, ub, 413.98, max_states=max_states, **kw)
            assert capped.lower_bound <= capped.value


def test_import_without_a_writable_cache_compiles_in_memory() -> None:
    """A read-only install with no writable home (numba finds no cache locator) still
    imports and solves, compiling in memory, and says so once."""
    import os
    import subprocess
    import sys

    code = ("import numpy as np\n"
            "from coral.allocator.decomposition.knapsack import cover_dp\n"
            "print(cover_dp(np.array([1.0, 2.0]), np.array([1.0, 3.0]), np.array([5, 5]),"
            " 4.0).value)\n")
    # only the zip-import locator: none applies to a file on disk, as when none is writable
    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "ZipCacheLocator"}
    env.pop("NUMBA_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3.0"
    assert out.stderr.count("no writable cache directory") == 1
