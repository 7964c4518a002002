"""The simulator's model router: the runtime's router (`coral.routing.SwrrRouter`, its skip
rules included) over one model's simulated instances, weighted by planned capacity, each
instance's slots what it serves at once (`coral.routing.serving_slots`)."""

from __future__ import annotations

from typing import Sequence

from coral.routing import LOAD_SLACK, SwrrRouter, serving_slots
from coral.sim.scheduler import SimInstance

#: Smooth weighted round robin picks are drawn up to this many at a time while no instance
#: is skipped (the same picks as one at a time, see `SwrrRouter`).
SWRR_BLOCK = 512


def instance_slots(inst: SimInstance) -> int:
    """Requests `inst` serves at once: its batch (`max_seqs`: sequences, or a prefill
    instance's prompt tokens per round) read by its role, a prefill instance's prompts at
    its SLO's prompt length."""
    spec = inst.spec
    slo = spec.slo
    return serving_slots(spec.role, inst.max_seqs, slo.input_tokens if slo is not None else None)


class SimModelRouter:
    """One model's instances, routed as the gateway routes them (`coral.routing`).

    The instances' (waiting + running) counts are the router's `inflight` list, which the
    instances hold too (`slot` is their index in it) and keep as requests arrive and end.
    """

    def __init__(self, insts: list[SimInstance], load_slack: float | None = LOAD_SLACK):
        self.insts = insts
        self._rr = SwrrRouter([max(i.spec.weight, 1e-12) for i in insts],
                              load_slack=load_slack, block=SWRR_BLOCK,
                              slots=[instance_slots(i) for i in insts])
        self.inflight = self._rr.in_flight
        self.backlog = self._rr.backlog  # `coral.sim.pd`'s prefill instances keep it
        self._pick = self._rr.pick
        for k, i in enumerate(insts):
            i.router, i.slot, i.inflight = self, k, self.inflight

    @property
    def weights(self) -> list[float]:
        return list(self._rr.weights)

    @weights.setter
    def weights(self, weights: Sequence[float]) -> None:
        self._rr.set_weights(weights)

    def set_routable(self, inst: SimInstance, routable: bool) -> None:
        """Whether `inst` takes new requests (False while it drains after a preemption
        notice, and once it is gone); its requests in flight stay its own."""
        self._rr.set_routable(inst.slot, routable)

    def pick(self) -> SimInstance | None:
        """The instance the next request goes to (None: no instance of the model is
        routable)."""
        k = self._pick()
        return None if k is None else self.insts[k]
