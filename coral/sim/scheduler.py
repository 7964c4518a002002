"""One simulated instance: its queues, KV cache, decode clock and the scheduler that forms
its steps (continuous batching with chunked prefill and preemption; see `coral.sim.event_loop`
for the model). The event loop (`coral.sim.event_loop.Simulator`) drives it.

`SimInstance.schedule` is the one scheduler of every kind of instance: aggregated, and the
prefill and decode halves of `coral.sim.pd` (subclasses that change its data, not its
steps): a prefill instance's token budget is its template's chunk and a finished prompt
leaves through `handoff`; a decode instance first takes landed KV caches into its decode
batch (`takes_landed`, `admit_landed`). Each step it forms is a `Step` record, which the
step model prices and the event loop applies."""

from __future__ import annotations

import heapq
from bisect import insort
from collections import deque
from typing import Any, Callable, Literal, Sequence

from coral.perf.step import StepModel
from coral.sim.config import SimConfig
from coral.sim.deployment import InstanceSpec
from coral.sim.workload import Request


class Seq:
    """A request inside an instance.

    While decoding, `ctx` and `generated` hold their values at instance decode clock `off`;
    both grow by one per decode step, so their current values are `x + clock - off` (this
    keeps a decode step O(1) instead of O(batch))."""

    __slots__ = ("req", "instance", "target", "ctx", "generated", "first_token_s",
                 "preemptions", "off", "fin", "status", "end_s", "decode_instance",
                 "transfer_s", "lag", "held_by")

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
        # PD: the prefill instance whose backlog it is in while its KV has landed and it
        # waits for a decode slot (`coral.sim.pd`, "Back-pressure"); None otherwise
        self.held_by: Any = None
        # seconds its tokens come after the ends of the steps they are counted in: the
        # micro-batch launches it waited for past the step boundary (`SimInstance.launch_lag`)
        self.lag = 0.0


#: Step ends: a heap of times, each time's instance (or instances, in push order, on a tie)
#: in a dict. A float heap compares much faster than one of tuples; an entry is stale (its
#: run was cut short) unless the instance's `step_end` is still its time.
Due = dict[float, "SimInstance | list[SimInstance]"]
NO_CHUNKS: tuple[tuple[Seq, int], ...] = ()
_heappush = heapq.heappush


class Step:
    """One scheduler step, or a closed-form run of `n` identical ones: what runs in it, as
    the scheduler forms it (`SimInstance.schedule`) and the event loop applies it (vLLM's
    `SchedulerOutput`, for the simulator). Its (prompt tokens, decodes, context,
    micro-batches) are what the step model prices (`StepModel.step_cost`, giving `dt_s`
    and `busy`).

    The decoding seqs are counted, not listed: every running seq whose prompt is cached
    decodes one token a step, and they are filed by the decode clock (`SimInstance.fin`), so
    that a step costs O(1) in the batch size. A plain class with slots rather than a frozen
    dataclass, as one is formed per event; `n` shrinks when an arrival cuts the run short
    (`SimInstance.cut`) and nothing else changes after it is formed."""

    __slots__ = ("chunks", "prompt_tokens", "decode", "context", "micro_batches", "n",
                 "start_s", "dt_s", "busy")

    def __init__(self, chunks: Sequence[tuple[Seq, int]], prompt_tokens: int, decode: int,
                 context: int, micro_batches: int, n: int, start_s: float, dt_s: float,
                 busy: tuple[tuple[int, float], ...]):
        self.chunks = chunks  # (seq, its prompt tokens in this step), partial prefills first
        self.prompt_tokens = prompt_tokens  # the chunks' tokens
        self.decode = decode  # seqs that decode one token each
        self.context = context  # the decoding seqs' context, rounded up to its bucket
        self.micro_batches = micro_batches  # min(stages, sequences in the step)
        self.n = n  # identical steps in the run (> 1 only for a pure-decode closed form)
        self.start_s = start_s  # when the run starts
        self.dt_s = dt_s  # seconds of each step (the step model's)
        self.busy = busy  # (node index, busy seconds of each step) of the step model


class SimInstance:
    """The state of one instance: its queues, decode clock, KV use and step in progress.

    The step in progress is `step` (None when the instance is idle), ending at `step_end`.
    Decoding seqs are filed by the clock of their last token (`fin`,
    with its keys in ascending order in `fin_clocks`: a sorted list rather than a heap, as
    seqs mostly finish in the order they start, so a key is mostly appended and always taken
    from the front, comparing with no other key). A preempted seq's entry stays behind,
    stale, and is skipped: a live entry has `s.off >= 0 and s.fin == clock`."""

    __slots__ = (
        "spec", "index", "layout", "kv_cap", "max_seqs", "max_tokens", "n_stages",
        "buckets", "closed_form", "waiting", "running", "prefilling", "clock", "n_decode",
        "ctx_base", "fin", "fin_clocks", "kv_used", "step", "step_end", "busy", "heap",
        "due", "on_reject", "router", "costs", "slot", "inflight", "handoff")

    #: Whether a step's tokens lag by the micro-batch launches an arrival waited for
    #: (`launch_lag`); the PD instances count none (`coral.sim.pd`, "Latency accounting").
    lags_launches = True
    #: Whether queued requests may arrive with their prompt's KV cache, to join the decode
    #: batch before the step is formed (`admit_landed`: a PD decode instance).
    takes_landed = False

    def __init__(self, spec: InstanceSpec, index: int, layout: StepModel, cfg: SimConfig):
        self.spec, self.index, self.layout = spec, index, layout
        self.kv_cap, self.max_seqs = layout.kv_cap, layout.max_seqs
        self.n_stages = layout.n_stages
        self.costs = layout.costs
        self.max_tokens = max(cfg.max_batched_tokens, 1)
        self.buckets = cfg.context_buckets
        self.closed_form = cfg.mode == "fast" and cfg.context_buckets > 0
        self.waiting: deque[Seq] = deque()
        self.running: dict[Seq, None] = {}  # in admission order (the last is preempted first)
        self.prefilling: dict[Seq, None] = {}  # running seqs whose prompt is not all cached
        self.clock = 0  # decode steps run so far
        self.n_decode = 0  # running seqs that decode
        self.ctx_base = 0  # sum over decoding seqs of ctx - off (context = this + n clock)
        self.fin: dict[int, list[Seq]] = {}  # clock -> seqs whose last token is then
        self.fin_clocks: list[int] = []  # fin's keys, ascending
        self.kv_used = 0
        self.step: Step | None = None  # the step (run) in progress; None: idle
        self.step_end = -1.0  # when it ends
        self.busy = [0.0] * len(layout.nodes)
        # set by Simulator.run: the step-end heap and its instances, the reject callback
        self.heap: list[float] = []
        self.due: Due = {}
        self.on_reject: Callable[[Seq], None] = lambda s: None
        self.router: Any = None  # its model's `coral.sim.model_router.SimModelRouter`, set by it
        self.slot = 0  # this instance's index in its router's lists
        self.inflight: list[int] = [0]  # the router's (waiting + running) per instance
        # PD prefill instances: takes a seq whose prompt is done to a decode instance
        self.handoff: Callable[[Seq, float], None] | None = None

    # ---- decoding seqs ----

    def materialise(self, s: Seq) -> None:
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

    def start_decoding(self, s: Seq) -> None:
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

    def enqueue(self, s: Seq, t: float) -> None:
        """Queue `s` here at `t` (not counted in the router's in-flight list: the caller
        counts it where it does) and start a step, or cut the running one short so that `s`
        may join after it, as an arrival does. The engine's arrival loop runs the same lines
        inlined (its hot path)."""
        waiting = self.waiting
        was_empty = not waiting
        waiting.append(s)
        s.lag = self.launch_lag(t)
        step = self.step
        if step is None:
            self.schedule(t)
        elif was_empty and step.n > 1 and len(self.running) < self.max_seqs:
            self.cut(t)

    def launch_lag(self, t: float) -> float:
        """How much later than the step model says the tokens of a request arriving at `t`
        come, for an instance busy with a step of `m` micro-batches: the pipeline launches
        them `dt / m` apart, one after the other, so a prompt arriving after `k` of them
        went joins the next launch, its `m` chunks ride in the `m` launches from there and its
        first token is back a round trip (a step) after the last; the step model takes its
        prompt at the next step and counts its token at that step's end, `k dt / m`
        earlier. Its tokens keep that phase, so every one of them comes `k dt / m` later
        (its TPOT is the step model's). 0 when idle, with one micro-batch, or on a PD
        instance (`lags_launches`)."""
        step = self.step
        if step is None or step.micro_batches < 2 or not self.lags_launches:
            return 0.0
        m = step.micro_batches
        phase = (t - step.start_s) / step.dt_s
        k = int((phase - int(phase)) * m)
        return k * step.dt_s / m

    def admit_landed(self) -> None:
        """Move queued requests whose KV cache has landed into the decode batch (the
        instances with `takes_landed` only: `coral.sim.pd.DecodeInstance`)."""
        raise NotImplementedError(f"{type(self).__name__} takes no landed requests")

    def schedule(self, now: float) -> None:
        """Form the next step from `now` (a `Step`, in `step`) and queue its end (the
        instance idles, `step` None, when there is nothing to run):

        1. preempt the most recently admitted seqs while the cache cannot take this step's
           decode tokens;
        2. on a PD decode instance (`takes_landed`), landed requests at the head of the
           queue join the decode batch (`admit_landed`);
        3. every decoding seq decodes one token, and the rest of the token budget goes to
           prompt chunks: running partial prefills first, then waiting requests FCFS while
           fewer than `max_seqs` run and the whole prompt fits in the free cache (a prompt
           that cannot fit even alone is rejected); a landed request at the head stops
           them, as it joins at a later step;
        4. the step's cost is looked up for its context rounded up to its bucket;
        5. in fast mode, a pure-decode step that no waiting request could join repeats
           until the first decoding seq finishes, the cache fills, or the context leaves its
           bucket: those steps are one event. A landed request that could not join now
           cannot join before a seq finishes (slots and free cache only shrink until then),
           and a run ends at the first finish.

        It runs once per event, so its helpers are written inline (as is `min` of ints)."""
        running, waiting, kv_cap = self.running, self.waiting, self.kv_cap
        if self.kv_used + self.n_decode > kv_cap and running:
            self.preempt()
        if self.takes_landed and waiting:
            self.admit_landed()
        b = self.n_decode
        kv_used = self.kv_used
        budget = self.max_tokens - b
        free = kv_cap - kv_used - b
        chunks: Sequence[tuple[Seq, int]] = NO_CHUNKS
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
                if need <= 0:
                    break  # landed (PD decode): joins the decode batch at a later step
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
            self.step = None
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
        dt, busy = self.costs.get((p, b, c, m)) or self.layout.step_cost(p, b, c, m)
        n = 1
        if not p and self.closed_form:
            if waiting and len(running) < max_seqs:  # may the head join a later step?
                head = waiting[0]
                need = head.target - head.ctx
                joins = 0 < need and kv_used + need <= kv_cap
            else:
                joins = False
            if not joins:
                n = self._run_length(c, c_raw, b, kv_used)
        self.step = Step(chunks, p, b, c, m, n, now, dt, busy)
        self.step_end = t = now + n * dt
        other = self.due.get(t)  # self.queue(t)
        if other is None:
            self.due[t] = self
            _heappush(self.heap, t)
        elif other.__class__ is list:
            other.append(self)
        else:
            self.due[t] = [other, self]

    def _run_length(self, c: int, c_raw: int, b: int, kv_used: int) -> int:
        """How many identical pure-decode steps of `b` seqs, at context `c_raw` rounded up
        to `c`, run as one (fast mode): until the first decoding seq finishes, the cache
        fills, or the context leaves `c`'s bucket (steps k = 0..n-1 keep context
        c_raw + k b in it); at least 1."""
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
        n = f - self.clock
        k = (self.kv_cap - kv_used) // b
        if k < n:
            n = k
        k = (c - c_raw) // b + 1
        if k < n:
            n = k
        return n if n > 1 else 1

    def cut(self, t: float) -> None:
        """An arrival at `t` may join the batch: end a closed-form run after the step in
        progress. The run's batch is fixed until it ends, so an arrival can only join earlier
        when it heads the queue and a slot is free (otherwise the per-step schedule would not
        admit it either)."""
        step = self.step
        if step is None:
            return
        k = min(step.n, int((t - step.start_s) / step.dt_s) + 1)
        if k < step.n:
            step.n = k
            self.queue(step.start_s + k * step.dt_s)

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
