"""Homogeneous combinations (`k` nodes of one type) that a library drops but a plan can use.

A library drops a combination when its parts side by side reach its throughput
(`build.py`, the floor). The allocator plans each instance at its *planned* capacity
(`coral.allocator.headroom`: throughput times the utilisation at which TTFT holds), which pools
the queue inside one instance, so one instance over `k` identical nodes can plan above `k`
single-node instances: llama-3.1-8b on 2 x 1x-l40s plans 10.16 req/s against 2 x 4.98. These
completions put every such `k x g` (within `n_max`, `rho` and the memory floor) back, solved
without the floor. They are the set the Homo baseline is built from, so no baseline has a
column Coral lacks. Heterogeneous combinations dropped the same way stay dropped: there are
combinatorially many of them, and a lossless rule would judge the library on planned capacity
(which needs the traffic shape in the library's key).
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from coral.catalog.loader import Catalog
from coral.templates.build import Template
from coral.templates.enumerate import Combo, enumerate_combinations
from coral.templates.slo import SloSpec
from coral.templates.types import Mode


def min_kv_tokens(slo: SloSpec, mode: Mode) -> int:
    """Cache tokens one request needs on a node (a prefill half keeps no output tokens)."""
    return int(slo.input_tokens + (slo.output_tokens if mode != "prefill" else 0))


def homogeneous_combos(model: str, catalog: Catalog, slo: SloSpec, mode: Mode, *,
                       node_types: Iterable[str], n_max: int, rho: float,
                       memory_reserve: float) -> list[Combo]:
    """`k` copies of one node type, `k <= n_max`, that a library's enumeration would keep
    (the weights plus one request fit; total memory at most `rho` x the weights)."""
    out: set[Combo] = set()
    for g in node_types:
        enum = enumerate_combinations(
            model, catalog, nmax=n_max, rho=rho, node_types=[g],
            min_kv_tokens=min_kv_tokens(slo, mode), memory_reserve=memory_reserve,
            require_common_region=False,
        )
        out.update(enum.combos)
    return sorted(out, key=lambda c: (c[0], len(c)))


def homogeneous_completions(kept: Sequence[Template], combos: Iterable[Combo],
                            solve: Callable[[Combo], Template]) -> list[Template]:
    """The feasible templates of `combos` that `kept` lacks, each solved by `solve` (a
    placement over exactly those nodes, without a floor)."""
    have = {tuple(sorted(t.combo)) for t in kept}
    out = []
    for combo in combos:
        if tuple(sorted(combo)) in have:
            continue
        t = solve(combo)
        if t.feasible and t.throughput > 0:
            out.append(t)
    return out
