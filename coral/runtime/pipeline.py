"""Executors: run one engine step's work items through every stage of a pipeline.

`LocalPipeline` holds all stages in this process (tests, reference); `coral.runtime.worker`'s
`ZmqPipeline` runs one worker process per node. Both take a `PipelineSpec`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol, Sequence

from coral.runtime.config import PipelineSpec
from coral.runtime.messages import TokenResult, WorkItem
from coral.runtime.model import Stage
from coral.runtime.stage_router import StageNodeRouter


class Executor(Protocol):
    def execute(self, items: Sequence[WorkItem]) -> list[TokenResult]:
        """Run the items through the whole pipeline; one token per non-release item."""

    def close(self) -> None: ...


def group_by_node(items: Sequence[WorkItem], router: StageNodeRouter) -> dict[int, list[WorkItem]]:
    """Split items among a stage's nodes; a release item frees its route after being routed."""
    groups: dict[int, list[WorkItem]] = defaultdict(list)
    for item in items:
        groups[router.route(item.request_id)].append(item)
        if item.release:
            router.release(item.request_id)
    return groups


def micro_batches(items: Sequence[WorkItem], stages: int) -> list[list[WorkItem]]:
    """A step's items as `m = min(stages, requests)` micro-batches that follow each other
    through the stages, so that stage s works on one while stage s + 1 works on the one
    before (the step model's pipeline, `coral.perf.step`). A request's item stays whole;
    items go, largest first, to the micro-batch with the fewest tokens so far, so the
    micro-batches are near equal; release items ride with the first."""
    work = [i for i in items if not i.release]
    m = max(1, min(stages, len(work)))
    groups: list[list[WorkItem]] = [[] for _ in range(m)]
    tokens = [0] * m
    for item in sorted(work, key=lambda i: -len(i.token_ids)):
        k = tokens.index(min(tokens))
        groups[k].append(item)
        tokens[k] += len(item.token_ids)
    groups[0].extend(i for i in items if i.release)
    return [g for g in groups if g]


class LocalPipeline:
    """Every node of every stage in this process; one router per stage."""

    def __init__(self, spec: PipelineSpec, device: str = "cpu"):
        self.spec = spec
        self.nodes = [[Stage(spec.model, s.first_layer, s.end_layer, device)
                       for _ in s.node_weights]
                      for s in spec.stages]
        self.routers = [StageNodeRouter(s.node_weights) for s in spec.stages]

    def execute(self, items: Sequence[WorkItem]) -> list[TokenResult]:
        current: list = list(items)
        for nodes, router in zip(self.nodes, self.routers):
            nxt: list = []
            for node, group in group_by_node(current, router).items():
                nxt.extend(nodes[node].forward(group))
            current = nxt
        return current

    def close(self) -> None:
        pass
