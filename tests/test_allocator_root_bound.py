"""HiGHS's bound from a child process (`core/root_bound.py`): never above the best plan the
oracle finds, the cutoff's meaning, and a child that stops when told."""

from __future__ import annotations

import time

import numpy as np
import pytest
from test_allocator_fair import fairness_phase

from coral.allocator.core.root_bound import RootBound


def _phase_a(seed: int) -> tuple:
    """(arrays, objective of the fairness phase, column lower bounds, the oracle's level,
    the LP's bound) of `scarce_pool(seed)`."""
    oracle, (_, _, _, _, arr, col_lb), objective, relaxed = fairness_phase(seed)
    return arr, objective, col_lb, oracle.fair_level, relaxed.value


def _finish(child: RootBound, within_s: float = 30.0) -> float:
    """The child's bound once it has ended by itself."""
    end = time.perf_counter() + within_s
    while child._proc.poll() is None and time.perf_counter() < end:
        time.sleep(0.02)
    assert child._proc.poll() is not None, "the child did not end"
    return child.stop()


@pytest.mark.parametrize("seed", range(6))
def test_child_bound_holds_against_the_oracle(seed: int) -> None:
    # minimising -t: the child's bound is never above minus the oracle's level, and, run to
    # the end at gap 0, it proves that level
    arr, objective, col_lb, level, lp_bound = _phase_a(seed)
    child = RootBound(arr, objective, col_lb, arr.row_lb, cutoff=np.inf, mip_gap=0.0,
                         time_limit_s=20.0)
    bound = _finish(child)
    assert lp_bound - 1e-9 <= bound <= -level + 1e-7
    assert bound == pytest.approx(-level, abs=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_a_cutoff_below_the_optimum_leaves_the_cutoff_as_the_bound(seed: int) -> None:
    # nothing is below a cutoff under the optimum: every solution is at least the cutoff
    arr, objective, col_lb, level, _ = _phase_a(seed)
    if level <= 0.0:
        pytest.skip("no level above 0 to cut below")
    cutoff = -level * 1.5
    child = RootBound(arr, objective, col_lb, arr.row_lb, cutoff=cutoff, mip_gap=0.0,
                         time_limit_s=20.0)
    bound = _finish(child)
    assert bound <= -level + 1e-7
    assert bound >= cutoff - 1e-9


def test_stop_ends_the_child_at_once() -> None:
    arr, objective, col_lb, _, _ = _phase_a(0)
    child = RootBound(arr, objective, col_lb, arr.row_lb, cutoff=np.inf, mip_gap=0.0,
                         time_limit_s=600.0)
    start = time.perf_counter()
    child.stop()
    assert time.perf_counter() - start < 2.0
    assert child._proc.poll() is not None
    assert child.bound() <= 0.0 or child.bound() == -np.inf
