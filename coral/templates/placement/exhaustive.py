"""Brute-force placement oracle for tiny problems (a check on the MILP and the chain DP).

Written straight from the model, sharing no code with the solvers:

* flow topology — every split of the nodes into idle ones and replicas; per replica every
  ordered split of its nodes into stages of identical nodes, every split of the layers, every
  operating point per stage (shared by the stage's nodes); throughput is the smallest stage
  capacity (times its nodes) or link limit (times the node pairs between two stages).
* dag topology — every layout (each node idle or holding a range), every operating point
  per range, every subset of the node-to-node edges the ranges allow; a subset counts if
  every source→sink path through it meets TPOT/TTFT; its value is a max flow
  (Edmonds–Karp on the node-split graph, node capacities and NIC limits).
* chain topology — every distinct ordering of the nodes, every split of the layers, every
  operating point per stage.

Exactness-preserving pruning only: a node carrying no flow may hold anything that fits, so
"idle" stands for all of its choices; the nodes that do carry flow form a layout in which
every start > 0 is some node's end and every end < L some node's start (else some node
would be cut off from the source or the sink); a layout, or a choice of points, whose
simple cut bound cannot beat the best value so far is skipped. Meant for <= 4 nodes and
<= 12 layers (4 nodes with <= 8 layers run in well under a second).
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque

from coral.templates.types import (
    SINK,
    SOURCE,
    NodePlacement,
    Placement,
    PlacementProblem,
    SolveStatus,
)

_RTOL = 1e-9  # the slack the solvers allow on a latency bound


def _ok(total: float, bound: float | None) -> bool:
    return bound is None or total <= bound * (1.0 + _RTOL) + 1e-15


def _fits(problem: PlacementProblem, i: int, oi: int, s: int) -> bool:
    node = problem.nodes[i]
    op = node.options[oi]
    end = s + op.layers
    if op.layers < 1 or s < 0 or end > problem.num_layers:
        return False
    if op.is_last != (end == problem.num_layers):
        return False
    extra = problem.first_stage_extra_bytes if s == 0 else 0.0
    return op.mem_bytes + extra <= node.mem_bytes


def _nic(problem: PlacementProblem, i: int, j: int) -> float:
    if problem.edge_bytes_per_unit <= 0:
        return math.inf
    return min(problem.nodes[i].nic_bytes_per_s,
               problem.nodes[j].nic_bytes_per_s) / problem.edge_bytes_per_unit


def max_flow(n: int, cap: list[list[float]], s: int, t: int) -> tuple[float, list[list[float]]]:
    """Edmonds–Karp on a dense capacity matrix; returns (value, flow matrix)."""
    flow = [[0.0] * n for _ in range(n)]
    total = 0.0
    while True:
        parent = [-1] * n
        parent[s] = s
        q = deque([s])
        while q and parent[t] < 0:
            u = q.popleft()
            for v in range(n):
                if parent[v] < 0 and cap[u][v] - flow[u][v] > 1e-12:
                    parent[v] = u
                    q.append(v)
        if parent[t] < 0:
            return total, flow
        push, v = math.inf, t
        while v != s:
            u = parent[v]
            push = min(push, cap[u][v] - flow[u][v])
            v = u
        v = t
        while v != s:
            u = parent[v]
            flow[u][v] += push
            flow[v][u] -= push
            v = u
        total += push


def _node_flow(problem, chosen, mid_edges):
    """Max flow for active nodes `chosen` {i: (oi, s)} with the given node-to-node edges."""
    idx = {i: n for n, i in enumerate(chosen)}
    m = len(chosen)
    S, T = 2 * m, 2 * m + 1
    cap = [[0.0] * (2 * m + 2) for _ in range(2 * m + 2)]
    L = problem.num_layers
    for i, (oi, s) in chosen.items():
        op = problem.nodes[i].options[oi]
        a = idx[i]
        cap[2 * a][2 * a + 1] = op.capacity
        if s == 0:
            cap[S][2 * a] = math.inf
        if s + op.layers == L:
            cap[2 * a + 1][T] = math.inf
    for i, j in mid_edges:
        cap[2 * idx[i] + 1][2 * idx[j]] = _nic(problem, i, j)
    value, flow = max_flow(2 * m + 2, cap, S, T)
    edges = {}
    for i in chosen:
        a = idx[i]
        if flow[S][2 * a] > 0:
            edges[SOURCE, i] = flow[S][2 * a]
        if flow[2 * a + 1][T] > 0:
            edges[i, SINK] = flow[2 * a + 1][T]
    for i, j in mid_edges:
        f = flow[2 * idx[i] + 1][2 * idx[j]]
        if f > 0:
            edges[i, j] = f
    return value, edges


def _paths_ok(problem, chosen, mid_edges) -> bool:
    """Every source→sink path over the enabled edges meets both bounds."""
    L = problem.num_layers
    succ = {i: [] for i in chosen}
    for i, j in mid_edges:
        succ[i].append(j)

    def walk(i, step, pre) -> bool:
        op = problem.nodes[i].options[chosen[i][0]]
        step, pre = step + op.step_s, pre + op.prefill_s
        if chosen[i][1] + op.layers == L and not (_ok(step, problem.tpot_s)
                                                  and _ok(pre, problem.ttft_s)):
            return False
        return all(walk(j, step, pre) for j in succ[i])

    return all(walk(i, 0.0, 0.0) for i, (oi, s) in chosen.items() if s == 0)


def _placement(problem, chosen, edges, value, t0, notes=()) -> Placement:
    nodes = []
    for i, spec in enumerate(problem.nodes):
        if i in chosen:
            oi, s = chosen[i]
        else:
            oi, s = next((oi, s) for oi in range(len(spec.options))
                         for s in range(problem.num_layers) if _fits(problem, i, oi, s))
        op = spec.options[oi]
        nodes.append(NodePlacement(
            node_type=spec.node_type, first_layer=s, layers=op.layers, batch=op.batch,
            tp_degree=int(getattr(spec, "tp_degree", 0) or 0), capacity=op.capacity,
            step_s=op.step_s, prefill_s=op.prefill_s, mem_bytes=op.mem_bytes))
    return Placement(throughput=value, nodes=tuple(nodes),
                     edges=tuple((u, v, f) for (u, v), f in edges.items()),
                     status=SolveStatus.OPTIMAL, gap=0.0, solve_s=time.perf_counter() - t0,
                     method="exhaustive", notes=tuple(notes))


def _infeasible(reason: str, t0: float) -> Placement:
    return Placement(throughput=0.0, nodes=(), edges=(), status=SolveStatus.INFEASIBLE,
                     gap=0.0, solve_s=time.perf_counter() - t0, method="exhaustive",
                     notes=(reason,))


def exhaustive_placement(problem: PlacementProblem) -> Placement:
    """The optimal placement by enumeration (tiny problems only)."""
    t0 = time.perf_counter()
    L, N = problem.num_layers, len(problem.nodes)
    for i, spec in enumerate(problem.nodes):
        if not any(_fits(problem, i, oi, s) for oi in range(len(spec.options))
                   for s in range(L)):
            return _infeasible(f"node {i} fits no operating point", t0)
    if problem.topology == "chain":
        return _chain(problem, t0)
    if problem.topology == "flow":
        return _staged(problem, t0)

    # per node: range -> operating points that fit there and meet the SLO on their own
    ranges: list[dict[tuple[int, int], list[int]]] = []
    for i, spec in enumerate(problem.nodes):
        r: dict[tuple[int, int], list[int]] = {}
        for oi, op in enumerate(spec.options):
            if not (_ok(op.step_s, problem.tpot_s) and _ok(op.prefill_s, problem.ttft_s)):
                continue
            for s in range(L):
                if _fits(problem, i, oi, s):
                    r.setdefault((s, s + op.layers), []).append(oi)
        ranges.append(r)

    best = [0.0, {}, {}]  # value, chosen, edges

    def evaluate(layout: dict[int, tuple[int, int]]) -> None:
        if _cut_bound(layout, {i: max(problem.nodes[i].options[o].capacity
                                      for o in ranges[i][rg]) for i, rg in layout.items()},
                      L) <= best[0]:
            return
        act = sorted(layout)
        mids = [(i, j) for i in act for j in act if i != j and layout[i][1] == layout[j][0]]
        for ops in itertools.product(*(ranges[i][layout[i]] for i in act)):
            chosen = {i: (oi, layout[i][0]) for i, oi in zip(act, ops)}
            caps = {i: problem.nodes[i].options[oi].capacity for i, oi in zip(act, ops)}
            if _cut_bound(layout, caps, L) <= best[0]:
                continue
            for n in range(len(mids), -1, -1):
                for sub in itertools.combinations(mids, n):
                    if not _paths_ok(problem, chosen, sub):
                        continue
                    value, edges = _node_flow(problem, chosen, sub)
                    if value > best[0]:
                        best[:] = [value, dict(chosen), edges]

    def deficits(layout) -> int:
        starts = {s for s, e in layout.values()}
        ends = {e for s, e in layout.values()}
        return (sum(1 for s in starts if s > 0 and s not in ends)
                + sum(1 for e in ends if e < L and e not in starts))

    def rec(i: int, layout: dict[int, tuple[int, int]]) -> None:
        if deficits(layout) > 2 * (N - i):
            return
        if i == N:
            if layout:
                evaluate(layout)
            return
        rec(i + 1, layout)
        for rg in ranges[i]:
            layout[i] = rg
            rec(i + 1, layout)
            del layout[i]

    rec(0, {})
    return _placement(problem, best[1], best[2], best[0], t0)


def _cut_bound(layout, caps, L) -> float:
    """min over layers l of the summed capacity of nodes holding l (first and last included)."""
    bound = math.inf
    points = sorted({s for s, e in layout.values()} | {0})
    for l in points:
        bound = min(bound, sum(caps[i] for i, (s, e) in layout.items() if s <= l < e))
    return bound


def _chain(problem: PlacementProblem, t0: float) -> Placement:
    L, N = problem.num_layers, len(problem.nodes)
    best: list = [-1.0, None]
    seen = set()
    for perm in itertools.permutations(range(N)):
        sig = tuple(problem.nodes[i] for i in perm)
        if sig in seen:
            continue
        seen.add(sig)
        for cuts in itertools.combinations(range(1, L), N - 1):
            bounds = (0,) + cuts + (L,)

            def rec(pos, chosen, step, pre, thr):
                if pos == N:
                    if thr > best[0]:
                        best[:] = [thr, dict(chosen)]
                    return
                i, s = perm[pos], bounds[pos]
                k = bounds[pos + 1] - s
                for oi, op in enumerate(problem.nodes[i].options):
                    if op.layers != k or not _fits(problem, i, oi, s):
                        continue
                    st, pr = step + op.step_s, pre + op.prefill_s
                    if not (_ok(st, problem.tpot_s) and _ok(pr, problem.ttft_s)):
                        continue
                    t = min(thr, op.capacity)
                    if pos > 0:
                        t = min(t, _nic(problem, perm[pos - 1], i))
                    if t <= best[0]:
                        continue
                    chosen[i] = (oi, s)
                    rec(pos + 1, chosen, st, pr, t)
                    del chosen[i]

            rec(0, {}, 0.0, 0.0, math.inf)
    if best[1] is None:
        return _infeasible("no chain meets memory and SLO", t0)
    chosen = best[1]
    order = sorted(chosen, key=lambda i: chosen[i][1])
    thr = best[0]
    edges = {(SOURCE, order[0]): thr, (order[-1], SINK): thr}
    for a, b in zip(order, order[1:]):
        edges[a, b] = thr
    return _placement(problem, chosen, edges, thr, t0)


def staged_pipeline(problem: PlacementProblem, nodes: tuple[int, ...]):
    """The best pipeline of data-parallel stages over exactly `nodes`:
    (throughput, [(group, option, start), ...]) or None."""
    L = problem.num_layers
    kinds: dict = {}
    for i in nodes:
        kinds.setdefault(problem.nodes[i], []).append(i)
    types = list(kinds.values())
    best: list = [0.0, None]

    def orders(counts):
        """Sequences of (type, group size) that use `counts` up exactly."""
        if not any(counts):
            yield []
            return
        for t, c in enumerate(counts):
            for j in range(1, c + 1):
                rest = list(counts)
                rest[t] -= j
                for tail in orders(rest):
                    yield [(t, j)] + tail

    for seq in orders([len(g) for g in types]):
        used = [0] * len(types)
        groups = []
        for t, j in seq:
            groups.append(tuple(types[t][used[t]:used[t] + j]))
            used[t] += j
        m = len(groups)
        for cuts in itertools.combinations(range(1, L), m - 1):
            bounds = (0,) + cuts + (L,)

            def rec(pos, stages, step, pre, thr):
                if pos == m:
                    if thr > best[0]:
                        best[:] = [thr, list(stages)]
                    return
                grp, s = groups[pos], bounds[pos]
                k, lead = bounds[pos + 1] - s, grp[0]
                for oi, op in enumerate(problem.nodes[lead].options):
                    if op.layers != k or not _fits(problem, lead, oi, s):
                        continue
                    st, pr = step + op.step_s, pre + op.prefill_s
                    if not (_ok(st, problem.tpot_s) and _ok(pr, problem.ttft_s)):
                        continue
                    t = min(thr, op.capacity * len(grp))
                    if pos > 0:
                        prev = groups[pos - 1]
                        t = min(t, _nic(problem, prev[0], lead) * len(prev) * len(grp))
                    if t <= best[0]:
                        continue
                    stages.append((grp, oi, s))
                    rec(pos + 1, stages, st, pr, t)
                    stages.pop()

            rec(0, [], 0.0, 0.0, math.inf)
    return None if best[1] is None else (best[0], best[1])


def _staged(problem: PlacementProblem, t0: float) -> Placement:
    N = len(problem.nodes)
    pipe = {}
    for r in range(1, N + 1):
        for sub in itertools.combinations(range(N), r):
            pipe[sub] = staged_pipeline(problem, sub)
    best: dict[tuple[int, ...], tuple[float, list]] = {(): (0.0, [])}
    for r in range(1, N + 1):
        for rest in itertools.combinations(range(N), r):
            head, tail = rest[0], rest[1:]
            cand = best[tail]  # `head` idle
            for q in range(len(tail) + 1):
                for others in itertools.combinations(tail, q):
                    sub = (head,) + others
                    if pipe[sub] is None:
                        continue
                    left = tuple(i for i in tail if i not in others)
                    val = pipe[sub][0] + best[left][0]
                    if val > cand[0]:
                        cand = (val, [sub] + best[left][1])
            best[rest] = cand
    value, parts = best[tuple(range(N))]
    chosen, edges = {}, {}
    for sub in parts:
        thr, stages = pipe[sub]
        for grp, oi, s in stages:
            for i in grp:
                chosen[i] = (oi, s)
        first, last = stages[0][0], stages[-1][0]
        for i in first:
            edges[SOURCE, i] = thr / len(first)
        for i in last:
            edges[i, SINK] = thr / len(last)
        for (ga, _, _), (gb, _, _) in zip(stages, stages[1:]):
            for a in ga:
                for b in gb:
                    edges[a, b] = thr / (len(ga) * len(gb))
    return _placement(problem, chosen, edges, value, t0)
