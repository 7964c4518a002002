"""The per-model knapsack's Pareto-state programme, compiled (numba, `jit.py`): after
`knapsack_kernel.fix` leaves few free units, steps over the groups of free items of equal
capacity, keeping after each the states no other beats on both counts (capacity, cost) and
whose LP bound can still beat the best cover found (`decomposition/knapsack.py` states the method).

Ties are broken as the array code it replaced broke them (see `knapsack_kernel.py`), so the
answers are that code's bit for bit."""

from __future__ import annotations

import numpy as np

from coral.allocator.kernels.jit import jit as _jit
from coral.allocator.kernels.arrays import (
    argsort,
    grow_float,
    grow_int,
    search_from,
    sift,
)


@_jit("int64[::1](int64, int64, int64, int64[::1], int64[::1], int64[::1], int64[::1], "
      "int64[::1], int64[::1], int64[::1], int64[::1], int64)")
def _rebuild(s: int, k: int, parent: int, hist_par: np.ndarray, hist_kk: np.ndarray,
             hist_start: np.ndarray, lo: np.ndarray, free: np.ndarray, units: np.ndarray,
             members: np.ndarray, mem_start: np.ndarray, n_steps: int) -> np.ndarray:
    """The x of the state reached by k units at step s from state `parent` of step s - 1."""
    counts = np.zeros(n_steps, dtype=np.int64)
    counts[s] = k
    for back in range(s - 1, -1, -1):
        at = hist_start[back] + parent
        counts[back] = hist_kk[at]
        parent = hist_par[at]
    x = np.empty(lo.shape[0], dtype=np.int64)
    for i in range(lo.shape[0]):
        x[i] = lo[i]
    for step in range(n_steps):
        left = counts[step]
        if left == 0:
            continue
        for i in range(mem_start[step], mem_start[step + 1]):  # cheapest units first
            pos = members[i]
            t = min(left, units[pos])
            x[free[pos]] += t
            left -= t
            if left == 0:
                break
    return x


@_jit("int64(float64[::1], float64[::1], int64[::1], int64[::1], int64[::1], int64, int64, "
      "int64[::1], float64[::1], int64[::1], int64[::1])")
def _front(cap: np.ndarray, cost: np.ndarray, par: np.ndarray, kk: np.ndarray,
           bucket: np.ndarray, n_buckets: int, k_span: int, keep: np.ndarray,
           heap_key: np.ndarray, heap_b: np.ndarray, head: np.ndarray) -> int:
    """The states that no other beats on both counts (more capacity for no more cost; of
    equal capacity, the cheapest, then the first in the order (parent, k)), most capacity
    first, into `keep`; returns how many.

    This is the array code's stable sort by (capacity descending, cost) and sweep, without
    the sort: the states are in buckets (`bucket[b]:bucket[b + 1]`, one per k) and the parents
    have strictly decreasing capacity, so each bucket is in order of decreasing capacity (one
    shift of a decreasing sequence), and a heap (`heap_key`, `heap_b`: scratch) merges them."""
    size = 0
    for b in range(n_buckets):
        head[b] = bucket[b]
        if bucket[b] < bucket[b + 1]:
            heap_key[size] = cap[bucket[b]]
            heap_b[size] = b
            size += 1
    for root in range(size // 2 - 1, -1, -1):
        sift(heap_key, heap_b, size, root)
    n_keep = 0
    run_min = np.inf
    while size:
        top = heap_key[0]
        lead = head[heap_b[0]]  # the least cost of equal capacity, first of equals
        lead_idx = par[lead] * k_span + kk[lead]
        while size and heap_key[0] == top:
            b = heap_b[0]
            i = head[b]
            if cost[i] < cost[lead] or (cost[i] == cost[lead]
                                        and par[i] * k_span + kk[i] < lead_idx):
                lead = i
                lead_idx = par[i] * k_span + kk[i]
            head[b] = i + 1
            if i + 1 < bucket[b + 1]:
                heap_key[0] = cap[i + 1]
            else:
                size -= 1
                heap_key[0] = heap_key[size]
                heap_b[0] = heap_b[size]
            sift(heap_key, heap_b, size, 0)
        if n_keep == 0 or cost[lead] < run_min:
            keep[n_keep] = lead
            n_keep += 1
            run_min = cost[lead]
    return n_keep


@_jit("(float64[::1], float64[::1], int64[::1], int64[::1], float64, float64, float64, float64, "
      "float64, float64, int64, int64)")
def programme(c: np.ndarray, a: np.ndarray, lo: np.ndarray, hi: np.ndarray, demand: float,
              tol: float, pre_cap: float, pre_cost: float, best: float, rel_gap: float,
              max_states: int, pool: int):
    """The Pareto-state programme over the free units `hi - lo` (items sorted by ratio).

    Returns (best value, whether the programme improved on `best`, its x, least bound of a
    pruned state, the values and xs of up to 2 pool + 1 good complete states, best first)."""
    n = c.shape[0]
    n_free = 0
    for i in range(n):
        if hi[i] > lo[i]:
            n_free += 1
    free = np.empty(n_free, dtype=np.int64)
    units = np.empty(n_free, dtype=np.int64)
    f_cap = np.empty(n_free)
    f_ratio = np.empty(n_free)
    fa = np.empty(n_free)
    fc = np.empty(n_free)
    k = 0
    for i in range(n):
        if hi[i] > lo[i]:
            free[k] = i
            units[k] = hi[i] - lo[i]
            f_cap[k] = a[i]
            f_ratio[k] = c[i] / a[i]
            fa[k] = a[i] * units[k]
            fc[k] = c[i] * units[k]
            k += 1

    # steps: free items of equal capacity, in order of their cheapest unit
    by_cap = argsort(f_cap, n_free)
    group = np.empty(n_free, dtype=np.int64)
    group_first = np.empty(n_free, dtype=np.int64)
    g = -1
    for t in range(n_free):
        p = by_cap[t]
        if t == 0 or f_cap[p] != f_cap[by_cap[t - 1]]:
            g += 1
            group_first[g] = p  # least position of the group (the sort is stable)
        group[p] = g
    n_steps = g + 1
    first_key = np.empty(n_steps)
    for r in range(n_steps):
        first_key[r] = group_first[r]
    group_rank = argsort(first_key, n_steps)
    step_of_group = np.empty(n_steps, dtype=np.int64)
    for r in range(n_steps):
        step_of_group[group_rank[r]] = r
    item_step = np.empty(n_free, dtype=np.int64)
    mem_start = np.zeros(n_steps + 1, dtype=np.int64)
    step_units = np.zeros(n_steps, dtype=np.int64)
    for p in range(n_free):
        st = step_of_group[group[p]]
        item_step[p] = st
        mem_start[st + 1] += 1
        step_units[st] += units[p]
    for st in range(n_steps):
        mem_start[st + 1] += mem_start[st]
    members = np.empty(n_free, dtype=np.int64)  # positions in `free`, by step, in order
    fill_at = np.empty(n_steps, dtype=np.int64)
    for st in range(n_steps):
        fill_at[st] = mem_start[st]
    for p in range(n_free):
        st = item_step[p]
        members[fill_at[st]] = p
        fill_at[st] += 1
    step_cap = np.empty(n_steps)
    for st in range(n_steps):
        step_cap[st] = f_cap[members[mem_start[st]]]

    lp_a = np.zeros(n_free + 1)  # LP of the steps after the current one: cumulative capacity
    lp_c = np.zeros(n_free + 1)  # and cost of their free units, by ratio

    threshold = best - rel_gap * abs(best)
    lower = np.inf
    # the states of the current step (most capacity first), and the candidates of the next:
    # buffers kept from step to step, grown when needed
    s_cap = np.empty(64)
    s_cost = np.empty(64)
    s_cap[0] = pre_cap
    s_cost[0] = pre_cost
    n_live = 1
    kmax = np.empty(64, dtype=np.int64)
    cand_par = np.empty(64, dtype=np.int64)
    cand_k = np.empty(64, dtype=np.int64)
    cand_cap = np.empty(64)
    cand_cost = np.empty(64)
    bound = np.empty(64)
    keep = np.empty(64, dtype=np.int64)
    bucket = np.empty(64, dtype=np.int64)
    heap_key = np.empty(64)
    heap_b = np.empty(64, dtype=np.int64)
    head = np.empty(64, dtype=np.int64)
    hist_par = np.empty(64, dtype=np.int64)
    hist_kk = np.empty(64, dtype=np.int64)
    hist_start = np.zeros(n_steps + 1, dtype=np.int64)
    n_hist = 0
    raw_val = np.empty(16)
    raw_s = np.empty(16, dtype=np.int64)
    raw_k = np.empty(16, dtype=np.int64)
    raw_par = np.empty(16, dtype=np.int64)
    n_raw = 0
    top_val = np.empty(max(pool, 1))
    top_idx = np.empty(max(pool, 1), dtype=np.int64)
    top_k = np.empty(max(pool, 1), dtype=np.int64)
    top_par = np.empty(max(pool, 1), dtype=np.int64)
    best_s = -1
    best_k = 0
    best_par = 0
    table = np.zeros(1)
    for s in range(n_steps):
        if n_live == 0:
            break
        hist_start[s] = n_hist
        sc = step_cap[s]
        most = float(step_units[s])
        kmax = grow_int(kmax, n_live)
        total = 0
        k_top = 0
        for p in range(n_live):
            v = np.ceil((demand - s_cap[p]) / sc - 1e-12)
            if most < v:
                v = most
            km = np.int64(v)
            kmax[p] = km
            total += km + 1
            if km > k_top:
                k_top = km
        # cost of k units of the step, k = 0..k_top (its cheapest units first)
        if table.shape[0] < k_top + 1:
            table = np.empty(max(k_top + 1, 2 * table.shape[0]))
        table[0] = 0.0
        kk = 0
        for i in range(mem_start[s], mem_start[s + 1]):
            pos = members[i]
            unit = c[free[pos]]
            for _ in range(units[pos]):
                if kk >= k_top:
                    break
                table[kk + 1] = table[kk] + unit
                kk += 1
            if kk >= k_top:
                break
        # LP bound of what the later steps can add: their free units, by ratio
        last = s + 1 == n_steps
        if not last:
            for j in range(n_free):
                if item_step[j] > s:
                    lp_a[j + 1] = lp_a[j] + fa[j]
                    lp_c[j + 1] = lp_c[j] + fc[j]
                else:
                    lp_a[j + 1] = lp_a[j]
                    lp_c[j + 1] = lp_c[j]

        # the candidates: each state with k = 0..kmax units of the step, by k then state (their
        # order is (state, k): `idx`). The complete ones are solutions; the others are kept
        # with their bound, in buckets by k
        cand_par = grow_int(cand_par, total)
        cand_k = grow_int(cand_k, total)
        cand_cap = grow_float(cand_cap, total)
        cand_cost = grow_float(cand_cost, total)
        bound = grow_float(bound, total)
        bucket = grow_int(bucket, k_top + 2)
        k_span = k_top + 1
        m = 0
        step_best = np.inf
        step_k = -1
        step_par = 0
        step_idx = 0
        n_top = 0
        first = 0  # kmax is non-decreasing over the states: those with k units are a suffix
        for kq in range(k_top + 1):
            bucket[kq] = m
            while first < n_live and kmax[first] < kq:
                first += 1
            at_lp = 0
            for p in range(first, n_live):
                if kmax[p] < kq:
                    continue
                cap2 = s_cap[p] + kq * sc
                cost2 = s_cost[p] + table[kq]
                done = cap2 >= demand - tol
                value = cost2
                if done:
                    idx = p * k_span + kq
                    if step_k < 0 or value < step_best or (value == step_best
                                                           and idx < step_idx):
                        step_best, step_k, step_par, step_idx = value, kq, p, idx
                    if pool > 0 and (n_top < pool or value < top_val[n_top - 1] or (
                            value == top_val[n_top - 1] and idx < top_idx[n_top - 1])):
                        at = n_top if n_top < pool else pool - 1
                        while at > 0 and (top_val[at - 1] > value or (
                                top_val[at - 1] == value and top_idx[at - 1] > idx)):
                            if at < pool:
                                top_val[at] = top_val[at - 1]
                                top_idx[at] = top_idx[at - 1]
                                top_k[at] = top_k[at - 1]
                                top_par[at] = top_par[at - 1]
                            at -= 1
                        top_val[at] = value
                        top_idx[at] = idx
                        top_k[at] = kq
                        top_par[at] = p
                        if n_top < pool:
                            n_top += 1
                if done:
                    continue
                if last:
                    bd = np.inf
                else:
                    # the item that fills `rest` (rest grows with p: search on from the last)
                    rest = demand - cap2
                    at_lp = search_from(lp_a, n_free + 1, rest - tol, at_lp)
                    pos = at_lp - 1
                    pos_c = min(pos, n_free - 1)
                    if pos_c < 0:  # as numpy indexes -1
                        pos_a = n_free
                        pos_r = n_free - 1
                    else:
                        pos_a = pos_c
                        pos_r = pos_c
                    over = rest - lp_a[pos_a]
                    if over < 0.0:
                        over = 0.0
                    fill = lp_c[pos_a] + over * f_ratio[pos_r]
                    lp = fill if pos < n_free else np.inf
                    bd = value + lp
                cand_par[m] = p
                cand_k[m] = kq
                cand_cap[m] = cap2
                cand_cost[m] = cost2
                bound[m] = bd
                m += 1
        bucket[k_top + 1] = m
        if step_k >= 0:
            if step_best < best:
                best = step_best
                best_s = s
                best_k = step_k
                best_par = step_par
                threshold = best - rel_gap * abs(best)
            if n_top:
                need = n_raw + n_top
                raw_val = grow_float(raw_val, need)
                raw_s = grow_int(raw_s, need)
                raw_k = grow_int(raw_k, need)
                raw_par = grow_int(raw_par, need)
                for t in range(n_top):
                    raw_val[n_raw] = top_val[t]
                    raw_s[n_raw] = s
                    raw_k[n_raw] = top_k[t]
                    raw_par[n_raw] = top_par[t]
                    n_raw += 1
        if m == 0:
            hist_start[s + 1] = n_hist
            n_live = 0
            break
        # cut the states that cannot beat the best by more than the gap
        live = 0
        for kq in range(k_top + 1):
            j0 = bucket[kq]
            bucket[kq] = live
            for j in range(j0, bucket[kq + 1]):
                if bound[j] >= threshold:
                    if bound[j] < lower:
                        lower = bound[j]
                else:
                    if live != j:
                        cand_par[live] = cand_par[j]
                        cand_k[live] = cand_k[j]
                        cand_cap[live] = cand_cap[j]
                        cand_cost[live] = cand_cost[j]
                        bound[live] = bound[j]
                    live += 1
        bucket[k_top + 1] = live

        # the Pareto front (more capacity for no more cost), by capacity, most first
        keep = grow_int(keep, live)
        heap_key = grow_float(heap_key, k_top + 1)
        heap_b = grow_int(heap_b, k_top + 1)
        head = grow_int(head, k_top + 1)
        n_keep = _front(cand_cap, cand_cost, cand_par, cand_k, bucket, k_top + 1, k_span,
                        keep, heap_key, heap_b, head)
        if n_keep > max_states:  # keep the states of least bound, in their order
            kb = np.empty(n_keep)
            for t in range(n_keep):
                kb[t] = bound[keep[t]]
            ob = argsort(kb, n_keep)
            cut = kb[ob[max_states]]
            if cut < lower:
                lower = cut
            chosen = np.zeros(n_keep, dtype=np.bool_)
            for t in range(max_states):
                chosen[ob[t]] = True
            n2 = 0
            for t in range(n_keep):
                if chosen[t]:
                    keep[n2] = keep[t]
                    n2 += 1
            n_keep = n2
        hist_par = grow_int(hist_par, n_hist + n_keep)
        hist_kk = grow_int(hist_kk, n_hist + n_keep)
        s_cap = grow_float(s_cap, n_keep)
        s_cost = grow_float(s_cost, n_keep)
        for t in range(n_keep):
            j = keep[t]
            hist_par[n_hist + t] = cand_par[j]
            hist_kk[n_hist + t] = cand_k[j]
            s_cap[t] = cand_cap[j]
            s_cost[t] = cand_cost[j]
        n_hist += n_keep
        hist_start[s + 1] = n_hist
        n_live = n_keep

    found = False
    best_x = np.zeros(0, dtype=np.int64)
    if best_s >= 0:
        found = True
        best_x = _rebuild(best_s, best_k, best_par, hist_par, hist_kk, hist_start, lo, free,
                          units, members, mem_start, n_steps)
    n_out = min(n_raw, 2 * pool + 1)
    out_val = np.empty(n_out)
    out_x = np.empty((n_out, n), dtype=np.int64)
    if n_out:
        ro = argsort(raw_val, n_raw)
        for t in range(n_out):
            j = ro[t]
            out_val[t] = raw_val[j]
            xs = _rebuild(raw_s[j], raw_k[j], raw_par[j], hist_par, hist_kk, hist_start, lo,
                          free, units, members, mem_start, n_steps)
            for i in range(n):
                out_x[t, i] = xs[i]
    return best, found, best_x, lower, out_val, out_x
