"""A plan under perturbed GPU speeds: the perf model with some GPU types slower than modelled.

`coral simulate PLAN --slowdown l4=1.3,t4=1.3` runs the plan as it is (same instances, layer
splits and batches) while every iteration on an L4 or T4 node takes 1.3x what the perf model
says. The factor multiplies the whole iteration (compute, memory and the per-iteration
overhead) of a node of that GPU type: the error of a GPU type's model is the question, and
the NIC between nodes is not part of it. KV-cache room is unchanged (memory sizes are known).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from coral.errors import CoralError


class SlowdownError(CoralError, ValueError):
    """A --slowdown specification that cannot be applied (the message says why)."""


def parse_slowdown(text: str, gpu_names: Mapping[str, Any] | list[str]) -> dict[str, float]:
    """'l4=1.3,t4=1.3' -> {'l4': 1.3, 't4': 1.3}; names must be catalog GPU types."""
    known = sorted(gpu_names)
    factors: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name or not value.strip():
            raise SlowdownError(f"--slowdown: {part!r} is not GPU=FACTOR (e.g. l4=1.3)")
        if name not in known:
            raise SlowdownError(f"--slowdown: unknown GPU type {name!r}; known: "
                                f"{', '.join(known)}")
        if name in factors:
            raise SlowdownError(f"--slowdown: {name!r} is given twice")
        try:
            factor = float(value)
        except ValueError:
            raise SlowdownError(f"--slowdown: factor of {name!r} must be a number, got "
                                f"{value.strip()!r}") from None
        if not math.isfinite(factor) or factor <= 0:
            raise SlowdownError(f"--slowdown: factor of {name!r} must be a finite number > 0 "
                                f"(1.3 = 30 % slower), got {value.strip()}")
        factors[name] = factor
    if not factors:
        raise SlowdownError("--slowdown: give at least one GPU=FACTOR (e.g. l4=1.3)")
    return factors


class SlowedPerf:
    """`perf` with every iteration on a node of a GPU type in `factors` that many times longer.

    Everything else (memory, KV room, breakdowns' sources) is the wrapped model's."""

    def __init__(self, perf: Any, catalog: Any, factors: Mapping[str, float]):
        self._perf = perf
        self._catalog = catalog
        self.factors = dict(factors)
        self._by_node: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._perf, name)

    def factor(self, node: Any) -> float:
        """The slowdown of a node type (a name or a NodeType)."""
        key = node if isinstance(node, str) else node.name
        f = self._by_node.get(key)
        if f is None:
            f = self.factors.get(self._catalog.gpu_of(node).name, 1.0)
            self._by_node[key] = f
        return f

    def iteration_seconds(self, model: Any, node: Any, layers: int, prefill_tokens: int = 0,
                          decode_batch: int = 0, context_tokens: int = 0, *,
                          first_stage: bool = False, last_stage: bool = False) -> float:
        t = self._perf.iteration_seconds(model, node, layers, prefill_tokens, decode_batch,
                                         context_tokens, first_stage=first_stage,
                                         last_stage=last_stage)
        return t * self.factor(node)
