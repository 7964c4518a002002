"""What the placement solvers share: each node's usable operating points, and candidate
answers as placements.

`prepare` filters and sorts the operating points of every node of a problem (memory, its own
latency, dominance, and with the path filter the prefix/suffix path latency); the MILP, the
chain DP and the replica DP all start from it. An `Assignment` (a choice per node and
flows on edges) becomes a `Placement` by `to_placement`, with flows recomputed exactly by
`max_flow_lp` where a solver fixes only the discrete choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import highspy
import numpy as np

from coral.solvers import quiet_highs
from coral.templates.types import (
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


def within(value: float, bound: float | None) -> bool:
    """`value <= bound` up to `LATENCY_RTOL` (no bound: always true)."""
    return bound is None or value <= bound * (1.0 + LATENCY_RTOL) + 1e-15


# --------------------------------------------------------------------------------------------
# Preprocessing shared by the MILP, the chain DP and the replica DP
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


def latency_metrics(problem: PlacementProblem) -> list[tuple[str, float]]:
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
    metrics = latency_metrics(problem)
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
# A candidate solution (a DP answer or warm start) and its conversion to a Placement
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


