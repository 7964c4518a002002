"""Compiled loops of the PD cover (`pd_cover.py`): one group's frontier, two frontiers'
sums, and the least cost of completing a state."""

from __future__ import annotations

import math

import numpy as np

from coral.allocator.jit import jit


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


@jit
def _pareto(cq: np.ndarray, cc: np.ndarray, t: int, tol: float) -> np.ndarray:
    """Positions among the first `t` candidates (capacity, cost) that no other beats on both
    counts (equal capacity: the cheaper), capacity ascending: a sweep from the most capacity
    down keeps each state cheaper than every state above it."""
    order = np.argsort(cq[:t], kind="mergesort")
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


@jit
def _least_keys(ascending: np.ndarray, key: np.ndarray, max_states: int
                ) -> tuple[np.ndarray, float]:
    """The `max_states` states of least key (their order kept), and the least key of the
    others."""
    by_key = np.argsort(key, kind="mergesort")
    dropped = np.inf
    for a in range(max_states, len(ascending)):
        dropped = min(dropped, key[by_key[a]])
    return ascending[np.sort(by_key[:max_states])], dropped


@jit
def frontier(cost: np.ndarray, cap: np.ndarray, lo: np.ndarray, hi: np.ndarray,
             demand: float, limit: float, tol: float, pair_rate: float, pair_free: float,
             rest_rate: float, rest_free: float, max_states: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """Pareto frontier of one group's covers: (capacity capped at `demand`, cost) of every
    cover within `lo`..`hi` that no other beats on both counts and whose cheapest completion
    (`least_rest`) costs at most `limit`, capacity ascending. Returns (capacity, cost, and
    for rebuilding: per state its parent index in the step before, the units of that step's
    item, and the steps' offsets; and the least completion bound of the states dropped to keep
    at most `max_states` after a step, inf when none was: no cover through them is cheaper)."""
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
        s = len(q)
        if free > 0 and cap[i] > 0 and q0 < demand - tol:
            most = min(free, int(math.ceil((demand - q0) / cap[i] - 1e-12)))
        else:
            most = 0
        m = s * (most + 1)
        grow_rate = min(rest_rate, after[i + 1])
        cq = np.empty(m)
        cc = np.empty(m)
        cp = np.empty(m, np.int64)
        ck = np.empty(m, np.int64)
        t = 0
        for j in range(s):
            for k in range(most + 1):
                cost_k = c[j] + k * cost[i]
                if cost_k > limit:
                    break
                cap_k = q[j] + k * cap[i]
                if cap_k >= demand - tol:
                    cap_k = demand
                if cost_k + least_rest(cap_k, demand, pair_rate, pair_free, grow_rate,
                                        rest_free) > limit:
                    continue
                cq[t] = cap_k
                cc[t] = cost_k
                cp[t] = j
                ck[t] = k
                t += 1
                if cap_k >= demand:
                    break
        ascending = _pareto(cq, cc, t, tol)
        kept = len(ascending)
        if kept > max_states:  # keep the states of least completion bound
            key = np.empty(kept)
            for a in range(kept):
                b = ascending[a]
                key[a] = cc[b] + least_rest(cq[b], demand, pair_rate, pair_free, grow_rate,
                                            rest_free)
            ascending, cut = _least_keys(ascending, key, max_states)
            dropped = min(dropped, cut)
            kept = max_states
        q = cq[ascending]
        c = cc[ascending]
        parts_par.append(cp[ascending])
        parts_k.append(ck[ascending])
        offsets[i + 1] = offsets[i] + kept
    total = offsets[n]
    hist_par = np.empty(total, np.int64)
    hist_k = np.empty(total, np.int64)
    for i in range(n):
        hist_par[offsets[i]:offsets[i + 1]] = parts_par[i]
        hist_k[offsets[i]:offsets[i + 1]] = parts_k[i]
    return q, c, hist_par, hist_k, offsets, dropped


@jit
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


@jit
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
