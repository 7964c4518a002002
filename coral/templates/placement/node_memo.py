"""Per-node preprocessing, memoised across the combinations of a library.

`prepare` (placement_prep) filters and sorts the operating points of every node of a problem.
Without its path filter it treats each node on its own, and a library solves tens of
thousands of combinations built from a few dozen memoised `NodeSpec`s, so the one-node
results are kept here (keyed by the spec's identity and the problem's scalars) and
`prepare_unfiltered` puts them side by side.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from coral.templates.placement.prep import NodeOptions, Prepared, prepare
from coral.templates.types import NodeSpec, PlacementProblem


@dataclass
class NodeMemo:
    """What `prepare` (without the path filter) makes of one node on its own."""

    spec: NodeSpec  # held so that its id is not reused while the entry lives
    alone: Prepared  # `prepare` of the one-node problem
    group_key: tuple | None  # `NodeOptions.key` (None: the node cannot carry flow)


#: Largest number of per-node entries kept (one library build needs about 21 node types x
#: 6 combination sizes; an entry holds a few hundred kB at most).
_NODE_MEMO_SIZE = 1024
_NODE_MEMO: dict[tuple, NodeMemo] = {}


def node_memo(problem: PlacementProblem, spec: NodeSpec) -> NodeMemo:
    """The memo of `spec` in `problem` (keyed by identity: hashing a `NodeSpec` hashes every
    one of its operating points, which cost more than the preprocessing it would save)."""
    key = (id(spec), problem.num_layers, problem.tpot_s, problem.ttft_s,
           problem.first_stage_extra_bytes)
    hit = _NODE_MEMO.get(key)
    if hit is not None and hit.spec is spec:
        return hit
    alone = prepare(dataclasses.replace(problem, nodes=(spec,)), path_filter=False)
    u = alone.usable[0] if alone.usable else None
    hit = NodeMemo(spec, alone, None if u is None else u.key(spec))
    if len(_NODE_MEMO) >= _NODE_MEMO_SIZE:
        _NODE_MEMO.clear()
    _NODE_MEMO[key] = hit
    return hit


def prepare_unfiltered(problem: PlacementProblem) -> Prepared:
    """`prepare(problem, path_filter=False)`, from per-node results memoised across problems.

    Without the path filter `prepare` treats every node on its own, so its result is the
    one-node results side by side (identical nodes share their arrays, which nothing
    downstream modifies).
    """
    usable: list[NodeOptions | None] = []
    idle: dict[int, tuple[int, int]] = {}
    stats = {"options": 0, "fit": 0, "slo_ok": 0, "undominated": 0, "kept": 0}
    groups: dict[tuple, list[int]] = {}
    for i, spec in enumerate(problem.nodes):
        memo = node_memo(problem, spec)
        for name in ("options", "fit", "slo_ok", "undominated"):
            stats[name] += memo.alone.stats[name]
        if memo.alone.infeasible:
            return Prepared(problem, f"node {i} ({spec.node_type}) fits no operating point",
                            [], {}, [], stats=stats)
        idle[i] = memo.alone.idle[0]
        u = memo.alone.usable[0]
        if u is None:
            usable.append(None)
            continue
        usable.append(NodeOptions(i, u.opt, u.k, u.last, u.cap, u.step, u.pre, u.starts))
        groups.setdefault(memo.group_key, []).append(i)
    stats["kept"] = sum(len(u) for u in usable if u is not None)
    return Prepared(problem, None, usable, idle, list(groups.values()), stats=stats)
