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
    A step's `m` micro-batches are launched `dt / m` apart (a cyclic pipeline), so a request
    arriving after `k` of them went is `k dt / m` behind the step boundaries it is counted
    at: its prompt's chunks start at the next launch and its first token is back a step
    after its last chunk's launch. Its tokens carry that lag (`SimInstance.launch_lag`);
    its TPOT is the step model's.

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
    `SimInstance.schedule`; step costs are memoised per (prompt tokens, decodes, context
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

Timers
    `Simulator.at(t, fn)` calls `fn(t)` at simulated time `t` (a `Timer` on the step-end heap,
    taken in push order with the step ends and landings due then). Node preemptions
    (`coral.sim.preemption`) use them to drain, kill and start instances during a run, with
    `add_instance`; a run with timers runs in one process.
"""

from __future__ import annotations

import heapq
import logging
import math
from typing import Callable, Mapping, Sequence

import numpy as np

from coral.perf.step import NET_LATENCY_S, StepModel, StepModelError, build_step_model
from coral.sim import pd
from coral.sim.config import SimConfig
from coral.sim.deployment import DeploymentError, InstanceSpec
from coral.sim.results import NodeUsage, SimResult, request_results
from coral.sim.model_router import SimModelRouter
from coral.sim.scheduler import Due, Seq, SimInstance
from coral.sim.workers import model_groups, run_in_processes
from coral.sim.workload import Request, gc_paused

log = logging.getLogger(__name__)

#: Event priorities at equal times (smaller first).
STEP_DONE = 0
ARRIVAL = 1


class Timer:
    """A call due at its heap time (`Simulator.at`)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[float], None]):
        self.fn = fn


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
        self._lat = lat
        self._iter_cache: dict[tuple, float] = {}
        # timers to push when the run starts, then the run's heap and due table (`at`)
        self._timers: list[tuple[float, Timer]] = []
        self._heap: list[float] | None = None
        self._due: Due | None = None
        has_pd = any(s.role != "aggregated" for s in instances)
        layouts: dict[tuple[str, tuple], StepModel] = {}

        def layout(spec: InstanceSpec) -> StepModel:
            hit = layouts.get((spec.model, spec.stages))
            if hit is None:
                hit = layouts[(spec.model, spec.stages)] = build_layout(
                    spec, perf, catalog, lat, self._iter_cache)
            return hit

        self._layout = layout
        self.instances = [(SimInstance if s.role == "aggregated" else pd.instance_class(s.role))(
            s, i, layout(s), self.cfg) for i, s in enumerate(instances)]
        by_model: dict[str, list[SimInstance]] = {}  # the instances requests arrive at
        for inst in self.instances:
            if inst.spec.role != "decode":
                by_model.setdefault(inst.spec.model, []).append(inst)
        self.by_model = by_model
        self.routers = {m: SimModelRouter(v) for m, v in by_model.items()}
        # PD: decode routers per (model, region), and the class of a KV transfer's landing
        self.decode_routers: dict[tuple[str, str], SimModelRouter] = {}
        self._landing: type | None = None
        if has_pd:
            self.decode_routers = pd.wire(self.instances, self.routers, catalog)
            self._landing = pd.Landing

    # ---- changes during a run (see "Timers") ----

    def at(self, t: float, fn: Callable[[float], None]) -> None:
        """Call `fn(t)` at simulated time `t` (before or during the run)."""
        timer = Timer(fn)
        if self._heap is None or self._due is None:
            self._timers.append((t, timer))
            return
        other = self._due.get(t)
        if other is None:
            self._due[t] = timer
            heapq.heappush(self._heap, t)
        elif other.__class__ is list:
            other.append(timer)
        else:
            self._due[t] = [other, timer]

    def add_instance(self, spec: InstanceSpec) -> SimInstance:
        """A new instance (idle, in no router: the caller routes to it) that joins the run's
        event heap; its name must be new."""
        if any(i.spec.name == spec.name for i in self.instances):
            raise DeploymentError(f"instance name {spec.name!r} is taken")
        cls = SimInstance if spec.role == "aggregated" else pd.instance_class(spec.role)
        inst = cls(spec, len(self.instances), self._layout(spec), self.cfg)
        peer = self.instances[0]
        inst.heap, inst.due, inst.on_reject = peer.heap, peer.due, peer.on_reject
        self.instances.append(inst)
        return inst

    # ---- router ----

    def route(self, req: Request) -> SimInstance | None:
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
            if len(groups) > 1 and not self._timers:
                return run_in_processes(self, reqs, groups, progress)
            seqs, now, events, steps = self._run(reqs, progress)
            results = request_results(reqs, seqs)
            # freed while the collector is paused, it has half as many new objects to look
            # at when it resumes
            del seqs
        return SimResult(results, self.node_usage(), [i.spec for i in self.instances], now,
                         events, steps)

    def _model_groups(self, reqs: list[Request]) -> list[set[str]]:
        """The models split over `SimConfig.workers` processes (`coral.sim.workers`)."""
        return model_groups(self.routers, self.cfg.workers, reqs)

    def node_usage(self, busy: Mapping[int, list[float]] | None = None) -> list[NodeUsage]:
        """Busy seconds per node (of `busy[instance index]` where given, else as simulated
        here)."""
        nodes = []
        for inst in self.instances:
            acc = inst.busy if busy is None else busy.get(inst.index, inst.busy)
            for (si, ni, node, *_rest) in inst.layout.nodes:
                nodes.append(NodeUsage(inst.spec.name, si, node, acc[ni], inst.spec.role))
        return nodes

    def _run(self, reqs: list[Request], progress: Callable[[float], None] | None
             ) -> tuple[list[Seq | None], float, int, int]:
        """The event loop (see the module docstring for the order of events): each request's
        seq (None: it never arrived), the time of the last event, the event and step counts.
        What runs per event is written inline, as this loop is the simulator's running
        time."""
        horizon = math.inf if self.cfg.horizon_s is None else self.cfg.horizon_s
        heap: list[float] = []
        due: Due = {}
        seqs: list[Seq | None] = [None] * len(reqs)  # by arrival; None: not arrived
        unrouted = Seq(Request(-1, "", 0.0, 1, 1), "")  # stands for "no instance of its model"
        unrouted.status = "rejected"
        events = steps = 0
        now = 0.0
        heappop, heappush = heapq.heappop, heapq.heappush
        routers = self.routers
        landing = self._landing  # None without PD instances: no event is one

        def reject(s: Seq) -> None:
            s.status = "rejected"

        for inst in self.instances:
            inst.heap, inst.due, inst.on_reject = heap, due, reject
        self._heap, self._due = heap, due
        timers, self._timers = self._timers, []
        for t, timer in timers:
            self.at(t, timer.fn)

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
                if inst.__class__ is Timer:
                    inst.fn(t)
                    continue
                step = inst.step
                if inst.step_end != t or step is None:
                    continue  # superseded by a cut
                n = step.n
                steps += n
                acc = inst.busy
                for k, x in step.busy:
                    acc[k] += n * x
                b = step.decode
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
                                if s.off >= 0 and s.fin == f:  # live (see SimInstance)
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
                                    s.end_s = t + s.lag
                for s, k in step.chunks:
                    s.ctx += k
                    inst.kv_used += k
                    if s.ctx >= s.target:
                        del inst.prefilling[s]
                        s.generated += 1
                        if s.first_token_s is None:
                            s.first_token_s = t + s.lag
                        if s.generated >= s.req.output_tokens:
                            del inst.running[s]
                            inst.inflight[inst.slot] -= 1
                            inst.kv_used -= s.ctx
                            s.status = "done"
                            s.end_s = t + s.lag
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
            s = seqs[next_arrival] = Seq(r, inst.spec.name)
            next_arrival += 1
            arrival_t = times[next_arrival]
            # SimInstance.enqueue, inlined: this loop runs once per request
            waiting = inst.waiting
            was_empty = not waiting
            waiting.append(s)
            router.inflight[inst.slot] += 1
            step = inst.step
            if step is None:
                inst.schedule(t)
            else:
                if step.micro_batches > 1:
                    s.lag = inst.launch_lag(t)
                if was_empty and step.n > 1 and len(inst.running) < inst.max_seqs:
                    inst.cut(t)
            if progress is not None and next_arrival % 1024 == 0:
                progress(t)

        if next_arrival:  # arrivals are events too; `now` is the last event's time
            events += next_arrival
            now = max(now, times[next_arrival - 1])
        return seqs, now, events, steps


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


def simulate(instances: Sequence[InstanceSpec], requests: Sequence[Request], *, perf, catalog,
             config: SimConfig | None = None) -> SimResult:
    """One-call form of `Simulator(...).run(requests)`."""
    return Simulator(instances, perf=perf, catalog=catalog, config=config).run(requests)
