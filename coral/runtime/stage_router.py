"""Choosing among the data-parallel nodes of a stage, by weight, sticky per request."""

from __future__ import annotations

from typing import Sequence

from coral.routing import SwrrRouter


class StageNodeRouter:
    """Smooth weighted round robin (`coral.routing`) over nodes; a request keeps its node
    until released.

    Deterministic (no random draws), so tests know where each request goes; over many requests
    each node gets a share proportional to its weight. Sticky because the node holds the request's
    KV cache. No node is skipped: the step model splits a stage's sequences evenly over its
    nodes by weight, and this is what it models.
    """

    def __init__(self, weights: Sequence[float]):
        if not weights or any(w <= 0 for w in weights):
            raise ValueError(f"router weights {tuple(weights)} must be positive, at least one")
        self.weights = tuple(float(w) for w in weights)
        self._rr = SwrrRouter(self.weights, load_slack=None)
        self._assigned: dict[str, int] = {}

    def route(self, request_id: str) -> int:
        node = self._assigned.get(request_id)
        if node is None:
            node = self._assigned[request_id] = self._rr.pick()
        return node

    def release(self, request_id: str) -> int | None:
        return self._assigned.pop(request_id, None)

    @property
    def active(self) -> int:
        return len(self._assigned)
