"""Smooth weighted round robin (nginx's) and the one model router built on it.

Each pick adds every candidate's weight to its credit, takes the candidate with the most
credit (the first on ties) and takes the candidates' total weight off it. Over many picks each
candidate gets a share proportional to its weight, interleaved rather than in runs, with no
random draws, so tests know where each request goes.

`SwrrRouter` is that rotation over one model's instances with the skip rules the runtime
needs, and the simulator routes through the same class so that it models the runtime's
router. A request skips an instance that is

1. not routable: its owner marked it so (`set_routable`): not ready yet, draining (a
   reconfiguration or a preemption notice), stopped or dead. It keeps its credit and its
   in-flight count, and takes requests again once marked routable;
2. excluded for this request by the caller (the runtime's instances that already failed it);
3. overloaded: more requests queued (in flight beyond its `slots`, the requests it serves
   at once, `serving_slots`, plus its `backlog`: requests it passed on that wait further
   down, which the simulator's prefill instances count while their decode instance has no
   slot for them, `coral.sim.pd`) than the least queued candidate's queue per unit weight gives
   it, by more than `load_slack` requests and by more than that fair count itself (twice
   its fair share).
   Counting the queue rather than everything in flight matters on heterogeneous instances:
   an instance holds about its rate times its latency in flight, and a deep pipeline's
   latency is several times a one-node instance's at the same rate, so an in-flight rule
   would push the deep pipeline's share onto the fast instances. The gateway cannot see a
   worker's queue, but it knows the plan's batch slots and its own in-flight counts, and the
   simulator counts the same, so both skip the same instances.

What an instance serves at once depends on its kind (`serving_slots`): an aggregated or a
decode instance runs its batch of sequences, and a request arriving while it has a free slot
joins its next step. A prefill instance's batch counts prompt tokens per round (one step of
chunked prefill through its stages, many times a decode step), and a prompt arriving during
a round waits for the next: at its planned rate it holds the round in
progress and the one forming, twice its token batch over the prompt length in prompts; a
queue beyond both means it falls behind. Counting its tokens as sequences would put its
slots in the thousands, so its queue would never show, and a prefill instance slower than
planned would keep its planned share while its prompts wait (with one GPU type slower than
modelled, TTFT grew without bound there while the model's other instances had room);
counting only the round in progress would read each round forming as a queue and move
requests about at the planned load.

Skipped instances take no credit on that pick; the pick is the rotation over the rest. There
is no "full" rule: an instance queues what it cannot batch, and the overload rule moves new
requests away from a queue that grows. With equal weights rule 3 reads "queued more than
`load_slack` above, and more than twice, the least queued instance's"; an instance with no
known slots (0) counts everything in flight as queued.

Users: the simulator's model router (`coral.sim.model_router.SimModelRouter`), the gateway's
model router (`coral.runtime.model_router.GatewayModelRouter`) and the router over a pipeline
stage's data-parallel nodes (`coral.runtime.stage_router.StageNodeRouter`: no overload rule,
sticky per request). This module sits below both the simulator and the runtime, so that they
share it without importing each other.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import add, lt, sub, truediv
from typing import Collection, Sequence

import numpy as np

#: Up to this many candidates a block of picks is drawn in Python, above it with numpy (the
#: same float operations in the same order, so the same picks).
SWRR_PYTHON_MAX = 12
#: Requests an instance may hold above its fair count before rule 3 can skip it.
LOAD_SLACK = 4
#: Rounds of prompts a prefill instance holds at its planned rate: the one in progress and
#: the one forming (`serving_slots`).
PREFILL_ROUNDS = 2


def serving_slots(role: str, batch: int, prompt_tokens: int | None = None) -> int:
    """Requests an instance of `role` serves at once, the router's `slots` for it: `batch`
    (stages x the smallest stage's batch) for an `aggregated` or `decode` instance, whose
    batch counts sequences; for a `prefill` instance, whose batch counts prompt tokens per
    round, the prompts of `prompt_tokens` that fill a round (at least one) in the round in
    progress and the one forming (see the module docstring); 0, all in flight counted as
    queued, when the prompt length is not known. Both the simulator and the gateway take an
    instance's slots from here."""
    if batch < 0:
        raise ValueError(f"batch {batch} must be >= 0")
    if role != "prefill":
        return batch
    if not prompt_tokens or prompt_tokens <= 0:
        return 0
    return PREFILL_ROUNDS * max(1, batch // int(prompt_tokens))


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


def overloaded(queued: Sequence[int], weights: Sequence[float], candidates: Sequence[int],
               load_slack: float) -> list[int]:
    """The candidates rule 3 skips (see the module docstring), in `candidates`' order:
    `k` with `queued[k] > fair + max(load_slack, fair)`, where `queued` is each instance's
    in-flight count beyond its slots (never negative).

    The least queued candidate `j` is the first with the fewest queued requests per unit
    weight; `k`'s fair count is `queued[j] * (weights[k] / weights[j])` (exact for equal
    weights). Written out; `SwrrRouter` computes the same in C-level scans."""
    if not candidates or max(queued[k] for k in candidates) <= load_slack:
        return []
    j = min(candidates, key=lambda k: queued[k] / weights[k])
    least, w_least = queued[j], weights[j]
    out = []
    for k in candidates:
        fair = least * (weights[k] / w_least)
        if queued[k] > fair + max(load_slack, fair):
            out.append(k)
    return out


class SwrrRouter:
    """Smooth weighted round robin over one model's instances (indices `0..n-1`) with the
    skip rules of the module docstring.

    The owner keeps `in_flight` (one count per instance, mutated in place, never replaced:
    the simulator's instances hold the list itself) and marks instances with `set_routable`.
    `block` > 1 draws that many picks ahead while no rule skips anyone (the simulator's speed);
    a skip or a change replays the picks used to recover the exact credits, so every block
    size gives the same picks as `block=1` (`tests/test_routing.py`).
    """

    def __init__(self, weights: Sequence[float], *, load_slack: float | None = LOAD_SLACK,
                 block: int = 1, credits: Sequence[float] | None = None,
                 slots: Sequence[int] | None = None):
        if not weights or any(not w > 0 for w in weights):
            raise ValueError(f"router weights {tuple(weights)} must be positive, at least one")
        if block < 1:
            raise ValueError(f"router block {block} must be at least 1")
        if load_slack is not None and not load_slack >= 0:
            raise ValueError(f"router load_slack {load_slack} must be >= 0")
        self.weights = [float(w) for w in weights]
        self.load_slack = load_slack  # None: no overload rule
        self.block = block
        self.in_flight = [0] * len(self.weights)
        # requests each instance serves at once (`serving_slots`; 0: not known); in flight
        # beyond them queue
        self.slots = [0] * len(self.weights) if slots is None else [int(n) for n in slots]
        if len(self.slots) != len(self.weights) or any(n < 0 for n in self.slots):
            raise ValueError(f"router slots {tuple(self.slots)} must be >= 0, one per "
                             f"instance ({len(self.weights)})")
        # requests each instance passed on that wait further down (kept by the owner like
        # `in_flight`, mutated in place): queued wherever its own in-flight count stands
        self.backlog = [0] * len(self.weights)
        self._credits = [0.0] * len(self.weights) if credits is None else list(credits)
        if len(self._credits) != len(self.weights):
            raise ValueError("router credits and weights differ in length")
        self._routable = [True] * len(self.weights)
        self._next_block = 1
        self._start: list[float] | None = None  # active credits before the drawn block
        self._end: list[float] = []  # ... and after all of it
        self._drawn: list[int] = []  # positions in `_active` not yet used, the next last
        self._used = 0
        self._size = 0
        self._refresh()

    def __len__(self) -> int:
        return len(self.weights)

    # ---- state ----
    def _refresh(self) -> None:
        self._active = [k for k, r in enumerate(self._routable) if r]
        self._active_weights = [self.weights[k] for k in self._active]

    def _settle(self) -> None:
        """Write the exact credits after the picks used from the drawn block, drop the rest."""
        if self._start is None:
            return
        if self._used == self._size:
            cur = self._end
            self._next_block = min(self.block, 2 * self._size)
        else:
            cur = self._start
            swrr_picks(self._active_weights, cur, self._used)
            self._next_block = min(self.block, max(1, 2 * self._used))
        for k, c in zip(self._active, cur):
            self._credits[k] = c
        self._start, self._end, self._drawn, self._used, self._size = None, [], [], 0, 0

    def credits(self) -> list[float]:
        """Each instance's credit now."""
        self._settle()
        return list(self._credits)

    def routable(self, k: int) -> bool:
        return self._routable[k]

    def set_routable(self, k: int, routable: bool) -> None:
        """Mark instance `k` routable or not (rule 1): not ready, draining, stopped or dead
        instances take no new request; their in-flight ones are theirs to finish."""
        if self._routable[k] != routable:
            self._settle()
            self._routable[k] = routable
            self._refresh()

    def set_weights(self, weights: Sequence[float]) -> None:
        """New capacity weights (same instances); credits carry over."""
        if len(weights) != len(self.weights) or any(not w > 0 for w in weights):
            raise ValueError(f"router weights {tuple(weights)} must be positive, one per "
                             f"instance ({len(self.weights)})")
        self._settle()
        self.weights = [float(w) for w in weights]
        self._refresh()

    # ---- choice ----
    def pick(self, exclude: Collection[int] = ()) -> int | None:
        """The instance the next request goes to (None: every instance is skipped by rules 1
        and 2). The caller counts the request in `in_flight`."""
        active = self._active
        cand = [k for k in active if k not in exclude] if exclude else active
        if not cand:
            return None
        if self.load_slack is None:
            over: list[int] = []
        elif cand is active and len(active) == len(self.weights):
            over = self._overloaded_all()
        else:
            over = overloaded(self.queued(), self.weights, cand, self.load_slack)
        if not over and cand is active:
            drawn = self._drawn or self._draw()
            self._used += 1
            return active[drawn.pop()]
        self._settle()
        eligible = [k for k in cand if k not in over] if over else cand
        weights = [self.weights[k] for k in eligible]
        credits = [self._credits[k] for k in eligible]
        chosen = swrr_pick(weights, credits)
        for k, c in zip(eligible, credits):
            self._credits[k] = c
        return eligible[chosen]

    def queued(self) -> list[int]:
        """Each instance's requests in flight beyond its slots (never negative), plus its
        backlog."""
        own = [q if q > 0 else 0 for q in map(sub, self.in_flight, self.slots)]
        return list(map(add, own, self.backlog)) if any(self.backlog) else own

    def _overloaded_all(self) -> list[int]:
        """`overloaded` over every instance, its scans in C (the simulator asks on every
        arrival): with an instance queueing nothing the fair counts are 0, so the instances
        queueing over the slack; otherwise the exact test runs only on those queueing near
        twice the least."""
        slack = self.load_slack
        queued = (self.queued() if any(self.backlog)
                  else list(map(sub, self.in_flight, self.slots)))
        if max(queued) <= slack:
            return []
        if min(queued) <= 0:  # an instance queues nothing: every fair count is 0
            return list(compress(range(len(queued)), map(lt, repeat(slack), queued)))
        loads = list(map(truediv, queued, self.weights))
        least_load = min(loads)
        j = loads.index(least_load)
        least = queued[j]
        near = least_load * (2.0 - 1e-9)  # rule 3 needs more than twice; a rounding margin
        if max(loads) <= near:
            return []
        weights, w_least = self.weights, self.weights[j]
        out = []
        for k in compress(range(len(loads)), map(lt, repeat(near), loads)):
            fair = least * (weights[k] / w_least)
            if queued[k] > fair + max(slack, fair):
                out.append(k)
        return out

    def _draw(self) -> list[int]:
        """The next block of picks over every routable instance."""
        self._settle()
        start = [self._credits[k] for k in self._active]
        end = list(start)
        size = self._next_block
        drawn = swrr_picks(self._active_weights, end, size)
        drawn.reverse()
        self._start, self._end, self._drawn, self._used, self._size = start, end, drawn, 0, size
        return drawn
