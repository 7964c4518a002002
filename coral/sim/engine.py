"""Discrete-event simulator of a deployment: routed requests, continuous batching, pipelines.

Events and their order
    The loop pops `(time_s, priority, seq)` keys from a heap: earlier time first; at equal
    times a finished instance step (`STEP_DONE`, 0) before an arrival (`ARRIVAL`, 1), so a
    request arriving just as a step ends waits for the next step in both modes; `seq` (push
    order) breaks the remaining ties, so a run is deterministic. Arrivals are pushed one at a
    time (the next when one is handled), which keeps the heap as small as the instance count.

An instance (`InstanceSpec`) runs vLLM-style continuous batching:
    each scheduler step every running sequence whose prompt is in the KV cache decodes one
    token; the rest of `max_batched_tokens` goes to prompt chunks (running partial prefills
    first, then waiting requests FCFS while fewer than `max_seqs` run and the whole prompt fits
    in the free KV cache). When the cache cannot take this step's decode tokens, the most
    recently admitted sequence is preempted and later recomputed (prompt + tokens so far as a
    new prompt). The sequences of a step are split into `m = min(stages, sequences)` equal
    micro-batches that flow through the stages (a stage's micro-batch is split over its
    data-parallel nodes by their shares); a node's time is the perf model's iteration plus,
    when it is not the last stage, the activation send (`tokens x hidden bytes / NIC +
    NET_LATENCY_S`). With stage times `T_s`, one step (every micro-batch one token further)
    lasts `max(sum_s T_s, m * max_s T_s)`: the latency of the path, or the bottleneck stage
    busy with every micro-batch — the period of a cyclic pipeline with `m` identical jobs.
    `max_seqs = stages x the smallest stage batch` (the template's batch per micro-batch).

Closed form ("fast" mode)
    A pure-decode step whose batch cannot change (no prompt chunk, no admissible waiting
    request) repeats identically until a sequence finishes, the cache fills, or the batch's
    context crosses the next context bucket (contexts are rounded up to `1/context_buckets`
    of their power of two, in both modes, so that iteration times are piecewise constant and
    cacheable). Those steps are one event; an arrival routed to the instance meanwhile cuts
    the run short at the end of the step in progress. "naive" mode pushes one event per step
    and gives the same results (up to float rounding), only slower. Decoding sequences keep
    their context and token count relative to an instance decode clock, with their finishing
    clock in a heap, so a step costs O(1) in the batch size plus its prompt chunks and
    finishers.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping, Sequence

from coral.sim.deployment import DeploymentError, InstanceSpec
from coral.sim.workload import Request

log = logging.getLogger(__name__)

#: Event priorities at equal times (smaller first).
STEP_DONE = 0
ARRIVAL = 1

#: Default token budget of one scheduler step (vLLM's chunked-prefill default order).
DEFAULT_MAX_BATCHED_TOKENS = 2048
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
    """Tokens one scheduler step may process (decode tokens + prompt chunks)."""
    context_buckets: int = DEFAULT_CONTEXT_BUCKETS
    """Context rounding: up to 1/N of its power of two; 0 keeps exact contexts (no jumps)."""
    horizon_s: float | None = None
    """Stop at this simulated time; requests still in flight are reported unfinished."""
    net_latency_s: float | None = None
    """Per-hop activation latency, s (None: the planner's NET_LATENCY_S)."""

    def __post_init__(self) -> None:
        if self.mode not in ("fast", "naive"):
            raise ValueError(f"mode must be 'fast' or 'naive', got {self.mode!r}")
        if self.max_batched_tokens < 1:
            raise ValueError(f"max_batched_tokens must be >= 1, got {self.max_batched_tokens}")
        if self.context_buckets < 0:
            raise ValueError(f"context_buckets must be >= 0, got {self.context_buckets}")


@dataclass(frozen=True)
class RequestResult:
    """What happened to one request (times in simulated seconds)."""

    id: int
    model: str
    instance: str  # "" when never routed (no instance of its model)
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    status: Literal["done", "unfinished", "rejected"]
    first_token_s: float | None
    end_s: float | None
    preemptions: int

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


@dataclass
class NodeUsage:
    """Busy time of one node of one instance."""

    instance: str
    stage: int
    node_type: str
    busy_s: float = 0.0


@dataclass
class SimResult:
    requests: list[RequestResult]
    nodes: list[NodeUsage]
    instances: list[InstanceSpec]
    end_s: float  # simulated time of the last event
    events: int  # events popped
    steps: int  # scheduler steps simulated (a closed-form run counts each step)


class _Seq:
    """A request inside an instance.

    While decoding, `ctx` and `generated` hold their values at instance decode clock `off`;
    both grow by one per decode step, so their current values are `x + clock - off` (this
    keeps a decode step O(1) instead of O(batch))."""

    __slots__ = ("req", "target", "ctx", "generated", "first_token_s", "preemptions", "off",
                 "epoch")

    def __init__(self, req: Request):
        self.req = req
        self.target = req.prompt_tokens  # tokens to have in cache before the next token
        self.ctx = 0  # tokens in the KV cache
        self.generated = 0
        self.first_token_s: float | None = None
        self.preemptions = 0
        self.off = -1  # decode clock when decoding started; -1 while prefilling or waiting
        self.epoch = 0  # bumped on preemption (stale finish-heap entries)


IterFn = Callable[[str, int, int, int, int, bool, bool], float]


class _Step:
    __slots__ = ("start", "dt", "n", "decode", "chunks", "busy", "version")
    # decode: how many sequences decode in each of the n steps

    def __init__(self, start, dt, n, decode, chunks, busy, version):
        self.start, self.dt, self.n = start, dt, n
        self.decode, self.chunks, self.busy, self.version = decode, chunks, busy, version


class _Instance:
    def __init__(self, spec: InstanceSpec, index: int, iteration: IterFn,
                 kv_tokens: Callable[[str, int, bool, bool], int],
                 send: Callable[[str, int], float], cfg: SimConfig):
        self.spec, self.index, self.cfg = spec, index, cfg
        self.iteration, self.send = iteration, send
        n_st = len(spec.stages)
        self.nodes: list[tuple[int, int, str, int, float, bool, bool]] = []
        cap = math.inf
        for si, st in enumerate(spec.stages):
            first, last = si == 0, si == n_st - 1
            for nd in st.nodes:
                self.nodes.append((si, len(self.nodes), nd.node_type, nd.layers, nd.share,
                                   first, last))
                kv = kv_tokens(nd.node_type, nd.layers, first, last)
                if nd.share > 0:
                    cap = min(cap, kv / nd.share)
        self.kv_cap = int(cap)
        if self.kv_cap < 1:
            raise DeploymentError(f"instance {spec.name}: no room for any KV cache")
        self.max_seqs = n_st * min(st.batch for st in spec.stages)
        self.max_tokens = max(cfg.max_batched_tokens, 1)
        self.waiting: deque[_Seq] = deque()
        self.running: dict[int, _Seq] = {}  # request id -> seq, in admission order
        self.prefilling: dict[int, _Seq] = {}  # running seqs whose prompt is not all cached
        self.clock = 0  # decode steps run so far
        self.n_decode = 0  # running seqs that decode
        self.ctx_base = 0  # sum over decoding seqs of ctx - off (context = this + n clock)
        self.finish_heap: list[tuple[int, int, int, _Seq]] = []  # (clock, id, epoch, seq)
        self.kv_used = 0
        self.step: _Step | None = None
        self.version = 0
        self.busy = [0.0] * len(self.nodes)
        self._cost: dict[tuple[int, int, int], tuple[float, tuple[float, ...]]] = {}

    # ---- timing ----

    def _qctx(self, c: int) -> int:
        nb = self.cfg.context_buckets
        if nb <= 0 or c <= nb:
            return c
        q = max(1, (1 << (c.bit_length() - 1)) // nb)
        return -(-c // q) * q

    def step_cost(self, p: int, b: int, c: int, seqs: int) -> tuple[float, tuple[float, ...]]:
        """(step seconds, busy seconds per node) of a step with p prompt tokens, b decodes,
        c decode context tokens (already rounded) over `seqs` sequences."""
        m = max(1, min(len(self.spec.stages), seqs))
        key = (p, b, c, m)
        hit = self._cost.get(key)
        if hit is not None:
            return hit
        pm, bm, cm = -(-p // m), -(-b // m), -(-c // m)
        stage_t = [0.0] * len(self.spec.stages)
        busy = [0.0] * len(self.nodes)
        for si, ni, node, layers, share, first, last in self.nodes:
            pn, bn = math.ceil(pm * share - 1e-9), math.ceil(bm * share - 1e-9)
            if pn == 0 and bn == 0:
                continue
            cn = max(bn, math.ceil(cm * share - 1e-9)) if bn else 0
            t = self.iteration(node, layers, pn, bn, cn, first, last)
            busy[ni] = m * t
            if not last:
                t += self.send(node, pn + bn)
            stage_t[si] = max(stage_t[si], t)
        dt = max(sum(stage_t), m * max(stage_t))
        out = (dt, tuple(busy))
        self._cost[key] = out
        return out

    # ---- scheduling ----

    def can_admit_head(self) -> bool:
        if not self.waiting or len(self.running) >= self.max_seqs:
            return False
        s = self.waiting[0]
        return self.kv_used + (s.target - s.ctx) <= self.kv_cap

    def start_decode(self, s: _Seq) -> None:
        s.off = self.clock
        self.n_decode += 1
        self.ctx_base += s.ctx - s.off
        heapq.heappush(self.finish_heap, (self.clock + s.req.output_tokens - s.generated,
                                          s.req.id, s.epoch, s))

    def materialise(self, s: _Seq) -> None:
        """Bring a decoding seq's ctx/generated up to the clock and take it out of decoding."""
        d = self.clock - s.off
        self.ctx_base -= s.ctx - s.off
        s.ctx += d
        s.generated += d
        s.off = -1
        self.n_decode -= 1

    def next_finish(self) -> int:
        """Decode steps until the first decoding seq finishes."""
        h = self.finish_heap
        while h and (h[0][2] != h[0][3].epoch or h[0][3].off < 0):
            heapq.heappop(h)
        return h[0][0] - self.clock

    def pop_finished(self) -> list[_Seq]:
        h, out = self.finish_heap, []
        while h and h[0][0] <= self.clock:
            _, _, epoch, s = heapq.heappop(h)
            if epoch == s.epoch and s.off >= 0:
                out.append(s)
        return out

    def schedule(self, now: float, on_reject: Callable[[_Seq], None]) -> _Step | None:
        """Form the next step (or None when there is nothing to run)."""
        while self.kv_used + self.n_decode > self.kv_cap and self.running:
            victim = self.running.pop(next(reversed(self.running)))
            if victim.off >= 0:
                self.materialise(victim)
            self.prefilling.pop(victim.req.id, None)
            self.kv_used -= victim.ctx
            victim.ctx = 0
            victim.target = victim.req.prompt_tokens + victim.generated
            victim.preemptions += 1
            victim.epoch += 1
            self.waiting.appendleft(victim)
        b = self.n_decode
        budget = self.max_tokens - b
        free = self.kv_cap - self.kv_used - b
        chunks: list[tuple[_Seq, int]] = []
        for s in self.prefilling.values():
            if budget <= 0 or free <= 0:
                break
            k = min(s.target - s.ctx, budget, free)
            chunks.append((s, k))
            budget -= k
            free -= k
        while budget > 0 and self.waiting and len(self.running) < self.max_seqs:
            s = self.waiting[0]
            need = s.target - s.ctx
            if need + 1 > self.kv_cap:  # can never fit, even alone
                self.waiting.popleft()
                on_reject(s)
                continue
            if need > free:
                break
            self.waiting.popleft()
            self.running[s.req.id] = s
            self.prefilling[s.req.id] = s
            k = min(need, budget)
            chunks.append((s, k))
            budget -= k
            free -= k
        if not b and not chunks:
            return None
        p = sum(k for _, k in chunks)
        c_raw = self.ctx_base + b * self.clock
        c = self._qctx(c_raw)
        dt, busy = self.step_cost(p, b, c, b + len(chunks))
        n = 1
        if self.cfg.mode == "fast" and p == 0 and self.cfg.context_buckets > 0 \
                and not self.can_admit_head():
            n = min(self.next_finish(), (self.kv_cap - self.kv_used) // b,
                    (c - c_raw) // b + 1)  # steps k = 0..n-1 keep context c_raw + k b in c's bucket
            n = max(n, 1)
        self.version += 1
        self.step = _Step(now, dt, n, b, chunks, busy, self.version)
        return self.step


class Simulator:
    """Runs requests through a deployment. Build once, `run()` once (no I/O anywhere)."""

    def __init__(self, instances: Sequence[InstanceSpec], *, perf, catalog,
                 config: SimConfig | None = None):
        from coral.templates.operating_points import NET_LATENCY_S

        if not instances:
            raise DeploymentError("the deployment has no instances")
        names = [i.name for i in instances]
        if len(set(names)) != len(names):
            raise DeploymentError("instance names must be unique")
        self.cfg = config or SimConfig()
        self.perf, self.catalog = perf, catalog
        lat = NET_LATENCY_S if self.cfg.net_latency_s is None else self.cfg.net_latency_s
        self._iter_cache: dict[tuple, float] = {}
        self._models: dict[str, tuple[str, ...]] = {}

        def make(spec: InstanceSpec, idx: int) -> _Instance:
            model = spec.model
            arch = catalog.model(model)
            hidden_bytes = arch.hidden_size * arch.dtype_bytes
            cache = self._iter_cache

            def iteration(node: str, layers: int, p: int, b: int, c: int, first: bool,
                          last: bool) -> float:
                key = (model, node, layers, p, b, c, first, last)
                t = cache.get(key)
                if t is None:
                    t = perf.iteration_seconds(model, node, layers, p, b, c,
                                               first_stage=first, last_stage=last)
                    cache[key] = t
                return t

            def kv_tokens(node: str, layers: int, first: bool, last: bool) -> int:
                return perf.max_kv_tokens(model, node, layers, first_stage=first,
                                          last_stage=last)

            def send(node: str, tokens: int) -> float:
                nic = catalog.node_type(node).nic_gbps * 1e9 / 8.0
                return tokens * hidden_bytes / nic + lat

            return _Instance(spec, idx, iteration, kv_tokens, send, self.cfg)

        self.instances = [make(s, i) for i, s in enumerate(instances)]
        by_model: dict[str, list[_Instance]] = {}
        for inst in self.instances:
            by_model.setdefault(inst.spec.model, []).append(inst)
        self.by_model = by_model
        self._swrr = {m: [0.0] * len(v) for m, v in by_model.items()}
        self._weights = {}
        for m, v in by_model.items():
            w = [max(i.spec.weight, 1e-12) for i in v]
            self._weights[m] = (w, sum(w))

    # ---- router ----

    def route(self, req: Request) -> _Instance | None:
        """Smooth (interleaved) weighted round robin by planned capacity, load-aware: a pick
        whose waiting queue is far longer than the model's shortest goes to the least loaded
        instance per unit weight instead."""
        insts = self.by_model.get(req.model)
        if not insts:
            return None
        cur = self._swrr[req.model]
        weights, total = self._weights[req.model]
        best = 0
        for k, w in enumerate(weights):
            cur[k] += w
            if cur[k] > cur[best]:
                best = k
        cur[best] -= total
        pick = insts[best]
        if len(pick.waiting) >= MIN_SKIP_QUEUE:
            shortest = min(len(i.waiting) for i in insts)
            if len(pick.waiting) >= LOAD_SKIP_FACTOR * (shortest + 1):
                k = min(range(len(insts)), key=lambda j: (
                    (len(insts[j].waiting) + len(insts[j].running)) / weights[j], j))
                pick = insts[k]
        return pick

    # ---- loop ----

    def run(self, requests: Sequence[Request],
            progress: Callable[[float], None] | None = None) -> SimResult:
        """Simulate `requests` (sorted by arrival) to completion or to the horizon."""
        reqs = sorted(requests, key=lambda r: (r.arrival_s, r.id))
        if len({r.id for r in reqs}) != len(reqs):
            raise ValueError("request ids must be unique (coral.sim.workload.merge renumbers "
                             "several workloads)")
        horizon = self.cfg.horizon_s
        heap: list[tuple[float, int, int, int, int]] = []  # time, prio, seq, kind-arg, version
        seq = 0
        results: dict[int, RequestResult] = {}
        where: dict[int, str] = {}
        events = steps = 0
        now = 0.0

        def finish(s: _Seq, inst: _Instance, t: float) -> None:
            r = s.req
            results[r.id] = RequestResult(r.id, r.model, inst.spec.name, r.arrival_s,
                                          r.prompt_tokens, r.output_tokens, "done",
                                          s.first_token_s, t, s.preemptions)

        def start_step(inst: _Instance, t: float) -> None:
            nonlocal seq

            def reject(s: _Seq) -> None:
                r = s.req
                results[r.id] = RequestResult(r.id, r.model, inst.spec.name, r.arrival_s,
                                              r.prompt_tokens, r.output_tokens, "rejected",
                                              s.first_token_s, None, s.preemptions)

            st = inst.schedule(t, reject)
            if st is not None:
                heapq.heappush(heap, (t + st.n * st.dt, STEP_DONE, seq, inst.index, st.version))
                seq += 1

        next_arrival = 0
        if reqs:
            heapq.heappush(heap, (reqs[0].arrival_s, ARRIVAL, seq, -1, 0))
            seq += 1
        while heap:
            t, prio, _, idx, version = heapq.heappop(heap)
            if horizon is not None and t > horizon:
                break
            events += 1
            now = t
            if prio == ARRIVAL:
                r = reqs[next_arrival]
                next_arrival += 1
                if next_arrival < len(reqs):
                    heapq.heappush(heap, (reqs[next_arrival].arrival_s, ARRIVAL, seq, -1, 0))
                    seq += 1
                inst = self.route(r)
                if inst is None:
                    results[r.id] = RequestResult(r.id, r.model, "", r.arrival_s,
                                                  r.prompt_tokens, r.output_tokens, "rejected",
                                                  None, None, 0)
                    continue
                where[r.id] = inst.spec.name
                was_empty = not inst.waiting
                inst.waiting.append(_Seq(r))
                st = inst.step
                if st is None:
                    start_step(inst, t)
                elif st.n > 1 and was_empty and len(inst.running) < inst.max_seqs:
                    # The run's batch is fixed until it ends, so an arrival can only join
                    # earlier when it heads the queue and a slot is free (otherwise the
                    # per-step schedule would not admit it either): cut the closed-form run
                    # at the end of the step in progress.
                    k = min(st.n, int((t - st.start) / st.dt) + 1)
                    if k < st.n:
                        inst.version += 1
                        st.n, st.version = k, inst.version
                        heapq.heappush(heap, (st.start + k * st.dt, STEP_DONE, seq, inst.index,
                                              st.version))
                        seq += 1
                if progress is not None and next_arrival % 1024 == 0:
                    progress(t)
                continue
            inst = self.instances[idx]
            st = inst.step
            if st is None or st.version != version:
                continue  # superseded by a cut
            n = st.n
            steps += n
            for k, b in enumerate(st.busy):
                if b:
                    inst.busy[k] += n * b
            if st.decode:
                inst.clock += n
                inst.kv_used += st.decode * n
            done = inst.pop_finished() if st.decode else []
            for s in done:
                inst.materialise(s)
            for s, k in st.chunks:
                s.ctx += k
                inst.kv_used += k
                if s.ctx >= s.target:
                    del inst.prefilling[s.req.id]
                    s.generated += 1
                    if s.first_token_s is None:
                        s.first_token_s = t
                    if s.generated >= s.req.output_tokens:
                        done.append(s)
                    else:
                        inst.start_decode(s)
            for s in done:
                del inst.running[s.req.id]
                inst.kv_used -= s.ctx
                finish(s, inst, t)
            inst.step = None
            start_step(inst, t)

        # whatever is left is unfinished (horizon): every request is reported exactly once
        inflight = {s.req.id: s for inst in self.instances
                    for s in (*inst.running.values(), *inst.waiting)}
        for r in reqs:
            if r.id not in results:
                s = inflight.get(r.id)
                results[r.id] = RequestResult(
                    r.id, r.model, where.get(r.id, ""), r.arrival_s, r.prompt_tokens,
                    r.output_tokens, "unfinished", s.first_token_s if s else None, None,
                    s.preemptions if s else 0)
        nodes = []
        for inst in self.instances:
            for (si, ni, node, *_rest) in inst.nodes:
                nodes.append(NodeUsage(inst.spec.name, si, node, inst.busy[ni]))
        return SimResult([results[r.id] for r in reqs], nodes,
                         [i.spec for i in self.instances], now, events, steps)


def simulate(instances: Sequence[InstanceSpec], requests: Sequence[Request], *, perf, catalog,
             config: SimConfig | None = None) -> SimResult:
    """One-call form of `Simulator(...).run(requests)`."""
    return Simulator(instances, perf=perf, catalog=catalog, config=config).run(requests)
