"""An upper bound on Helix's no-SLO max flow over a whole cluster: the layer-cover LP.

In any placement carrying `T` requests/s every layer is held by nodes whose flows add up to
`T`, each at most `min(cap, T)`; a node of `k` layers sits in `k` layers' sets. So for the
bound, each layer picks a *configuration* (a multiset of (node type, layers) items whose
`min(cap, T)` add up to at least `T`), a node of `k` layers supplies `k` items, and the
layers that can be covered are at most the LP

    max sum_a y_a  s.t.  sum_a a_i y_a <= k_i z_i  (item i = (type, k)),
                         sum_{i of type t} z_i <= n_t,   y, z >= 0,

solved by column generation (pricing: a covering knapsack, by DP over item sizes rounded up
to a grid, which only loosens it). `T` is out of reach when the LP covers fewer than `L`
layers; that is checked by weak duality at every iteration (the duals scaled to feasibility
by the pricing's optimum), so an early stop never claims too much. A bisection between a
flow known to be reachable and a known bound gives the smallest `T` not excluded.

Against `helix_cluster.coverage_bound` (the same count with fractions of a layer allowed),
this sees that a layer takes whole items: a one-layer node of capacity `1.3 T` covers one
layer at `T`, not 1.3.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import highspy
import numpy as np

from coral.solvers import quiet_highs

#: Grid of the pricing DP: item sizes are rounded up to multiples of T / GRID.
GRID = 2000
#: Most column-generation rounds per tested flow (each adds one configuration).
MAX_ROUNDS = 2000


def _cheapest_cover(price: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
    """The configuration of least summed `price` whose sizes `w` reach `GRID`, and that
    price (unbounded covering knapsack, DP over the grid)."""
    f = np.full(GRID + 1, np.inf)
    f[0] = 0.0
    arg = np.zeros(GRID + 1, dtype=int)
    for r in range(1, GRID + 1):
        vals = price + f[np.maximum(r - w, 0)]
        j = int(np.argmin(vals))
        f[r], arg[r] = vals[j], j
    a = np.zeros(len(w), dtype=int)
    r = GRID
    while r > 0:
        a[arg[r]] += 1
        r = max(r - int(w[arg[r]]), 0)
    return float(f[GRID]), a


def excluded(T: float, layers: int, group_sizes: Sequence[int],
             items: Sequence[tuple[int, int, float]], deadline: float) -> bool | None:
    """Whether no placement carries `T`: True (proven), False (the LP covers every layer),
    None (undecided at `deadline`, a `time.perf_counter()` value). `items`: (group, layers,
    most capacity of a node of that group at that many layers)."""
    grp = np.array([g for g, _, _ in items], dtype=int)
    k = np.array([kk for _, kk, _ in items], dtype=float)
    cap = np.array([c for _, _, c in items], dtype=float)
    w = np.maximum(np.ceil(np.minimum(cap, T) / T * GRID - 1e-9), 1).astype(int)
    n_i, inf = len(items), highspy.kHighsInf
    h = quiet_highs()
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    none_i, none_v = np.array([], dtype=np.int32), np.array([])
    for _ in range(n_i):
        h.addRow(-inf, 0.0, 0, none_i, none_v)
    for n in group_sizes:
        h.addRow(-inf, float(n), 0, none_i, none_v)
    for i in range(n_i):  # z_i: nodes of item i's type at item i's layers
        h.addCol(0.0, 0.0, inf, 2, np.array([i, n_i + grp[i]], dtype=np.int32),
                 np.array([-k[i], 1.0]))

    def add(a: np.ndarray) -> None:
        idx = np.nonzero(a)[0]
        h.addCol(1.0, 0.0, inf, len(idx), idx.astype(np.int32), a[idx].astype(float))

    for i in range(n_i):  # one item kind per layer, as many as it takes
        a = np.zeros(n_i, dtype=int)
        a[i] = math.ceil(GRID / w[i])
        add(a)
    sizes = np.array(group_sizes, dtype=float)
    for _ in range(MAX_ROUNDS):
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:  # pragma: no cover
            return None
        if h.getInfo().objective_function_value >= layers * (1 - 1e-9):
            return False
        price = np.abs(np.array(h.getSolution().row_dual)[:n_i])
        best, a = _cheapest_cover(price, w)
        if best > 0:
            # duals scaled so that every configuration prices at >= 1: a feasible dual of
            # the LP, whose value bounds the layers it can cover
            p = price / best
            mu = np.zeros(len(group_sizes))
            np.maximum.at(mu, grp, k * p)
            if float(sizes @ mu) < layers * (1 - 1e-9):
                return True
        if best >= 1 - 1e-12 or time.perf_counter() > deadline:
            return None
        add(a)
    return None


def layer_cover_bound(layers: int, group_sizes: Sequence[int],
                      items: Sequence[tuple[int, int, float]], reachable: float,
                      bound: float, *, deadline: float, rtol: float = 1e-3) -> float:
    """The least flow in [`reachable`, `bound`] that the layer-cover LP does not exclude,
    to `rtol` of `bound`, or the best proven by `deadline` (`bound` if none)."""
    lo, hi = reachable, bound
    if lo >= hi:
        return hi
    while hi - lo > rtol * bound and time.perf_counter() < deadline:
        mid = (lo + hi) / 2
        verdict = excluded(mid, layers, group_sizes, items, deadline)
        if verdict is None:
            break
        if verdict:
            hi = mid
        else:
            lo = mid
    return hi
