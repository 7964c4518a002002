"""Placement MILP (Helix's max-flow placement with exact path-latency SLOs), built for HiGHS.

The model, for nodes `i` of a combination and a model of `L` layers:

* node `i` picks one operating point `o` (one-hot `z[i,o]`) and a start layer `s[i]`, and holds
  `[s[i], s[i] + k_o)`; a last-stage point ends at `L`, any other point before `L`;
* `first[i] = 1` iff `s[i] = 0`; the node holding layer 0 needs `first_stage_extra_bytes` more;
* edges: source→i iff `first[i]`, i→sink iff `o` is a last-stage point, i→j (binary `y[i,j]`)
  only if `s[i] + k[i] = s[j]`; flows are conserved, a node's inflow is at most its capacity,
  an inter-node edge carries at most `min(NIC_i, NIC_j) / edge_bytes_per_unit`;
* latency: cumulative step times `a[j] >= a[i] + step[j] - M (1 - y[i,j])`, `a[i] <= TPOT`, and
  the same with prefill times against TTFT — every flow-carrying path meets both bounds;
* objective: maximise the flow out of the source.

Two builds:

* ``NaiveMilp`` (``naive=True``) — the formulation written down directly: every operating
  point that fits somewhere, integer starts in [0, L], binaries on every ordered node pair and
  on source/sink edges, big-M `2L` on ranges and a fixed huge constant on flows and latencies,
  no symmetry breaking, no bounds beyond the obvious, no start. The benchmark baseline.
* ``TightMilp`` (the default) — points filtered by `prepare` (memory, own latency,
  dominance, prefix/suffix path latency); nodes may stay unused (then they hold nothing in
  the model, which removes the duplicate solutions that differ only in what idle nodes
  hold); edges only where ranges can meet; big-M from real capacities, start windows and
  the SLO (M = 1 on scaled latencies); bounds on every variable; per-point capacity rows
  with the layer-coverage equality `sum_i k_i inflow_i = L T`; "a used node has a way in and
  out" rows; forward and backward latencies with per-layer prefix/suffix lower bounds;
  symmetry breaking among identical nodes; the objective capped by an upper bound; a warm
  start (the best split into replicas of `placement_chain`, exact for `flow`).

Status is reported as HiGHS proves it: `optimal` only when the MILP closed, `time_limit` with
the gap between the incumbent and the proven bound otherwise. Flows of the returned placement
are recomputed by an LP on the MILP's discrete choice, so they satisfy the model exactly.

Each constraint family is one method whose docstring states the inequality and its index set;
each returns the number of rows it added.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

import numpy as np

from coral.templates.types import SINK, SOURCE, Placement, PlacementProblem

from coral.templates.placement.milp import INF, MilpBase, NaiveMilp
from coral.templates.placement.prep import (
    Assignment,
    Prepared,
    edge_limit,
    latency_metrics,
    prepare,
)

# ---- the tightened build --------------------------------------------------------------------


class TightMilp(MilpBase):
    """The tightened placement MILP.

    Per node `i`: `used[i]`, one-hot point `z[i,r]` (summing to `used[i]`), integer start
    `s[i]`, `first[i]` (s = 0 and used), per-point inflow `g[i,r]`; per candidate edge
    `y[i,j]` and flow `f[i,j]`; `fsrc`, `fsnk`; forward/backward latencies per SLO; `T`.
    Unused nodes hold nothing in the model (they are reported with any memory-feasible
    point), which removes every duplicate solution that only differs in what idle nodes hold.
    Against the naive build: filtered points, big-M from real capacities and start windows,
    bounds on every variable, per-point capacity rows with the layer-coverage equality, path
    structure rows, prefix/suffix latency bounds, symmetry breaking among identical nodes,
    an objective upper bound and a warm start.
    """

    method = "ilp"
    presolve_off_above = 2000

    def _row_families(self) -> list[tuple[str, Callable[[], int]]]:
        families = [("node_use", self._add_node_use), ("layer_range", self._add_layer_range),
                    ("edge_activation", self._add_edge_activation),
                    ("edge_flow_bounds", self._add_edge_flow_bounds),
                    ("conservation", self._add_conservation), ("capacity", self._add_capacity),
                    ("layer_coverage", self._add_layer_coverage),
                    ("objective", self._add_objective),
                    ("path_structure", self._add_path_structure)]
        families += [(f"latency_{m}", partial(self._add_latency, m))
                     for m, _ in latency_metrics(self.problem)]
        if self.symmetry:
            families.append(("symmetry_breaking", self._add_symmetry_breaking))
        return families

    def _add_variables(self) -> None:
        """Columns with their bounds: `used, z, first, y` binary; `s[i]` integer in
        [0, max start]; `g[i,r] <= cap_r`; `fsrc[i] <=` max cap of points that may start at 0;
        `fsnk[i] <=` of last points; `f[i,j] <= U[i,j] = min(max cap of i's non-last points,
        max cap of j's points starting after 0, NIC_ij)`; latencies in [0, 1]; `T <=` the
        upper bound. Chain topology: `used = 1`."""
        b, fs = self.b, self.fs
        nodes = self.nodes()
        self.used, self.z, self.g, self.s, self.first = {}, {}, {}, {}, {}
        self.fsrc, self.fsnk, self.smax, self.kmax = {}, {}, {}, {}
        for i in nodes:
            u = self.prep.usable[i]
            self.used[i] = b.col(f"used[{i}]", 1 if self.chain else 0, 1, True)
            self.z[i] = [b.col(f"z[{i},{r}]", 0, 1, True) for r in range(len(u))]
            self.g[i] = [b.col(f"g[{i},{r}]", 0, float(u.cap[r]) / fs) for r in range(len(u))]
            self.smax[i] = int(u.hi.max())
            self.kmax[i] = int(u.k.max())
            self.s[i] = b.col(f"s[{i}]", 0, self.smax[i], True)
            can0 = bool(u.ok0.any())
            self.first[i] = b.col(f"first[{i}]", 0, 1 if can0 else 0, True)
            self.fsrc[i] = b.col(f"fsrc[{i}]", 0, float(u.cap[u.ok0].max()) / fs if can0 else 0)
            self.fsnk[i] = b.col(f"fsnk[{i}]", 0, float(u.cap[u.last].max()) / fs
                                 if u.last.any() else 0.0)
        self.y, self.f, self.U = {}, {}, {}
        for i in nodes:
            for j in nodes:
                if i == j or not self._edge_possible(i, j):
                    continue
                ui, uj = self.prep.usable[i], self.prep.usable[j]
                self.U[i, j] = min(float(ui.cap[~ui.last].max()),
                                   float(uj.cap[uj.starts[:, 1:].any(axis=1)].max()),
                                   edge_limit(self.problem, i, j)) / fs
                self.y[i, j] = b.col(f"y[{i},{j}]", 0, 1, True)
                self.f[i, j] = b.col(f"f[{i},{j}]", 0, self.U[i, j])
        self.lat: dict[str, tuple[dict[int, int], dict[int, int]]] = {}
        for m, _ in latency_metrics(self.problem):
            self.lat[m] = ({i: b.col(f"{m}_fwd[{i}]", 0, 1) for i in nodes},
                           {i: b.col(f"{m}_bwd[{i}]", 0, 1) for i in nodes})
        ub = INF if self.ub is None else self.ub / fs * (1 + 1e-9) + 1e-12
        self.T = b.col("T", 0, ub)
        b.cost[self.T] = 1.0

    def _edge_possible(self, i: int, j: int) -> bool:
        ui, uj = self.prep.usable[i], self.prep.usable[j]
        rr, ss = np.nonzero(ui.starts & ~ui.last[:, None])
        ends = set((ss + ui.k[rr]).tolist())
        starts = set(np.nonzero(uj.starts[:, 1:].any(axis=0))[0] + 1)
        return bool(ends & starts)

    def _zsum(self, i: int, coef: np.ndarray, mask: np.ndarray | None = None):
        return [(c, float(coef[r])) for r, c in enumerate(self.z[i])
                if (mask is None or mask[r]) and coef[r] != 0]

    def _inflow(self, i: int) -> list[tuple[int, float]]:
        return [(self.fsrc[i], 1.0)] + [(f, 1.0) for (p, q), f in self.f.items() if q == i]

    def _outflow(self, i: int) -> list[tuple[int, float]]:
        return [(self.fsnk[i], 1.0)] + [(f, 1.0) for (p, q), f in self.f.items() if p == i]

    def _add_node_use(self) -> int:
        """sum_r z[i,r] = used[i],  first[i] <= used[i],  s[i] <= smax[i] used[i]  (every i)."""
        b, n = self.b, 0
        for i in self.nodes():
            n += b.row([(c, 1.0) for c in self.z[i]] + [(self.used[i], -1.0)], 0, 0)
            n += b.row([(self.first[i], 1.0), (self.used[i], -1.0)], -INF, 0)
            n += b.row([(self.s[i], 1.0), (self.used[i], -float(self.smax[i]))], -INF, 0)
        return n

    def _add_layer_range(self) -> int:
        """Start window of the chosen point, for every node i:

          s[i] >= sum_r lo_r z[i,r],   s[i] <= sum_r hi_r z[i,r],
          s[i] >= used[i] - first[i],  s[i] <= smax[i] (1 - first[i]),
          first[i] <= sum_{r: r may start at 0} z[i,r].
        (Last points have lo = hi = L - k, so they end at L; others end before L.)
        """
        b, n = self.b, 0
        for i in self.nodes():
            u, s, fi = self.prep.usable[i], self.s[i], self.first[i]
            n += b.row([(s, 1.0)] + [(c, -v) for c, v in self._zsum(i, u.lo.astype(float))],
                       0, INF)
            n += b.row([(s, 1.0)] + [(c, -v) for c, v in self._zsum(i, u.hi.astype(float))],
                       -INF, 0)
            n += b.row([(s, 1.0), (fi, 1.0), (self.used[i], -1.0)], 0, INF)
            n += b.row([(s, 1.0), (fi, float(self.smax[i]))], -INF, self.smax[i])
            n += b.row([(fi, 1.0)] + [(c, -1.0) for r, c in enumerate(self.z[i]) if u.ok0[r]],
                       -INF, 0)
        return n

    def _add_edge_activation(self) -> int:
        """An enabled edge joins adjacent ranges, for every candidate edge (i, j):

          s[j] - s[i] - k[i] <= M+ (1 - y[i,j]),  s[i] + k[i] - s[j] <= M- (1 - y[i,j]),
        M+ = smax[j], M- = smax[i] + kmax[i] (from the bounds, unused nodes included);
          y[i,j] <= sum_{r not last} z[i,r],  y[i,j] <= used[j] - first[j],  y[i,j] + y[j,i] <= 1.
        """
        b, n = self.b, 0
        for (i, j), y in self.y.items():
            ui = self.prep.usable[i]
            mp, mm = float(self.smax[j]), float(self.smax[i] + self.kmax[i])
            diff = ([(self.s[j], 1.0), (self.s[i], -1.0)]
                    + [(c, -v) for c, v in self._zsum(i, ui.k.astype(float))])
            n += b.row(diff + [(y, mp)], -INF, mp)
            n += b.row([(c, -v) for c, v in diff] + [(y, mm)], -INF, mm)
            n += b.row([(y, 1.0)] + [(c, -1.0) for r, c in enumerate(self.z[i])
                                     if not ui.last[r]], -INF, 0)
            n += b.row([(y, 1.0), (self.first[j], 1.0), (self.used[j], -1.0)], -INF, 0)
            if i < j and (j, i) in self.y:
                n += b.row([(y, 1.0), (self.y[j, i], 1.0)], -INF, 1)
        return n

    def _add_edge_flow_bounds(self) -> int:
        """f[i,j] <= U[i,j] y[i,j];  fsrc[i] <= capmax0[i] first[i];
        fsnk[i] <= sum_{r last} cap_r z[i,r]."""
        b, n, fs = self.b, 0, self.fs
        for (i, j), y in self.y.items():
            n += b.row([(self.f[i, j], 1.0), (y, -self.U[i, j])], -INF, 0)
        for i in self.nodes():
            u = self.prep.usable[i]
            if u.ok0.any():
                n += b.row([(self.fsrc[i], 1.0),
                            (self.first[i], -float(u.cap[u.ok0].max()) / fs)], -INF, 0)
            if u.last.any():
                n += b.row([(self.fsnk[i], 1.0)] + [(c, -v) for c, v in
                                                    self._zsum(i, u.cap / fs, u.last)], -INF, 0)
        return n

    def _add_conservation(self) -> int:
        """fsrc[i] + sum_j f[j,i] = fsnk[i] + sum_j f[i,j]           for every node i."""
        return sum(self.b.row(self._inflow(i) + [(c, -v) for c, v in self._outflow(i)], 0, 0)
                   for i in self.nodes())

    def _add_capacity(self) -> int:
        """inflow[i] = sum_r g[i,r],  g[i,r] <= cap_r z[i,r]     (every node i, point r)."""
        b, n = self.b, 0
        for i in self.nodes():
            u = self.prep.usable[i]
            n += b.row(self._inflow(i) + [(g, -1.0) for g in self.g[i]], 0, 0)
            for r, g in enumerate(self.g[i]):
                n += b.row([(g, 1.0), (self.z[i][r], -float(u.cap[r]) / self.fs)], -INF, 0)
        return n

    def _add_layer_coverage(self) -> int:
        """sum_i sum_r k_r g[i,r] = L T        (each unit of flow passes all L layers; one row).
        """
        terms = [(g, float(self.prep.usable[i].k[r]))
                 for i in self.nodes() for r, g in enumerate(self.g[i])]
        return self.b.row(terms + [(self.T, -float(self.problem.num_layers))], 0, 0)

    def _add_objective(self) -> int:
        """T = sum_i fsrc[i]   (maximise T; one row)."""
        return self.b.row([(self.T, 1.0)] + [(self.fsrc[i], -1.0) for i in self.nodes()], 0, 0)

    def _add_path_structure(self) -> int:
        """first[i] + sum_j y[j,i] >= used[i],  sum_{r last} z[i,r] + sum_j y[i,j] >= used[i].
        (Valid: in an optimal solution, `used` marks the nodes with positive flow.)"""
        b, n = self.b, 0
        if self.chain:
            return 0
        for i in self.nodes():
            u = self.prep.usable[i]
            lastz = [(c, 1.0) for r, c in enumerate(self.z[i]) if u.last[r]]
            n += b.row([(self.first[i], 1.0)] + [(y, 1.0) for (p, q), y in self.y.items()
                                                 if q == i] + [(self.used[i], -1.0)], 0, INF)
            n += b.row(lastz + [(y, 1.0) for (p, q), y in self.y.items() if p == i]
                       + [(self.used[i], -1.0)], 0, INF)
        return n

    def _add_latency(self, m: str) -> int:
        """Path latency within the SLO (scaled to 1), t[i] = sum_r t_r z[i,r]:

          a[i] >= t[i] + rho s[i],   d[i] >= t[i] + sigma (L used[i] - s[i] - k[i]),
          a[i] + d[i] - t[i] <= 1                                       (every node i),
          a[j] >= a[i] + t[j] - (1 - y[i,j]),  d[i] >= d[j] + t[i] - (1 - y[i,j])
                                                                        (every candidate edge),
        with rho = min_s P(s)/s and sigma = min_c S(c)/(L - c) the per-layer slopes of the
        prefix/suffix latency lower bounds (so rho s <= P(s)).
        """
        b, n, L = self.b, 0, self.problem.num_layers
        fwd, bwd = self.lat[m]
        P, S = self.prep.prefix[m], self.prep.suffix[m]
        with np.errstate(invalid="ignore", divide="ignore"):
            rho = float(np.min(P[1:L] / np.arange(1, L))) if L > 1 else 0.0
            sig = float(np.min(S[:L] / (L - np.arange(L))))
        rho = rho if math.isfinite(rho) else 0.0
        sig = sig if math.isfinite(sig) else 0.0
        bound = self.problem.tpot_s if m == "step" else self.problem.ttft_s
        t = {i: getattr(self.prep.usable[i], m) / bound for i in self.nodes()}
        for i in self.nodes():
            u = self.prep.usable[i]
            ti = [(c, -v) for c, v in self._zsum(i, t[i])]
            n += b.row([(fwd[i], 1.0), (self.s[i], -rho)] + ti, 0, INF)
            n += b.row([(bwd[i], 1.0), (self.s[i], sig), (self.used[i], -sig * L)] + ti
                       + [(c, sig * v) for c, v in self._zsum(i, u.k.astype(float))], 0, INF)
            n += b.row([(fwd[i], 1.0), (bwd[i], 1.0)] + ti, -INF, 1.0)
        for (i, j), y in self.y.items():
            n += b.row([(fwd[j], 1.0), (fwd[i], -1.0), (y, -1.0)]
                       + [(c, -v) for c, v in self._zsum(j, t[j])], -1.0, INF)
            n += b.row([(bwd[i], 1.0), (bwd[j], -1.0), (y, -1.0)]
                       + [(c, -v) for c, v in self._zsum(i, t[i])], -1.0, INF)
        return n

    def _add_symmetry_breaking(self) -> int:
        """Identical nodes i < i' in order (consecutive members of each group):

          used[i] <= used[i'],   R s[i] + sum_r r z[i,r] <= R s[i'] + sum_r r z[i',r].
        """
        b, n = self.b, 0
        for grp in self.prep.groups:
            for i, j in zip(grp, grp[1:]):
                R = float(len(self.prep.usable[i]))
                if not self.chain:
                    n += b.row([(self.used[i], 1.0), (self.used[j], -1.0)], -INF, 0)
                terms = [(self.s[i], R), (self.s[j], -R)]
                terms += [(c, float(r)) for r, c in enumerate(self.z[i])]
                terms += [(c, -float(r)) for r, c in enumerate(self.z[j])]
                n += b.row(terms, -INF, 0)
        return n

    def _add_chain_structure(self) -> int:
        """One pipeline through every node (`used = 1`):  sum_i first[i] = 1,
        sum_i last[i] = 1,  first[i] + sum_j y[j,i] = 1,  last[i] + sum_j y[i,j] = 1,
        inflow[i] = T."""
        b, n = self.b, 0
        nodes = self.nodes()
        last = {i: [(c, 1.0) for r, c in enumerate(self.z[i]) if self.prep.usable[i].last[r]]
                for i in nodes}
        n += b.row([(self.first[i], 1.0) for i in nodes], 1, 1)
        n += b.row([t for i in nodes for t in last[i]], 1, 1)
        for i in nodes:
            n += b.row([(self.first[i], 1.0)] + [(y, 1.0) for (p, q), y in self.y.items()
                                                 if q == i], 1, 1)
            n += b.row(last[i] + [(y, 1.0) for (p, q), y in self.y.items() if p == i], 1, 1)
            n += b.row(self._inflow(i) + [(self.T, -1.0)], 0, 0)
        return n

    def _start_vector(self, a: Assignment) -> np.ndarray | None:
        P, fs, L = self.problem, self.fs, self.problem.num_layers
        a = canonical(self.prep, a)
        x = np.zeros(len(self.b.col_lb))
        rank = {}
        for i, (oi, s) in a.choice.items():
            u = self.prep.usable[i]
            if u is None:
                return None
            rs = np.nonzero(u.opt == oi)[0]
            if len(rs) == 0 or not u.starts[rs[0], s]:
                return None
            r = rank[i] = int(rs[0])
            x[self.used[i]] = 1
            x[self.z[i][r]] = 1
            x[self.s[i]] = s
            x[self.first[i]] = 1 if s == 0 else 0
            x[self.g[i][r]] = sum(f for (p_, q), f in a.edges.items() if q == i) / fs
        if self.chain and len(rank) < len(self.nodes()):
            return None
        for (i, j), f in a.edges.items():
            if i == SOURCE:
                x[self.fsrc[j]] = f / fs
            elif j == SINK:
                x[self.fsnk[i]] = f / fs
            elif (i, j) in self.y:
                x[self.y[i, j]] = 1
                x[self.f[i, j]] = f / fs
            else:
                return None
        x[self.T] = min(a.throughput / fs, self.b.col_ub[self.T])
        order = sorted(a.choice, key=lambda i: a.choice[i][1])
        for m, bound in latency_metrics(P):
            fwd, bwd = self.lat[m]
            own = {i: float(getattr(self.prep.usable[i], m)[rank[i]]) / bound for i in order}
            pv, sv = self.prep.prefix[m], self.prep.suffix[m]
            av, dv = {}, {}
            for i in order:
                preds = [av[p_] for (p_, q) in a.edges if q == i and p_ >= 0]
                av[i] = own[i] + max(preds + [float(pv[a.choice[i][1]])])
            for i in reversed(order):
                end = a.choice[i][1] + int(self.prep.usable[i].k[rank[i]])
                succ = [dv[q] for (p_, q) in a.edges if p_ == i and q >= 0]
                dv[i] = own[i] + max(succ + [float(sv[end])])
            for i in order:
                x[fwd[i]] = min(av[i], 1.0)
                x[bwd[i]] = min(dv[i], 1.0)
        del L
        return x

    def _read(self, x: np.ndarray) -> Assignment:
        choice = {}
        L = self.problem.num_layers
        for i in self.nodes():
            if x[self.used[i]] < 0.5:
                continue
            u = self.prep.usable[i]
            r = int(np.argmax([x[c] for c in self.z[i]]))
            choice[i] = (int(u.opt[r]), int(round(x[self.s[i]])))
        edges = [(i, j) for (i, j), y in self.y.items() if x[y] > 0.5]
        for i, (oi, s) in choice.items():
            if s == 0:
                edges.append((SOURCE, i))
            if s + self.problem.nodes[i].options[oi].layers == L:
                edges.append((i, SINK))
        return self._polish(choice, edges)


def canonical(prep: Prepared, a: Assignment) -> Assignment:
    """Relabel identical nodes so that (used, start, point rank) ascends with the index, as
    the symmetry-breaking rows require."""
    perm: dict[int, int] = {}
    for grp in prep.groups:
        if len(grp) < 2:
            continue
        u = prep.usable[grp[0]]

        def key(i: int) -> tuple[int, int, int]:
            if i not in a.choice:
                return (0, 0, 0)
            oi, s = a.choice[i]
            rs = np.nonzero(u.opt == oi)[0]
            return (1, s, int(rs[0]) if len(rs) else 0)

        for new, old in zip(grp, sorted(grp, key=key)):
            perm[old] = new
    if not perm:
        return a

    def m(i: int) -> int:
        return perm.get(i, i) if i >= 0 else i

    return Assignment({m(i): c for i, c in a.choice.items()},
                      {(m(u), m(v)): f for (u, v), f in a.edges.items()})


def make_placement_milp(problem: PlacementProblem, *, naive: bool = False,
                        warm_start: Assignment | None = None, upper_bound: float | None = None,
                        prep: Prepared | None = None, symmetry_breaking: bool = True) -> MilpBase:
    """The naive or the tightened MILP of `problem` (not yet built)."""
    if prep is None:
        prep = prepare(problem, filter_options=not naive)
    milp: MilpBase = NaiveMilp(problem, prep) if naive else TightMilp(problem, prep)
    if not naive:
        milp.warm = warm_start
        milp.ub = upper_bound
        milp.symmetry = symmetry_breaking
    return milp


def solve_ilp(problem: PlacementProblem, *, time_limit_s: float = 60.0, naive: bool = False,
              warm_start: Assignment | None = None, upper_bound: float | None = None,
              prep: Prepared | None = None, threads: int | None = None,
              symmetry_breaking: bool = True) -> Placement:
    """Solve `problem` (flow or chain topology) with the placement MILP.

    `warm_start` / `upper_bound` / `symmetry_breaking` apply to the tightened build only.
    """
    milp = make_placement_milp(problem, naive=naive, warm_start=warm_start,
                               upper_bound=upper_bound, prep=prep,
                               symmetry_breaking=symmetry_breaking)
    return milp.solve(time_limit_s=time_limit_s, threads=threads)
