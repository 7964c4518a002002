"""Plans for the fair scarcity phases (`fair.py`) without a solver: HiGHS on a max-min
objective gets no guidance from reduced costs (only `t` is priced) and finds good plans
slowly, so each phase starts from one of these.

- `level_fill`: water filling, the model of the lowest level (served over its weighted
  demand) gets one more instance at a time, of its column of most capacity per node value;
- `tokens_fill`: the nodes left filled with the instances of most tokens/s per node value
  (`plan_search.fill_goodput`, output tokens as the weight), keeping every floor since it
  only adds;
- both from the LP optimum rounded down as well as from the plan so far, the better kept.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from coral.allocator.decomposition.branch_price import INTEGRALITY_TOL
from coral.allocator.decomposition.lagrange import Bounds, Decomposition, Pricer
from coral.allocator.decomposition.pd_cover import AGG, DECODE, PREFILL
from coral.allocator.decomposition.plan_search import fill_goodput


def rounded(dec: Decomposition, xbar: np.ndarray, floor: np.ndarray | None = None
            ) -> np.ndarray:
    """The LP's counts rounded down (within availability, as they were), at least `floor`
    where that fits."""
    x = np.clip(np.floor(xbar + INTEGRALITY_TOL).astype(np.int64), 0, dec.col_ub)
    if floor is not None:
        y = np.maximum(x, floor)
        if dec.fits(y):
            return y
    return x if dec.fits(x) else np.zeros(dec.n_cols, dtype=np.int64)


def level_fill(dec: Decomposition, weight: np.ndarray, counts: np.ndarray,
               node_value: np.ndarray, *, top: float = 1.0) -> np.ndarray:
    """Raise the smallest level `served_m / (weight_m demand_m)` of `counts` one move at a
    time, the lowest model's move of most capacity gained per node value that fits (one
    instance; for a PD model one half where the other half has room in its region, else a
    prefill and decode pair), until the lowest model has no move left or every level
    reaches `top`. Models left at nothing (the others took the nodes they can use first)
    get their moves first on another try, the fairest try kept."""
    best, first = None, ()
    for _ in range(dec.n_models):
        y = _fill_levels(dec, weight, counts, node_value, top, first=first)
        if best is None or _level(dec, weight, y) > _level(dec, weight, best):
            best = y
        starved = tuple(int(m) for m in np.flatnonzero(dec.served(y) <= 0)
                        if dec.demand[m] > 0 and m not in first)
        if not starved:
            break
        first = starved + first
    assert best is not None
    return best


def _level(dec: Decomposition, weight: np.ndarray, x: np.ndarray) -> float:
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.min(np.minimum(dec.served(x), dec.demand) / (weight * dec.demand)))


def _fill_levels(dec: Decomposition, weight: np.ndarray, counts: np.ndarray,
                 node_value: np.ndarray, top: float, first: tuple[int, ...]) -> np.ndarray:
    """`level_fill`'s water filling, the models in `first` given one move each up front."""
    x = counts.copy()
    left = dec.avail - dec.used(x)
    use = dec.usage
    value = use @ node_value
    # rows the prices leave at 0 still hold nodes others need: a hair of value per node
    value = value + 1e-6 * max(float(value.max(initial=0.0)), 1e-9) * (1.0 + use.sum(axis=1))
    scale = weight * dec.demand
    blocked = np.zeros(dec.n_models, dtype=bool)
    cols_of = [np.flatnonzero(dec.col_model == m) for m in range(dec.n_models)]
    cap = dec.capacity(x)
    queue = list(first)
    while True:
        with np.errstate(divide="ignore", invalid="ignore"):
            level = np.where(scale > 0, np.minimum(cap, dec.demand) / scale, np.inf)
        level[blocked] = np.inf
        m = queue.pop(0) if queue else int(np.argmin(level))
        if not np.isfinite(level[m]) or level[m] >= top:
            if queue:
                continue
            return x
        mine = cols_of[m]
        fits = mine[(x[mine] < dec.col_ub[mine])
                    & (use[mine] <= left[None, :] + 1e-9).all(axis=1)]
        move = _best_move(dec, x, m, fits, value, left)
        if move is None:
            blocked[m] = True
            continue
        for j in move:
            x[j] += 1
            left -= use[j]
        if (left < -1e-9).any():  # a pair that does not fit together
            for j in move:
                x[j] -= 1
                left += use[j]
            blocked[m] = True
            continue
        cap[m] = dec.capacity(x)[m]


def _best_move(dec: Decomposition, x: np.ndarray, m: int, fits: np.ndarray,
               value: np.ndarray, left: np.ndarray) -> tuple[int, ...] | None:
    """The columns to add to raise model `m`'s capacity most per node value (None: none)."""
    if not len(fits):
        return None
    half = dec.col_half[fits]
    gain = np.where(half == AGG, dec.col_cap[fits], 0.0)
    if dec.is_pd(m):
        own = np.flatnonzero((dec.col_model == m) & (dec.col_half != AGG))
        n_r = int(dec.col_region.max()) + 1
        have = np.zeros((n_r, 2))
        np.add.at(have, (dec.col_region[own], dec.col_half[own]),
                  dec.col_cap[own] * x[own])
        pd = half != AGG
        r, h = dec.col_region[fits[pd]], half[pd]
        mine, other = have[r, h], have[r, 1 - h]
        gain[pd] = np.minimum(mine + dec.col_cap[fits[pd]], other) - np.minimum(mine, other)
    if (gain > 1e-12).any():
        return (int(fits[np.argmax(gain / value[fits])]),)
    if not dec.is_pd(m):
        return None
    best, pick = 0.0, None
    for r in np.unique(dec.col_region[fits]):
        halves = [fits[(half == h) & (dec.col_region[fits] == r)] for h in (PREFILL, DECODE)]
        if not len(halves[0]) or not len(halves[1]):
            continue
        for first, second in ((0, 1), (1, 0)):  # the best of one half, then what fits beside
            a = halves[first][np.argmax(dec.col_cap[halves[first]] / value[halves[first]])]
            rest = halves[second]
            rest = rest[(dec.usage[rest] <= left[None, :] - dec.usage[a] + 1e-9).all(axis=1)]
            if not len(rest):
                continue
            b = rest[np.argmax(dec.col_cap[rest] / value[rest])]
            score = min(dec.col_cap[a], dec.col_cap[b]) / (value[a] + value[b])
            if score > best:
                best, pick = score, (int(a), int(b))
    return pick


def tokens_fill(dec: Decomposition, token_value: np.ndarray, counts: np.ndarray,
                node_value: np.ndarray) -> np.ndarray:
    """`counts` with the nodes left filled, most (priority-weighted) tokens/s per node value first."""
    return fill_goodput(replace(dec, priority=token_value.astype(float)), counts, node_value)


#: Relative width at which `level_bound`'s bisection stops.
LEVEL_BOUND_REL_TOL = 1e-4


def level_bound(dec: Decomposition, weight: np.ndarray, node_price: np.ndarray, lo: float,
                hi: float, *, deadline: float, pd_covers: bool = False) -> float:
    """An upper bound on the fairness level at most `hi` (the LP's), from per-model integer
    covers: at node prices `pi >= 0` (the LP's shadow prices), any plan of level `t` covers
    `weight_m demand_m t` of every model, each cover using nodes worth at least its cheapest
    integer cover at `pi` (`lagrange.Pricer`, exact knapsacks), all of them within
    availability, so

        sum_m cover_m(pi, weight_m demand_m t) <= pi . avail.

    A `t` where that fails is above every plan's level (covers only grow with `t`); the
    bisection between `lo` (a plan's level) and `hi` returns the least such `t` found, `hi`
    when none. The covers being whole instances is what it gains over the LP (on a synthetic
    core scarce draw, 1 % of the LP's 2.5 % gap; climbing the prices by subgradient steps
    gained nothing more). PD models are covered exactly (`decomposition/pd_cover.py`) only with
    `pd_covers` (problems whose covers are small enough); else the LP's bound stands (`hi`)."""
    if (dec.has_pd and not pd_covers) or not (node_price > 0).any() or not hi > lo:
        return hi
    n = dec.n_cols
    base = replace(dec, col_price=np.zeros(n), col_penalty=np.zeros(n))
    budget = float(node_price @ dec.avail)
    scale = weight * dec.demand

    def short(t: float) -> bool:
        at = replace(base, demand=scale * t)  # a new pricer: its cache is by prices only
        got = Pricer(at).price(node_price, Bounds.root(at))
        return got.bound > 1e-9 * max(1.0, budget)

    best = hi
    while best - lo > LEVEL_BOUND_REL_TOL * max(best, 1e-9) and time.perf_counter() < deadline:
        mid = 0.5 * (lo + best)
        if short(mid):
            best = mid
        else:
            lo = mid
    return best

