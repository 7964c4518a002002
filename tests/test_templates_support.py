"""Shared fixtures of the template tests: a tiny catalog and a brute-force reference solver.

The reference solver enumerates every assignment of (start layer, operating point) or "unused"
to every node of a small problem and takes the best max-flow among those whose used nodes meet
memory and whose every source→sink path meets the SLO. It is exponential and only meant for
problems of one to three small nodes; it lets the library tests run independently of the
production solver's speed and checks the builder's bookkeeping, not the solver.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from pathlib import Path

from coral.catalog import Catalog, load_catalog
from coral.templates.types import (
    SINK,
    SOURCE,
    NodePlacement,
    Placement,
    PlacementProblem,
    SolveStatus,
)

TINY_CATALOG_YAML = """
gpus:
  - {name: sgpu, memory_gb: 1.5, bf16_tflops: 60, mem_bandwidth_gb_per_s: 300,
     intra_node_link: pcie, intra_node_link_gb_per_s: 16, architecture: ampere,
     source: test}
  - {name: bgpu, memory_gb: 4, bf16_tflops: 120, mem_bandwidth_gb_per_s: 900,
     intra_node_link: pcie, intra_node_link_gb_per_s: 32, architecture: ampere,
     source: test}
regions:
  - {name: r1, cloud: aws, location: here}
  - {name: r2, cloud: aws, location: there}
node_types:
  - name: 1x-s
    gpu: sgpu
    gpu_count: 1
    nic_gbps: 10
    instances: {aws: s.small}
    prices:
      - {region: r1, usd_per_hour: 0.5, source: test}
  - name: 2x-s
    gpu: sgpu
    gpu_count: 2
    nic_gbps: 10
    instances: {aws: s.medium}
    prices:
      - {region: r1, usd_per_hour: 1.0, source: test}
  - name: 1x-b
    gpu: bgpu
    gpu_count: 1
    nic_gbps: 25
    instances: {aws: b.large}
    prices:
      - {region: r1, usd_per_hour: 2.0, source: test}
      - {region: r2, usd_per_hour: 1.8, source: test}
  - name: 1x-r2only
    gpu: bgpu
    gpu_count: 1
    nic_gbps: 25
    instances: {aws: b.other}
    prices:
      - {region: r2, usd_per_hour: 1.5, source: test}
models:
  - name: tiny-4l
    hf_id: test/tiny
    source: test
    num_layers: 4
    hidden_size: 4096
    ffn_size: 14336
    num_heads: 32
    num_kv_heads: 8
    head_dim: 128
    vocab_size: 32000
"""

TINY_BATCHES = (1, 4, 16)


def tiny_catalog(tmp_path: Path) -> Catalog:
    path = tmp_path / "tiny_catalog.yaml"
    path.write_text(TINY_CATALOG_YAML)
    return load_catalog([path], include_builtin=False)


def tiny_slo():
    from coral.templates.slo import SloSpec

    return SloSpec(tpot_s=0.25, ttft_s=5.0, input_tokens=512, output_tokens=128)


# ---- brute-force reference solver -----------------------------------------------------------


def _max_flow(n: int, cap: dict[tuple[int, int], float], s: int, t: int) -> tuple[float, dict]:
    """Edmonds-Karp on a small graph given as {(u, v): capacity}."""
    residual: dict[tuple[int, int], float] = {}
    adj: dict[int, set[int]] = {i: set() for i in range(n)}
    for (u, v), c in cap.items():
        residual[(u, v)] = residual.get((u, v), 0.0) + c
        residual.setdefault((v, u), 0.0)
        adj[u].add(v)
        adj[v].add(u)
    total = 0.0
    while True:
        parent = {s: s}
        q = deque([s])
        while q and t not in parent:
            u = q.popleft()
            for v in adj[u]:
                if v not in parent and residual[(u, v)] > 1e-12:
                    parent[v] = u
                    q.append(v)
        if t not in parent:
            break
        push, v = math.inf, t
        while v != s:
            push = min(push, residual[(parent[v], v)])
            v = parent[v]
        v = t
        while v != s:
            residual[(parent[v], v)] -= push
            residual[(v, parent[v])] += push
            v = parent[v]
        total += push
    # flow on an edge = what its reverse residual gained (exact also for infinite capacities)
    flows = {(u, v): max(0.0, residual[(v, u)] - (cap.get((v, u), 0.0))) for (u, v) in cap}
    return total, flows


def reference_solve(problem: PlacementProblem, *, time_limit_s: float = 60.0,
                    method: str = "auto") -> Placement:
    start = time.perf_counter()
    L = problem.num_layers
    choices = []
    for node in problem.nodes:
        opts: list[tuple[int, int] | None] = [None]
        for oi, op in enumerate(node.options):
            starts = [L - op.layers] if op.is_last else range(0, L - op.layers)
            for s in starts:
                extra = problem.first_stage_extra_bytes if s == 0 else 0.0
                if op.mem_bytes + extra <= node.mem_bytes:
                    opts.append((s, oi))
        choices.append(opts)
    best = (0.0, None, None)
    for assign in itertools.product(*choices):
        used = [i for i, a in enumerate(assign) if a is not None]
        if not used:
            continue
        ops = {i: problem.nodes[i].options[assign[i][1]] for i in used}
        st = {i: assign[i][0] for i in used}
        end = {i: st[i] + ops[i].layers for i in used}
        n = len(problem.nodes)
        # vertices: 2i in, 2i+1 out, 2n source, 2n+1 sink
        S, T = 2 * n, 2 * n + 1
        cap: dict[tuple[int, int], float] = {}
        succ: dict[int, list[int]] = {}
        for i in used:
            cap[(2 * i, 2 * i + 1)] = ops[i].capacity
            if st[i] == 0:
                cap[(S, 2 * i)] = math.inf
                succ.setdefault(SOURCE, []).append(i)
            if end[i] == L:
                cap[(2 * i + 1, T)] = math.inf
                succ.setdefault(i, []).append(SINK)
            for j in used:
                if j != i and end[i] == st[j]:
                    nic = min(problem.nodes[i].nic_bytes_per_s, problem.nodes[j].nic_bytes_per_s)
                    cap[(2 * i + 1, 2 * j)] = nic / problem.edge_bytes_per_unit
                    succ.setdefault(i, []).append(j)
        # every source->sink path must meet the bounds
        ok = True
        for attr, bound in (("step_s", problem.tpot_s), ("prefill_s", problem.ttft_s)):
            if bound is None:
                continue
            memo: dict[int, float] = {}

            def longest(u: int) -> float:
                if u == SINK:
                    return 0.0
                if u not in memo:
                    own = 0.0 if u == SOURCE else getattr(ops[u], attr)
                    memo[u] = own + max((longest(v) for v in succ.get(u, [])), default=-math.inf)
                return memo[u]

            if longest(SOURCE) > bound * (1 + 1e-9):
                ok = False
        if not ok:
            continue
        value, flows = _max_flow(2 * n + 2, cap, S, T)
        if value > best[0] + 1e-12:
            best = (value, assign, flows)
    solve_s = time.perf_counter() - start
    value, assign, flows = best
    if assign is None:
        return Placement(throughput=0.0, nodes=(), edges=(), status=SolveStatus.INFEASIBLE,
                         gap=0.0, solve_s=solve_s, method="reference")
    n = len(problem.nodes)
    nodes = []
    for i, node in enumerate(problem.nodes):
        a = assign[i]
        if a is None:
            nodes.append(NodePlacement(node.node_type, 0, 0, 0, 1, 0.0, 0.0, 0.0, 0.0))
            continue
        op = node.options[a[1]]
        nodes.append(NodePlacement(node.node_type, a[0], op.layers, op.batch, 1, op.capacity,
                                   op.step_s, op.prefill_s, op.mem_bytes))
    edges = []
    for (u, v), f in flows.items():
        if u == 2 * n:
            edges.append((SOURCE, v // 2, f))
        elif v == 2 * n + 1:
            edges.append((u // 2, SINK, f))
        elif u // 2 != v // 2:
            edges.append((u // 2, v // 2, f))
    return Placement(throughput=value, nodes=tuple(nodes), edges=tuple(edges),
                     status=SolveStatus.OPTIMAL, gap=0.0, solve_s=solve_s, method="reference")


class CountingSolver:
    """Wraps a solver and counts the combinations it is asked to solve (per process)."""

    def __init__(self, inner=reference_solve):
        self.inner = inner
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, problem: PlacementProblem, **kw) -> Placement:
        self.calls.append(tuple(sorted(n.node_type for n in problem.nodes)))
        return self.inner(problem, **kw)
