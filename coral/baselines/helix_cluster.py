"""Helix's no-SLO placement on a whole cluster of tens of nodes: a max-flow MILP over layer
boundaries, identical nodes aggregated, under a time limit.

The per-node solvers do not scale to Helix's cluster (64 nodes of 4 types): the staged DP of
the `flow` topology solves a pipeline DP for every sub-multiset of the nodes (5 x 7 x 17 x 39
of them), and the per-node DAG MILP carries a binary per ordered node pair. Without a latency
bound neither is needed. A placement is then, per node type, how many nodes hold which
operating point from which start layer, and the flow through every layer boundary:

    max T  s.t.  g_c <= cap_c x_c                    (entry c: type, point, start; x_c nodes)
                 sum_{c of type t} x_c <= n_t       (nodes of each type)
                 sum_{c ends at b} g_c = sum_{c starts at b} g_c   (every boundary 0 < b < L)
                 sum_{c starts at 0} g_c = T = sum_{c ends at L} g_c
                 x_c integer,

which is Helix's graph (any node may hand its activations to any node whose range starts
where its own ends) with the nodes of one entry side by side. It is exact for that graph
when no path's latency can reach the bounds (checked: the most nodes a path can cross times
the slowest point stays within them; otherwise `ValueError`), with one deliberate
difference: a node's NIC bounds all of its inflow (and outflow), not each edge on its own,
as a NIC does. Per (type, layers, role, start) only the point of the most capacity is
offered, since without a latency bound a slower point of more capacity is never worse.

The MILP starts from a heuristic placement (`pipelines`) and is capped by the layer-cover
bound (`coral.baselines.helix_bound`, which also cuts every capacity to it: no node carries
more than the whole flow); its LP relaxation alone stays near `coverage_bound`, which counts
fractions of nodes per layer. The answer is a real placement: each entry's nodes take an
equal share of its flow, and at each boundary the flow splits over the next entries in
proportion to their flows (`ClusterPlacement.template`, checked by
`coral.templates.placement.verify`). HiGHS runs under a time limit; the status and the
proven gap (against the smaller of HiGHS's bound and the layer-cover bound) come with it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import highspy
import numpy as np

from coral.baselines.helix import path_share
from coral.baselines.helix_bound import layer_cover_bound
from coral.catalog.loader import Catalog
from coral.solvers import quiet_highs
from coral.templates.placement.milp import MilpBuilder
from coral.templates.placement.prep import (
    Prepared,
    edge_limit,
    flow_upper_bound,
    node_placement,
    prepare,
)
from coral.templates.slo import SloSpec
from coral.templates.space.operating_points import OperatingPointTables, input_embedding_bytes
from coral.templates.template import Template, template_from_placement
from coral.templates.types import (
    SINK,
    SOURCE,
    Placement,
    PlacementProblem,
    SolveStatus,
    upper_bound_of,
)

#: Placement method named in the template.
METHOD = "helix-boundary-milp"
#: Share of the time limit the layer-cover bound may take before the MILP starts.
BOUND_SHARE = 0.6
_FLOW_EPS = 1e-9


@dataclass(frozen=True)
class Entry:
    """`count` identical nodes of one type holding `layers` layers from `start` at one
    operating point, carrying `flow` between them."""

    node_type: str
    option: int  # index into the node type's `NodeSpec.options`
    start: int
    layers: int
    is_last: bool
    count: int
    flow: float
    step_s: float
    prefill_s: float

    @property
    def end(self) -> int:
        return self.start + self.layers


@dataclass(frozen=True)
class ClusterPlacement:
    """The solved placement, its template, and what the solve proved."""

    template: Template
    entries: tuple[Entry, ...]
    status: SolveStatus
    gap: float  # (bound - incumbent) / bound; 0 when optimal
    upper_bound: float  # proven bound on the optimum, requests/s
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.template.throughput

    def boundary_edges(self) -> list[tuple[int, int, float]]:
        """The entries' graph: (entry, entry, flow) with `SOURCE`/`SINK`, each boundary's
        flow split in proportion to the flows of the entries starting there."""
        return _entry_edges(self.entries)

    def slo_share(self, slo: SloSpec) -> float:
        """Of the flow, the most that paths meeting `slo`'s TPOT and TTFT can carry, as a
        share (`path_share` over the entries' graph: exact for the nodes' graph too, since
        each entry's nodes split its flow evenly, so any routing over entries spreads over
        the nodes in the same proportions as the nodes' own edge flows)."""
        edges = self.boundary_edges()
        return path_share([e.step_s for e in self.entries], [e.prefill_s for e in self.entries],
                          edges, self.template.throughput, tpot_s=slo.tpot_s,
                          ttft_s=slo.ttft_s, what=f"Helix's placement of {self.template.model}")

    def describe(self) -> str:
        proven = ("optimal" if self.status is SolveStatus.OPTIMAL else
                  f"time limit, gap {self.gap:.1%} to the bound {self.upper_bound:.4g}")
        return (f"{self.throughput:.4g} req/s on {sum(e.count for e in self.entries)} nodes "
                f"({len(self.entries)} entries; {proven})")


def _entry_edges(entries: Sequence[Entry]) -> list[tuple[int, int, float]]:
    edges: list[tuple[int, int, float]] = []
    starting: dict[int, list[int]] = {}
    for c, e in enumerate(entries):
        if e.flow > 0:
            starting.setdefault(e.start, []).append(c)
    for c, e in enumerate(entries):
        if e.flow <= 0:
            continue
        if e.start == 0:
            edges.append((SOURCE, c, e.flow))
        if e.is_last:
            edges.append((c, SINK, e.flow))
            continue
        nxt = starting.get(e.end, [])
        total = sum(entries[d].flow for d in nxt)
        for d in nxt:
            edges.append((c, d, e.flow * entries[d].flow / total))
    return edges


@dataclass(frozen=True)
class _Candidate:
    group: int
    option: int
    start: int
    layers: int
    is_last: bool
    cap: float  # per node, NIC limits applied


def _candidates(prep: Prepared) -> list[_Candidate]:
    """Per group of identical nodes and (layers, role, start), the point of most capacity
    (capped by the node's NIC where flow crosses it)."""
    P = prep.problem
    out: list[_Candidate] = []
    for gi, members in enumerate(prep.groups):
        i = members[0]
        u = prep.usable[i]
        assert u is not None
        nic = edge_limit(P, i, i)
        best: dict[tuple[int, bool, int], tuple[float, int]] = {}
        for r in range(len(u)):
            k, last, cap = int(u.k[r]), bool(u.last[r]), float(u.cap[r])
            for s in np.nonzero(u.starts[r])[0].tolist():
                c = cap
                if s > 0:
                    c = min(c, nic)
                if not last:
                    c = min(c, nic)
                key = (k, last, s)
                if c > best.get(key, (-1.0, -1))[0]:
                    best[key] = (c, int(u.opt[r]))
        for (k, last, s), (c, oi) in sorted(best.items()):
            if c > 0:
                out.append(_Candidate(gi, oi, s, k, last, c))
    return out


def check_latency_slack(prep: Prepared) -> None:
    """Raise unless no source-to-sink path can exceed the problem's latency bounds: the
    boundary MILP does not model path latency."""
    P = prep.problem
    active = prep.active
    hops = min(P.num_layers, len(active))
    for bound, attr, what in ((P.tpot_s, "step", "TPOT"), (P.ttft_s, "pre", "TTFT")):
        if bound is None or not active:
            continue
        worst = sorted((float(getattr(prep.usable[i], attr).max()) for i in active),
                       reverse=True)[:hops]
        if sum(worst) > bound:
            raise ValueError(
                f"a path over {hops} nodes may take {sum(worst):.4g} s against the {what} "
                f"bound {bound:g} s: the boundary MILP does not model path latency; place "
                "under a latency bound with the per-node placement solver (`build_template`)")


def pipelines(prep: Prepared, cands: list[_Candidate]) -> tuple[float, np.ndarray, np.ndarray]:
    """The warm start: disjoint pipelines of data-parallel stages (`j` nodes of one type on
    the same layers), every stage carrying at least a common `theta`, for the best `theta`;
    returns the throughput (`pipelines x theta`), and per candidate its node count and flow.

    A pipeline is built stage by stage from layer 0, each stage the one of the most layers
    per node (then the most layers) whose `j` nodes carry `theta`, and ends on the last stage
    of the fewest nodes that covers the rest (a bin-covering greedy).
    """
    L = prep.problem.num_layers
    at: dict[tuple[int, int, bool, int], int] = {}
    for c, cand in enumerate(cands):
        at[cand.group, cand.layers, cand.is_last, cand.start] = c
    empty = np.zeros(len(cands))
    best: tuple[float, np.ndarray, np.ndarray] = (0.0, empty.astype(int), empty)
    for theta in sorted({c.cap / j for c in cands for j in range(1, len(prep.groups[c.group])
                                                                 + 1)}, reverse=True):
        left = [len(g) for g in prep.groups]
        x, g = np.zeros(len(cands), dtype=int), np.zeros(len(cands))
        chains = 0
        while (chain := _one_pipeline(L, theta, left, at, cands)) is not None:
            for c, j in chain:
                x[c] += j
                g[c] += theta
                left[cands[c].group] -= j
            chains += 1
        if chains * theta > best[0] * (1 + 1e-12):
            best = (chains * theta, x, g)
    return best


def _one_pipeline(L: int, theta: float, left: list[int], at: dict, cands: list[_Candidate]
                  ) -> list[tuple[int, int]] | None:
    """One pipeline as (candidate, nodes) stages from the nodes `left`, or None."""
    free = list(left)
    chain: list[tuple[int, int]] = []
    pos = 0
    while pos < L:
        rest = L - pos
        ends = []  # (nodes, candidate) of a last stage covering the rest
        for grp, n in enumerate(free):
            c = at.get((grp, rest, True, pos))
            if n > 0 and c is not None:
                j = math.ceil(theta / cands[c].cap * (1 - 1e-12))
                if j <= n:
                    ends.append((j, c))
        if ends:
            j, c = min(ends)
            chain.append((c, j))
            return chain
        stages = []  # (layers per node, layers, candidate, nodes)
        for grp, n in enumerate(free):
            for k in range(1, rest):
                c = at.get((grp, k, False, pos))
                if n > 0 and c is not None:
                    j = math.ceil(theta / cands[c].cap * (1 - 1e-12))
                    if j <= n:
                        stages.append((k / j, k, c, j))
        if not stages:
            return None
        _, k, c, j = max(stages)
        chain.append((c, j))
        free[cands[c].group] -= j
        pos += k
    return None


def coverage_bound(prep: Prepared, cands: list[_Candidate], hi: float) -> float:
    """The largest `T <= hi` with `L T <= sum_nodes max_k k min(cap_k, T)`: a bound on the
    flow, since every unit passes `L` layers and a node carries at most its capacity and at
    most the whole flow `T`. (`flow_upper_bound` leaves out the `min(., T)`, which is what
    makes the boundary LP loose: it counts one-layer points whose capacity exceeds `T`.)
    The slack `sum - L T` falls as `T` grows (the sum's slope is at most its value over
    `T`), so a bisection finds it."""
    L = prep.problem.num_layers
    per_group: list[tuple[int, np.ndarray, np.ndarray]] = []
    for gi, members in enumerate(prep.groups):
        ks = np.array([c.layers for c in cands if c.group == gi], dtype=float)
        caps = np.array([c.cap for c in cands if c.group == gi], dtype=float)
        per_group.append((len(members), ks, caps))

    def slack(T: float) -> float:
        return sum(n * float((k * np.minimum(c, T)).max()) for n, k, c in per_group
                   if len(k)) - L * T

    lo = 0.0
    if slack(hi) >= 0:
        return hi
    for _ in range(100):
        mid = (lo + hi) / 2
        if slack(mid) >= 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-9 * hi:
            break
    return hi


def _build(prep: Prepared, cands: list[_Candidate], fs: float, fixed: np.ndarray | None,
           ub: float) -> tuple[MilpBuilder, list[int], list[int], int]:
    """The MILP (or, with `fixed` node counts, the LP of the flows on them)."""
    L = prep.problem.num_layers
    b = MilpBuilder()
    xs, gs = [], []
    # no node carries more than the whole flow: capacities above the bound are cut to it
    caps = [min(cand.cap, ub) for cand in cands]
    for c, cand in enumerate(cands):
        n = len(prep.groups[cand.group])
        lo_hi = (fixed[c], fixed[c]) if fixed is not None else (0, n)
        xs.append(b.col(f"x[{c}]", lo_hi[0], lo_hi[1], fixed is None))
        gs.append(b.col(f"g[{c}]", 0, n * caps[c] / fs))
    T = b.col("T", 0, ub / fs * (1 + 1e-9) + 1e-12)
    b.cost[T] = 1.0
    for c, cand in enumerate(cands):
        b.row([(gs[c], 1.0), (xs[c], -caps[c] / fs)], -highspy.kHighsInf, 0)
    for gi, members in enumerate(prep.groups):
        b.row([(xs[c], 1.0) for c, cand in enumerate(cands) if cand.group == gi], 0, len(members))
    into: list[list[tuple[int, float]]] = [[] for _ in range(L + 1)]
    for c, cand in enumerate(cands):
        into[cand.start].append((gs[c], -1.0))
        into[cand.start + cand.layers].append((gs[c], 1.0))
    into[0].append((T, 1.0))
    into[L].append((T, -1.0))
    for terms in into:
        if terms:
            b.row(terms, 0, 0)
    return b, xs, gs, T


def _run(b: MilpBuilder, time_limit_s: float, log: bool,
         start: np.ndarray | None = None) -> highspy.Highs:
    h = quiet_highs()
    if log:
        h.setOptionValue("output_flag", True)
    h.setOptionValue("time_limit", float(max(time_limit_s, 0.01)))
    h.setOptionValue("mip_rel_gap", 1e-6)
    h.passModel(b.lp())
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(start)
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    return h


def solve_cluster(problem: PlacementProblem, *, time_limit_s: float = 60.0,
                  log: bool = False) -> tuple[Placement, list[Entry], float, dict[str, float]]:
    """The boundary MILP of `problem` (no path latency: `check_latency_slack`), warm-started
    from `pipelines` and capped by `coverage_bound`: the placement, its entries, the proven
    bound on the optimum and the MILP's size and times. `log` prints HiGHS's progress (its
    bound and incumbent over time)."""
    t0 = time.perf_counter()
    prep = prepare(problem, path_filter=False)
    if prep.infeasible:
        raise ValueError(f"the cluster cannot hold the model: {prep.infeasible}")
    check_latency_slack(prep)
    cands = _candidates(prep)
    if not cands:
        raise ValueError("no node of the cluster can carry flow")
    fs = max(c.cap for c in cands)
    warm, wx, wg = pipelines(prep, cands)
    cover = coverage_bound(prep, cands, flow_upper_bound(prep))
    tb = time.perf_counter()
    items: dict[tuple[int, int], float] = {}
    for cand in cands:
        items[cand.group, cand.layers] = max(items.get((cand.group, cand.layers), 0.0), cand.cap)
    ub = layer_cover_bound(problem.num_layers, [len(g) for g in prep.groups],
                           [(g, k, c) for (g, k), c in sorted(items.items())], warm, cover,
                           deadline=t0 + BOUND_SHARE * time_limit_s)
    b, xs, gs, T = _build(prep, cands, fs, None, ub)
    start = np.zeros(len(b.col_lb))
    start[xs] = wx
    start[gs] = wg / fs
    start[T] = warm / fs
    stats: dict[str, float] = {"cols": len(b.col_lb), "integers": sum(b.col_int),
                               "rows": len(b.row_lb), "nonzeros": len(b.row_idx),
                               "warm_start": warm, "coverage_bound": cover,
                               "layer_cover_bound": ub, "bound_s": time.perf_counter() - tb,
                               "build_s": time.perf_counter() - t0}
    left = time_limit_s - (time.perf_counter() - t0)
    ts = time.perf_counter()
    h = _run(b, left, log, start)
    stats["solve_s"] = time.perf_counter() - ts
    info = h.getInfo()
    status = h.getModelStatus()
    stats["bb_nodes"] = int(info.mip_node_count)
    if info.primal_solution_status != 2:  # kSolutionStatusFeasible
        raise RuntimeError(f"boundary MILP: HiGHS {h.modelStatusToString(status)} with no "
                           f"placement after {stats['solve_s']:.1f} s; allow more time")
    x = np.rint(np.array(h.getSolution().col_value)[xs]).astype(int)
    bound = min(ub, float(info.mip_dual_bound) * fs)
    optimal = status == highspy.HighsModelStatus.kOptimal
    # the flows on the chosen counts, re-solved as an LP so they meet every row exactly
    lp, _, gs2, T2 = _build(prep, cands, fs, x, ub)
    lp.col_int = [False] * len(lp.col_int)
    h2 = _run(lp, 60.0, False)
    if h2.getModelStatus() != highspy.HighsModelStatus.kOptimal:  # pragma: no cover
        raise RuntimeError(f"boundary LP: HiGHS {h2.modelStatusToString(h2.getModelStatus())}")
    col = np.array(h2.getSolution().col_value)
    entries = []
    for c, cand in enumerate(cands):
        if x[c] <= 0:
            continue
        i = prep.groups[cand.group][0]
        op = problem.nodes[i].options[cand.option]
        flow = max(0.0, float(col[gs2[c]]) * fs)
        entries.append(Entry(problem.nodes[i].node_type, cand.option, cand.start, cand.layers,
                             cand.is_last, int(x[c]), flow if flow > _FLOW_EPS * fs else 0.0,
                             op.step_s, op.prefill_s))
    thr = float(col[T2]) * fs
    thr = thr if thr > _FLOW_EPS * fs else 0.0  # the LP's round-off on a cluster that carries none
    bound = thr if optimal else max(bound, thr)
    gap = 0.0 if optimal or bound <= 0 else max(0.0, (bound - thr) / bound)
    st = SolveStatus.OPTIMAL if optimal else SolveStatus.TIME_LIMIT
    placement = _placement(prep, cands, x, entries, thr, st, gap, time.perf_counter() - t0,
                           stats)
    stats["total_s"] = time.perf_counter() - t0
    return placement, entries, bound, stats


def _placement(prep: Prepared, cands: list[_Candidate], x: np.ndarray, entries: list[Entry],
               thr: float, status: SolveStatus, gap: float, solve_s: float,
               stats: dict[str, float]) -> Placement:
    """Nodes of each group handed to its entries in order (the rest idle), each carrying an
    equal share; node-to-node flows split in proportion (`_entry_edges`)."""
    problem = prep.problem
    choice = dict(prep.idle)
    nodes_of: list[list[int]] = []
    used = [0] * len(prep.groups)
    picked = [c for c in range(len(cands)) if x[c] > 0]
    for e, c in zip(entries, picked):
        cand = cands[c]
        members = prep.groups[cand.group][used[cand.group]:used[cand.group] + e.count]
        used[cand.group] += e.count
        for i in members:
            choice[i] = (cand.option, cand.start)
        nodes_of.append(members)
    edges: list[tuple[int, int, float]] = []
    for a, bb, f in _entry_edges(entries):
        src = [SOURCE] if a == SOURCE else nodes_of[a]
        dst = [SINK] if bb == SINK else nodes_of[bb]
        share = f / (len(src) * len(dst))
        edges += [(u, v, share) for u in src for v in dst]
    placed = tuple(node_placement(problem, i, *choice[i]) for i in range(len(problem.nodes)))
    notes = (f"boundary MILP {int(stats['cols'])} cols ({int(stats['integers'])} int) "
             f"{int(stats['rows'])} rows, {int(stats['bb_nodes'])} B&B nodes",)
    edges.sort(key=lambda e: (e[0] if e[0] >= 0 else 10**9 + e[0], e[1]))
    return Placement(throughput=thr, nodes=placed, edges=tuple(edges), status=status, gap=gap,
                     solve_s=solve_s, method=METHOD, notes=notes)


def cluster_placement(
    model: str,
    cluster_node_types: Sequence[str],
    slo: SloSpec,
    *,
    catalog: Catalog,
    tables: OperatingPointTables,
    time_limit_s: float = 60.0,
    log: bool = False,
) -> ClusterPlacement:
    """`model` on every node of `cluster_node_types` (one entry per node) under `slo`, whose
    latency bounds must be too loose to bind (`check_latency_slack`): Helix's max flow."""
    arch = catalog.model(model)
    names = tuple(sorted(cluster_node_types))
    t0 = time.perf_counter()
    problem = tables.problem(arch, names, slo, "aggregated", "dag")
    placement, entries, bound, stats = solve_cluster(problem,
                                                     time_limit_s=time_limit_s - (
                                                         time.perf_counter() - t0), log=log)
    tpl = template_from_placement(arch, names, slo, "aggregated", "dag",
                                  input_embedding_bytes(arch), placement, catalog,
                                  solve_s=time.perf_counter() - t0)
    scale = tpl.throughput_rps / tpl.throughput if tpl.throughput > 0 else 1.0
    if not math.isfinite(bound):  # pragma: no cover - the flow bound is always finite
        bound = upper_bound_of(placement.throughput, placement.status, placement.gap)
    return ClusterPlacement(tpl, tuple(entries), placement.status, placement.gap,
                            bound * scale, stats)
