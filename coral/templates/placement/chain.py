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

`path_lp.path_lp_bound` is the matching upper bound. When the two meet, the replica split is
optimal and no MILP is needed.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from coral.templates.placement.prep import (
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
