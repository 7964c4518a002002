"""Smooth weighted round robin (nginx's), the one rotation every Coral router draws from.

Each pick adds every candidate's weight to its credit, takes the candidate with the most
credit (the first on ties) and takes the candidates' total weight off it. Over many picks each
candidate gets a share proportional to its weight, interleaved rather than in runs, with no
random draws, so tests know where each request goes.

Its users, and the skip rule each puts on top of the rotation:

- the simulator's model router (`coral.sim.routing`): picks over every instance; a pick whose
  waiting queue is far longer than the model's shortest goes to the least loaded instance per
  unit weight instead;
- the gateway's model router (`coral.runtime.model_router`): picks over the ready instances
  whose in-flight count is not far above the least loaded one's;
- a pipeline stage's data-parallel nodes (`coral.runtime.routing`): no skip, sticky per request.

This module sits below both the simulator and the runtime, so that they share it without
importing each other.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

#: Up to this many candidates a block of picks is drawn in Python, above it with numpy (the
#: same float operations in the same order, so the same picks).
SWRR_PYTHON_MAX = 12


def swrr_pick(weights: Sequence[float], credits: list[float],
              total: float | None = None) -> int:
    """One pick: the index of the chosen candidate; `credits` is updated in place. `total`
    is `sum(weights)` (given by callers that keep it)."""
    if total is None:
        total = sum(weights)
    best = 0
    for k in range(len(weights)):
        credits[k] += weights[k]
        if credits[k] > credits[best]:
            best = k
    credits[best] -= total
    return best


def swrr_picks(weights: Sequence[float], current: list[float], count: int) -> list[int]:
    """The next `count` picks over fixed weights; `current` (the credits) is updated in
    place. Many candidates draw through numpy, which performs the same float operations in
    the same order as `swrr_pick`, so both give the same picks."""
    total = sum(weights)
    if len(weights) <= SWRR_PYTHON_MAX:
        return [swrr_pick(weights, current, total) for _ in range(count)]
    out = [0] * count
    cur = np.array(current, dtype=np.float64)
    w = np.array(weights, dtype=np.float64)
    iadd, argmax, item, setitem = cur.__iadd__, cur.argmax, cur.item, cur.__setitem__
    for i in range(count):
        iadd(w)
        best = argmax()  # the first index of the maximum
        setitem(best, item(best) - total)
        out[i] = best
    current[:] = cur.tolist()
    return [int(k) for k in out]
