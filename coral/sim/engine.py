"""Discrete-event simulator of a deployment: routed requests, continuous batching, pipelines.

Events and their order
    Events are taken by the key `(time_s, priority, seq)`: earlier time first; at equal times
    a finished instance step (`STEP_DONE`, 0) before an arrival (`ARRIVAL`, 1), so a request
    arriving just as a step ends waits for the next step in both modes; `seq` (push order)
    breaks the remaining ties, so a run is deterministic. Step ends sit on a heap (of times;
    the instances ending at a time are kept in push order beside it); arrivals are read in
    order from the sorted request list and taken when they come strictly before the heap's
    first step end.

An instance (`InstanceSpec`) runs vLLM-style continuous batching:
    each scheduler step every running sequence whose prompt is in the KV cache decodes one
    token; the rest of `max_batched_tokens` goes to prompt chunks (running partial prefills
    first, then waiting requests FCFS while fewer than `max_seqs` run and the whole prompt fits
    in the free KV cache). When the cache cannot take this step's decode tokens, the most
    recently admitted sequence is preempted and later recomputed (prompt + tokens so far as a
    new prompt). A step's cost is the pipeline step model of `coral.perf.step` (the step's
    sequences as `min(stages, sequences)` micro-batches through the stages, the bottleneck
    stage, activation sends over the NIC), the same model the planner sizes templates by;
    `max_seqs = stages x the smallest stage batch` (the template's batch per micro-batch).

Closed form ("fast" mode)
    A pure-decode step whose batch cannot change (no prompt chunk, no admissible waiting
    request) repeats identically until a sequence finishes, the cache fills, or the batch's
    context crosses the next context bucket (contexts are rounded up to `1/context_buckets`
    of their power of two, in both modes, so that iteration times are piecewise constant and
    cacheable). Those steps are one event; an arrival routed to the instance meanwhile cuts
    the run short at the end of the step in progress. "naive" mode pushes one event per step
    and gives the same results (up to float rounding), only slower. Decoding sequences keep
    their context and token count relative to an instance decode clock, filed by the clock
    of their last token, so a step costs O(1) in the batch size plus its prompt chunks and
    finishers.

Speed
    Near its planned capacity a deployment changes some instance's batch at almost every
    step, so the closed form saves little there and the cost is per event (about three per
    request: its arrival, its admission step, and the end of a decode run). The loop is
    therefore written for CPython: the per-event work is inlined in `Simulator._run` and
    `_Instance.schedule`; step costs are memoised per (prompt tokens, decodes, context
    bucket, micro-batches) and shared by the copies of a template; the step-end heap holds
    bare floats; the router draws its round-robin picks in blocks and keeps per-instance
    load counts; results are built once at the end; the cyclic garbage collector is paused
    during the run. Models share no instance and no request, so `SimConfig.workers` splits
    them over forked processes. None of this changes a result: `tests/test_sim_speed.py`
    checks the engine against the straightforward form of the same model, bit for bit.

Prefill/decode disaggregation
    Instances with role `prefill` or `decode` (`InstanceSpec.role`) serve a model in two
    halves: a request runs its prompt on a prefill instance, which emits the first token, and
    its KV cache then travels to a decode instance of the same region that generates the rest.
    The model, its latency accounting and how it maps onto the planner's SLO split are in
    `coral.sim.pd`; here the loop only hands a finished prompt to its prefill instance's
    `handoff` and lands transfers (`pd.Landing`, on the step-end heap, so a landing at the
    time of a step end is taken in push order) when they end.
    Aggregated instances take none of these paths.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import pickle
import signal
from bisect import insort
from collections import Counter, deque
from dataclasses import dataclass
from operator import itemgetter, truediv
from typing import Any, Callable, Iterable, Literal, Mapping, NamedTuple, Sequence

import numpy as np

from coral.perf.step import (
    DEFAULT_MAX_BATCHED_TOKENS,
    NET_LATENCY_S,
    StepModel,
    StepModelError,
    build_step_model,
)
from coral.sim.deployment import DeploymentError, InstanceSpec
from coral.sim.workload import Request, gc_paused

log = logging.getLogger(__name__)

#: Event priorities at equal times (smaller first).
STEP_DONE = 0
ARRIVAL = 1

#: Contexts are rounded up to 1/CONTEXT_BUCKETS of their power of two (about 3 % at 32).
DEFAULT_CONTEXT_BUCKETS = 32
#: Router: an instance's waiting queue is "far longer" when at least this many requests wait
#: and more than LOAD_SKIP_FACTOR times (plus one) the shortest queue of the model.
MIN_SKIP_QUEUE = 4
LOAD_SKIP_FACTOR = 2.0


@dataclass(frozen=True)
class SimConfig:
    """Simulator settings (all have defaults)."""

    mode: Literal["fast", "naive"] = "fast"
    """fast: identical decode steps as one event; naive: one event per step (for checking)."""
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    """Tokens one scheduler step may process (decode tokens + prompt chunks). Prefill
    instances (PD) take their template's prompt-token chunk per step instead."""
    context_buckets: int = DEFAULT_CONTEXT_BUCKETS
    """Context rounding: up to 1/N of its power of two; 0 keeps exact contexts (no jumps)."""
    horizon_s: float | None = None
    """Stop at this simulated time; requests still in flight are reported unfinished."""
    net_latency_s: float | None = None
    """Per-hop activation latency, s (None: the planner's NET_LATENCY_S)."""
    workers: int = 1
    """Processes to simulate in. Models share no instance and no request, so each extra
    worker (a forked process; where the OS cannot fork, 1 is used) simulates a share of the
    models. The results do not depend on it."""

    def __post_init__(self) -> None:
        if self.mode not in ("fast", "naive"):
            raise ValueError(f"mode must be 'fast' or 'naive', got {self.mode!r}")
        if self.max_batched_tokens < 1:
            raise ValueError(f"max_batched_tokens must be >= 1, got {self.max_batched_tokens}")
        if self.context_buckets < 0:
            raise ValueError(f"context_buckets must be >= 0, got {self.context_buckets}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")


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
    status: Literal["done", "unfinished", "rejected"]
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


class _Seq:
    """A request inside an instance.

    While decoding, `ctx` and `generated` hold their values at instance decode clock `off`;
    both grow by one per decode step, so their current values are `x + clock - off` (this
    keeps a decode step O(1) instead of O(batch))."""

    __slots__ = ("req", "instance", "target", "ctx", "generated", "first_token_s",
                 "preemptions", "off", "fin", "status", "end_s", "decode_instance",
                 "transfer_s")

    def __init__(self, req: Request, instance: str):
        self.req = req
        self.instance = instance  # the name of the instance it was routed to
        self.target = req.prompt_tokens  # tokens to have in cache before the next token
        self.ctx = 0  # tokens in the KV cache
        self.generated = 0
        self.first_token_s: float | None = None
        self.preemptions = 0
        self.off = -1  # decode clock when decoding started; -1 while prefilling or waiting
        self.fin = -1  # decode clock of its last token while decoding
        self.status: Literal["done", "unfinished", "rejected"] = "unfinished"
        self.end_s: float | None = None
        self.decode_instance = ""  # PD: the decode instance its KV cache went to
        self.transfer_s: float | None = None  # PD: seconds of that transfer (None: none)


#: Step ends: a heap of times, each time's instance (or instances, in push order, on a tie)
#: in a dict. A float heap compares much faster than one of tuples; an entry is stale (its
#: run was cut short) unless the instance's `step_end` is still its time.
_Due = dict[float, "_Instance | list[_Instance]"]
_NO_CHUNKS: tuple[tuple[_Seq, int], ...] = ()
_heappush = heapq.heappush


class _Instance:
    """The state of one instance: its queues, decode clock, KV use and step in progress.

    The step in progress (`step_n` identical steps from `step_start`, each `step_dt` long)
    is kept in fields rather than an object, as one is formed per event; `step_n` is 0 when
    the instance is idle. Decoding seqs are filed by the clock of their last token (`fin`,
    with its keys in ascending order in `fin_clocks`: a sorted list rather than a heap, as
    seqs mostly finish in the order they start, so a key is mostly appended and always taken
    from the front, comparing with no other key). A preempted seq's entry stays behind,
    stale, and is skipped: a live entry has `s.off >= 0 and s.fin == clock`."""

    __slots__ = (
        "spec", "index", "layout", "kv_cap", "max_seqs", "max_tokens", "n_stages",
        "buckets", "closed_form", "waiting", "running", "prefilling", "clock", "n_decode",
        "ctx_base", "fin", "fin_clocks", "kv_used", "step_end", "busy", "step_start",
        "step_dt", "step_n", "step_decode", "step_chunks", "step_busy", "heap", "due",
        "on_reject", "router", "costs", "slot", "inflight", "handoff")

    def __init__(self, spec: InstanceSpec, index: int, layout: StepModel, cfg: SimConfig):
        self.spec, self.index, self.layout = spec, index, layout
        self.kv_cap, self.max_seqs = layout.kv_cap, layout.max_seqs
        self.n_stages = layout.n_stages
        self.costs = layout.costs
        self.max_tokens = max(cfg.max_batched_tokens, 1)
        self.buckets = cfg.context_buckets
        self.closed_form = cfg.mode == "fast" and cfg.context_buckets > 0
        self.waiting: deque[_Seq] = deque()
        self.running: dict[_Seq, None] = {}  # in admission order (the last is preempted first)
        self.prefilling: dict[_Seq, None] = {}  # running seqs whose prompt is not all cached
        self.clock = 0  # decode steps run so far
        self.n_decode = 0  # running seqs that decode
        self.ctx_base = 0  # sum over decoding seqs of ctx - off (context = this + n clock)
        self.fin: dict[int, list[_Seq]] = {}  # clock -> seqs whose last token is then
        self.fin_clocks: list[int] = []  # fin's keys, ascending
        self.kv_used = 0
        self.step_end = -1.0  # when the step (run) in progress ends
        self.busy = [0.0] * len(layout.nodes)
        self.step_start = self.step_dt = 0.0
        self.step_n = 0  # identical steps in the run in progress (0: idle)
        self.step_decode = 0  # sequences that decode in each of them
        self.step_chunks: Sequence[tuple[_Seq, int]] = _NO_CHUNKS  # prompt chunks (n = 1)
        self.step_busy: tuple[tuple[int, float], ...] = ()
        # set by Simulator.run: the step-end heap and its instances, the reject callback
        self.heap: list[float] = []
        self.due: _Due = {}
        self.on_reject: Callable[[_Seq], None] = lambda s: None
        self.router: _Router | None = None  # set by the router of its model
        self.slot = 0  # this instance's index in its router's lists
        self.inflight: list[int] = [0]  # the router's (waiting + running) per instance
        # PD prefill instances: takes a seq whose prompt is done to a decode instance
        self.handoff: Callable[[_Seq, float], None] | None = None

    # ---- decoding seqs ----

    def materialise(self, s: _Seq) -> None:
        """Bring a decoding seq's ctx/generated up to the clock and take it out of decoding."""
        d = self.clock - s.off
        self.ctx_base -= s.ctx - s.off
        s.ctx += d
        s.generated += d
        s.off = -1
        self.n_decode -= 1

    def preempt(self) -> None:
        """Preempt the most recently admitted seqs until this step's decode tokens fit."""
        while self.kv_used + self.n_decode > self.kv_cap and self.running:
            victim = next(reversed(self.running))
            del self.running[victim]
            if victim.off >= 0:
                self.materialise(victim)
            self.prefilling.pop(victim, None)
            self.kv_used -= victim.ctx
            victim.ctx = 0
            victim.target = victim.req.prompt_tokens + victim.generated
            victim.preemptions += 1
            self.waiting.appendleft(victim)

    # ---- scheduling ----

    def start_decoding(self, s: _Seq) -> None:
        """`s` (its prompt done, or its KV cache landed) decodes from this step on, filed by
        the decode clock at which its last token comes."""
        clock = self.clock
        s.off = clock
        self.n_decode += 1
        self.ctx_base += s.ctx - clock
        f = s.fin = clock + s.req.output_tokens - s.generated
        filed = self.fin.get(f)
        if filed is None:
            self.fin[f] = [s]
            fc = self.fin_clocks
            if not fc or f > fc[-1]:
                fc.append(f)
            else:
                insort(fc, f)
        else:
            filed.append(s)

    def schedule(self, now: float) -> None:
        """Form the next step from `now` and queue its end (the instance idles when there is
        nothing to run):

        1. preempt the most recently admitted seqs while the cache cannot take this step's
           decode tokens;
        2. every decoding seq decodes one token, and the rest of the token budget goes to
           prompt chunks: running partial prefills first, then waiting requests FCFS while
           fewer than `max_seqs` run and the whole prompt fits in the free cache (a prompt
           that cannot fit even alone is rejected);
        3. the step's cost is looked up for its context rounded up to its bucket;
        4. in fast mode, a pure-decode step that no waiting request could join repeats
           until the first decoding seq finishes, the cache fills, or the context leaves its
           bucket: those steps are one event.

        It runs once per event, so its helpers are written inline (as is `min` of ints)."""
        running, waiting, kv_cap = self.running, self.waiting, self.kv_cap
        if self.kv_used + self.n_decode > kv_cap and running:
            self.preempt()
        b = self.n_decode
        kv_used = self.kv_used
        budget = self.max_tokens - b
        free = kv_cap - kv_used - b
        chunks: Sequence[tuple[_Seq, int]] = _NO_CHUNKS
        p = 0
        if self.prefilling:
            chunks = []
            for s in self.prefilling:
                if budget <= 0 or free <= 0:
                    break
                k = s.target - s.ctx
                if k > budget:
                    k = budget
                if k > free:
                    k = free
                chunks.append((s, k))
                budget -= k
                free -= k
                p += k
        max_seqs = self.max_seqs
        if waiting and budget > 0 and len(running) < max_seqs:
            if not p:
                chunks = []
            while budget > 0 and waiting and len(running) < max_seqs:
                s = waiting[0]
                need = s.target - s.ctx
                if need + 1 > kv_cap:  # can never fit, even alone
                    waiting.popleft()
                    self.inflight[self.slot] -= 1
                    self.on_reject(s)
                    continue
                if need > free:
                    break
                waiting.popleft()
                running[s] = None
                self.prefilling[s] = None
                k = need if need < budget else budget
                chunks.append((s, k))
                budget -= k
                free -= k
                p += k
        if not b and not p:
            self.step_n = 0
            return
        c = c_raw = self.ctx_base + b * self.clock
        nb = self.buckets
        if nb > 0 and c > nb:  # up to a multiple of 1/nb of its power of two
            q = (1 << (c.bit_length() - 1)) // nb
            if q > 1:
                c = -(-c // q) * q
        m = b + len(chunks)
        if m > self.n_stages:
            m = self.n_stages
        cost = self.costs.get((p, b, c, m)) or self.layout.step_cost(p, b, c, m)
        n = 1
        if not p and self.closed_form and not (
                waiting and len(running) < max_seqs
                and kv_used + (waiting[0].target - waiting[0].ctx) <= kv_cap):
            fc, fin = self.fin_clocks, self.fin
            while True:  # the first clock with a live entry (dropping stale ones)
                f = fc[0]
                for s in fin[f]:
                    if s.off >= 0 and s.fin == f:
                        break
                else:
                    del fc[0]
                    del fin[f]
                    continue
                break
            # steps until the first finishes, the cache fills, or the context leaves c's
            # bucket (steps k = 0..n-1 keep context c_raw + k b in it)
            n = f - self.clock
            k = (kv_cap - kv_used) // b
            if k < n:
                n = k
            k = (c - c_raw) // b + 1
            if k < n:
                n = k
            if n < 1:
                n = 1
        dt, self.step_busy = cost
        self.step_start, self.step_dt, self.step_n = now, dt, n
        self.step_decode, self.step_chunks = b, chunks
        self.step_end = t = now + n * dt
        other = self.due.get(t)  # self.queue(t)
        if other is None:
            self.due[t] = self
            _heappush(self.heap, t)
        elif other.__class__ is list:
            other.append(self)
        else:
            self.due[t] = [other, self]

    def cut(self, t: float) -> None:
        """An arrival at `t` may join the batch: end a closed-form run after the step in
        progress. The run's batch is fixed until it ends, so an arrival can only join earlier
        when it heads the queue and a slot is free (otherwise the per-step schedule would not
        admit it either)."""
        k = min(self.step_n, int((t - self.step_start) / self.step_dt) + 1)
        if k < self.step_n:
            self.step_n = k
            self.queue(self.step_start + k * self.step_dt)

    def queue(self, t: float) -> None:
        """Make `t` the end of the step in progress (its earlier entry, if any, is stale)."""
        self.step_end = t
        self.push_due(t, self)

    def push_due(self, t: float, item: Any) -> None:
        """Put `item` (this instance's step end, or a PD hand-over landing) on the shared
        heap of due times at `t`; items due together run in push order."""
        other = self.due.get(t)
        if other is None:
            self.due[t] = item
            _heappush(self.heap, t)
        elif other.__class__ is list:
            other.append(item)
        else:
            self.due[t] = [other, item]


#: Smooth weighted round robin picks are drawn this many at a time.
SWRR_BLOCK = 512
#: Up to this many instances the picks are drawn in Python, above it with numpy (same floats).
SWRR_PYTHON_MAX = 12


def swrr_picks(weights: Sequence[float], current: list[float], count: int) -> list[int]:
    """The next `count` picks of smooth weighted round robin (nginx): each pick adds every
    weight to its current value, takes the largest (the first on ties) and takes the total
    off it. `current` is updated in place. The numpy path performs the same float operations
    in the same order, so both give the same picks."""
    total = sum(weights)
    n = len(weights)
    out = [0] * count
    if n <= SWRR_PYTHON_MAX:
        cur = current
        for i in range(count):
            best = 0
            for k in range(n):
                cur[k] += weights[k]
                if cur[k] > cur[best]:
                    best = k
            cur[best] -= total
            out[i] = best
        return out
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


class _Router:
    """One model's instances: smooth (interleaved) weighted round robin by planned capacity,
    load-aware: a pick whose waiting queue is far longer than the model's shortest goes to
    the least loaded instance per unit weight instead.

    Both scans run in C (`map`): the shortest queue only once the pick's queue is long.
    """

    def __init__(self, insts: list[_Instance]):
        self.insts = insts
        self.weights = [max(i.spec.weight, 1e-12) for i in insts]
        self.current = [0.0] * len(insts)
        self.picks: list[_Instance] = []  # drawn and not yet used, the next last
        self.queues = [i.waiting for i in insts]
        # waiting + running requests per instance, kept by the instances (`slot` is their
        # index here), for the least-loaded pick
        self.inflight = [0] * len(insts)
        for k, i in enumerate(insts):
            i.router, i.slot, i.inflight = self, k, self.inflight

    def draw(self) -> list[_Instance]:
        """The next block of round-robin picks, last first (taken with `pop()`)."""
        self.picks = [self.insts[k] for k in swrr_picks(self.weights, self.current,
                                                        SWRR_BLOCK)]
        self.picks.reverse()
        return self.picks

    def least_loaded(self) -> _Instance:
        """The instance with the fewest (waiting + running) requests per unit weight, the
        first on ties (computed in C, as it is asked for on up to half of the arrivals)."""
        loads = list(map(truediv, self.inflight, self.weights))
        return self.insts[loads.index(min(loads))]

    def pick(self) -> _Instance:
        """The instance the next request goes to."""
        picks = self.picks or self.draw()
        pick = picks.pop()
        q = len(pick.waiting)
        if q >= MIN_SKIP_QUEUE and q >= LOAD_SKIP_FACTOR * (min(map(len, self.queues)) + 1):
            pick = self.least_loaded()
        return pick


def build_layout(spec: InstanceSpec, perf, catalog, net_latency_s: float,
                 iter_cache: dict[tuple, float] | None = None) -> StepModel:
    """The step model (`coral.perf.step`) of an instance's stages."""
    try:
        return build_step_model(spec.model, spec.stages, perf, catalog,
                                net_latency_s=net_latency_s, iter_cache=iter_cache,
                                name=spec.name)
    except StepModelError as exc:
        raise DeploymentError(str(exc)) from None


class Simulator:
    """Runs requests through a deployment. Build once, `run()` once (no I/O anywhere)."""

    def __init__(self, instances: Sequence[InstanceSpec], *, perf, catalog,
                 config: SimConfig | None = None):
        if not instances:
            raise DeploymentError("the deployment has no instances")
        names = [i.name for i in instances]
        if len(set(names)) != len(names):
            raise DeploymentError("instance names must be unique")
        self.cfg = config or SimConfig()
        self.perf, self.catalog = perf, catalog
        lat = NET_LATENCY_S if self.cfg.net_latency_s is None else self.cfg.net_latency_s
        self._iter_cache: dict[tuple, float] = {}
        pd = None
        if any(s.role != "aggregated" for s in instances):
            from coral.sim import pd  # prefill/decode disaggregation (imports this module)
        layouts: dict[tuple[str, tuple], StepModel] = {}

        def layout(spec: InstanceSpec) -> StepModel:
            hit = layouts.get((spec.model, spec.stages))
            if hit is None:
                hit = layouts[(spec.model, spec.stages)] = build_layout(
                    spec, perf, catalog, lat, self._iter_cache)
            return hit

        self.instances = [(_Instance if s.role == "aggregated" else pd.instance_class(s.role))(
            s, i, layout(s), self.cfg) for i, s in enumerate(instances)]
        by_model: dict[str, list[_Instance]] = {}  # the instances requests arrive at
        for inst in self.instances:
            if inst.spec.role != "decode":
                by_model.setdefault(inst.spec.model, []).append(inst)
        self.by_model = by_model
        self.routers = {m: _Router(v) for m, v in by_model.items()}
        # PD: decode routers per (model, region), and the class of a KV transfer's landing
        self.decode_routers: dict[tuple[str, str], _Router] = {}
        self._landing: type | None = None
        if pd is not None:
            self.decode_routers = pd.wire(self.instances, self.routers, catalog)
            self._landing = pd.Landing

    # ---- router ----

    def route(self, req: Request) -> _Instance | None:
        """The instance `req` goes to (a prefill instance for a PD model; None when no
        instance serves its model)."""
        router = self.routers.get(req.model)
        return router.pick() if router is not None else None

    # ---- loop ----

    def run(self, requests: Sequence[Request],
            progress: Callable[[float], None] | None = None) -> SimResult:
        """Simulate `requests` (sorted by arrival) to completion or to the horizon.

        `progress(t)` is called now and then with the simulated time reached (with several
        workers, that of the models simulated in this process)."""
        with gc_paused():  # a seq, a result and more per request: see gc_paused
            reqs = _by_arrival(requests)
            groups = self._model_groups(reqs)
            if len(groups) > 1:
                return self._run_forked(reqs, groups, progress)
            seqs, now, events, steps = self._run(reqs, progress)
            results = _request_results(reqs, seqs)
            # freed while the collector is paused, it has half as many new objects to look
            # at when it resumes
            del seqs
        return SimResult(results, self._node_usage(), [i.spec for i in self.instances], now,
                         events, steps)

    def _node_usage(self, busy: Mapping[int, list[float]] | None = None) -> list[NodeUsage]:
        """Busy seconds per node (of `busy[instance index]` where given, else as simulated
        here)."""
        nodes = []
        for inst in self.instances:
            acc = inst.busy if busy is None else busy.get(inst.index, inst.busy)
            for (si, ni, node, *_rest) in inst.layout.nodes:
                nodes.append(NodeUsage(inst.spec.name, si, node, acc[ni], inst.spec.role))
        return nodes

    # ---- several processes ----

    def _model_groups(self, reqs: list[Request]) -> list[set[str]]:
        """The models split into up to `workers` groups of about equal request counts (the
        largest model first into the lightest group); models with no instance go with the
        first group. One group when there is one worker or the OS cannot fork."""
        workers = min(self.cfg.workers, len(self.routers))
        if workers < 2 or not hasattr(os, "fork"):
            return [set(self.routers)]
        counts = Counter(r.model for r in reqs)
        groups: list[set[str]] = [set() for _ in range(workers)]
        loads = [0] * workers
        for m in sorted(self.routers, key=lambda m: (-counts[m], m)):
            g = loads.index(min(loads))
            groups[g].add(m)
            loads[g] += counts[m]
        groups[0] |= set(counts) - set(self.routers)
        return [g for g in groups if g]

    def _run_forked(self, reqs: list[Request], groups: list[set[str]],
                    progress: Callable[[float], None] | None) -> SimResult:
        """Simulate each group of models in its own process (this one takes the first) and
        put the results together. The groups' events never interact, so every request,
        node and count comes out as in one process: the end time is the latest group's,
        the event and step counts are sums."""
        where = {m: g for g, models in enumerate(groups) for m in models}
        parts: list[list[int]] = [[] for _ in groups]  # request positions per group
        for k, r in enumerate(reqs):
            parts[where[r.model]].append(k)
        children: list[tuple[int, int]] = []  # (pid, read end of its pipe)
        try:
            for g in range(1, len(groups)):
                children.append(self._fork([reqs[k] for k in parts[g]]))
            seqs, now, events, steps = self._run([reqs[k] for k in parts[0]], progress)
            records: list[tuple | None] = [None] * len(reqs)
            for k, s in zip(parts[0], seqs):
                records[k] = _record(s)
            del seqs
            busy: dict[int, list[float]] = {}
            for g in range(1, len(groups)):
                pid, fd = children[g - 1]
                children[g - 1] = (0, -1)  # reaped by _receive, whatever happens
                recs, busy_g, now_g, events_g, steps_g = _receive(pid, fd)
                for k, rec in zip(parts[g], recs):
                    records[k] = rec
                busy.update(busy_g)
                now, events, steps = max(now, now_g), events + events_g, steps + steps_g
        finally:
            for pid, fd in children:
                if pid:
                    os.close(fd)
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
        results = _request_results_from_records(reqs, records)
        del records
        return SimResult(results, self._node_usage(busy), [i.spec for i in self.instances], now,
                         events, steps)

    def _fork(self, reqs: list[Request]) -> tuple[int, int]:
        """Start a process that simulates `reqs` and writes back what `_receive` reads."""
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid:
            os.close(write_fd)
            return pid, read_fd
        try:  # the child: simulate, send, and leave without running the parent's cleanup
            os.close(read_fd)
            models = {r.model for r in reqs}
            seqs, now, events, steps = self._run(reqs, None)
            busy = {i.index: i.busy for i in self.instances if i.spec.model in models}
            data = pickle.dumps(("ok", ([_record(s) for s in seqs], busy, now, events, steps)),
                                protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as exc:  # noqa: BLE001 - reported by the parent
            data = pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))
        try:
            with os.fdopen(write_fd, "wb") as fh:
                fh.write(data)
        finally:
            os._exit(0)

    def _run(self, reqs: list[Request], progress: Callable[[float], None] | None
             ) -> tuple[list[_Seq | None], float, int, int]:
        """The event loop (see the module docstring for the order of events): each request's
        seq (None: it never arrived), the time of the last event, the event and step counts.
        What runs per event is written inline, as this loop is the simulator's running
        time."""
        horizon = math.inf if self.cfg.horizon_s is None else self.cfg.horizon_s
        heap: list[float] = []
        due: _Due = {}
        seqs: list[_Seq | None] = [None] * len(reqs)  # by arrival; None: not arrived
        unrouted = _Seq(Request(-1, "", 0.0, 1, 1), "")  # stands for "no instance of its model"
        unrouted.status = "rejected"
        events = steps = 0
        now = 0.0
        heappop, heappush = heapq.heappop, heapq.heappush
        routers = self.routers
        landing = self._landing  # None without PD instances: no event is one

        def reject(s: _Seq) -> None:
            s.status = "rejected"

        for inst in self.instances:
            inst.heap, inst.due, inst.on_reject = heap, due, reject

        n_reqs = len(reqs)
        next_arrival = 0
        times = [r.arrival_s for r in reqs]
        times.append(math.inf)
        arrival_t = times[0]
        while True:
            if heap and heap[0] <= arrival_t:
                # ---- a step (or a closed-form run of steps) ends
                t = heappop(heap)
                if t > horizon:
                    break
                inst = due.pop(t)
                if inst.__class__ is list:  # a tie: the first now, the rest next
                    rest = inst
                    inst = rest.pop(0)
                    due[t] = rest if len(rest) > 1 else rest[0]
                    heappush(heap, t)
                events += 1
                now = t
                if inst.__class__ is landing:  # PD: a KV cache reaches its decode instance
                    inst.land(t)
                    continue
                if inst.step_end != t or not inst.step_n:
                    continue  # superseded by a cut
                n = inst.step_n
                steps += n
                acc = inst.busy
                for k, x in inst.step_busy:
                    acc[k] += n * x
                b = inst.step_decode
                clock = inst.clock
                if b:
                    clock = inst.clock = clock + n
                    inst.kv_used += b * n
                    fc = inst.fin_clocks
                    if fc and fc[0] <= clock:  # seqs whose last token this was finish
                        fin = inst.fin
                        while fc and fc[0] <= clock:
                            f = fc.pop(0)
                            for s in fin.pop(f):
                                if s.off >= 0 and s.fin == f:  # live (see _Instance)
                                    inst.ctx_base -= s.ctx - s.off  # inst.materialise(s)
                                    d = clock - s.off
                                    s.ctx += d
                                    s.generated += d
                                    s.off = -1
                                    inst.n_decode -= 1
                                    del inst.running[s]
                                    inst.inflight[inst.slot] -= 1
                                    inst.kv_used -= s.ctx
                                    s.status = "done"
                                    s.end_s = t
                for s, k in inst.step_chunks:
                    s.ctx += k
                    inst.kv_used += k
                    if s.ctx >= s.target:
                        del inst.prefilling[s]
                        s.generated += 1
                        if s.first_token_s is None:
                            s.first_token_s = t
                        if s.generated >= s.req.output_tokens:
                            del inst.running[s]
                            inst.inflight[inst.slot] -= 1
                            inst.kv_used -= s.ctx
                            s.status = "done"
                            s.end_s = t
                        elif inst.handoff is not None:  # PD prefill: on to a decode instance
                            inst.handoff(s, t)
                        else:
                            inst.start_decoding(s)
                inst.schedule(t)
                continue
            # ---- the next request arrives
            if next_arrival == n_reqs:
                break
            t = arrival_t
            if t > horizon:
                break
            r = reqs[next_arrival]
            router = routers.get(r.model)
            if router is None:
                seqs[next_arrival] = unrouted
                next_arrival += 1
                arrival_t = times[next_arrival]
                continue
            inst = router.pick()
            s = seqs[next_arrival] = _Seq(r, inst.spec.name)
            next_arrival += 1
            arrival_t = times[next_arrival]
            waiting = inst.waiting
            was_empty = not waiting
            waiting.append(s)
            router.inflight[inst.slot] += 1
            if not inst.step_n:
                inst.schedule(t)
            elif was_empty and inst.step_n > 1 and len(inst.running) < inst.max_seqs:
                inst.cut(t)
            if progress is not None and next_arrival % 1024 == 0:
                progress(t)

        if next_arrival:  # arrivals are events too; `now` is the last event's time
            events += next_arrival
            now = max(now, times[next_arrival - 1])
        return seqs, now, events, steps


def _record(s: _Seq | None) -> tuple | None:
    """What a request's result takes from its seq: (instance, status, first token, end,
    preemptions), plus (decode instance, transfer seconds) once its KV cache was sent to a
    decode instance; None when it never arrived."""
    if s is None:
        return None
    if s.transfer_s is not None:
        return (s.instance, s.status, s.first_token_s, s.end_s, s.preemptions,
                s.decode_instance, s.transfer_s)
    return (s.instance, s.status, s.first_token_s, s.end_s, s.preemptions)


def _receive(pid: int, fd: int) -> tuple:
    """Read a forked worker's results (see `Simulator._fork`) and reap it."""
    chunks: list[bytes] = []
    read = False
    try:
        with os.fdopen(fd, "rb") as fh:
            while chunk := fh.read(1 << 20):
                chunks.append(chunk)
        read = True
    finally:
        if not read:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if not chunks:
        raise RuntimeError(f"simulator worker {pid} ended without a result")
    status, payload = pickle.loads(b"".join(chunks))
    if status != "ok":
        raise RuntimeError(f"simulator worker {pid} failed: {payload}")
    return payload


def _by_arrival(requests: Sequence[Request]) -> list[Request]:
    """`requests` sorted by (arrival, id), which must be unique. A workload usually comes
    sorted with increasing ids (`merge` numbers them so), which is checked in numpy at a
    fraction of the cost of sorting millions of requests."""
    reqs = list(requests)
    times = np.array([r.arrival_s for r in reqs], dtype=np.float64)
    ids = np.array([r.id for r in reqs], dtype=np.int64)
    if len(reqs) > 1 and np.all(np.diff(ids) > 0):  # unique, and ties in time are in order
        if np.all(np.diff(times) >= 0):
            return reqs
    elif len(np.unique(ids)) != len(reqs):
        raise ValueError("request ids must be unique (coral.sim.workload.merge renumbers "
                         "several workloads)")
    reqs.sort(key=lambda r: (r.arrival_s, r.id))
    return reqs


def _request_results(reqs: list[Request], seqs: list[_Seq | None]) -> list[RequestResult]:
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


def _request_results_from_records(reqs: list[Request], records: list[tuple | None]
                                  ) -> list[RequestResult]:
    """`_request_results` from `_record`s (what forked workers send back)."""
    new, cls = tuple.__new__, RequestResult
    return [new(cls, (r.id, r.model, "", r.arrival_s, r.prompt_tokens, r.output_tokens,
                      "unfinished", None, None, 0)) if rec is None else
            new(cls if len(rec) == 5 else PdRequestResult,
                (r.id, r.model, rec[0], r.arrival_s, r.prompt_tokens, r.output_tokens,
                 *rec[1:]))
            for r, rec in zip(reqs, records)]


def simulate(instances: Sequence[InstanceSpec], requests: Sequence[Request], *, perf, catalog,
             config: SimConfig | None = None) -> SimResult:
    """One-call form of `Simulator(...).run(requests)`."""
    return Simulator(instances, perf=perf, catalog=catalog, config=config).run(requests)
