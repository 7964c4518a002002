"""Compiled loops of the per-model knapsack (`decomposition/knapsack.py`): the items by ratio,
the LP optimum, the quick solutions and reduced-cost fixing. The Pareto-state programme that
follows them is `knapsack_programme.py`; both use the array helpers of `arrays.py`.

The knapsack is called a hundred times per re-plan on instances of a hundred or so items, and
its Pareto-state programme takes tens of small steps per call: as array code it spent its time
in per-operation overhead, so its loops are compiled (numba: every function with its
signatures when its module is imported, so that no solve's clock pays for it, and cached on
disk, so that only the first import after an install or a change compiles; `jit.py`). The
functions take and return plain arrays and numbers; `decomposition/knapsack.py` keeps the API
and the few dot products whose rounding the numpy build decides (each is computed there, with
numpy, as before), so that the answers are those of the array code bit for bit.

Every tie is broken as the array code breaks it: a sort by capacity then cost then position
(stable), the first of equal minima, the stable order of equal bounds under the state cap. The
pool's candidates of equal value come in the order of their states (a stable sort)."""

from __future__ import annotations

import numpy as np

from coral.allocator.kernels.jit import jit as _jit
from coral.allocator.kernels.arrays import argsort, search_left


@_jit("(float64[::1], float64[::1], int64[::1], float64, float64)")
def start(cost: np.ndarray, cap: np.ndarray, ub: np.ndarray, demand: float, tol: float):
    """Items by ratio (ties: larger capacity, then position), the LP optimum and the quick
    solutions (as many of each item as fit under the demand, by ratio; that completed by the
    cheapest single item; the cheapest cover by one item alone).

    Returns (feasible, order, c, a, u, lam, z_lp, taken, starts, n_starts): `starts[:n]`
    are the quick solutions, still to be checked against the demand."""
    n = cost.shape[0]
    key = np.empty(n)
    for i in range(n):
        key[i] = -cap[i]
    o1 = argsort(key, n)
    for i in range(n):
        key[i] = cost[o1[i]] / cap[o1[i]]
    o2 = argsort(key, n)
    order = np.empty(n, dtype=np.int64)
    c = np.empty(n)
    a = np.empty(n)
    u = np.empty(n, dtype=np.int64)
    ratio = np.empty(n)
    for i in range(n):
        j = o1[o2[i]]
        order[i] = j
        c[i] = cost[j]
        a[i] = cap[j]
        u[i] = ub[j]
        ratio[i] = c[i] / a[i]
    cum_a = np.zeros(n + 1)
    cum_c = np.zeros(n + 1)
    for i in range(n):
        cum_a[i + 1] = cum_a[i] + a[i] * u[i]
        cum_c[i + 1] = cum_c[i] + c[i] * u[i]
    starts = np.zeros((3, n), dtype=np.int64)
    if cum_a[n] < demand - tol:
        return False, order, c, a, u, 0.0, 0.0, 0, starts, 0

    # LP optimum: items by ratio up to the critical one, which meets the demand (there is
    # one: the caller asks for demand > tol, and every unit covers it)
    b = search_left(cum_a, n + 1, demand - tol) - 1
    lam = ratio[b]
    z_lp = cum_c[b] + (demand - cum_a[b]) * lam
    taken = b

    n_starts = 1
    rest = demand
    for j in range(n):
        f = np.floor(rest / a[j] + 1e-12)
        take = u[j] if f >= u[j] else np.int64(f)
        if take > 0:
            starts[0, j] = take
            rest -= take * a[j]
        if rest <= tol:
            break
    if rest > tol:
        jb = -1
        kb = 0.0
        tb = np.inf
        for j in range(n):
            k = np.ceil(rest / a[j] - 1e-12)
            if k <= u[j] - starts[0, j]:
                t = k * c[j]
                if jb < 0 or t < tb:
                    jb, kb, tb = j, k, t
        if jb >= 0:
            for j in range(n):
                starts[n_starts, j] = starts[0, j]
            starts[n_starts, jb] += np.int64(kb)
            n_starts += 1
    jb = -1
    kb = 0.0
    tb = np.inf
    for j in range(n):
        k = np.ceil(demand / a[j] - 1e-12)
        if k <= u[j]:
            t = k * c[j]
            if jb < 0 or t < tb:
                jb, kb, tb = j, k, t
    if jb >= 0:
        starts[n_starts, jb] = np.int64(kb)
        n_starts += 1
    return True, order, c, a, u, lam, z_lp, taken, starts, n_starts


@_jit("(float64[::1], float64[::1], int64[::1], float64, float64, int64)")
def fix(c: np.ndarray, a: np.ndarray, u: np.ndarray, lam: float, slack: float, taken: int):
    """Reduced-cost fixing: a solution within `slack` of the LP optimum `lam` keeps x_j within
    slack / |c_j - lam a_j| of the LP's value. Returns (lo, hi, whether any unit is free)."""
    n = c.shape[0]
    lo = np.zeros(n, dtype=np.int64)
    hi = np.zeros(n, dtype=np.int64)
    any_free = False
    top = float(2 ** 40)
    for j in range(n):
        d = abs(c[j] - lam * a[j])
        r = np.floor(slack / d) if d > 1e-15 else np.inf
        if r < 0.0:
            r = 0.0
        if r > top:
            r = top
        room = np.int64(r)
        low = max(0, u[j] - room) if j < taken else 0
        high = min(u[j], room) if j > taken else u[j]
        if high < low:
            high = low
        lo[j] = low
        hi[j] = high
        if high > low:
            any_free = True
    return lo, hi, any_free
