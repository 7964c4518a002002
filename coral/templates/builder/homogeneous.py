"""Homogeneous combinations (`k` nodes of one type) that a library drops but a plan can use.

A library drops a combination when its parts side by side reach its throughput
(`build.py`, the floor). The allocator plans each instance at its *planned* capacity
(`coral.allocator.scenario.headroom`: throughput times the utilisation at which TTFT holds),
which pools the queue inside one instance, so one instance over `k` identical nodes can plan
above `k` single-node instances: llama-3.1-8b on 2 x 1x-l40s plans 10.16 req/s against 2 x 4.98.
These completions put every such `k x g` (within `n_max`, `rho` and the memory floor) back, each
solved as one pipeline over all `k` nodes (floor 0): a template is one instance, and the best
split into smaller replicas is already the library's smaller templates side by side. They are
the set the Homo baseline is built from, so no baseline has a column Coral lacks. Heterogeneous
combinations dropped the same way stay dropped: there are combinatorially many of them, and a
lossless rule would judge the library on planned capacity (which needs the traffic shape in the
library's key).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

from coral.catalog.loader import Catalog
from coral.templates.template import Template
from coral.templates.space.enumerate import Combo, enumerate_combinations
from coral.templates.slo import SloSpec
from coral.templates.types import Mode

log = logging.getLogger(__name__)

#: The completions of a library, stored beside it (`cached_completions`).
COMPLETIONS_FILE = "homogeneous.json"
#: 2: every completion is one pipeline over all its nodes (format 1 could hold replicas).
COMPLETIONS_FORMAT = 2


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
    """The feasible templates of `combos` that `kept` lacks, each solved by `solve` (one
    pipeline over exactly those nodes); a solver that answers with
    several pipelines side by side gives no completion (its parts are the library's)."""
    have = {tuple(sorted(t.combo)) for t in kept}
    out = []
    for combo in combos:
        if tuple(sorted(combo)) in have:
            continue
        t = solve(combo)
        if t.feasible and t.throughput > 0 and t.is_pipeline:
            out.append(t)
    return out


def cached_completions(library_dir: str | Path | None, library_digest: str,
                       kept: Sequence[Template], combos: Sequence[Combo],
                       solve: Callable[[Combo], Template]) -> list[Template]:
    """`homogeneous_completions`, stored in `library_dir/homogeneous.json` and read back on
    the next call whose library digest and combinations are the same (they are solved from
    the library's own inputs, so the digest keys them). A missing, unreadable or stale file is
    solved afresh and rewritten; with `library_dir` None nothing is stored."""
    key = {"format": COMPLETIONS_FORMAT, "library_digest": library_digest,
           "combos": sorted(list(c) for c in combos)}
    path = None if library_dir is None else Path(library_dir) / COMPLETIONS_FILE
    if path is not None and path.exists():
        try:
            doc = json.loads(path.read_text())
            if doc.get("key") == key:
                return [Template.from_dict(d) for d in doc["templates"]]
            log.info("%s: written for other inputs; solving the completions again", path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: unreadable (%s); solving the completions again", path, exc)
    out = homogeneous_completions(kept, combos, solve)
    if path is not None and path.parent.is_dir():
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"key": key, "templates": [t.to_dict() for t in out]}))
        os.replace(tmp, path)
    return out
