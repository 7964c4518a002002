"""Exact placement for the `chain` topology, and the exact best split into replicas for `flow`.

A chain is one pipeline: an ordering of the nodes, a split of `[0, L)` into consecutive
stages, and one operating point per stage. Its throughput is the bottleneck
`min(stage capacities, link limits)` and its latency the sum of stage times.

Bottleneck objective → threshold search: for a threshold `theta`, is there a chain whose
every stage has capacity >= theta and every link allows >= theta, within the latency bounds?
That is monotone in `theta`, so a binary search over the values that occur (capacities and
link limits) finds the optimum. One feasibility test is a dynamic programme over states
(how many nodes of each distinct type are used so far, type of the last stage, layer
boundary reached) whose value is the least cumulative latency — a scalar when at most one
SLO is bounded (vectorised over boundaries as a min-plus product), and the Pareto front of
(step time, prefill time) when both are. Identical nodes form one type, so orderings that
only swap identical nodes are never enumerated twice. Exact: every chain is a path through
these states, and a state keeps every latency vector that is not dominated.

The same DP with *group* stages — `j` identical nodes on the same range and point, data
parallel, capacity `j * cap` — gives, per sub-multiset of the nodes, the best pipeline of
data-parallel stages; the best partition of the nodes into such replicas (a DP over
sub-multisets) is the warm start and lower bound of the flow-topology MILP.

`path_lp_bound` is the matching upper bound: the LP over latency-feasible paths with each
node's choice convexified, solved by generating paths (the pricing problem is a labelled
shortest path over layer boundaries). When the two meet, the replica split is optimal and no
MILP is needed.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from coral.templates.placement_prep import (
    LATENCY_RTOL,
    Assignment,
    NodeOptions,
    Prepared,
    edge_limit,
    infeasible_placement,
    prepare,
    to_placement,
)
from coral.templates.types import SINK, SOURCE, Placement, PlacementProblem, SolveStatus

_BOUND = 1.0 + LATENCY_RTOL  # latencies are scaled by their SLO


@dataclass(frozen=True)
class Chain:
    """A pipeline: stages in order as (nodes of the stage, option index, start layer).

    A stage of several (identical) nodes is data parallel: each carries an equal share.
    """

    throughput: float
    stages: tuple[tuple[tuple[int, ...], int, int], ...]

    @property
    def nodes(self) -> list[int]:
        return [i for grp, _, _ in self.stages for i in grp]

    def assignment(self) -> Assignment:
        T = self.throughput
        choice = {i: (oi, s) for grp, oi, s in self.stages for i in grp}
        first, last = self.stages[0][0], self.stages[-1][0]
        edges = {(SOURCE, i): T / len(first) for i in first}
        edges.update({(i, SINK): T / len(last) for i in last})
        for (ga, _, _), (gb, _, _) in zip(self.stages, self.stages[1:]):
            share = T / (len(ga) * len(gb))
            for a in ga:
                for b in gb:
                    edges[a, b] = share
        return Assignment(choice, edges)


class _ChainDP:
    """Threshold-feasibility DP over (used-count vector, last stage kind, boundary).

    A stage kind is (node type, group size j); `groups=False` allows j = 1 only (a chain).
    """

    def __init__(self, prep: Prepared, nodes: Sequence[int], require_all: bool,
                 groups: bool = False) -> None:
        P = prep.problem
        self.L = P.num_layers
        self.require_all = require_all
        self.use_x = P.tpot_s is not None
        self.use_y = P.ttft_s is not None
        avail = set(nodes)
        self.members: list[list[int]] = []
        for grp in prep.groups:
            m = [i for i in grp if i in avail]
            if m:
                self.members.append(m)
        self.types: list[NodeOptions] = [prep.usable[m[0]] for m in self.members]
        self.counts = [len(m) for m in self.members]
        G = len(self.types)
        self.G = G
        self.radix = [1] * G
        for t in range(1, G):
            self.radix[t] = self.radix[t - 1] * (self.counts[t - 1] + 1)
        self.full = sum(c * r for c, r in zip(self.counts, self.radix))
        # stage kinds
        self.kinds = [(t, j) for t in range(G)
                      for j in (range(1, self.counts[t] + 1) if groups else (1,))]
        K = len(self.kinds)
        self.K = K
        lim = np.array([[edge_limit(P, self.members[t][0], self.members[u][0])
                         for u in range(G)] for t in range(G)]) if G else np.zeros((0, 0))
        self.link = np.array([[lim[t, u] * j * jj for (u, jj) in self.kinds]
                              for (t, j) in self.kinds]) if K else np.zeros((0, 0))
        xs = [(u.step / P.tpot_s) if self.use_x else np.zeros(len(u)) for u in self.types]
        ys = [(u.pre / P.ttft_s) if self.use_y else np.zeros(len(u)) for u in self.types]
        if self.use_x and self.use_y and all(np.all(y <= x) for x, y in zip(xs, ys)):
            # every point's scaled prefill time is at most its scaled step time, so any path
            # within TPOT is within TTFT: one latency dimension suffices (exact, and the
            # scalar search is far faster than the Pareto one)
            self.use_y = False
            ys = [np.zeros(len(u)) for u in self.types]
        self.x = [xs[t] for t, _ in self.kinds]
        self.y = [ys[t] for t, _ in self.kinds]
        self.cap = [self.types[t].cap * j for t, j in self.kinds]
        self.k = [self.types[t].k for t, _ in self.kinds]
        self.inc = [j * self.radix[t] for t, j in self.kinds]
        self.role = []
        for t, _ in self.kinds:
            u = self.types[t]
            lo, hi = u.lo, u.hi
            self.role.append({
                "first": (~u.last) & (lo == 0),
                "only": u.last & (lo == 0),
                "mid": (~u.last) & (hi >= 1),
                "end": u.last & (lo >= 1),
            })
        # count vectors in order of the number of nodes used
        self.order: list[list[int]] = [[] for _ in range(sum(self.counts) + 1)]
        for c in range(self.full + 1):
            vec = self._vec(c)
            if all(v <= n for v, n in zip(vec, self.counts)):
                self.order[sum(vec)].append(c)

    def _vec(self, c: int) -> list[int]:
        return [c // self.radix[t] % (self.counts[t] + 1) for t in range(self.G)]

    def _fits(self, vec: list[int], kind: int) -> bool:
        t, j = self.kinds[kind]
        return vec[t] + j <= self.counts[t]

    def _done(self, c2: int) -> bool:
        return not self.require_all or c2 == self.full

    def candidates(self) -> np.ndarray:
        vals = self.cap + [self.link[np.isfinite(self.link)]]
        return np.unique(np.concatenate(vals)) if self.K else np.zeros(0)

    # ---- scalar DP (at most one latency bound) ---------------------------------------------

    def _scalar_tables(self, theta: float):
        L = self.L
        tabs = []
        for v in range(self.K):
            metric = self.x[v] if self.use_x else self.y[v]
            ok = self.cap[v] >= theta
            tab = {}
            for role, mask in self.role[v].items():
                arr = np.full(L + 1, np.inf)
                m = mask & ok
                if m.any():
                    np.minimum.at(arr, self.k[v][m], metric[m])
                tab[role] = arr
            tabs.append(tab)
        return tabs

    def feasible_scalar(self, theta: float) -> bool:
        L, K = self.L, self.K
        tabs = self._scalar_tables(theta)
        linkok = self.link >= theta
        val: dict[tuple[int, int], np.ndarray] = {}
        for v in range(K):
            if tabs[v]["only"][L] <= _BOUND and self._done(self.inc[v]):
                return True
            arr = tabs[v]["first"].copy()
            arr[L] = np.inf
            arr[arr > _BOUND] = np.inf
            if np.isfinite(arr).any():
                old = val.get((self.inc[v], v))
                val[self.inc[v], v] = arr if old is None else np.minimum(old, arr)
        pads = []
        for v in range(K):
            cpad = np.full(2 * L + 1, np.inf)
            cpad[L:] = tabs[v]["mid"]
            pads.append(sliding_window_view(cpad, L + 1)[::-1])  # W[b, c] = C[c - b]
        ends = [tabs[v]["end"][::-1] for v in range(K)]  # ends[v][b] = C_end[L - b]
        for level in self.order[1:]:
            for c in level:
                vec = self._vec(c)
                for v in range(K):
                    A = val.get((c, v))
                    if A is None:
                        continue
                    for u in range(K):
                        if not self._fits(vec, u) or not linkok[v, u]:
                            continue
                        c2 = c + self.inc[u]
                        if self._done(c2) and np.min(A + ends[u]) <= _BOUND:
                            return True
                        if c2 == self.full:
                            continue
                        new = (A[:, None] + pads[u]).min(axis=0)
                        new[L] = np.inf
                        new[new > _BOUND] = np.inf
                        if not np.isfinite(new).any():
                            continue
                        old = val.get((c2, u))
                        val[c2, u] = new if old is None else np.minimum(old, new)
        return False

    # ---- Pareto DP (both bounds), with reconstruction ----------------------------------------

    def _front_tables(self, theta: float):
        """Per stage kind and role: the points (k, x, y, rank) Pareto-best per k."""
        tabs = []
        for v in range(self.K):
            ok = self.cap[v] >= theta
            tab = {}
            for role, mask in self.role[v].items():
                r = np.nonzero(mask & ok)[0]
                if len(r):
                    r = r[_pareto(self.k[v][r], self.x[v][r], self.y[v][r])]
                tab[role] = (self.k[v][r], self.x[v][r], self.y[v][r], r)
            tabs.append(tab)
        return tabs

    def solve_front(self, theta: float, *, reconstruct: bool):
        """Feasibility at `theta`; with `reconstruct`, the stages as [(kind, rank, start)]."""
        L, K = self.L, self.K
        tabs = self._front_tables(theta)
        linkok = self.link >= theta
        # a state's front: arrays b, x, y, predecessor state id, predecessor index, rank
        store: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}
        pending: dict[tuple[int, int], list[tuple[np.ndarray, ...]]] = {}

        def finish(key, parts):
            cols = [np.concatenate([p[n] for p in parts]) for n in range(6)]
            keep = _pareto(cols[0], cols[1], cols[2])
            store[key] = tuple(col[keep] for col in cols)

        for v in range(K):
            k, x, y, r = tabs[v]["only"]
            hit = (k == L) & (x <= _BOUND) & (y <= _BOUND)
            if hit.any() and self._done(self.inc[v]):
                return [(v, int(r[np.nonzero(hit)[0][0]]), 0)] if reconstruct else True
            k, x, y, r = tabs[v]["first"]
            m = (k <= L - 1) & (x <= _BOUND) & (y <= _BOUND)
            if m.any():
                n = int(m.sum())
                pending.setdefault((self.inc[v], v), []).append(
                    (k[m], x[m], y[m], np.full(n, -1), np.full(n, -1), r[m]))
        keys: list[tuple[int, int]] = []
        for level in self.order[1:]:
            for c in level:
                vec = self._vec(c)
                for v in range(K):
                    parts = pending.pop((c, v), None)
                    if parts is None:
                        continue
                    finish((c, v), parts)
                    sid = len(keys)
                    keys.append((c, v))
                    bA, xA, yA = store[c, v][:3]  # bA ascends
                    for u in range(K):
                        if not self._fits(vec, u) or not linkok[v, u]:
                            continue
                        c2 = c + self.inc[u]
                        if self._done(c2):
                            k, x, y, r = tabs[u]["end"]
                            for j in range(len(k)):
                                start = L - int(k[j])  # the last stage starts where we are
                                lo = np.searchsorted(bA, start)
                                hi = np.searchsorted(bA, start, side="right")
                                if lo == hi:
                                    continue
                                ok = (xA[lo:hi] + x[j] <= _BOUND) & (yA[lo:hi] + y[j] <= _BOUND)
                                if ok.any():
                                    if not reconstruct:
                                        return True
                                    idx = lo + int(np.nonzero(ok)[0][0])
                                    return self._backtrack(store, keys, (c, v), idx,
                                                           (u, int(r[j]), start))
                        if c2 == self.full:
                            continue
                        k, x, y, r = tabs[u]["mid"]
                        if not len(k):
                            continue
                        nb = bA[:, None] + k[None, :]
                        nx = xA[:, None] + x[None, :]
                        ny = yA[:, None] + y[None, :]
                        m = (nb <= L - 1) & (nx <= _BOUND) & (ny <= _BOUND)
                        if not m.any():
                            continue
                        ia, io = np.nonzero(m)
                        pending.setdefault((c2, u), []).append(
                            (nb[m], nx[m], ny[m], np.full(len(ia), sid), ia, r[io]))
        return None if reconstruct else False

    def _backtrack(self, store, keys, key, idx, tail):
        out = [tail]
        while True:
            c, v = key
            b, x, y, pst, pidx, rk = store[key]
            k = int(self.k[v][rk[idx]])
            out.append((v, int(rk[idx]), int(b[idx]) - k))
            if pst[idx] < 0:
                break
            key, idx = keys[int(pst[idx])], int(pidx[idx])
        return out[::-1]

    # ---- driver ------------------------------------------------------------------------------

    def feasible(self, theta: float) -> bool:
        if self.use_x and self.use_y:
            return bool(self.solve_front(theta, reconstruct=False))
        return self.feasible_scalar(theta)

    def best(self, at_least: float = -math.inf) -> Chain | None:
        """The best chain, or None if none exists (or none beats `at_least`)."""
        if self.K == 0:
            return None
        cands = self.candidates()
        if self.require_all:
            # every type is used, so its best group capacity bounds the bottleneck
            ub = min(float(u.cap.max()) * n for u, n in zip(self.types, self.counts))
            cands = cands[cands <= ub]
        cands = cands[cands > at_least]
        if at_least > -math.inf:
            if len(cands) == 0:
                return None  # nothing can beat the floor: no DP needed
        elif not self.feasible(-math.inf):
            return None
        lo, hi = -1, len(cands) - 1  # cands[lo] feasible (lo = -1: below all), find the last
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.feasible(float(cands[mid])):
                lo = mid
            else:
                hi = mid - 1
        if lo < 0 and at_least > -math.inf:
            return None
        theta = -math.inf if lo < 0 else float(cands[lo])
        path = self.solve_front(theta, reconstruct=True)
        assert path is not None, "chain DP: the scalar and Pareto searches disagree"
        used = [0] * self.G
        stages = []
        thr = math.inf
        prev = None
        for v, r, s in path:
            t, j = self.kinds[v]
            grp = tuple(self.members[t][used[t]:used[t] + j])
            used[t] += j
            u = self.types[t]
            stages.append((grp, int(u.opt[r]), s))
            thr = min(thr, float(self.cap[v][r]))
            if prev is not None:
                thr = min(thr, float(self.link[prev, v]))
            prev = v
        return Chain(throughput=thr, stages=tuple(stages))


def _pareto(b: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points not dominated within their `b` group (min x, min y), sorted by
    (b, x, y); of equal points the first is kept."""
    n = len(b)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((y, x, b))
    bs, ys = b[order], y[order]
    # equal y values share a rank so that equal points count as dominated
    yrank = np.searchsorted(np.sort(ys), ys).astype(np.int64)
    span = int(bs.max()) - int(bs.min()) + 1
    key = (span - (bs.astype(np.int64) - int(bs.min()))) * (n + 1) + yrank
    prev = np.minimum.accumulate(np.concatenate(([np.iinfo(np.int64).max], key[:-1])))
    return order[key < prev]


def best_chain(prep: Prepared, nodes: Sequence[int] | None = None, *,
               require_all: bool = True, groups: bool = False,
               at_least: float = -math.inf) -> Chain | None:
    """The highest-throughput chain over `nodes` (default: all nodes that can carry flow).

    `require_all`: every node is a stage; otherwise any non-empty subset may be.
    `groups`: stages may be data-parallel groups of identical nodes.
    `at_least`: only report a chain with a higher throughput than this.
    """
    if nodes is None:
        nodes = prep.active
    nodes = [i for i in nodes if prep.usable[i] is not None]
    if not nodes:
        return None
    return _ChainDP(prep, nodes, require_all, groups).best(at_least)


def best_replicas(prep: Prepared) -> Assignment:
    """Flow-topology lower bound: the best split of the nodes into independent replicas,
    each a pipeline of data-parallel stages of identical nodes (nodes may stay idle).

    Exact over that class: the best replica on every sub-multiset of the nodes, then a DP
    over sub-multisets for the best partition.
    """
    members = [list(g) for g in prep.groups]
    counts = [len(g) for g in members]
    vecs = [v for v in itertools.product(*(range(n + 1) for n in counts)) if any(v)]
    vecs.sort(key=sum)
    replica: dict[tuple[int, ...], Chain | None] = {}
    for vec in vecs:
        nodes = [i for g, n in zip(members, vec) for i in g[:n]]
        replica[vec] = best_chain(prep, nodes, require_all=True, groups=True)
    zero = tuple(0 for _ in counts)
    best: dict[tuple[int, ...], tuple[float, list[tuple[int, ...]]]] = {zero: (0.0, [])}
    for vec in vecs:
        ch = replica[vec]
        cand = (ch.throughput, [vec]) if ch is not None else (0.0, [])
        for sub in itertools.product(*(range(n + 1) for n in vec)):
            if not any(sub) or sub == vec or replica.get(sub) is None:
                continue
            rest = tuple(a - b for a, b in zip(vec, sub))
            val = replica[sub].throughput + best[rest][0]
            if val > cand[0]:
                cand = (val, [sub] + best[rest][1])
        best[vec] = cand
    full = tuple(counts)
    out = Assignment({}, {})
    used = [0] * len(counts)
    for sub in best.get(full, (0.0, []))[1] if any(full) else []:
        ch = replica[sub]
        # map the replica's nodes (the first members of each group) to unused members
        remap = {}
        for t, n in enumerate(sub):
            for a, b in zip(members[t][:n], members[t][used[t]:used[t] + n]):
                remap[a] = b
            used[t] += n
        sub_a = ch.assignment()
        out.choice.update({remap[i]: c for i, c in sub_a.choice.items()})
        for (u, v), f in sub_a.edges.items():
            out.edges[(remap.get(u, u), remap.get(v, v))] = f
    return out


def solve_chain(problem: PlacementProblem, *, prep: Prepared | None = None) -> Placement:
    """Exact optimum of a `chain` problem (every node one stage of one pipeline)."""
    t0 = time.perf_counter()
    prep = prep if prep is not None else prepare(problem)
    if prep.infeasible:
        return infeasible_placement(prep.infeasible, time.perf_counter() - t0, "chain-dp")
    missing = [i for i, u in enumerate(prep.usable) if u is None]
    if missing:
        return infeasible_placement(
            f"node {missing[0]} has no operating point within the SLO",
            time.perf_counter() - t0, "chain-dp")
    ch = best_chain(prep, require_all=True)
    if ch is None:
        return infeasible_placement("no chain meets memory and SLO",
                                    time.perf_counter() - t0, "chain-dp")
    return to_placement(prep, ch.assignment(), status=SolveStatus.OPTIMAL, gap=0.0,
                        solve_s=time.perf_counter() - t0, method="chain-dp",
                        keep_empty_edges=True)


# --------------------------------------------------------------------------------------------
# Upper bound for the flow topology: the path LP
# --------------------------------------------------------------------------------------------


def path_lp_bound(prep: Prepared, seed: Assignment | None = None, *, max_iter: int = 200,
                  tol: float = 1e-9) -> float:
    """An upper bound on the flow-topology optimum that accounts for path latency.

    Relax each node's choice to a distribution over (point, start) configurations, and let
    flow follow any *path* of configurations that covers [0, L) within the latency bound(s)
    (configurations of one node type may repeat; NIC limits are dropped). The LP
    `max sum_p f_p  s.t.  sum_p w_t(p) f_p <= n_t  (every node type t)`, with
    `w_t(p) = sum over the stages of type t on p of 1 / capacity`, bounds the optimum: in a
    real placement node i spends the fraction flow_i / cap_i of its time on its one range.
    Its dual, `min sum_t n_t pi_t  s.t.  sum_t pi_t w_t(p) >= 1  (every path p)`, has one
    variable per node type; it is solved by generating paths: the pricing problem (least
    `sum pi_t / cap` path within the latency bound) is a shortest path over layer boundaries
    with labels (cost, latency). Any dual iterate `pi` scaled by the least path cost is dual
    feasible, so what is returned is a valid bound even if `max_iter` stops early. With both
    SLOs bounded, each is taken alone (two bounds, the smaller kept).
    """
    metrics = _metrics_of(prep.problem)
    if not prep.groups:
        return 0.0
    if not metrics:
        metrics = [None]
    best = math.inf
    for m in metrics:
        best = min(best, _path_lp_one(prep, m, seed, max_iter, tol))
    return best


def _metrics_of(problem: PlacementProblem) -> list[str]:
    out = []
    if problem.tpot_s is not None:
        out.append("step")
    if problem.ttft_s is not None:
        out.append("pre")
    return out


def _path_lp_one(prep: Prepared, metric: str | None, seed: Assignment | None,
                 max_iter: int, tol: float) -> float:
    import highspy

    from coral.solvers import quiet_highs

    L = prep.problem.num_layers
    types = [prep.usable[g[0]] for g in prep.groups]
    counts = np.array([len(g) for g in prep.groups], dtype=float)
    type_of = {i: t for t, g in enumerate(prep.groups) for i in g}
    G = len(types)
    bound = None if metric is None else (prep.problem.tpot_s if metric == "step"
                                         else prep.problem.ttft_s)
    res = [np.zeros(len(u)) if metric is None else getattr(u, metric) / bound for u in types]
    suffix = prep.suffix.get(metric, np.zeros(L + 1)) if metric else np.zeros(L + 1)
    # configurations by start layer: (type, rank, k, resource, capacity)
    by_start = []
    for b in range(L):
        rows = []
        for t, u in enumerate(types):
            r = np.nonzero(u.starts[:, b])[0]
            if len(r):
                rows.append((np.full(len(r), t), r, u.k[r], res[t][r], u.cap[r]))
        if rows:
            by_start.append(tuple(np.concatenate([x[n] for x in rows]) for n in range(5)))
        else:
            by_start.append(None)

    def pricing(pi: np.ndarray, limit: float) -> tuple[float, np.ndarray | None]:
        """Least cost sum pi_t / cap over latency-feasible paths, if below `limit`, and the
        path's w (else (inf, None))."""
        togo = np.full(L + 1, np.inf)  # resource-free cost to go, for pruning
        togo[L] = 0.0
        for b in range(L - 1, -1, -1):
            cf = by_start[b]
            if cf is not None:
                t, r, k, x, cap = cf
                togo[b] = np.min(pi[t] / cap + togo[b + k])
        best_cost, best_lab = limit, None
        # labels per boundary: cost, resource, back-pointer (boundary, index), type, cap
        fronts: dict[int, tuple[np.ndarray, ...]] = {}
        pending: dict[int, list[tuple[np.ndarray, ...]]] = {0: [(
            np.zeros(1), np.zeros(1), np.full(1, -1), np.full(1, -1), np.full(1, -1),
            np.ones(1))]}
        for b in range(L):
            parts = pending.pop(b, None)
            if parts is None or by_start[b] is None:
                continue
            cols = [np.concatenate([p[n] for p in parts]) for n in range(6)]
            order = np.lexsort((cols[1], cols[0]))
            cols = [c[order] for c in cols]
            keep = cols[1] < np.minimum.accumulate(
                np.concatenate(([np.inf], cols[1][:-1])))
            cols = [c[keep] for c in cols]
            cost, x = cols[0], cols[1]
            t, r, k, xr, cap = by_start[b]
            cc = pi[t] / cap
            tgt = b + k
            # configurations that cannot beat the limit even from the cheapest label
            ok = (cost[0] + cc + togo[tgt] < best_cost) & (x[-1] + xr + suffix[tgt] <= _BOUND)
            if not ok.any():
                continue
            keep = cost + togo[b] < best_cost
            cols = [c[keep] for c in cols]
            fronts[b] = tuple(cols)
            cost, x = cols[0], cols[1]
            t, k, xr, cap, cc, tgt = t[ok], k[ok], xr[ok], cap[ok], cc[ok], tgt[ok]
            c2 = cost[:, None] + cc[None, :]
            x2 = x[:, None] + xr[None, :]
            m = (x2 + suffix[tgt][None, :] <= _BOUND) & (c2 + togo[tgt][None, :] < best_cost)
            if not m.any():
                continue
            ia, ic = np.nonzero(m)
            tg = tgt[ic]
            done = tg == L
            if done.any():
                cd = c2[ia[done], ic[done]]
                j = int(np.argmin(cd))
                if cd[j] < best_cost:
                    best_cost = float(cd[j])
                    best_lab = (b, int(ia[done][j]), int(t[ic[done][j]]),
                                float(cap[ic[done][j]]))
            ia, ic, tg = ia[~done], ic[~done], tg[~done]
            if not len(tg):
                continue
            srt = np.argsort(tg, kind="stable")
            ia, ic, tg = ia[srt], ic[srt], tg[srt]
            cut = np.nonzero(np.diff(tg))[0] + 1
            for lo, hi in zip(np.concatenate(([0], cut)), np.concatenate((cut, [len(tg)]))):
                a_, c_ = ia[lo:hi], ic[lo:hi]
                pending.setdefault(int(tg[lo]), []).append((
                    c2[a_, c_], x2[a_, c_], np.full(hi - lo, b), a_, t[c_], cap[c_]))
        if best_lab is None:
            return math.inf, None
        w = np.zeros(G)
        b, idx, tt, cp = best_lab
        w[tt] += 1.0 / cp
        while b > 0:
            cost, x, pb, pidx, pt, pcap = fronts[b]
            w[int(pt[idx])] += 1.0 / float(pcap[idx])
            b, idx = int(pb[idx]), int(pidx[idx])
        return best_cost, w

    # seed columns: the paths of the best split into replicas, else none
    cols: list[np.ndarray] = []
    if seed is not None:
        succ: dict[int, list[int]] = {}
        for (u, v), f in seed.edges.items():
            if f > 0:
                succ.setdefault(u, []).append(v)

        def walk(u: int, w: np.ndarray) -> None:
            for v in succ.get(u, []):
                if v == SINK:
                    cols.append(w.copy())
                    continue
                oi = seed.choice[v][0]
                cap = prep.problem.nodes[v].options[oi].capacity
                w2 = w.copy()
                w2[type_of[v]] += 1.0 / cap
                if len(cols) < 64:
                    walk(v, w2)

        walk(SOURCE, np.zeros(G))
    if pricing(np.zeros(G), math.inf)[1] is None:
        return 0.0  # no path meets the latency bound: no flow at all
    ub = math.inf
    pi = np.zeros(G)
    for _ in range(max_iter):
        if cols:
            h = quiet_highs()
            h.addVars(G, np.zeros(G), np.full(G, highspy.kHighsInf))
            h.changeColsCost(G, np.arange(G, dtype=np.int32), counts)
            for w in cols:
                nz = np.nonzero(w)[0].astype(np.int32)
                h.addRow(1.0, highspy.kHighsInf, len(nz), nz, w[nz])
            h.run()
            if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
                break
            pi = np.maximum(np.array(h.getSolution().col_value), 0.0)
        cost, w = pricing(pi, 1.0 - tol)
        if w is None:  # every path costs >= 1 - tol: pi is (nearly) dual feasible
            ub = min(ub, float(counts @ pi) / (1.0 - tol))
            break
        if cost > 0:  # pi / cost is dual feasible (Farley's bound)
            ub = min(ub, float(counts @ pi) / cost)
        cols.append(w)
    return ub
