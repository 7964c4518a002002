"""The placement MILP's machinery: the column/row builder handed to HiGHS at once, the solve
and readout shared by both builds (`MilpBase`), and the naive build — the formulation written
down directly, the benchmark baseline of the tightened one (`placement_ilp.TightMilp`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import highspy
import numpy as np

from coral.solvers import quiet_highs, set_threads
from coral.templates.types import SINK, SOURCE, Placement, PlacementProblem, SolveStatus

from coral.templates.placement.prep import (
    Assignment,
    Prepared,
    edge_limit,
    infeasible_placement,
    max_flow_lp,
    to_placement,
)

_NAIVE_BIG = 1e4  # the naive build's fixed big-M, in scaled units (flows / cap, times / SLO)




class MilpBuilder:
    """Columns and rows of one MILP, accumulated in Python and passed to HiGHS at once."""

    def __init__(self) -> None:
        self.col_lb: list[float] = []
        self.col_ub: list[float] = []
        self.col_int: list[bool] = []
        self.cost: list[float] = []
        self.names: list[str] = []
        self.row_lb: list[float] = []
        self.row_ub: list[float] = []
        self.row_start: list[int] = [0]
        self.row_idx: list[int] = []
        self.row_val: list[float] = []

    def col(self, name: str, lb: float, ub: float, integer: bool = False) -> int:
        self.col_lb.append(float(lb))
        self.col_ub.append(float(ub))
        self.col_int.append(integer)
        self.cost.append(0.0)
        self.names.append(name)
        return len(self.col_lb) - 1

    def row(self, terms, lb: float, ub: float) -> int:
        """Add `lb <= sum(v * x[c] for c, v in terms) <= ub`; returns 1 (rows added)."""
        acc: dict[int, float] = {}
        for c, v in terms:
            acc[c] = acc.get(c, 0.0) + v
        for c, v in acc.items():
            if v != 0.0:
                self.row_idx.append(c)
                self.row_val.append(v)
        self.row_start.append(len(self.row_idx))
        self.row_lb.append(float(lb))
        self.row_ub.append(float(ub))
        return 1

    def lp(self) -> highspy.HighsLp:
        lp = highspy.HighsLp()
        lp.num_col_ = len(self.col_lb)
        lp.num_row_ = len(self.row_lb)
        lp.col_cost_ = np.array(self.cost)
        lp.col_lower_ = np.array(self.col_lb)
        lp.col_upper_ = np.array(self.col_ub)
        lp.row_lower_ = np.array(self.row_lb)
        lp.row_upper_ = np.array(self.row_ub)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.array(self.row_start, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(self.row_idx, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(self.row_val)
        lp.integrality_ = [highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous
                           for b in self.col_int]
        lp.sense_ = highspy.ObjSense.kMaximize
        return lp


INF = highspy.kHighsInf


@dataclass
class MilpStats:
    cols: int = 0
    integers: int = 0
    rows: int = 0
    nonzeros: int = 0
    rows_by_family: dict[str, int] = field(default_factory=dict)
    build_s: float = 0.0
    solve_s: float = 0.0
    nodes: int = 0
    upper_bound: float = math.inf
    warm_start: float | None = None


class MilpBase:
    """Shared solve/readout of the naive and the tightened build.

    Subclasses add columns in `_add_variables()`, name their families of rows in
    `_row_families()` and turn a column vector into an `Assignment` in `_read()`; flows are
    then recomputed exactly on the enabled edges.
    """

    method = "ilp"
    presolve_off_above: int | None = None  # integer columns above which presolve is off

    def __init__(self, problem: PlacementProblem, prep: Prepared) -> None:
        self.problem = problem
        self.prep = prep
        self.chain = problem.topology == "chain"
        self.b = MilpBuilder()
        self.stats = MilpStats()
        self.built = False
        self.warm: Assignment | None = None
        self.ub: float | None = None
        self.symmetry = True
        nodes = self.prep.active
        self.fs = max((float(self.prep.usable[i].cap.max()) for i in nodes), default=1.0)
        self.fs = self.fs if self.fs > 0 else 1.0

    def nodes(self) -> list[int]:
        return self.prep.active

    def build(self) -> None:
        """The columns, then each family of rows in `_row_families()`'s order and the chain
        topology's structure rows last, each family's row count in `stats.rows_by_family`."""
        t0 = time.perf_counter()
        self._add_variables()
        fam = self.stats.rows_by_family
        for name, add in self._row_families():
            fam[name] = add()
        if self.chain:
            fam["chain_structure"] = self._add_chain_structure()
        self._finish_build(t0)

    def _add_variables(self) -> None:
        raise NotImplementedError

    def _row_families(self) -> list[tuple[str, Callable[[], int]]]:
        """(family, the method that adds its rows and returns how many) in the order the
        rows are added, which HiGHS sees as the row order."""
        raise NotImplementedError

    def _add_chain_structure(self) -> int:
        raise NotImplementedError

    def _finish_build(self, t0: float) -> None:
        self.stats.cols = len(self.b.col_lb)
        self.stats.integers = sum(self.b.col_int)
        self.stats.rows = len(self.b.row_lb)
        self.stats.nonzeros = len(self.b.row_idx)
        self.stats.build_s = time.perf_counter() - t0
        self.built = True

    def _start_vector(self, a: Assignment) -> np.ndarray | None:
        return None

    def _read(self, x: np.ndarray) -> Assignment:
        raise NotImplementedError

    def solve(self, *, time_limit_s: float = 60.0, threads: int | None = None) -> Placement:
        t0 = time.perf_counter()
        method = self.method
        if self.prep.infeasible:
            return infeasible_placement(self.prep.infeasible, time.perf_counter() - t0, method)
        if self.chain and len(self.prep.active) < len(self.problem.nodes):
            return infeasible_placement("a node has no operating point within the SLO",
                                        time.perf_counter() - t0, method)
        if not self.prep.active:  # flow topology, nothing can carry flow
            return to_placement(self.prep, Assignment({}, {}), status=SolveStatus.OPTIMAL,
                                gap=0.0, solve_s=time.perf_counter() - t0, method=method,
                                notes=("no node can carry flow within the SLO",))
        if not self.built:
            self.build()
        h = quiet_highs()
        h.setOptionValue("time_limit", float(max(time_limit_s - (time.perf_counter() - t0),
                                                 0.01)))
        h.setOptionValue("mip_rel_gap", 1e-9)
        h.setOptionValue("mip_abs_gap", 1e-10)
        set_threads(h, threads)
        if self.presolve_off_above is not None and self.stats.integers > self.presolve_off_above:
            # measured: on L = 80 models HiGHS's presolve (and the presolve of its sub-MIPs)
            # takes most of the root time without reducing much; on small ones it pays off
            h.setOptionValue("presolve", "off")
        h.passModel(self.b.lp())
        notes: list[str] = []
        if self.warm is not None:
            x = self._start_vector(self.warm)
            if x is not None:
                sol = highspy.HighsSolution()
                sol.col_value = list(x)
                sol.value_valid = True
                h.setSolution(sol)
                self.stats.warm_start = self.warm.throughput
                notes.append(f"warm start {self.warm.throughput:.6g}")
        if self.ub is not None:
            self.stats.upper_bound = self.ub
            notes.append(f"upper bound {self.ub:.6g}")
        ts = time.perf_counter()
        h.run()
        self.stats.solve_s = time.perf_counter() - ts
        status = h.getModelStatus()
        info = h.getInfo()
        self.stats.nodes = int(info.mip_node_count)
        elapsed = time.perf_counter() - t0
        notes.append(f"milp {self.stats.cols} cols ({self.stats.integers} int) "
                     f"{self.stats.rows} rows, {info.mip_node_count} nodes")
        if status == highspy.HighsModelStatus.kInfeasible:
            reason = "no chain meets memory and SLO" if self.chain else "no feasible placement"
            return infeasible_placement(reason, elapsed, method)
        has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
        bound = float(info.mip_dual_bound) * self.fs
        if status == highspy.HighsModelStatus.kOptimal and has_sol:
            st = SolveStatus.OPTIMAL
        elif has_sol:
            st = SolveStatus.TIME_LIMIT
            notes.append(f"HiGHS: {h.modelStatusToString(status)}")
        else:
            notes.append(f"HiGHS: {h.modelStatusToString(status)}, no incumbent")
            if self.warm is not None and not self.chain:
                thr = self.warm.throughput
                gap = (bound - thr) / bound if bound > 0 and math.isfinite(bound) else math.inf
                return to_placement(self.prep, self.warm, status=SolveStatus.TIME_LIMIT,
                                    gap=max(gap, 0.0), solve_s=elapsed, method=method,
                                    notes=tuple(notes))
            return Placement(throughput=0.0, nodes=(), edges=(), status=SolveStatus.TIME_LIMIT,
                             gap=math.inf, solve_s=elapsed, method=method, notes=tuple(notes))
        assign = self._read(np.array(h.getSolution().col_value))
        placement = to_placement(self.prep, assign, status=st, gap=0.0, solve_s=elapsed,
                                 method=method, notes=tuple(notes),
                                 keep_empty_edges=self.chain)
        if st is SolveStatus.TIME_LIMIT:
            thr = placement.throughput
            gap = (bound - thr) / bound if bound > 0 and math.isfinite(bound) else math.inf
            placement = with_gap(placement, max(gap, 0.0) if thr < bound else 0.0)
        return placement

    def _polish(self, choice: dict[int, tuple[int, int]], edges: list[tuple[int, int]]
                ) -> Assignment:
        flows = max_flow_lp(self.problem, choice, edges)
        if self.chain:
            for e in edges:
                flows.setdefault(e, 0.0)
        return Assignment(choice, flows)



def with_gap(p: Placement, gap: float) -> Placement:
    return Placement(throughput=p.throughput, nodes=p.nodes, edges=p.edges, status=p.status,
                     gap=gap, solve_s=p.solve_s, method=p.method, notes=p.notes)



# ---- the naive build ------------------------------------------------------------------------


class NaiveMilp(MilpBase):
    """The placement MILP written down directly (the baseline the tightened build beats).

    Every operating point that fits somewhere is a candidate; integer start `s[i]` in
    [0, L]; `last[i] = sum_{r last} z[i,r]`; binaries `y[i,j]` on every ordered node pair and
    `xsrc[i]`, `xsnk[i]` on source/sink edges; big-M `2L` on ranges and a fixed huge
    constant on flows and latencies; no symmetry breaking, no tightened bounds, no start.
    """

    method = "ilp-naive"

    def _row_families(self) -> list[tuple[str, Callable[[], int]]]:
        families = [("option_choice", self._add_option_choice),
                    ("layer_range", self._add_layer_range), ("memory", self._add_memory),
                    ("edge_activation", self._add_edge_activation),
                    ("edge_flow_bounds", self._add_edge_flow_bounds),
                    ("conservation", self._add_conservation), ("capacity", self._add_capacity),
                    ("objective", self._add_objective)]
        tpot, ttft = self.problem.tpot_s, self.problem.ttft_s
        if tpot is not None:
            families.append(("latency_tpot", partial(self._add_latency, "step", tpot)))
        if ttft is not None:
            families.append(("latency_ttft", partial(self._add_latency, "pre", ttft)))
        return families

    def _add_variables(self) -> None:
        """Columns z, s, first, xsrc, xsnk, fsrc, fsnk, y, f, a/p (latencies), T."""
        b, L = self.b, self.problem.num_layers
        nodes = self.nodes()
        self.z = {i: [b.col(f"z[{i},{r}]", 0, 1, True) for r in range(len(self.prep.usable[i]))]
                  for i in nodes}
        self.s = {i: b.col(f"s[{i}]", 0, L, True) for i in nodes}
        self.first = {i: b.col(f"first[{i}]", 0, 1, True) for i in nodes}
        self.xsrc = {i: b.col(f"xsrc[{i}]", 0, 1, True) for i in nodes}
        self.xsnk = {i: b.col(f"xsnk[{i}]", 0, 1, True) for i in nodes}
        self.fsrc = {i: b.col(f"fsrc[{i}]", 0, INF) for i in nodes}
        self.fsnk = {i: b.col(f"fsnk[{i}]", 0, INF) for i in nodes}
        self.y, self.f = {}, {}
        for i in nodes:
            for j in nodes:
                if i != j:
                    self.y[i, j] = b.col(f"y[{i},{j}]", 0, 1, True)
                    self.f[i, j] = b.col(f"f[{i},{j}]", 0, INF)
        self.lat = {}
        if self.problem.tpot_s is not None:
            self.lat["step"] = {i: b.col(f"a[{i}]", 0, INF) for i in nodes}
        if self.problem.ttft_s is not None:
            self.lat["pre"] = {i: b.col(f"p[{i}]", 0, INF) for i in nodes}
        self.T = b.col("T", 0, INF)
        b.cost[self.T] = 1.0

    def _k(self, i: int, sign: float = 1.0) -> list[tuple[int, float]]:
        u = self.prep.usable[i]
        return [(c, sign * float(u.k[r])) for r, c in enumerate(self.z[i])]

    def _last(self, i: int, coef: float = 1.0) -> list[tuple[int, float]]:
        u = self.prep.usable[i]
        return [(c, coef) for r, c in enumerate(self.z[i]) if u.last[r]]

    def _add_option_choice(self) -> int:
        """sum_r z[i,r] = 1                                          for every node i."""
        return sum(self.b.row([(c, 1.0) for c in self.z[i]], 1, 1) for i in self.nodes())

    def _add_layer_range(self) -> int:
        """For every node i, with k[i] = sum_r k_r z[i,r]:

          s[i] + k[i] <= L,   s[i] + k[i] <= L - 1 + last[i],   s[i] + k[i] >= L last[i],
          s[i] >= 1 - first[i],   s[i] <= L (1 - first[i]).
        """
        b, L, n = self.b, self.problem.num_layers, 0
        for i in self.nodes():
            s, fi = self.s[i], self.first[i]
            n += b.row([(s, 1.0)] + self._k(i), -INF, L)
            n += b.row([(s, 1.0)] + self._k(i) + self._last(i, -1.0), -INF, L - 1)
            n += b.row([(s, 1.0)] + self._k(i) + self._last(i, -float(L)), 0, INF)
            n += b.row([(s, 1.0), (fi, 1.0)], 1, INF)
            n += b.row([(s, 1.0), (fi, float(L))], -INF, L)
        return n

    def _add_memory(self) -> int:
        """sum_r mem_r z[i,r] + extra first[i] <= mem_i   (scaled by mem_i)   for every i."""
        n = 0
        for i in self.nodes():
            spec, u = self.problem.nodes[i], self.prep.usable[i]
            terms = [(c, float(spec.options[u.opt[r]].mem_bytes) / spec.mem_bytes)
                     for r, c in enumerate(self.z[i])]
            terms.append((self.first[i], self.problem.first_stage_extra_bytes / spec.mem_bytes))
            n += self.b.row(terms, -INF, 1.0)
        return n

    def _add_edge_activation(self) -> int:
        """For every ordered pair (i, j), i != j:

          s[j] - s[i] - k[i] <= 2L (1 - y[i,j]),   s[i] + k[i] - s[j] <= 2L (1 - y[i,j]);
        for every node i:  xsrc[i] <= first[i],   xsnk[i] <= last[i].
        """
        b, n = self.b, 0
        M = 2.0 * self.problem.num_layers
        for (i, j), y in self.y.items():
            diff = [(self.s[j], 1.0), (self.s[i], -1.0)] + self._k(i, -1.0)
            n += b.row(diff + [(y, M)], -INF, M)
            n += b.row([(c, -v) for c, v in diff] + [(y, M)], -INF, M)
        for i in self.nodes():
            n += b.row([(self.xsrc[i], 1.0), (self.first[i], -1.0)], -INF, 0)
            n += b.row([(self.xsnk[i], 1.0)] + self._last(i, -1.0), -INF, 0)
        return n

    def _add_edge_flow_bounds(self) -> int:
        """f[i,j] <= BIG y[i,j],  f[i,j] <= NIC_ij  (every pair);  fsrc[i] <= BIG xsrc[i],
        fsnk[i] <= BIG xsnk[i]  (every node)."""
        b, n = self.b, 0
        for (i, j), y in self.y.items():
            n += b.row([(self.f[i, j], 1.0), (y, -_NAIVE_BIG)], -INF, 0)
            lim = edge_limit(self.problem, i, j) / self.fs
            if math.isfinite(lim):
                n += b.row([(self.f[i, j], 1.0)], -INF, lim)
        for i in self.nodes():
            n += b.row([(self.fsrc[i], 1.0), (self.xsrc[i], -_NAIVE_BIG)], -INF, 0)
            n += b.row([(self.fsnk[i], 1.0), (self.xsnk[i], -_NAIVE_BIG)], -INF, 0)
        return n

    def _inflow(self, i: int) -> list[tuple[int, float]]:
        return [(self.fsrc[i], 1.0)] + [(f, 1.0) for (u, v), f in self.f.items() if v == i]

    def _add_conservation(self) -> int:
        """fsrc[i] + sum_j f[j,i] = fsnk[i] + sum_j f[i,j]           for every node i."""
        n = 0
        for i in self.nodes():
            out = [(self.fsnk[i], -1.0)] + [(f, -1.0) for (u, v), f in self.f.items() if u == i]
            n += self.b.row(self._inflow(i) + out, 0, 0)
        return n

    def _add_capacity(self) -> int:
        """inflow[i] <= sum_r cap_r z[i,r]                            for every node i."""
        n = 0
        for i in self.nodes():
            u = self.prep.usable[i]
            n += self.b.row(self._inflow(i) + [(c, -float(u.cap[r]) / self.fs)
                                               for r, c in enumerate(self.z[i])], -INF, 0)
        return n

    def _add_objective(self) -> int:
        """T = sum_i fsrc[i]   (maximise T; one row)."""
        return self.b.row([(self.T, 1.0)] + [(self.fsrc[i], -1.0) for i in self.nodes()], 0, 0)

    def _add_latency(self, m: str, bound: float) -> int:
        """Scaled by the SLO, with t[i] = sum_r t_r z[i,r]:

          a[i] >= t[i],   a[i] <= 1 + BIG (1 - xsnk[i])                  (every node i),
          a[j] >= a[i] + t[j] - BIG (1 - y[i,j])                          (every pair).
        """
        b, n, var = self.b, 0, self.lat[m]
        for i in self.nodes():
            t = getattr(self.prep.usable[i], m) / bound
            n += b.row([(var[i], 1.0)] + [(c, -float(t[r])) for r, c in enumerate(self.z[i])],
                       0, INF)
            n += b.row([(var[i], 1.0), (self.xsnk[i], _NAIVE_BIG)], -INF, 1.0 + _NAIVE_BIG)
        for (i, j), y in self.y.items():
            t = getattr(self.prep.usable[j], m) / bound
            n += b.row([(var[j], 1.0), (var[i], -1.0), (y, -_NAIVE_BIG)]
                       + [(c, -float(t[r])) for r, c in enumerate(self.z[j])], -_NAIVE_BIG, INF)
        return n

    def _add_chain_structure(self) -> int:
        """One pipeline through every node:  sum_i xsrc[i] = 1,  sum_i xsnk[i] = 1,
        xsrc[i] + sum_j y[j,i] = 1,  xsnk[i] + sum_j y[i,j] = 1,  inflow[i] = T  (every i)."""
        b, n = self.b, 0
        nodes = self.nodes()
        n += b.row([(self.xsrc[i], 1.0) for i in nodes], 1, 1)
        n += b.row([(self.xsnk[i], 1.0) for i in nodes], 1, 1)
        for i in nodes:
            n += b.row([(self.xsrc[i], 1.0)] + [(y, 1.0) for (u, v), y in self.y.items()
                                                if v == i], 1, 1)
            n += b.row([(self.xsnk[i], 1.0)] + [(y, 1.0) for (u, v), y in self.y.items()
                                                if u == i], 1, 1)
            n += b.row(self._inflow(i) + [(self.T, -1.0)], 0, 0)
        return n

    def _read(self, x: np.ndarray) -> Assignment:
        choice = {}
        for i in self.nodes():
            u = self.prep.usable[i]
            r = int(np.argmax([x[c] for c in self.z[i]]))
            choice[i] = (int(u.opt[r]), int(round(x[self.s[i]])))
        edges = [(i, j) for (i, j), y in self.y.items() if x[y] > 0.5]
        for i in self.nodes():
            if x[self.xsrc[i]] > 0.5:
                edges.append((SOURCE, i))
            if x[self.xsnk[i]] > 0.5:
                edges.append((i, SINK))
        return self._polish(choice, edges)


