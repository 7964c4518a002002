"""An upper bound on a combination's throughput for the flow and DAG topologies: the path LP.

The LP over latency-feasible source-to-sink paths with each node's choice convexified, solved
by generating paths (the pricing problem is a labelled shortest path over layer boundaries).
When it meets the best split into replicas (`placement_chain.best_replicas`) that split is
optimal and no MILP is needed.
"""

from __future__ import annotations

import math

import numpy as np

from coral.templates.placement.prep import LATENCY_RTOL, Assignment, Prepared
from coral.templates.types import SINK, SOURCE, PlacementProblem

_BOUND = 1.0 + LATENCY_RTOL  # latencies are scaled by their SLO

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
