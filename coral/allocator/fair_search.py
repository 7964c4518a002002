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

from coral.allocator.branch_price import INTEGRALITY_TOL
from coral.allocator.lagrange import Bounds, Decomposition, Pricer
from coral.allocator.pd_cover import AGG
from coral.allocator.plan_search import fill_goodput


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
    """Raise the smallest level `served_m / (weight_m demand_m)` of `counts` one instance at
    a time (the lowest model's column of most capacity per node value that fits), until the
    lowest model has no column left that fits or every level reaches `top`."""
    x = counts.copy()
    left = dec.avail - dec.used(x)
    use = dec.usage
    value = use @ node_value
    value = value + 1e-6 * max(float(value.max(initial=0.0)), 1e-9) + 1e-12
    scale = weight * dec.demand
    room = dec.col_ub - x
    fits = (use <= left[None, :] + 1e-9).all(axis=1) & (room > 0)
    per_value = dec.col_cap / value
    blocked = np.zeros(dec.n_models, dtype=bool)
    cap = dec.capacity(x)
    while True:
        with np.errstate(divide="ignore", invalid="ignore"):
            level = np.where(scale > 0, np.minimum(cap, dec.demand) / scale, np.inf)
        level[blocked] = np.inf
        m = int(np.argmin(level))
        if not np.isfinite(level[m]) or level[m] >= top:
            return x
        mine = np.flatnonzero((dec.col_model == m) & fits)
        if dec.is_pd(m):  # a PD model gains only by pairs: its halves are left to HiGHS
            mine = mine[dec.col_half[mine] == AGG]
        if not len(mine):
            blocked[m] = True
            continue
        j = int(mine[np.argmax(per_value[mine])])
        x[j] += 1
        room[j] -= 1
        left -= use[j]
        cap[m] += dec.col_cap[j]
        rows = use[j] > 0
        fits &= (use[:, rows] <= left[rows][None, :] + 1e-9).all(axis=1)
        fits[j] &= room[j] > 0


def tokens_fill(dec: Decomposition, out_tokens: np.ndarray, counts: np.ndarray,
                node_value: np.ndarray) -> np.ndarray:
    """`counts` with the nodes left filled, most tokens/s per node value first."""
    return fill_goodput(replace(dec, priority=out_tokens.astype(float)), counts, node_value)


#: Relative width at which `level_bound`'s bisection stops.
LEVEL_BOUND_REL_TOL = 1e-4


def level_bound(dec: Decomposition, weight: np.ndarray, node_price: np.ndarray, lo: float,
                hi: float, *, deadline: float) -> float:
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
    gained nothing more). PD models' covers are left to the LP (`hi`)."""
    if dec.has_pd or not (node_price > 0).any() or not hi > lo:
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
