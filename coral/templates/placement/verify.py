"""Independent re-check of a solved `Placement` against its `PlacementProblem`.

Recomputes everything from the problem's numbers — nothing is taken from the solver's
bookkeeping — and lists every violation found: memory, layer ranges, roles, edges versus
ranges, conservation, capacities, NIC limits, path latencies, the throughput figure, and for
the chain topology that the edges form one pipeline through every node.
"""

from __future__ import annotations

import math
from collections import defaultdict

from coral.templates.types import SINK, SOURCE, Placement, PlacementProblem, SolveStatus


def verify_placement(problem: PlacementProblem, placement: Placement, tol: float = 1e-6
                     ) -> list[str]:
    """Violations of `placement` (empty: valid). `tol` is relative (absolute for flows:
    relative to the largest capacity among the nodes' points)."""
    errs: list[str] = []
    L = problem.num_layers
    N = len(problem.nodes)
    if placement.status is SolveStatus.INFEASIBLE:
        if placement.throughput != 0 or placement.edges:
            errs.append("infeasible placement with flow")
        return errs
    if len(placement.nodes) != N:
        return [f"{len(placement.nodes)} node placements for {N} nodes"]
    if placement.status is SolveStatus.OPTIMAL and placement.gap > tol:
        errs.append(f"status optimal with gap {placement.gap}")
    if not placement.gap >= 0:
        errs.append(f"negative or undefined gap {placement.gap}")
    scale = max([1e-30] + [op.capacity for spec in problem.nodes for op in spec.options])
    ftol = tol * scale
    carry = 1e-9 * max(1.0, scale)  # flow above which an edge counts as carrying flow

    # ---- nodes: a real operating point, placed within [0, L), fitting in memory ----
    for i, (spec, npl) in enumerate(zip(problem.nodes, placement.nodes)):
        tag = f"node {i} ({spec.node_type})"
        if npl.node_type != spec.node_type:
            errs.append(f"{tag}: node type {npl.node_type!r}")
        if npl.layers < 1 or npl.first_layer < 0 or npl.first_layer + npl.layers > L:
            errs.append(f"{tag}: range [{npl.first_layer}, {npl.first_layer + npl.layers}) "
                        f"outside [0, {L})")
        is_last = npl.first_layer + npl.layers == L
        match = [op for op in spec.options
                 if op.layers == npl.layers and op.batch == npl.batch and op.is_last == is_last
                 and _close(op.capacity, npl.capacity, tol) and _close(op.step_s, npl.step_s, tol)
                 and _close(op.prefill_s, npl.prefill_s, tol)
                 and _close(op.mem_bytes, npl.mem_bytes, tol)]
        if not match:
            errs.append(f"{tag}: no operating point with {npl.layers} layers, batch "
                        f"{npl.batch}, last={is_last} and these numbers")
        mem = npl.mem_bytes + (problem.first_stage_extra_bytes if npl.first_layer == 0 else 0)
        if mem > spec.mem_bytes * (1 + tol):
            errs.append(f"{tag}: needs {mem:.6g} bytes, has {spec.mem_bytes:.6g}")

    # ---- edges ----
    seen = set()
    inflow = defaultdict(float)
    outflow = defaultdict(float)
    for u, v, f in placement.edges:
        if (u, v) in seen:
            errs.append(f"edge {u}->{v} listed twice")
        seen.add((u, v))
        if not (u == SOURCE or 0 <= u < N) or not (v == SINK or 0 <= v < N) or u == v:
            errs.append(f"edge {u}->{v}: bad endpoints")
            continue
        if not f >= -ftol:
            errs.append(f"edge {u}->{v}: flow {f}")
        if u == SOURCE and v == SINK:
            errs.append("edge source->sink")
            continue
        if u == SOURCE:
            if placement.nodes[v].first_layer != 0:
                errs.append(f"source edge to node {v} starting at layer "
                            f"{placement.nodes[v].first_layer}")
        elif v == SINK:
            nu = placement.nodes[u]
            if nu.first_layer + nu.layers != L:
                errs.append(f"sink edge from node {u} ending at {nu.first_layer + nu.layers}")
        else:
            nu, nv = placement.nodes[u], placement.nodes[v]
            if nu.first_layer + nu.layers != nv.first_layer:
                errs.append(f"edge {u}->{v}: node {u} ends at {nu.first_layer + nu.layers}, "
                            f"node {v} starts at {nv.first_layer}")
            if problem.edge_bytes_per_unit > 0:
                nic = min(problem.nodes[u].nic_bytes_per_s, problem.nodes[v].nic_bytes_per_s)
                if f * problem.edge_bytes_per_unit > nic * (1 + tol) + ftol * problem.edge_bytes_per_unit:
                    errs.append(f"edge {u}->{v}: {f:.6g} units/s exceed the NIC "
                                f"({nic / problem.edge_bytes_per_unit:.6g})")
        outflow[u] += f
        inflow[v] += f

    for i, npl in enumerate(placement.nodes):
        if abs(inflow[i] - outflow[i]) > ftol:
            errs.append(f"node {i}: inflow {inflow[i]:.9g} != outflow {outflow[i]:.9g}")
        if inflow[i] > npl.capacity * (1 + tol) + ftol:
            errs.append(f"node {i}: inflow {inflow[i]:.9g} exceeds capacity {npl.capacity:.9g}")
    if abs(placement.throughput - outflow[SOURCE]) > ftol:
        errs.append(f"throughput {placement.throughput:.9g} != source outflow "
                    f"{outflow[SOURCE]:.9g}")
    if abs(outflow[SOURCE] - inflow[SINK]) > ftol:
        errs.append(f"source outflow {outflow[SOURCE]:.9g} != sink inflow {inflow[SINK]:.9g}")

    # ---- latency on every flow-carrying source->sink path ----
    live = [(u, v) for u, v, f in placement.edges if f > carry]
    if problem.topology == "chain":
        live = [(u, v) for u, v, _ in placement.edges]  # a chain's path counts regardless
    for attr, bound, name in (("step_s", problem.tpot_s, "TPOT"),
                              ("prefill_s", problem.ttft_s, "TTFT")):
        if bound is None:
            continue
        worst = _longest(placement, live, attr)
        if worst is not None and worst > bound * (1 + tol):
            errs.append(f"a flow-carrying path takes {worst:.6g} s > {name} {bound:.6g} s")

    if problem.topology == "chain":
        errs.extend(_check_chain(problem, placement, tol, ftol))
    return errs


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-300)


def _longest(placement: Placement, edges, attr) -> float | None:
    succ = defaultdict(list)
    for u, v in edges:
        succ[u].append(v)
    memo: dict[int, float] = {}
    on_stack: set[int] = set()

    def down(u: int) -> float:
        if u == SINK:
            return 0.0
        if u in memo:
            return memo[u]
        if u in on_stack:
            raise ValueError("cycle")
        on_stack.add(u)
        own = 0.0 if u == SOURCE else getattr(placement.nodes[u], attr)
        best = max((down(v) for v in succ[u]), default=-math.inf)
        on_stack.discard(u)
        memo[u] = own + best
        return memo[u]

    try:
        value = down(SOURCE)
    except ValueError:
        return math.inf
    return None if value == -math.inf else value


def _check_chain(problem: PlacementProblem, placement: Placement, tol: float, ftol: float
                 ) -> list[str]:
    errs = []
    N = len(problem.nodes)
    nxt: dict[int, list[int]] = defaultdict(list)
    indeg: dict[int, int] = defaultdict(int)
    for u, v, _ in placement.edges:
        nxt[u].append(v)
        indeg[v] += 1
    if len(nxt[SOURCE]) != 1 or indeg[SINK] != 1:
        return [f"chain: {len(nxt[SOURCE])} source edges, {indeg[SINK]} sink edges"]
    order, u = [], nxt[SOURCE][0]
    while u != SINK and len(order) <= N:
        if len(nxt[u]) != 1 or indeg[u] != 1:
            return [f"chain: node {u} has {indeg[u]} in-edges and {len(nxt[u])} out-edges"]
        order.append(u)
        u = nxt[u][0]
    if sorted(order) != list(range(N)):
        return [f"chain: the path visits {order}, not every node once"]
    nodes = placement.nodes
    thr = min(nodes[i].capacity for i in order)
    if problem.edge_bytes_per_unit > 0:
        for a, b in zip(order, order[1:]):
            nic = min(problem.nodes[a].nic_bytes_per_s, problem.nodes[b].nic_bytes_per_s)
            thr = min(thr, nic / problem.edge_bytes_per_unit)
    if abs(placement.throughput - thr) > ftol + tol * thr:
        errs.append(f"chain: throughput {placement.throughput:.9g}, bottleneck {thr:.9g}")
    return errs
