"""The Lagrangian bound and branch and price against enumeration on random tiny problems.

Each problem is a `Decomposition` made by hand: two models, four columns, two or three
availability rows, a few instances at most per column, some of them running now with a
start-up penalty. Enumerating every count vector gives the optimum the decomposition solves:
the cheapest plan meeting demand.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

from coral.allocator.decomposition.branch_price import solve_decomposed
from coral.allocator.decomposition.lagrange import (
    Bounds,
    Decomposition,
    Master,
    Pattern,
    Pricer,
    column_generation,
)
from coral.allocator.decomposition.plan_search import (
    best_part_plan,
    best_pattern_plan,
    round_and_repair,
)

def _random_decomposition(seed: int) -> Decomposition:
    rng = np.random.default_rng(seed)
    n_models, n_cols, n_rows = 2, 4, int(rng.integers(2, 4))
    col_model = np.array([0, 1] + list(rng.integers(0, n_models, n_cols - 2)))
    usage = rng.integers(0, 3, (n_cols, n_rows)).astype(float)
    usage[usage.sum(axis=1) == 0, 0] = 1.0  # every column uses some node
    cap = np.round(rng.uniform(1.0, 6.0, n_cols), 2)
    price = np.round(rng.uniform(0.5, 4.0, n_cols) * usage.sum(axis=1), 2)
    current = np.where(rng.random(n_cols) < 0.4, rng.integers(1, 3, n_cols), 0)
    return Decomposition(
        demand=np.round(rng.uniform(1.0, 12.0, n_models), 3),
        priority=rng.choice([0.5, 1.0, 2.0], n_models),
        col_model=col_model,
        col_cap=cap,
        col_price=price,
        col_penalty=np.round(price * rng.choice([0.0, 0.5, 2.0]), 4),
        col_current=current.astype(np.int64),
        col_ub=rng.integers(1, 4, n_cols).astype(np.int64),
        usage=usage,
        avail=rng.integers(1, 7, n_rows).astype(float),
    )


def _vectors(dec: Decomposition):
    for x in itertools.product(*[range(int(u) + 1) for u in dec.col_ub]):
        x = np.array(x, dtype=np.int64)
        if dec.fits(x):
            yield x


def _optimum(dec: Decomposition) -> float:
    """The cheapest plan's cost (inf when no plan meets demand)."""
    return min((dec.cost(x) for x in _vectors(dec) if dec.covers(x)), default=math.inf)


SEEDS = range(60)


@pytest.mark.parametrize("seed", SEEDS)
def test_bound_at_any_prices_is_below_the_optimum(seed: int) -> None:
    """L(pi) <= optimum for arbitrary prices, not only the converged ones."""
    dec = _random_decomposition(seed)
    best = _optimum(dec)
    rng = np.random.default_rng(1000 + seed)
    pricer = Pricer(dec)
    for _ in range(5):
        price = rng.uniform(0.0, 3.0, dec.n_rows) * (rng.random(dec.n_rows) < 0.7)
        got = pricer.price(price, Bounds.root(dec))
        if best == math.inf:
            continue  # any bound is valid
        assert got.bound <= best + 1e-7


@pytest.mark.parametrize("seed", SEEDS)
def test_column_generation_bound_is_below_the_optimum(seed: int) -> None:
    dec = _random_decomposition(seed)
    best = _optimum(dec)
    master = Master(dec)
    pricer = Pricer(dec)
    node = column_generation(master, pricer, Bounds.root(dec),
                             deadline=time.perf_counter() + 10)
    assert node.converged
    if best < math.inf:
        assert node.bound <= best + 1e-7
        assert node.master is not None


@pytest.mark.parametrize("seed", SEEDS)
def test_branch_and_price_finds_the_optimum(seed: int) -> None:
    dec = _random_decomposition(seed)
    best = _optimum(dec)
    res = solve_decomposed(dec, deadline=time.perf_counter() + 20, rel_gap=0.0)
    assert res.finished
    if best == math.inf:
        assert res.counts is None and res.bound == math.inf
        return
    assert res.counts is not None
    assert dec.fits(res.counts) and dec.covers(res.counts)
    assert res.objective == pytest.approx(best, rel=1e-9, abs=1e-9)
    # the bound sums terms as large as the duals, so it meets the optimum only to a
    # relative 1e-5 at worst
    assert res.gap <= 1e-5 and res.bound <= best + 1e-6 * max(1.0, abs(best))


@pytest.mark.parametrize("seed", range(30))
def test_plans_from_patterns_and_rounding_are_feasible(seed: int) -> None:
    dec = _random_decomposition(seed)
    rng = np.random.default_rng(2000 + seed)
    master = Master(dec)
    pricer = Pricer(dec)
    column_generation(master, pricer, Bounds.root(dec), deadline=time.perf_counter() + 5)
    plan = best_pattern_plan(dec, master.patterns, time_limit_s=5.0)
    xbar = rng.uniform(0.0, 1.0, dec.n_cols) * dec.col_ub
    xbar *= min(1.0, float(np.min(dec.avail / np.maximum(xbar @ dec.usage, 1e-9))))
    repaired = round_and_repair(dec, xbar)
    for x in (plan, repaired):
        if x is None:
            continue
        assert dec.fits(x) and (x >= 0).all() and (x <= dec.col_ub).all()
        assert dec.covers(x)


def test_random_problems_cover_both_outcomes() -> None:
    """Guards the factory: the cost problem must be feasible on some seeds, not on others."""
    feasible = {_optimum(_random_decomposition(s)) < math.inf for s in SEEDS}
    assert feasible == {True, False}


def test_pattern_parts_recombine_into_a_plan_no_pattern_holds():
    # one model in two regions: region 0 is cheap on column 0, region 1 on column 3; each
    # known pattern is cheap in one region only, and needs both to meet demand
    dec = Decomposition(
        demand=np.array([4.0]), priority=np.array([1.0]), col_model=np.zeros(4, np.int64),
        col_cap=np.array([2.0, 2.0, 2.0, 2.0]), col_price=np.array([1.0, 3.0, 3.0, 1.0]),
        col_penalty=np.zeros(4), col_current=np.zeros(4, np.int64),
        col_ub=np.full(4, 2, np.int64), usage=np.eye(4), avail=np.full(4, 2.0),
        col_half=np.full(4, -1, np.int64), col_region=np.array([0, 0, 1, 1]))
    a, b = np.array([1, 0, 1, 0]), np.array([0, 1, 0, 1])  # $4 each
    patterns = [Pattern(0, x, dec.cost(x), 4.0) for x in (a, b)]
    assert best_pattern_plan(dec, patterns, time_limit_s=5.0) is not None
    got = best_part_plan(dec, patterns, time_limit_s=5.0)
    assert got is not None and dec.covers(got) and dec.fits(got)
    assert dec.cost(got) == pytest.approx(2.0)  # a's region 0 with b's region 1
    assert list(got) == [1, 0, 0, 1]
