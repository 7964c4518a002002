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
  start (the replica heuristic of `placement_chain`).

Status is reported as HiGHS proves it: `optimal` only when the MILP closed, `time_limit` with
the gap between the incumbent and the proven bound otherwise. Flows of the returned placement
are recomputed by an LP on the MILP's discrete choice, so they satisfy the model exactly.

Each constraint family is one method whose docstring states the inequality and its index set;
each returns the number of rows it added.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import highspy

from coral.solvers import quiet_highs, set_threads
import numpy as np

from coral.templates.types import (
    SINK,
    SOURCE,
    NodePlacement,
    NodeSpec,
    OperatingPoint,
    Placement,
    PlacementProblem,
    SolveStatus,
)

LATENCY_RTOL = 1e-9
"""Relative slack allowed on a latency bound (summing floats in another order must not flip
a feasible path to infeasible)."""

_BOUND_SCALED = 1.0 + LATENCY_RTOL  # a latency bound on times scaled by their SLO
_FLOW_EPS = 1e-9  # relative (to the flow scale) flow below which an edge counts as empty
_NAIVE_BIG = 1e4  # the naive build's fixed big-M, in scaled units (flows / cap, times / SLO)


def within(value: float, bound: float | None) -> bool:
    """`value <= bound` up to `LATENCY_RTOL` (no bound: always true)."""
    return bound is None or value <= bound * (1.0 + LATENCY_RTOL) + 1e-15


# --------------------------------------------------------------------------------------------
# Preprocessing shared by the MILP, the chain DP and the heuristic
# --------------------------------------------------------------------------------------------


def start_interval(problem: PlacementProblem, node: NodeSpec, op: OperatingPoint
                   ) -> tuple[int, int] | None:
    """Start layers at which `op` fits on `node`, as an interval `(lo, hi)`, or None.

    A last-stage point starts at exactly `L - k`; any other point at `0 .. L - 1 - k`. Start 0
    needs `mem + first_stage_extra_bytes <= node memory`, a later start `mem <= node memory`.
    """
    L, k = problem.num_layers, op.layers
    if k < 1 or k > L:
        return None
    if op.is_last:
        cand_lo, cand_hi = L - k, L - k
    else:
        cand_lo, cand_hi = 0, L - 1 - k
        if cand_hi < 0:
            return None
    ok0 = cand_lo == 0 and op.mem_bytes + problem.first_stage_extra_bytes <= node.mem_bytes
    ok_pos = cand_hi >= 1 and op.mem_bytes <= node.mem_bytes
    if ok0 and ok_pos:
        return 0, cand_hi
    if ok0:
        return 0, 0
    if ok_pos:
        return max(cand_lo, 1), cand_hi
    return None


@dataclass
class NodeOptions:
    """The operating points of one node that survive preprocessing, as parallel arrays.

    Index `r` (the point's rank) orders points by (layers, is_last, batch); `opt[r]` is its
    index into `NodeSpec.options`; `starts[r, s]` says whether the point may start at layer
    `s` (memory, range and — after path filtering — latency); `lo`/`hi` bound those starts.
    """

    node: int
    opt: np.ndarray
    k: np.ndarray
    last: np.ndarray
    cap: np.ndarray
    step: np.ndarray
    pre: np.ndarray
    starts: np.ndarray  # bool (points, L)

    def __len__(self) -> int:
        return len(self.opt)

    @property
    def lo(self) -> np.ndarray:
        return np.argmax(self.starts, axis=1)

    @property
    def hi(self) -> np.ndarray:
        L = self.starts.shape[1]
        return L - 1 - np.argmax(self.starts[:, ::-1], axis=1)

    @property
    def ok0(self) -> np.ndarray:
        return self.starts[:, 0]

    def subset(self, keep: np.ndarray) -> NodeOptions:
        return NodeOptions(self.node, self.opt[keep], self.k[keep], self.last[keep],
                           self.cap[keep], self.step[keep], self.pre[keep], self.starts[keep])

    def key(self, spec: NodeSpec) -> tuple:
        """Nodes with equal keys are interchangeable in every placement."""
        return (spec.node_type, spec.nic_bytes_per_s, self.k.tobytes(), self.last.tobytes(),
                self.cap.tobytes(), self.step.tobytes(), self.pre.tobytes(),
                np.packbits(self.starts).tobytes())


@dataclass
class Prepared:
    """A problem after option filtering.

    `usable[i]` is None for a node that cannot carry flow at all (it still sits in the
    combination, holding `idle[i]`: a memory-feasible (option, start)). `prefix[m][b]` /
    `suffix[m][c]` are lower bounds on the latency (scaled by its SLO; `m` is "step" or
    "pre") of any stage sequence covering layers `[0, b)` / `[c, L)`.
    """

    problem: PlacementProblem
    infeasible: str | None
    usable: list[NodeOptions | None]
    idle: dict[int, tuple[int, int]]
    groups: list[list[int]]  # identical usable nodes, each list ascending, singletons included
    prefix: dict[str, np.ndarray] = field(default_factory=dict)
    suffix: dict[str, np.ndarray] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def active(self) -> list[int]:
        return [i for i, u in enumerate(self.usable) if u is not None]


def prepare(problem: PlacementProblem, *, filter_options: bool = True,
            path_filter: bool = True) -> Prepared:
    """Drop operating points that can never carry flow, and dominated ones.

    Dropped: points that fit at no start (memory, range); points whose own step time exceeds
    TPOT or prefill time exceeds TTFT; points dominated by another point of the same node
    with the same layers and role, at least its capacity, at most its step/prefill time
    (where that SLO is bounded) and at least its starts; and (start, point) pairs that no
    source→sink path can meet the SLO through, by the prefix/suffix latency bounds (computed
    with any node's points, reuse allowed, so they are valid lower bounds). Every node keeps
    an idle choice (any memory-feasible point), since a node carrying no flow still holds
    layers; a node with none makes the problem infeasible. With `filter_options=False`
    only points that fit nowhere are dropped (the naive build); `path_filter=False` skips the
    prefix/suffix cut, which only pays off for the MILP (the DPs are exact without it).
    """
    L = problem.num_layers
    usable: list[NodeOptions | None] = []
    idle: dict[int, tuple[int, int]] = {}
    stats = {"options": 0, "fit": 0, "slo_ok": 0, "undominated": 0, "kept": 0}
    for i, spec in enumerate(problem.nodes):
        rows = []
        for oi, op in enumerate(spec.options):
            stats["options"] += 1
            iv = start_interval(problem, spec, op)
            if iv is None:
                continue
            stats["fit"] += 1
            if i not in idle:
                idle[i] = (oi, iv[0])
            if filter_options and not (within(op.step_s, problem.tpot_s)
                                       and within(op.prefill_s, problem.ttft_s)):
                continue
            stats["slo_ok"] += 1
            rows.append((op.layers, op.is_last, op.batch, oi, op, iv))
        if i not in idle:
            return Prepared(problem, f"node {i} ({spec.node_type}) fits no operating point",
                            [], {}, [], stats=stats)
        if filter_options:
            rows = _undominated(rows, problem)
        stats["undominated"] += len(rows)
        if not rows:
            usable.append(None)
            continue
        rows.sort(key=lambda r: (r[0], r[1], r[2], r[3]))
        starts = np.zeros((len(rows), L), dtype=bool)
        for n, r in enumerate(rows):
            starts[n, r[5][0]:r[5][1] + 1] = True
        usable.append(NodeOptions(
            node=i,
            opt=np.array([r[3] for r in rows], dtype=np.int64),
            k=np.array([r[0] for r in rows], dtype=np.int64),
            last=np.array([r[1] for r in rows], dtype=bool),
            cap=np.array([r[4].capacity for r in rows], dtype=float),
            step=np.array([r[4].step_s for r in rows], dtype=float),
            pre=np.array([r[4].prefill_s for r in rows], dtype=float),
            starts=starts,
        ))
    prep = Prepared(problem, None, usable, idle, [], stats=stats)
    if filter_options and path_filter:
        _path_filter(prep)
    stats["kept"] = sum(len(u) for u in prep.usable if u is not None)
    groups: dict[tuple, list[int]] = {}
    for i, u in enumerate(prep.usable):
        if u is not None:
            groups.setdefault(u.key(problem.nodes[i]), []).append(i)
    prep.groups = list(groups.values())
    return prep


def _metrics(problem: PlacementProblem) -> list[tuple[str, float]]:
    out = []
    if problem.tpot_s is not None:
        out.append(("step", problem.tpot_s))
    if problem.ttft_s is not None:
        out.append(("pre", problem.ttft_s))
    return out


def _prefix_suffix(L: int, K: np.ndarray, last: np.ndarray, t: np.ndarray,
                   starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least latency of a stage sequence covering [0, b) (prefix) and [c, L) (suffix), over
    the given points (any of them, any number of times)."""
    P = np.full(L + 1, np.inf)
    P[0] = 0.0
    rows = np.arange(len(K))
    for b in range(1, L):
        s = b - K
        ok = (~last) & (s >= 0)
        if not ok.any():
            continue
        sc = np.clip(s, 0, L - 1)
        ok &= starts[rows, sc]
        if ok.any():
            P[b] = np.min(P[sc[ok]] + t[ok])
    S = np.full(L + 1, np.inf)
    S[L] = 0.0
    for c in range(L - 1, -1, -1):
        ok = starts[:, c] & (c + K <= L)
        if ok.any():
            S[c] = np.min(t[ok] + S[c + K[ok]])
    return P, S


def _path_filter(prep: Prepared) -> None:
    """Keep (point, start) only if prefix(start) + own + suffix(end) meets every bound."""
    problem = prep.problem
    L = problem.num_layers
    metrics = _metrics(problem)
    if not metrics:
        return
    for _ in range(8):
        act = [u for u in prep.usable if u is not None]
        if not act:
            break
        K = np.concatenate([u.k for u in act])
        last = np.concatenate([u.last for u in act])
        starts = np.concatenate([u.starts for u in act])
        for m, bound in metrics:
            t = np.concatenate([getattr(u, m) for u in act]) / bound
            prep.prefix[m], prep.suffix[m] = _prefix_suffix(L, K, last, t, starts)
        changed = False
        for n, u in enumerate(prep.usable):
            if u is None:
                continue
            ok = u.starts.copy()
            s = np.arange(L)
            for m, bound in metrics:
                t = getattr(u, m) / bound
                end = np.clip(s[None, :] + u.k[:, None], 0, L)
                tot = prep.prefix[m][None, :L] + t[:, None] + prep.suffix[m][end]
                ok &= tot <= _BOUND_SCALED
            if (ok != u.starts).any():
                changed = True
                keep = ok.any(axis=1)
                u.starts = ok
                prep.usable[n] = u.subset(keep) if keep.any() else None
        if not changed:
            break


def _undominated(rows: list, problem: PlacementProblem) -> list:
    use_step, use_pre = problem.tpot_s is not None, problem.ttft_s is not None
    by_role: dict[tuple[int, bool], list] = {}
    for r in rows:
        by_role.setdefault((r[0], r[1]), []).append(r)
    kept = []
    for group in by_role.values():
        # best first: a point can only be dominated by one sorted before it
        group.sort(key=lambda r: (-r[4].capacity, r[4].step_s if use_step else 0.0,
                                  r[4].prefill_s if use_pre else 0.0, r[5][0], -r[5][1], r[3]))
        front: list = []
        for r in group:
            op, (lo, hi) = r[4], r[5]
            if not any(q[4].capacity >= op.capacity
                       and (not use_step or q[4].step_s <= op.step_s)
                       and (not use_pre or q[4].prefill_s <= op.prefill_s)
                       and q[5][0] <= lo and q[5][1] >= hi for q in front):
                front.append(r)
        kept.extend(front)
    return kept


def flow_upper_bound(prep: Prepared) -> float:
    """A valid bound on the flow: min over (first-layer cut, last-layer cut, layer coverage).

    Every unit of flow enters a node holding layer 0 and leaves one holding layer L-1, and
    passes `L` layers in all: `L * T = sum_i k_i * inflow_i <= sum_i max_o k_o * cap_o`.
    """
    L = prep.problem.num_layers
    first = last = cover = 0.0
    for u in prep.usable:
        if u is None:
            continue
        if u.ok0.any():
            first += float(u.cap[u.ok0].max())
        if u.last.any():
            last += float(u.cap[u.last].max())
        cover += float((u.k * u.cap).max()) / L
    return min(first, last, cover)


def edge_limit(problem: PlacementProblem, i: int, j: int) -> float:
    """Largest flow the NIC allows on the inter-node edge i→j."""
    nic = min(problem.nodes[i].nic_bytes_per_s, problem.nodes[j].nic_bytes_per_s)
    if problem.edge_bytes_per_unit <= 0:
        return math.inf
    return nic / problem.edge_bytes_per_unit


# --------------------------------------------------------------------------------------------
# A candidate solution (heuristic or warm start) and its conversion to a Placement
# --------------------------------------------------------------------------------------------


@dataclass
class Assignment:
    """Per node an (option index, start layer); edges with their flows (source -1, sink -2)."""

    choice: dict[int, tuple[int, int]]
    edges: dict[tuple[int, int], float]

    @property
    def throughput(self) -> float:
        return sum(f for (u, _), f in self.edges.items() if u == SOURCE)


def node_placement(problem: PlacementProblem, i: int, oi: int, s: int) -> NodePlacement:
    """Node i holding option `oi` from layer `s`. `NodeSpec` carries no TP degree, so 0 is
    reported (meaning: tensor parallel over all of the node's GPUs) unless it has one."""
    spec = problem.nodes[i]
    op = spec.options[oi]
    return NodePlacement(
        node_type=spec.node_type, first_layer=int(s), layers=op.layers, batch=op.batch,
        tp_degree=int(getattr(spec, "tp_degree", 0) or 0), capacity=op.capacity, step_s=op.step_s,
        prefill_s=op.prefill_s, mem_bytes=op.mem_bytes)


def to_placement(prep: Prepared, a: Assignment, *, status: SolveStatus, gap: float,
                 solve_s: float, method: str, notes: tuple[str, ...] = (),
                 keep_empty_edges: bool = False) -> Placement:
    problem = prep.problem
    choice = dict(prep.idle)
    choice.update(a.choice)
    nodes = tuple(node_placement(problem, i, *choice[i]) for i in range(len(problem.nodes)))
    scale = max((float(u.cap.max()) for u in prep.usable if u is not None), default=1.0)
    edges = tuple(sorted(((u, v, float(f)) for (u, v), f in a.edges.items()
                          if keep_empty_edges or f > _FLOW_EPS * scale),
                         key=lambda e: (e[0] if e[0] >= 0 else 10**9 + e[0], e[1])))
    thr = sum(f for u, _, f in edges if u == SOURCE)
    return Placement(throughput=thr, nodes=nodes, edges=edges, status=status, gap=gap,
                     solve_s=solve_s, method=method, notes=notes)


def infeasible_placement(reason: str, solve_s: float, method: str) -> Placement:
    return Placement(throughput=0.0, nodes=(), edges=(), status=SolveStatus.INFEASIBLE,
                     gap=0.0, solve_s=solve_s, method=method, notes=(reason,))


def max_flow_lp(problem: PlacementProblem, choice: dict[int, tuple[int, int]],
                edges: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
    """Max flow on a fixed edge set with node capacities and NIC limits (a small LP)."""
    if not edges:
        return {}
    h = quiet_highs()
    nodes = sorted(choice)
    cap = {i: problem.nodes[i].options[choice[i][0]].capacity for i in nodes}
    scale = max(cap.values()) or 1.0
    inf = highspy.kHighsInf
    lower, upper, cost = [], [], []
    for u, v in edges:
        ub = inf
        if u >= 0 and v >= 0:
            ub = edge_limit(problem, u, v) / scale
        lower.append(0.0)
        upper.append(min(ub, 1e30))
        cost.append(-1.0 if u == SOURCE else 0.0)
    h.addVars(len(edges), np.array(lower), np.array(upper))
    h.changeColsCost(len(edges), np.arange(len(edges), dtype=np.int32), np.array(cost))
    for i in nodes:
        inc = [e for e, (u, v) in enumerate(edges) if v == i]
        out = [e for e, (u, v) in enumerate(edges) if u == i]
        if not inc and not out:
            continue
        idx = np.array(inc + out, dtype=np.int32)
        val = np.array([1.0] * len(inc) + [-1.0] * len(out))
        h.addRow(0.0, 0.0, len(idx), idx, val)
        if inc:
            h.addRow(-inf, cap[i] / scale, len(inc), np.array(inc, dtype=np.int32),
                     np.ones(len(inc)))
    h.run()
    x = list(h.getSolution().col_value)
    return {e: max(0.0, x[n]) * scale for n, e in enumerate(edges)}


# --------------------------------------------------------------------------------------------
# The MILP
# --------------------------------------------------------------------------------------------



class _Builder:
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


_INF = highspy.kHighsInf


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


class _MilpBase:
    """Shared solve/readout of the naive and the tightened build.

    Subclasses add columns and rows in `build()` and turn a column vector into an
    `Assignment` in `_read()`; flows are then recomputed exactly on the enabled edges.
    """

    method = "ilp"
    presolve_off_above: int | None = None  # integer columns above which presolve is off

    def __init__(self, problem: PlacementProblem, prep: Prepared) -> None:
        self.problem = problem
        self.prep = prep
        self.chain = problem.topology == "chain"
        self.b = _Builder()
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
            placement = _with_gap(placement, max(gap, 0.0) if thr < bound else 0.0)
        return placement

    def _polish(self, choice: dict[int, tuple[int, int]], edges: list[tuple[int, int]]
                ) -> Assignment:
        flows = max_flow_lp(self.problem, choice, edges)
        if self.chain:
            for e in edges:
                flows.setdefault(e, 0.0)
        return Assignment(choice, flows)


# ---- the naive build ------------------------------------------------------------------------


class NaiveMilp(_MilpBase):
    """The placement MILP written down directly (the baseline the tightened build beats).

    Every operating point that fits somewhere is a candidate; integer start `s[i]` in
    [0, L]; `last[i] = sum_{r last} z[i,r]`; binaries `y[i,j]` on every ordered node pair and
    `xsrc[i]`, `xsnk[i]` on source/sink edges; big-M `2L` on ranges and a fixed huge
    constant on flows and latencies; no symmetry breaking, no tightened bounds, no start.
    """

    method = "ilp-naive"

    def build(self) -> None:
        t0 = time.perf_counter()
        self._add_variables()
        fam = self.stats.rows_by_family
        fam["option_choice"] = self._add_option_choice()
        fam["layer_range"] = self._add_layer_range()
        fam["memory"] = self._add_memory()
        fam["edge_activation"] = self._add_edge_activation()
        fam["edge_flow_bounds"] = self._add_edge_flow_bounds()
        fam["conservation"] = self._add_conservation()
        fam["capacity"] = self._add_capacity()
        fam["objective"] = self._add_objective()
        if self.problem.tpot_s is not None:
            fam["latency_tpot"] = self._add_latency("step", self.problem.tpot_s)
        if self.problem.ttft_s is not None:
            fam["latency_ttft"] = self._add_latency("pre", self.problem.ttft_s)
        if self.chain:
            fam["chain_structure"] = self._add_chain_structure()
        self._finish_build(t0)

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
        self.fsrc = {i: b.col(f"fsrc[{i}]", 0, _INF) for i in nodes}
        self.fsnk = {i: b.col(f"fsnk[{i}]", 0, _INF) for i in nodes}
        self.y, self.f = {}, {}
        for i in nodes:
            for j in nodes:
                if i != j:
                    self.y[i, j] = b.col(f"y[{i},{j}]", 0, 1, True)
                    self.f[i, j] = b.col(f"f[{i},{j}]", 0, _INF)
        self.lat = {}
        if self.problem.tpot_s is not None:
            self.lat["step"] = {i: b.col(f"a[{i}]", 0, _INF) for i in nodes}
        if self.problem.ttft_s is not None:
            self.lat["pre"] = {i: b.col(f"p[{i}]", 0, _INF) for i in nodes}
        self.T = b.col("T", 0, _INF)
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
            n += b.row([(s, 1.0)] + self._k(i), -_INF, L)
            n += b.row([(s, 1.0)] + self._k(i) + self._last(i, -1.0), -_INF, L - 1)
            n += b.row([(s, 1.0)] + self._k(i) + self._last(i, -float(L)), 0, _INF)
            n += b.row([(s, 1.0), (fi, 1.0)], 1, _INF)
            n += b.row([(s, 1.0), (fi, float(L))], -_INF, L)
        return n

    def _add_memory(self) -> int:
        """sum_r mem_r z[i,r] + extra first[i] <= mem_i   (scaled by mem_i)   for every i."""
        n = 0
        for i in self.nodes():
            spec, u = self.problem.nodes[i], self.prep.usable[i]
            terms = [(c, float(spec.options[u.opt[r]].mem_bytes) / spec.mem_bytes)
                     for r, c in enumerate(self.z[i])]
            terms.append((self.first[i], self.problem.first_stage_extra_bytes / spec.mem_bytes))
            n += self.b.row(terms, -_INF, 1.0)
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
            n += b.row(diff + [(y, M)], -_INF, M)
            n += b.row([(c, -v) for c, v in diff] + [(y, M)], -_INF, M)
        for i in self.nodes():
            n += b.row([(self.xsrc[i], 1.0), (self.first[i], -1.0)], -_INF, 0)
            n += b.row([(self.xsnk[i], 1.0)] + self._last(i, -1.0), -_INF, 0)
        return n

    def _add_edge_flow_bounds(self) -> int:
        """f[i,j] <= BIG y[i,j],  f[i,j] <= NIC_ij  (every pair);  fsrc[i] <= BIG xsrc[i],
        fsnk[i] <= BIG xsnk[i]  (every node)."""
        b, n = self.b, 0
        for (i, j), y in self.y.items():
            n += b.row([(self.f[i, j], 1.0), (y, -_NAIVE_BIG)], -_INF, 0)
            lim = edge_limit(self.problem, i, j) / self.fs
            if math.isfinite(lim):
                n += b.row([(self.f[i, j], 1.0)], -_INF, lim)
        for i in self.nodes():
            n += b.row([(self.fsrc[i], 1.0), (self.xsrc[i], -_NAIVE_BIG)], -_INF, 0)
            n += b.row([(self.fsnk[i], 1.0), (self.xsnk[i], -_NAIVE_BIG)], -_INF, 0)
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
                                               for r, c in enumerate(self.z[i])], -_INF, 0)
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
                       0, _INF)
            n += b.row([(var[i], 1.0), (self.xsnk[i], _NAIVE_BIG)], -_INF, 1.0 + _NAIVE_BIG)
        for (i, j), y in self.y.items():
            t = getattr(self.prep.usable[j], m) / bound
            n += b.row([(var[j], 1.0), (var[i], -1.0), (y, -_NAIVE_BIG)]
                       + [(c, -float(t[r])) for r, c in enumerate(self.z[j])], -_NAIVE_BIG, _INF)
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


# ---- the tightened build --------------------------------------------------------------------


class TightMilp(_MilpBase):
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

    def build(self) -> None:
        t0 = time.perf_counter()
        self._add_variables()
        fam = self.stats.rows_by_family
        fam["node_use"] = self._add_node_use()
        fam["layer_range"] = self._add_layer_range()
        fam["edge_activation"] = self._add_edge_activation()
        fam["edge_flow_bounds"] = self._add_edge_flow_bounds()
        fam["conservation"] = self._add_conservation()
        fam["capacity"] = self._add_capacity()
        fam["layer_coverage"] = self._add_layer_coverage()
        fam["objective"] = self._add_objective()
        fam["path_structure"] = self._add_path_structure()
        for m, _ in _metrics(self.problem):
            fam[f"latency_{m}"] = self._add_latency(m)
        if self.symmetry:
            fam["symmetry_breaking"] = self._add_symmetry_breaking()
        if self.chain:
            fam["chain_structure"] = self._add_chain_structure()
        self._finish_build(t0)

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
        for m, _ in _metrics(self.problem):
            self.lat[m] = ({i: b.col(f"{m}_fwd[{i}]", 0, 1) for i in nodes},
                           {i: b.col(f"{m}_bwd[{i}]", 0, 1) for i in nodes})
        ub = _INF if self.ub is None else self.ub / fs * (1 + 1e-9) + 1e-12
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
            n += b.row([(self.first[i], 1.0), (self.used[i], -1.0)], -_INF, 0)
            n += b.row([(self.s[i], 1.0), (self.used[i], -float(self.smax[i]))], -_INF, 0)
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
                       0, _INF)
            n += b.row([(s, 1.0)] + [(c, -v) for c, v in self._zsum(i, u.hi.astype(float))],
                       -_INF, 0)
            n += b.row([(s, 1.0), (fi, 1.0), (self.used[i], -1.0)], 0, _INF)
            n += b.row([(s, 1.0), (fi, float(self.smax[i]))], -_INF, self.smax[i])
            n += b.row([(fi, 1.0)] + [(c, -1.0) for r, c in enumerate(self.z[i]) if u.ok0[r]],
                       -_INF, 0)
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
            n += b.row(diff + [(y, mp)], -_INF, mp)
            n += b.row([(c, -v) for c, v in diff] + [(y, mm)], -_INF, mm)
            n += b.row([(y, 1.0)] + [(c, -1.0) for r, c in enumerate(self.z[i])
                                     if not ui.last[r]], -_INF, 0)
            n += b.row([(y, 1.0), (self.first[j], 1.0), (self.used[j], -1.0)], -_INF, 0)
            if i < j and (j, i) in self.y:
                n += b.row([(y, 1.0), (self.y[j, i], 1.0)], -_INF, 1)
        return n

    def _add_edge_flow_bounds(self) -> int:
        """f[i,j] <= U[i,j] y[i,j];  fsrc[i] <= capmax0[i] first[i];
        fsnk[i] <= sum_{r last} cap_r z[i,r]."""
        b, n, fs = self.b, 0, self.fs
        for (i, j), y in self.y.items():
            n += b.row([(self.f[i, j], 1.0), (y, -self.U[i, j])], -_INF, 0)
        for i in self.nodes():
            u = self.prep.usable[i]
            if u.ok0.any():
                n += b.row([(self.fsrc[i], 1.0),
                            (self.first[i], -float(u.cap[u.ok0].max()) / fs)], -_INF, 0)
            if u.last.any():
                n += b.row([(self.fsnk[i], 1.0)] + [(c, -v) for c, v in
                                                    self._zsum(i, u.cap / fs, u.last)], -_INF, 0)
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
                n += b.row([(g, 1.0), (self.z[i][r], -float(u.cap[r]) / self.fs)], -_INF, 0)
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
                                                 if q == i] + [(self.used[i], -1.0)], 0, _INF)
            n += b.row(lastz + [(y, 1.0) for (p, q), y in self.y.items() if p == i]
                       + [(self.used[i], -1.0)], 0, _INF)
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
            n += b.row([(fwd[i], 1.0), (self.s[i], -rho)] + ti, 0, _INF)
            n += b.row([(bwd[i], 1.0), (self.s[i], sig), (self.used[i], -sig * L)] + ti
                       + [(c, sig * v) for c, v in self._zsum(i, u.k.astype(float))], 0, _INF)
            n += b.row([(fwd[i], 1.0), (bwd[i], 1.0)] + ti, -_INF, 1.0)
        for (i, j), y in self.y.items():
            n += b.row([(fwd[j], 1.0), (fwd[i], -1.0), (y, -1.0)]
                       + [(c, -v) for c, v in self._zsum(j, t[j])], -1.0, _INF)
            n += b.row([(bwd[i], 1.0), (bwd[j], -1.0), (y, -1.0)]
                       + [(c, -v) for c, v in self._zsum(i, t[i])], -1.0, _INF)
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
                    n += b.row([(self.used[i], 1.0), (self.used[j], -1.0)], -_INF, 0)
                terms = [(self.s[i], R), (self.s[j], -R)]
                terms += [(c, float(r)) for r, c in enumerate(self.z[i])]
                terms += [(c, -float(r)) for r, c in enumerate(self.z[j])]
                n += b.row(terms, -_INF, 0)
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
        for m, bound in _metrics(P):
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


def _with_gap(p: Placement, gap: float) -> Placement:
    return Placement(throughput=p.throughput, nodes=p.nodes, edges=p.edges, status=p.status,
                     gap=gap, solve_s=p.solve_s, method=p.method, notes=p.notes)


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


def PlacementMilp(problem: PlacementProblem, *, naive: bool = False,
                  warm_start: Assignment | None = None, upper_bound: float | None = None,
                  prep: Prepared | None = None, symmetry_breaking: bool = True) -> _MilpBase:
    """The naive or the tightened MILP of `problem` (not yet built)."""
    if prep is None:
        prep = prepare(problem, filter_options=not naive)
    milp: _MilpBase = NaiveMilp(problem, prep) if naive else TightMilp(problem, prep)
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
    milp = PlacementMilp(problem, naive=naive, warm_start=warm_start, upper_bound=upper_bound,
                         prep=prep, symmetry_breaking=symmetry_breaking)
    return milp.solve(time_limit_s=time_limit_s, threads=threads)
