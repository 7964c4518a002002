"""What a simulation returns: one result per request, busy time per node, and the run's
totals; and how they are built from the scheduler's sequences (or from the records forked
workers send back) once, at the end of a run."""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Iterable, Literal, NamedTuple

from coral.sim.deployment import InstanceSpec
from coral.sim.scheduler import Seq
from coral.sim.workload import Request


class RequestResult(NamedTuple):
    """What happened to one request (times in simulated seconds).

    Immutable like a frozen dataclass, but a named tuple: one is built per request, and a
    frozen dataclass's `__init__` (one `object.__setattr__` per field) cost a tenth of a
    run."""

    id: int
    model: str
    instance: str  # "" when never routed (no instance of its model); PD: the prefill instance
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    status: Literal["done", "unfinished", "rejected", "failed"]  # failed: lost to a preemption
    first_token_s: float | None
    end_s: float | None
    preemptions: int

    # Not fields (plain class attributes): what a request that never reached a decode
    # instance reports; `PdRequestResult` carries a disaggregated request's own values.
    decode_instance = ""
    transfer_s = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (0 for one-token outputs)."""
        if self.end_s is None or self.first_token_s is None:
            return None
        if self.output_tokens <= 1:
            return 0.0
        return (self.end_s - self.first_token_s) / (self.output_tokens - 1)


class PdRequestResult(RequestResult):
    """A request served disaggregated: `instance` ran its prompt (and emitted its first
    token), `decode_instance` generated the rest after a KV transfer of `transfer_s` seconds.

    The two values follow the ten of a `RequestResult` in the tuple, so every other field,
    property and comparison reads as for an aggregated request."""

    __slots__ = ()
    _fields = RequestResult._fields + ("decode_instance", "transfer_s")
    decode_instance = property(itemgetter(10), doc="Decode instance it was handed to.")
    transfer_s = property(itemgetter(11), doc="KV transfer seconds, prefill to decode.")

    def __new__(cls, *values: object) -> "PdRequestResult":
        if len(values) != len(cls._fields):
            raise TypeError(f"PdRequestResult takes {len(cls._fields)} values, "
                            f"got {len(values)}")
        return tuple.__new__(cls, values)

    @classmethod
    def _make(cls, iterable: Iterable[object]) -> "PdRequestResult":
        return cls(*iterable)

    def _replace(self, **changes: object) -> "PdRequestResult":
        values = [changes.pop(f, v) for f, v in zip(self._fields, self)]
        if changes:
            raise ValueError(f"got unexpected field names: {list(changes)!r}")
        return self._make(values)

    def __getnewargs__(self) -> tuple:
        return tuple(self)

    def __repr__(self) -> str:
        return "PdRequestResult(" + ", ".join(
            f"{f}={v!r}" for f, v in zip(self._fields, self)) + ")"


@dataclass
class NodeUsage:
    """Busy time of one node of one instance."""

    instance: str
    stage: int
    node_type: str
    busy_s: float = 0.0
    role: str = "aggregated"  # of its instance (InstanceSpec.role)


@dataclass
class SimResult:
    requests: list[RequestResult]
    nodes: list[NodeUsage]
    instances: list[InstanceSpec]
    end_s: float  # simulated time of the last event
    events: int  # events handled: arrivals, step ends (stale ones included), KV landings
    steps: int  # scheduler steps simulated (a closed-form run counts each step)


def record(s: Seq | None) -> tuple | None:
    """What a request's result takes from its seq: (instance, status, first token, end,
    preemptions), plus (decode instance, transfer seconds) once its KV cache was sent to a
    decode instance; None when it never arrived."""
    if s is None:
        return None
    if s.transfer_s is not None:
        return (s.instance, s.status, s.first_token_s, s.end_s, s.preemptions,
                s.decode_instance, s.transfer_s)
    return (s.instance, s.status, s.first_token_s, s.end_s, s.preemptions)


def request_results(reqs: list[Request], seqs: list[Seq | None]) -> list[RequestResult]:
    """One RequestResult per request, from its seq (None: the horizon came before it did, so
    it is unfinished and was never routed)."""
    new, cls = tuple.__new__, RequestResult  # RequestResult._make, less a call per request
    return [new(cls, (r.id, r.model, "", r.arrival_s, r.prompt_tokens, r.output_tokens,
                      "unfinished", None, None, 0)) if s is None else
            new(cls, (r.id, r.model, s.instance, r.arrival_s, r.prompt_tokens,
                      r.output_tokens, s.status, s.first_token_s, s.end_s, s.preemptions))
            if s.transfer_s is None else
            new(PdRequestResult, (r.id, r.model, s.instance, r.arrival_s, r.prompt_tokens,
                                  r.output_tokens, s.status, s.first_token_s, s.end_s,
                                  s.preemptions, s.decode_instance, s.transfer_s))
            for r, s in zip(reqs, seqs)]


def request_results_from_records(reqs: list[Request], records: list[tuple | None]
                                  ) -> list[RequestResult]:
    """`request_results` from `record`s (what forked workers send back)."""
    new, cls = tuple.__new__, RequestResult
    return [new(cls, (r.id, r.model, "", r.arrival_s, r.prompt_tokens, r.output_tokens,
                      "unfinished", None, None, 0)) if rec is None else
            new(cls if len(rec) == 5 else PdRequestResult,
                (r.id, r.model, rec[0], r.arrival_s, r.prompt_tokens, r.output_tokens,
                 *rec[1:]))
            for r, rec in zip(reqs, records)]
