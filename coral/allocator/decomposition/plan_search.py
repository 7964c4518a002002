"""Plans for the decomposition of `lagrange.py` without a search tree: the primal side of
branch and price (`branch_price.py`), also run on their own by the allocator's solve
(`solve/ilp.py`) and its scarcity phases (`scarcity/phases.py`).

- `best_pattern_plan`: one pattern per model within availability, a 0/1 programme over the
  pattern pool (HiGHS solves it in milliseconds: set-partitioning structure);
- `best_part_plan`: the same over pattern parts (a PD pattern's regions apart), for plans the
  pool holds only in pieces;
- `round_and_repair`: the master's counts rounded down and each model's cover completed at
  least cost from the nodes left (`knapsack_dp`, `pd_cover`);
- `running_plan`: the instances running now, when they are a plan;
- `improve_by_model`: the cost problem's local search, one model's cover solved again with
  the nodes the others leave;
- `fill_goodput` / `goodput_plan`: under scarcity, the counts rounded down, the nodes left
  filled greedily, most goodput per shadow price first, then one instance out and the nodes
  filled again while that gains.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace

import highspy
import numpy as np

from coral.allocator.decomposition.knapsack import knapsack_dp
from coral.allocator.decomposition.lagrange import Bounds, Decomposition, ModelItems, Pattern
from coral.allocator.decomposition.pd_cover import AGG, pd_cover, pd_cover_rest
from coral.solvers import quiet_highs

log = logging.getLogger(__name__)

_INF = highspy.kHighsInf
#: A fractional master value closer than this to an integer counts as integral.
INTEGRALITY_TOL = 1e-6
#: Passes of `round_and_repair` over the models.
REPAIR_PASSES = 4


def feasible(dec: Decomposition, counts: np.ndarray) -> bool:
    """`counts` fit the availability and cover every demand."""
    return dec.fits(counts) and dec.covers(counts)


def _solve_binary(cost: np.ndarray, mat: np.ndarray, lower: np.ndarray, upper: np.ndarray, *,
                  time_limit_s: float, rel_gap: float, cutoff: float = math.inf,
                  target: float = -math.inf) -> np.ndarray | None:
    """The chosen columns of min `cost y`, `lower <= y mat <= upper`, y in {0, 1} (rows of
    `mat` are columns), by HiGHS; None when no solution is found in time."""
    n, rows = mat.shape
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = rows
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.ones(n)
    lp.row_lower_ = lower
    lp.row_upper_ = upper
    nz_col, nz_row = np.nonzero(mat)
    start = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(nz_col, minlength=n), out=start[1:])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = start
    lp.a_matrix_.index_ = nz_row.astype(np.int32)
    lp.a_matrix_.value_ = mat[nz_col, nz_row]
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    h = quiet_highs()
    h.setOptionValue("time_limit", float(max(time_limit_s, 1e-3)))
    h.setOptionValue("mip_rel_gap", float(rel_gap))
    if math.isfinite(cutoff):
        h.setOptionValue("objective_bound", float(cutoff))
    if math.isfinite(target):
        h.setOptionValue("objective_target", float(target))
    h.passModel(lp)
    h.run()
    if h.getInfo().primal_solution_status != 2:
        return None
    return np.flatnonzero(np.rint(np.array(h.getSolution().col_value)) > 0)


def best_pattern_plan(dec: Decomposition, patterns: list[Pattern], *, time_limit_s: float,
                      cutoff: float = math.inf) -> np.ndarray | None:
    """The cheapest plan made of one pattern per model within availability, by a 0/1
    programme over the patterns; None when none is found in time."""
    by_model = np.array([p.model for p in patterns], dtype=np.int64)
    if not len(patterns) or len(np.unique(by_model)) < dec.n_models:
        return None
    n = len(patterns)
    used = np.array([dec.used(p.counts) for p in patterns]).reshape(n, dec.n_rows)
    rows = dec.n_rows + dec.n_models
    mat = np.zeros((n, rows))
    mat[:, :dec.n_rows] = used
    mat[np.arange(n), dec.n_rows + by_model] = 1.0
    lower = np.concatenate([np.full(dec.n_rows, -_INF), np.ones(dec.n_models)])
    upper = np.concatenate([dec.avail.astype(float), np.ones(dec.n_models)])
    pick = _solve_binary(np.array([p.cost for p in patterns]), mat, lower, upper,
                         time_limit_s=time_limit_s, rel_gap=1e-7, cutoff=cutoff)
    if pick is None:
        return None
    counts = np.zeros(dec.n_cols, dtype=np.int64)
    for i in pick:
        counts += patterns[i].counts
    if not feasible(dec, counts):
        log.warning("a pattern plan failed a row; ignored")
        return None
    return counts


def best_part_plan(dec: Decomposition, patterns: list[Pattern], *, time_limit_s: float,
                   cutoff: float = math.inf, rel_gap: float = 1e-4,
                   target: float = -math.inf) -> np.ndarray | None:
    """The cheapest plan meeting every demand made of parts of patterns: each pattern split
    by region and by kind (its aggregated instances, its prefill/decode pairs), and for every
    (model, region, kind) at most one part, by a 0/1 programme. A part's cost and capacity
    are its own (columns are per region, and a region's pairs serve what both halves carry),
    so they add up; patterns from different search nodes recombine into plans no single one
    of them is part of. None when none is found in time."""
    parts: list[np.ndarray] = []
    group_of: list[int] = []
    groups: dict[tuple[int, int, bool], int] = {}
    seen: set[tuple[int, bytes]] = set()
    pd_col = dec.col_half != AGG
    for p in patterns:
        on = np.flatnonzero(p.counts)
        if not len(on):
            continue
        for r in np.unique(dec.col_region[on]):
            for is_pd in (False, True):
                cols = on[(dec.col_region[on] == r) & (pd_col[on] == is_pd)]
                if not len(cols):
                    continue
                sub = np.zeros(dec.n_cols, dtype=np.int64)
                sub[cols] = p.counts[cols]
                key = (p.model, sub.tobytes())
                if key in seen:
                    continue
                seen.add(key)
                g = groups.setdefault((p.model, int(r), is_pd), len(groups))
                parts.append(sub)
                group_of.append(g)
    n = len(parts)
    if not n:
        return None
    mat_parts = np.array(parts)
    model_of = np.array([k[0] for k in sorted(groups, key=groups.get)], dtype=np.int64)
    part_model = model_of[np.array(group_of)]
    used = mat_parts @ dec.usage  # (parts, rows)
    cap = np.array([dec.capacity(x)[m] for x, m in zip(parts, part_model)])
    cost = np.array([dec.cost(x) for x in parts])
    need = np.flatnonzero(dec.demand > 0)
    n_avail, n_group = dec.n_rows, len(groups)
    rows = n_avail + n_group + len(need)
    mat = np.zeros((n, rows))
    mat[:, :n_avail] = used
    mat[np.arange(n), n_avail + np.array(group_of)] = 1.0
    need_row = np.full(dec.n_models, -1)
    need_row[need] = n_avail + n_group + np.arange(len(need))
    on = need_row[part_model] >= 0
    mat[np.flatnonzero(on), need_row[part_model[on]]] = cap[on]
    lower = np.concatenate([np.full(n_avail + n_group, -_INF), dec.demand[need]])
    upper = np.concatenate([dec.avail.astype(float), np.ones(n_group),
                            np.full(len(need), _INF)])
    pick = _solve_binary(cost, mat, lower, upper, time_limit_s=time_limit_s, rel_gap=rel_gap,
                         cutoff=cutoff, target=target)
    if pick is None:
        return None
    counts = mat_parts[pick].sum(axis=0).astype(np.int64)
    if not feasible(dec, counts):
        log.warning("a plan of pattern parts failed a row; ignored")
        return None
    return counts


def round_and_repair(dec: Decomposition, xbar: np.ndarray, *, exact_pd: bool = True
                     ) -> np.ndarray | None:
    """A plan near the master's fractional counts: round them down (which keeps availability,
    the counts being a mix of patterns within it), then cover each model's uncovered demand
    at least cost from the nodes left, model by model (`knapsack_dp` with each column
    bounded by the nodes left for it). None when that does not make a plan meeting demand.
    """
    x = np.floor(xbar + INTEGRALITY_TOL).astype(np.int64)
    left = dec.avail - dec.used(x)
    order = np.argsort(-dec.priority, kind="stable")
    # a model whose columns share a row may be trimmed short: a few passes cover the rest
    for _ in range(REPAIR_PASSES):
        for m in order:
            cols = np.flatnonzero(dec.col_model == m)
            have = float(dec.capacity(x)[m])
            need = float(dec.demand[m]) - have
            if need <= 1e-9 * max(1.0, float(dec.demand[m])):
                continue
            use = dec.usage[cols]
            with np.errstate(divide="ignore", invalid="ignore"):
                fit = np.where(use > 0, np.floor(left[None, :] / use + 1e-9), np.inf).min(
                    axis=1)
            room = np.minimum(np.where(np.isfinite(fit), fit, dec.col_ub[cols]),
                              dec.col_ub[cols] - x[cols]).astype(np.int64)
            room = np.maximum(room, 0)
            if not room.any():
                continue
            price = dec.col_price[cols] + dec.col_penalty[cols] * (x[cols] >= dec.col_current[
                cols])
            if dec.is_pd(m) and not exact_pd:
                sol = pd_cover_rest(price, dec.col_cap[cols], x[cols], x[cols] + room,
                                    dec.col_half[cols], dec.col_region[cols],
                                    float(dec.demand[m]))
                if sol.x is not None:
                    sol = replace(sol, x=sol.x - x[cols])
            elif dec.is_pd(m):  # on top of the units there now (its pairs are per region)
                sol = pd_cover(price, dec.col_cap[cols], x[cols], x[cols] + room,
                               dec.col_half[cols], dec.col_region[cols], float(dec.demand[m]))
                if sol.x is not None:
                    sol = replace(sol, x=sol.x - x[cols])
            else:
                sol = knapsack_dp(price, dec.col_cap[cols], room, need)
            if sol.x is None or not sol.x.any():
                continue
            add = sol.x
            if (add @ use > left + 1e-9).any():  # columns sharing a row overdraw it: trim
                add = _trim(add, use, left, dec.col_cap[cols] / np.maximum(price, 1e-12))
            x[cols] += add
            left -= add @ use
    if not feasible(dec, x):
        return None
    return x


def running_plan(dec: Decomposition) -> np.ndarray | None:
    """A plan meeting every demand from the deployment running now (`dec.col_current`): what
    still fits the availability, most capacity per $ first, and each model's rest covered as
    in `round_and_repair`. A re-plan after a small change starts from it; None when nothing
    runs or no such plan is found."""
    if not dec.col_current.any():
        return None
    keep = np.minimum(dec.col_current, dec.col_ub).astype(np.int64)
    if not dec.fits(keep):
        keep = _trim(keep, dec.usage, dec.avail.astype(float),
                     dec.col_cap / np.maximum(dec.col_price, 1e-12))
    return round_and_repair(dec, keep.astype(float))


def _trim(add: np.ndarray, use: np.ndarray, left: np.ndarray, value: np.ndarray) -> np.ndarray:
    """As many of `add`'s instances as fit in `left`, most valuable columns first."""
    out = np.zeros_like(add)
    room = left.astype(float).copy()
    for j in np.argsort(-value, kind="stable"):
        if add[j] <= 0:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            fit = np.where(use[j] > 0, np.floor(room / use[j] + 1e-9), np.inf).min()
        take = int(min(add[j], fit))
        if take > 0:
            out[j] = take
            room -= take * use[j]
    return out


def improve_by_model(dec: Decomposition, counts: np.ndarray, *, node_price: np.ndarray,
                     sweeps: int = 2) -> np.ndarray:
    """Local search on a plan meeting every demand: take one model out, cover
    its demand again at least cost with the nodes the others leave (`knapsack_dp`, each
    column bounded by the nodes left for it), keep the change when it is cheaper and fits.
    Where the model's own columns share a row and overdraw it, the row is priced at
    `node_price` (raised on each retry) and the cover solved again."""
    x = counts.copy()
    items = {m: ModelItems(dec, m) for m in range(dec.n_models)}
    for _ in range(sweeps):
        better = False
        for m in range(dec.n_models):
            cols = np.flatnonzero(dec.col_model == m)
            rest = x.copy()
            rest[cols] = 0
            left = dec.avail - dec.used(rest)
            use = dec.usage[cols]
            with np.errstate(divide="ignore", invalid="ignore"):
                fit = np.where(use > 0, np.floor(left[None, :] / use + 1e-9), np.inf).min(
                    axis=1)
            room = np.minimum(np.where(np.isfinite(fit), fit, np.inf), dec.col_ub[cols])
            hi = dec.col_ub.copy()
            hi[cols] = np.maximum(room, 0).astype(np.int64)
            bounds = Bounds(np.zeros(dec.n_cols, dtype=np.int64), hi)
            it = items[m]
            lo_i, hi_i = it.bounds(bounds)
            price = np.zeros(dec.n_rows)
            for attempt in range(3):
                extra = dec.usage[it.col] @ price
                if it.pd:  # the model's units now are a cover (a hint, when within bounds)
                    sol = pd_cover(it.cost + extra, it.cap, lo_i, hi_i, it.half, it.region,
                                   float(dec.demand[m]), hints=(it.units(x),))
                else:
                    sol = knapsack_dp(it.cost + extra, it.cap, hi_i, float(dec.demand[m]),
                                      lo=lo_i, rel_gap=1e-6)
                if sol.x is None:
                    break
                new = np.zeros(dec.n_cols, dtype=np.int64)
                np.add.at(new, it.col, sol.x)
                over = dec.used(new) > left + 1e-9
                if not over.any():
                    trial = rest + new
                    if dec.cost(trial) < dec.cost(x) - 1e-9 * max(1.0, dec.cost(x)):
                        x, better = trial, True
                    break
                price = price + np.where(over, np.maximum(node_price, 1e-3 * (attempt + 1)
                                                          * float(dec.col_price.max())), 0.0)
        if not better:
            break
    return x


def fill_goodput(dec: Decomposition, counts: np.ndarray, node_value: np.ndarray, *,
                 skip: int = -1) -> np.ndarray:
    """Add instances to `counts` while any fits in the nodes left and serves demand not yet
    served: each time the one of most goodput per node value (`node_value`: a price per node
    of each row, e.g. the LP's shadow prices) first. `skip`: a column not to add to."""
    x = counts.copy()
    left = dec.avail - dec.used(x)
    need = np.maximum(dec.demand - dec.capacity(x), 0.0)
    use = dec.usage
    value = use @ node_value
    value = value + 1e-6 * max(float(value.max(initial=0.0)), 1e-9)
    weight = dec.priority[dec.col_model]
    room = dec.col_ub - x
    if skip >= 0:
        room[skip] = 0
    fits = (use <= left[None, :] + 1e-9).all(axis=1) & (room > 0)
    while True:
        gain = weight * np.minimum(dec.col_cap, need[dec.col_model])
        ok = fits & (gain > 1e-12)
        if not ok.any():
            return x
        j = int(np.argmax(np.where(ok, gain / value, -np.inf)))
        x[j] += 1
        room[j] -= 1
        left -= use[j]
        m = dec.col_model[j]
        need[m] = max(0.0, need[m] - dec.col_cap[j])
        touched = use[:, use[j] > 0]  # only columns sharing a row with j can stop fitting
        fits &= (touched <= left[use[j] > 0][None, :] + 1e-9).all(axis=1)
        fits[j] &= room[j] > 0


def goodput_plan(dec: Decomposition, xbar: np.ndarray, node_value: np.ndarray, *,
                 deadline: float) -> np.ndarray:
    """A plan of high goodput near fractional counts `xbar` (e.g. the LP optimum): round down,
    fill the nodes left (`fill_goodput`), then, until no move gains or `deadline`, take one
    instance out and fill again without it, keeping the change when goodput rises."""
    x = np.clip(np.floor(xbar + INTEGRALITY_TOL).astype(np.int64), 0, dec.col_ub)
    if not dec.fits(x):
        x = np.zeros(dec.n_cols, dtype=np.int64)
    x = fill_goodput(dec, x, node_value)
    best = dec.goodput(x)
    value = dec.usage @ node_value + 1e-9
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        on = np.flatnonzero(x > 0)
        per_value = dec.col_cap[on] * dec.priority[dec.col_model[on]] / value[on]
        for j in on[np.argsort(per_value, kind="stable")]:  # least goodput per value first
            if time.perf_counter() >= deadline:
                break
            y = x.copy()
            y[j] -= 1
            y = fill_goodput(dec, y, node_value, skip=j)
            got = dec.goodput(y)
            if got > best + 1e-9 * max(1.0, best):
                x, best, improved = y, got, True
                break
    return x
