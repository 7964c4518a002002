"""Compiled loops of the PD cover (`decomposition/pd_cover.py`): one group's frontier, two
frontiers' sums, and the least cost of completing a state.

Every function carries its signatures and is compiled when this module is imported (or
loaded from numba's cache), never inside a solve's clock (`jit.py`). `decomposition/pd_cover.py`
passes a sum of no groups' free capacity as the int 0: it is converted to the declared float."""

from __future__ import annotations

import math

import numpy as np

from coral.allocator.kernels.jit import jit
# a stable argsort in loops: numpy's (the same order, stable too) takes seconds to compile
from coral.allocator.kernels.arrays import argsort


@jit("float64(float64, float64, float64, float64, float64, float64)")
def least_rest(q: float, demand: float, pair_rate: float, pair_free: float,
                rest_rate: float, rest_free: float) -> float:
    """A lower bound of what completing a state of capacity `q` costs: the group serves some
    q' <= q (a half serves no more than its region's other half carries: `pair_free` of it
    for nothing, the rest at `pair_rate` or more per request/s), the other groups the rest of
    the demand (`rest_free` for nothing, then `rest_rate` or more). Both parts are convex
    piecewise linear in q', so the least is at an end or a kink."""
    best = np.inf
    for k in range(4):
        if k == 0:
            s = 0.0
        elif k == 1:
            s = min(q, pair_free)
        elif k == 2:
            s = min(max(demand - rest_free, 0.0), q)
        else:
            s = q
        v = 0.0
        if s > pair_free:
            v += pair_rate * (s - pair_free)
        if demand - s > rest_free:
            v += rest_rate * (demand - s - rest_free)
        if v < best:
            best = v
    return best


@jit("(float64[::1], float64[::1], int64, float64)")
def _pareto(cq: np.ndarray, cc: np.ndarray, t: int, tol: float) -> np.ndarray:
    """Positions among the first `t` candidates (capacity, cost) that no other beats on both
    counts (equal capacity: the cheaper), capacity ascending: a sweep from the most capacity
    down keeps each state cheaper than every state above it."""
    order = argsort(cq, t)
    keep = np.empty(t, np.int64)
    kept = 0
    best = np.inf
    for a in range(t - 1, -1, -1):
        b = order[a]
        if best == np.inf or cc[b] < best - tol * max(1.0, abs(best)):
            if kept > 0 and cq[keep[kept - 1]] == cq[b]:
                keep[kept - 1] = b  # same capacity, cheaper: replaces it
            else:
                keep[kept] = b
                kept += 1
            best = cc[b]
    return keep[:kept][::-1].copy()


@jit("(int64[::1], float64[::1], int64)")
def _least_keys(ascending: np.ndarray, key: np.ndarray, max_states: int
                ) -> tuple[np.ndarray, float]:
    """The `max_states` states of least key (their order kept), and the least key of the
    others."""
    n = len(ascending)
    by_key = argsort(key, n)
    dropped = np.inf
    for a in range(max_states, n):
        dropped = min(dropped, key[by_key[a]])
    chosen = np.zeros(n, np.bool_)
    for a in range(max_states):
        chosen[by_key[a]] = True
    out = np.empty(max_states, np.int64)
    w = 0
    for a in range(n):
        if chosen[a]:
            out[w] = ascending[a]
            w += 1
    return out, dropped


@jit("(float64[::1], float64[::1], int64[::1], int64[::1], float64, float64, float64, "
     "float64, float64, float64, float64, int64)")
def frontier(cost: np.ndarray, cap: np.ndarray, lo: np.ndarray, hi: np.ndarray,
             demand: float, limit: float, tol: float, pair_rate: float, pair_free: float,
             rest_rate: float, rest_free: float, max_states: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """Pareto frontier of one group's covers: (capacity capped at `demand`, cost) of every
    cover within `lo`..`hi` that no other beats on both counts and whose cheapest completion
    (`least_rest`) costs at most `limit`, capacity ascending. Returns (capacity, cost, and
    for rebuilding: per state its parent index in the step before, the units of that step's
    item, and the steps' offsets; and the least completion bound of the states dropped to keep
    at most `max_states` after a step, inf when none was: no cover through them is cheaper).

    An item's units are added in binary parts (1, 2, 4, ... units, then the remainder), each
    part a 0/1 choice: the frontier with and without it are two lists sorted by capacity,
    swept together in linear time, where adding 0..k units at once would sort k + 1 shifted
    copies."""
    n = len(cost)
    q0 = 0.0
    c0 = 0.0
    for i in range(n):
        q0 += cap[i] * lo[i]
        c0 += cost[i] * lo[i]
    q = np.empty(1)
    c = np.empty(1)
    q[0] = min(q0, demand)
    c[0] = c0
    dropped = np.inf
    if c0 > limit:
        return (np.empty(0), np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64),
                np.zeros(n + 1, np.int64), dropped)
    # a state can still grow by the items after it: their least cost per request/s bounds
    # that part of its completion as the other groups' rate bounds theirs
    after = np.full(n + 1, np.inf)
    for i in range(n - 1, -1, -1):
        after[i] = after[i + 1]
        if hi[i] > lo[i] and cap[i] > 0 and cost[i] / cap[i] < after[i]:
            after[i] = cost[i] / cap[i]
    offsets = np.zeros(n + 1, np.int64)
    parts_par = []
    parts_k = []
    for i in range(n):
        free = hi[i] - lo[i]
        if free > 0 and cap[i] > 0 and q0 < demand - tol:
            most = min(free, int(math.ceil((demand - q0) / cap[i] - 1e-12)))
        else:
            most = 0
        # this item's states: parent in the last item's frontier, units of this item so far
        par = np.arange(len(q))
        kk = np.zeros(len(q), np.int64)
        done = 0
        unit = 1  # parts 1, 2, 4, ... then the remainder: every count 0..most is a sum
        while True:
            part = min(unit, most - done)
            unit *= 2
            last = done + part >= most
            grow_rate = min(rest_rate, after[i + 1] if last else after[i])
            s = len(q)
            # the frontier of the states without the part and with it, both sorted by
            # capacity: a sweep from the most capacity down over the two at once keeps each
            # state cheaper than every state above it, written from the end of the buffers
            m = 2 * s
            nq = np.empty(m)
            nc = np.empty(m)
            npar = np.empty(m, np.int64)
            nk = np.empty(m, np.int64)
            w = m  # states kept so far: nq[w:], capacity ascending
            best = np.inf
            add_q = part * cap[i]
            add_c = part * cost[i]
            ja = s - 1
            jb = s - 1 if part > 0 else -1
            qa_j = ca_j = qb_j = cb_j = 0.0
            have_a = have_b = False
            while True:
                while not have_a and ja >= 0:  # next state without the part, if kept
                    qa_j, ca_j = q[ja], c[ja]
                    if ca_j + least_rest(qa_j, demand, pair_rate, pair_free, grow_rate,
                                         rest_free) <= limit:
                        have_a = True
                    else:
                        ja -= 1
                while not have_b and jb >= 0:  # next state with it, if kept
                    if q[jb] < demand and c[jb] + add_c <= limit:
                        qb_j = q[jb] + add_q
                        if qb_j >= demand - tol:
                            qb_j = demand
                        cb_j = c[jb] + add_c
                        if cb_j + least_rest(qb_j, demand, pair_rate, pair_free, grow_rate,
                                             rest_free) <= limit:
                            have_b = True
                            continue
                    jb -= 1
                if not have_a and not have_b:
                    break
                if have_b and (not have_a or qb_j >= qa_j):
                    qx, cx, px, kx = qb_j, cb_j, par[jb], kk[jb] + part
                    have_b = False
                    jb -= 1
                else:
                    qx, cx, px, kx = qa_j, ca_j, par[ja], kk[ja]
                    have_a = False
                    ja -= 1
                if best == np.inf or cx < best - tol * max(1.0, abs(best)):
                    if w < m and nq[w] == qx:
                        w += 1  # same capacity, cheaper: replaces it
                    w -= 1
                    nq[w], nc[w], npar[w], nk[w] = qx, cx, px, kx
                    best = cx
            q, c, par, kk = nq[w:], nc[w:], npar[w:], nk[w:]
            kept = m - w
            if kept > max_states:  # keep the states of least completion bound
                key = np.empty(kept)
                for a in range(kept):
                    key[a] = c[a] + least_rest(q[a], demand, pair_rate, pair_free, grow_rate,
                                               rest_free)
                chosen, cut = _least_keys(np.arange(kept), key, max_states)
                dropped = min(dropped, cut)
                q, c, par, kk = q[chosen], c[chosen], par[chosen], kk[chosen]
            done += part
            if last:
                break
        parts_par.append(par)
        parts_k.append(kk)
        offsets[i + 1] = offsets[i] + len(q)
    total = offsets[n]
    hist_par = np.empty(total, np.int64)
    hist_k = np.empty(total, np.int64)
    for i in range(n):  # a loop: a slice assignment's shape check takes seconds to compile
        part_par = parts_par[i]
        part_k = parts_k[i]
        at = offsets[i]
        for a in range(len(part_par)):
            hist_par[at + a] = part_par[a]
            hist_k[at + a] = part_k[a]
    return q, c, hist_par, hist_k, offsets, dropped


@jit("(float64[::1], float64[::1], float64[::1], float64[::1], float64, float64, "
     "float64, float64, float64, int64)")
def combine(qa: np.ndarray, ca: np.ndarray, qb: np.ndarray, cb: np.ndarray, demand: float,
            limit: float, tol: float, rest_rate: float, rest_free: float, max_states: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """Frontier of the sums of two frontiers (capacity capped at `demand`), of the sums
    whose cheapest completion by the groups still to come costs at most `limit`. Returns
    (capacity, cost, index in a, index in b), capacity ascending, and the least completion
    bound of the states dropped to keep at most `max_states` (inf when none was)."""
    na, nb = len(qa), len(qb)
    m = 0  # the sums within the limit, counted first
    for i in range(na):
        for j in range(nb):
            if ca[i] + cb[j] > limit:
                break
            m += 1
            if qa[i] + qb[j] >= demand - tol:
                break
    cq = np.empty(m)
    cc = np.empty(m)
    ia = np.empty(m, np.int64)
    ib = np.empty(m, np.int64)
    t = 0
    for i in range(na):
        for j in range(nb):  # cb ascending: the rest only cost more
            cost = ca[i] + cb[j]
            if cost > limit:
                break
            cap = qa[i] + qb[j]
            if cap >= demand - tol:
                cap = demand
            if demand - cap > rest_free and cost + rest_rate * (demand - cap - rest_free) \
                    > limit:
                continue
            cq[t] = cap
            cc[t] = cost
            ia[t] = i
            ib[t] = j
            t += 1
            if cap >= demand:
                break
    ascending = _pareto(cq, cc, t, tol)
    kept = len(ascending)
    dropped = np.inf
    if kept > max_states:  # keep the states of least completion bound
        key = np.empty(kept)
        for a in range(kept):
            b = ascending[a]
            key[a] = cc[b]
            if demand - cq[b] > rest_free:
                key[a] += rest_rate * (demand - cq[b] - rest_free)
        ascending, dropped = _least_keys(ascending, key, max_states)
    return cq[ascending], cc[ascending], ia[ascending], ib[ascending], dropped


@jit("(float64[::1], float64[::1], float64[::1], float64[::1], float64[::1], "
     "float64[::1], float64, float64, float64)")
def finish(qa: np.ndarray, ca: np.ndarray, qb: np.ndarray, cb: np.ndarray, qc: np.ndarray,
           cc: np.ndarray, demand: float, limit: float, tol: float
           ) -> tuple[float, int, int, int]:
    """The cheapest choice of one state from each of three frontiers (capacity ascending,
    cost ascending) whose capacities reach `demand`: (its cost, a, b and c indices), cost inf
    when none costs at most `limit`. A pair of states is completed by the cheapest state of
    the third that reaches the rest (binary search); pairs whose cost with the third's
    cheapest state cannot beat the best so far are skipped (costs only rise along each)."""
    best = limit
    bi, bj, bk = -1, -1, -1
    nc = len(qc)
    if nc == 0:
        return np.inf, -1, -1, -1
    for i in range(len(qa)):
        if ca[i] + cb[0] + cc[0] > best:
            break
        for j in range(len(qb)):
            base = ca[i] + cb[j]
            if base + cc[0] > best:
                break
            need = demand - tol - qa[i] - qb[j]
            k = 0
            if need > 0.0:
                lo, hi = 0, nc
                while lo < hi:
                    mid = (lo + hi) // 2
                    if qc[mid] < need:
                        lo = mid + 1
                    else:
                        hi = mid
                k = lo
                if k >= nc:
                    continue
            total = base + cc[k]
            if total <= best:
                if total < best or bi < 0:
                    best, bi, bj, bk = total, i, j, k
    if bi < 0:
        return np.inf, -1, -1, -1
    return best, bi, bj, bk
