"""The simulator's model router: smooth weighted round robin (`coral.routing`) by planned
capacity, load-aware, over one model's instances."""

from __future__ import annotations

from operator import truediv

from coral.routing import swrr_picks
from coral.sim.scheduler import SimInstance

#: Smooth weighted round robin picks are drawn this many at a time.
SWRR_BLOCK = 512
#: An instance's waiting queue is "far longer" when at least this many requests wait and
#: more than LOAD_SKIP_FACTOR times (plus one) the shortest queue of the model.
MIN_SKIP_QUEUE = 4
LOAD_SKIP_FACTOR = 2.0


class SimRouter:
    """One model's instances: smooth (interleaved) weighted round robin by planned capacity,
    load-aware: a pick whose waiting queue is far longer than the model's shortest goes to
    the least loaded instance per unit weight instead.

    Both scans run in C (`map`): the shortest queue only once the pick's queue is long.
    """

    def __init__(self, insts: list[SimInstance]):
        self.insts = insts
        self.weights = [max(i.spec.weight, 1e-12) for i in insts]
        self.current = [0.0] * len(insts)
        self.picks: list[SimInstance] = []  # drawn and not yet used, the next last
        self.queues = [i.waiting for i in insts]
        # waiting + running requests per instance, kept by the instances (`slot` is their
        # index here), for the least-loaded pick
        self.inflight = [0] * len(insts)
        for k, i in enumerate(insts):
            i.router, i.slot, i.inflight = self, k, self.inflight

    def draw(self) -> list[SimInstance]:
        """The next block of round-robin picks, last first (taken with `pop()`)."""
        self.picks = [self.insts[k] for k in swrr_picks(self.weights, self.current,
                                                        SWRR_BLOCK)]
        self.picks.reverse()
        return self.picks

    def least_loaded(self) -> SimInstance:
        """The instance with the fewest (waiting + running) requests per unit weight, the
        first on ties (computed in C, as it is asked for on up to half of the arrivals)."""
        loads = list(map(truediv, self.inflight, self.weights))
        return self.insts[loads.index(min(loads))]

    def pick(self) -> SimInstance:
        """The instance the next request goes to."""
        picks = self.picks or self.draw()
        pick = picks.pop()
        q = len(pick.waiting)
        if q >= MIN_SKIP_QUEUE and q >= LOAD_SKIP_FACTOR * (min(map(len, self.queues)) + 1):
            pick = self.least_loaded()
        return pick
