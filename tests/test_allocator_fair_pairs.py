"""Neighbourhoods by pairs of models in the fair phases (`scarcity/fair_pairs.py`): their
order, and plans that keep every column outside the pair and hold against the oracle."""

from __future__ import annotations

import numpy as np
import pytest
from test_allocator_fair import SEEDS, fair_ilp, scarce_pool, solved_against_oracle

from coral.allocator.decomposition.lagrange import Decomposition
from coral.allocator.scarcity import fair, fair_pairs


def _pairs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on large problems: no HiGHS run on every column; and neither the run near the LP
    nor the tokens heuristic keeps a plan, so the tokens and cost phases improve only by
    pairs of models."""
    monkeypatch.setattr(fair, "WHOLE_RUN_COLUMNS_PER_S", 0.0)
    monkeypatch.setattr(fair, "WHOLE_RUN_MIN_COLUMNS", 0)
    near_lp = fair.run_on_support
    monkeypatch.setattr(fair, "run_on_support", lambda *a, **kw: (near_lp(*a, **kw)[0], None))
    monkeypatch.setattr(fair, "tokens_fill", lambda dec, value, counts, price: counts)


def _dec(cap: list[float], model: list[int], demand: list[float]) -> Decomposition:
    n = len(cap)
    return Decomposition(
        demand=np.array(demand), priority=np.ones(len(demand)),
        col_model=np.array(model), col_cap=np.array(cap), col_price=np.ones(n),
        col_penalty=np.zeros(n), col_current=np.zeros(n, dtype=np.int64),
        col_ub=np.full(n, 5, dtype=np.int64), usage=np.ones((n, 1)), avail=np.array([9.0]))


def test_pairs_join_a_model_above_its_floor_with_one_held_at_it_first() -> None:
    dec = _dec([1.0, 1.0, 2.0, 1.0], [0, 1, 1, 2], [10.0, 10.0, 10.0])
    x = np.array([2, 1, 1, 4])  # served 2, 3, 4 of floors 2, 2.5, 2: models 2 then 1 above
    masks = fair_pairs.model_pairs(dec, x, np.array([2.0, 2.5, 2.0]))
    pairs = [tuple(int(m) for m in np.unique(dec.col_model[mask])) for mask in masks]
    assert pairs == [(0, 2), (0, 1), (1, 2)]  # with the one at its floor, most above first
    assert all(len(p) == 2 for p in pairs) and len(set(pairs)) == 3


@pytest.mark.parametrize("seed", SEEDS)
def test_pair_runs_keep_the_other_columns_and_hold_against_the_oracle(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # each pair's plan keeps the other columns at the plan's counts, and the phases' plans
    # and gaps hold against the oracle
    _pairs_only(monkeypatch)
    runs = []

    def spy(arr, v, objective, col_lb, row_lb, x, free, **kw):
        run, y = fair_pairs.run_around(arr, v, objective, col_lb, row_lb, x, free, **kw)
        if y is not None:
            assert (y[~free] == x[~free]).all()
        runs.append(kw["cutoff"])
        return run, y

    monkeypatch.setattr(fair, "run_around", spy)
    problem, oracle, plan = solved_against_oracle(seed)
    if plan.fair_level >= oracle.fair_level * (1.0 - 1e-6):  # at the oracle's floor
        assert plan.tokens_per_s <= oracle.tokens_per_s * (1.0 + 1e-6) + 1e-6
        gap = plan.phase_gaps["tokens"]
        assert plan.tokens_per_s * (1.0 + gap) >= oracle.tokens_per_s * (1.0 - 1e-5) - 1e-6
    if any("pairs of models" in note for note in plan.notes):
        assert runs


@pytest.mark.parametrize("seed", SEEDS)
def test_a_pair_run_holds_the_other_models_at_the_plan(seed: int) -> None:
    # the tokens objective from no plan: the pair (0, 1) first, then (1, 2) from its plan,
    # which must keep model 0's instances as they are
    problem = scarce_pool(seed)
    lp, v, dec, fr, arr, col_lb = fair_ilp(problem)
    objective = np.zeros(lp.n_col)
    objective[v.s] = -fr.token_value
    x = np.zeros(len(v.x), dtype=np.int64)
    for pair in ((0, 1), (1, 2)):
        free = np.isin(dec.col_model, pair)
        value = -float(fr.token_value @ dec.served(x))
        _, y = fair_pairs.run_around(arr, v, objective, col_lb, arr.row_lb, x, free,
                                     cutoff=value, target=-np.inf, time_limit_s=5.0,
                                     mip_gap=0.0, threads=1)
        if y is None:
            continue
        assert dec.fits(y) and (y[~free] == x[~free]).all()
        assert -float(fr.token_value @ dec.served(y)) <= value + 1e-9
        x = y
    assert x.any()
