"""The simulator's speed shortcuts change no result.

`Reference` below is the straightforward form of the simulator's model, kept as an oracle: one
heap of `(time, priority, seq)` events with arrivals on it, a step object per step, the
router's weighted round robin as a loop over the instances with the queue scans written out,
finishing sequences in a heap of `(clock, id, epoch, seq)`, and frozen results built as they
happen. The engine (`coral.sim.event_loop`) inlines, memoises and restructures all of that for
speed; here both run the same random small deployments and workloads and must agree exactly:
every request's outcome and times, each node's busy seconds, and the event and step counts.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque

import numpy as np
import pytest

from coral.perf.model import PerfModel
from coral.sim import InstanceSpec, Request, SimConfig, Simulator, synthetic
from coral.sim.deployment import stages_from_nodes
from coral.routing import LOAD_SLACK, swrr_picks
from coral.sim.event_loop import ARRIVAL, STEP_DONE
from coral.sim.workload import merge
from coral.templates.space.operating_points import NET_LATENCY_S

MODELS = ("llama-3.1-8b", "qwen3-14b")


# ---------------------------------------------------------------------------------------------
# The oracle
# ---------------------------------------------------------------------------------------------


class _RSeq:
    def __init__(self, req):
        self.req, self.target, self.ctx, self.generated = req, req.prompt_tokens, 0, 0
        self.first_token_s, self.preemptions, self.off, self.epoch = None, 0, -1, 0
        self.lag = 0.0  # micro-batch launches waited for past the step boundary, s


class _RStep:
    def __init__(self, start, dt, n, decode, chunks, busy, version, m):
        self.start, self.dt, self.n, self.decode = start, dt, n, decode
        self.chunks, self.busy, self.version, self.m = chunks, busy, version, m

    def lag(self, t):
        """An arrival at `t` waits for the launches of this step's micro-batches gone by."""
        if self.m < 2:
            return 0.0
        phase = (t - self.start) / self.dt
        return int((phase - int(phase)) * self.m) * self.dt / self.m


class _RInstance:
    def __init__(self, spec, index, perf, cat, cfg):
        self.spec, self.index, self.cfg, self.perf, self.cat = spec, index, cfg, perf, cat
        arch = cat.model(spec.model)
        self.hidden_bytes = arch.hidden_size * arch.dtype_bytes
        n_st = len(spec.stages)
        self.nodes = []
        cap = math.inf
        for si, st in enumerate(spec.stages):
            first, last = si == 0, si == n_st - 1
            for nd in st.nodes:
                self.nodes.append((si, len(self.nodes), nd.node_type, nd.layers, nd.share,
                                   first, last))
                kv = perf.max_kv_tokens(spec.model, nd.node_type, nd.layers, first_stage=first,
                                        last_stage=last)
                if nd.share > 0:
                    cap = min(cap, kv / nd.share)
        self.kv_cap = int(cap)
        self.max_seqs = n_st * min(st.batch for st in spec.stages)
        self.max_tokens = max(cfg.max_batched_tokens, 1)
        self.waiting, self.running, self.prefilling = deque(), {}, {}
        self.clock = self.n_decode = self.ctx_base = self.kv_used = self.version = 0
        self.finish_heap = []
        self.step = None
        self.busy = [0.0] * len(self.nodes)

    def qctx(self, c):
        nb = self.cfg.context_buckets
        if nb <= 0 or c <= nb:
            return c
        q = max(1, (1 << (c.bit_length() - 1)) // nb)
        return -(-c // q) * q

    def step_cost(self, p, b, c, seqs):
        m = max(1, min(len(self.spec.stages), seqs))
        pm, bm, cm = -(-p // m), -(-b // m), -(-c // m)
        stage_t = [0.0] * len(self.spec.stages)
        busy = [0.0] * len(self.nodes)
        lat = NET_LATENCY_S if self.cfg.net_latency_s is None else self.cfg.net_latency_s
        for si, ni, node, layers, share, first, last in self.nodes:
            pn, bn = math.ceil(pm * share - 1e-9), math.ceil(bm * share - 1e-9)
            if pn == 0 and bn == 0:
                continue
            cn = max(bn, math.ceil(cm * share - 1e-9)) if bn else 0
            t = self.perf.iteration_seconds(self.spec.model, node, layers, pn, bn, cn,
                                            first_stage=first, last_stage=last)
            busy[ni] = m * t
            if not last:
                nic = self.cat.node_type(node).nic_gbps * 1e9 / 8.0
                t += (pn + bn) * self.hidden_bytes / nic + lat
            stage_t[si] = max(stage_t[si], t)
        return max(sum(stage_t), m * max(stage_t)), busy

    def can_admit_head(self):
        if not self.waiting or len(self.running) >= self.max_seqs:
            return False
        s = self.waiting[0]
        return self.kv_used + (s.target - s.ctx) <= self.kv_cap

    def start_decode(self, s):
        s.off = self.clock
        self.n_decode += 1
        self.ctx_base += s.ctx - s.off
        heapq.heappush(self.finish_heap, (self.clock + s.req.output_tokens - s.generated,
                                          s.req.id, s.epoch, s))

    def materialise(self, s):
        d = self.clock - s.off
        self.ctx_base -= s.ctx - s.off
        s.ctx += d
        s.generated += d
        s.off = -1
        self.n_decode -= 1

    def next_finish(self):
        h = self.finish_heap
        while h and (h[0][2] != h[0][3].epoch or h[0][3].off < 0):
            heapq.heappop(h)
        return h[0][0] - self.clock

    def pop_finished(self):
        h, out = self.finish_heap, []
        while h and h[0][0] <= self.clock:
            _, _, epoch, s = heapq.heappop(h)
            if epoch == s.epoch and s.off >= 0:
                out.append(s)
        return out

    def schedule(self, now, on_reject):
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
        chunks = []
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
            if need + 1 > self.kv_cap:
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
        c = self.qctx(c_raw)
        dt, busy = self.step_cost(p, b, c, b + len(chunks))
        n = 1
        if self.cfg.mode == "fast" and p == 0 and self.cfg.context_buckets > 0 \
                and not self.can_admit_head():
            n = max(1, min(self.next_finish(), (self.kv_cap - self.kv_used) // b,
                           (c - c_raw) // b + 1))
        self.version += 1
        m = max(1, min(len(self.spec.stages), b + len(chunks)))
        self.step = _RStep(now, dt, n, b, chunks, busy, self.version, m)
        return self.step


class Reference:
    """The simulator without its speed shortcuts (see the module docstring)."""

    def __init__(self, specs, perf, cat, cfg):
        self.cfg = cfg
        self.instances = [_RInstance(s, i, perf, cat, cfg) for i, s in enumerate(specs)]
        self.by_model = {}
        for inst in self.instances:
            self.by_model.setdefault(inst.spec.model, []).append(inst)
        self.swrr = {m: [0.0] * len(v) for m, v in self.by_model.items()}

    def route(self, req):
        """The runtime's router (`coral.routing`) written out: skip the instances queueing
        (in flight beyond their slots) more than `LOAD_SLACK` requests above, and more than
        twice, their fair count at the least queued instance's queue per unit weight;
        weighted round robin over the rest."""
        insts = self.by_model.get(req.model)
        if not insts:
            return None
        cur = self.swrr[req.model]
        weights = [max(i.spec.weight, 1e-12) for i in insts]
        load = [max(len(i.waiting) + len(i.running) - i.max_seqs, 0) for i in insts]
        j = min(range(len(insts)), key=lambda k: (load[k] / weights[k], k))
        eligible = []
        for k in range(len(insts)):
            fair = load[j] * (weights[k] / weights[j])
            if load[k] <= fair + max(LOAD_SLACK, fair):
                eligible.append(k)
        best = eligible[0]
        for k in eligible:
            cur[k] += weights[k]
            if cur[k] > cur[best]:
                best = k
        cur[best] -= sum(weights[k] for k in eligible)
        return insts[best]

    def run(self, requests):
        reqs = sorted(requests, key=lambda r: (r.arrival_s, r.id))
        horizon = self.cfg.horizon_s
        heap, seq, results, where = [], 0, {}, {}
        events = steps = 0
        now = 0.0

        def row(r, inst_name, status, s, end):
            return (r.id, r.model, inst_name, r.arrival_s, r.prompt_tokens, r.output_tokens,
                    status, s.first_token_s if s else None, end, s.preemptions if s else 0)

        def start_step(inst, t):
            nonlocal seq

            def reject(s):
                results[s.req.id] = row(s.req, inst.spec.name, "rejected", s, None)

            st = inst.schedule(t, reject)
            if st is not None:
                heapq.heappush(heap, (t + st.n * st.dt, STEP_DONE, seq, inst.index, st.version))
                seq += 1

        nxt = 0
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
                r = reqs[nxt]
                nxt += 1
                if nxt < len(reqs):
                    heapq.heappush(heap, (reqs[nxt].arrival_s, ARRIVAL, seq, -1, 0))
                    seq += 1
                inst = self.route(r)
                if inst is None:
                    results[r.id] = row(r, "", "rejected", None, None)
                    continue
                where[r.id] = inst.spec.name
                was_empty = not inst.waiting
                rs = _RSeq(r)
                inst.waiting.append(rs)
                st = inst.step
                if st is not None:
                    rs.lag = st.lag(t)
                if st is None:
                    start_step(inst, t)
                elif st.n > 1 and was_empty and len(inst.running) < inst.max_seqs:
                    k = min(st.n, int((t - st.start) / st.dt) + 1)
                    if k < st.n:
                        inst.version += 1
                        st.n, st.version = k, inst.version
                        heapq.heappush(heap, (st.start + k * st.dt, STEP_DONE, seq, inst.index,
                                              st.version))
                        seq += 1
                continue
            inst = self.instances[idx]
            st = inst.step
            if st is None or st.version != version:
                continue
            steps += st.n
            for k, b in enumerate(st.busy):
                if b:
                    inst.busy[k] += st.n * b
            if st.decode:
                inst.clock += st.n
                inst.kv_used += st.decode * st.n
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
                        s.first_token_s = t + s.lag
                    if s.generated >= s.req.output_tokens:
                        done.append(s)
                    else:
                        inst.start_decode(s)
            for s in done:
                del inst.running[s.req.id]
                inst.kv_used -= s.ctx
                results[s.req.id] = row(s.req, inst.spec.name, "done", s, t + s.lag)
            inst.step = None
            start_step(inst, t)
        inflight = {s.req.id: s for inst in self.instances
                    for s in (*inst.running.values(), *inst.waiting)}
        out = []
        for r in reqs:
            if r.id not in results:
                results[r.id] = row(r, where.get(r.id, ""), "unfinished", inflight.get(r.id),
                                    None)
            out.append(results[r.id])
        busy = [b for inst in self.instances for b in inst.busy]
        return out, busy, now, events, steps


# ---------------------------------------------------------------------------------------------
# Random small cases
# ---------------------------------------------------------------------------------------------

NODES = ("1x-l4", "1x-a10g", "1x-l40s")


def random_spec(rng: random.Random, model: str, name: str, cat) -> InstanceSpec:
    """A random instance of `model` whose every node has room for some KV cache."""
    perf = PerfModel(cat)
    while True:
        spec = _draw_spec(rng, model, name, cat)
        if all(perf.max_kv_tokens(model, n.node_type, n.layers, first_stage=si == 0,
                                  last_stage=si == len(spec.stages) - 1) > 0
               for si, st in enumerate(spec.stages) for n in st.nodes):
            return spec


def _draw_spec(rng: random.Random, model: str, name: str, cat) -> InstanceSpec:
    layers = cat.model(model).num_layers
    n_stages = rng.choice((1, 1, 2))
    cut = rng.randint(layers // 3, 2 * layers // 3)
    ranges = [(0, layers)] if n_stages == 1 else [(0, cut), (cut, layers - cut)]
    nodes = []
    for first, count in ranges:
        for _ in range(rng.choice((1, 1, 2))):  # data-parallel copies now and then
            nodes.append((rng.choice(NODES), first, count, rng.choice((2, 4, 16, 64)),
                          rng.choice((1.0, 1.0, 2.0, 3.0))))
    weight = rng.choice((1.0, 1.0, 2.0, rng.uniform(0.5, 4.0)))  # equal weights: SWRR ties
    return InstanceSpec(name, model, stages_from_nodes(nodes), weight, 1.0)


def random_case(seed: int, cat):
    rng = random.Random(seed)
    models = MODELS[:rng.choice((1, 2))]
    specs = [random_spec(rng, m, f"{m}#{k}", cat) for m in models
             for k in range(rng.randint(1, 4))]
    parts = []
    for k, m in enumerate(models + ("unserved-model",) * rng.choice((0, 1))):
        parts.append(synthetic(
            m, rate_rps=rng.uniform(1.0, 12.0), duration_s=rng.uniform(5.0, 25.0),
            seed=seed * 10 + k, prompt_tokens=rng.choice((64, 700, 3000)),
            output_tokens=rng.choice((1, 40, 300)), length_dist="lognormal",
            sigma=rng.choice((0.3, 1.5)), process=rng.choice(("poisson", "gamma")),
            cv=rng.choice((1.0, 3.0))))
    reqs = merge(*parts)
    if rng.random() < 0.3:  # requests arriving together: ties everywhere
        reqs = [Request(r.id, r.model, round(r.arrival_s, 0), r.prompt_tokens, r.output_tokens)
                for r in reqs]
    if rng.random() < 0.2:  # a prompt no cache can hold: rejected
        reqs.append(Request(len(reqs), models[0], 1.0, 10**7, 5))
    cfg = SimConfig(mode=rng.choice(("fast", "fast", "naive")),
                    max_batched_tokens=rng.choice((2048, 2048, 256)),
                    context_buckets=rng.choice((32, 32, 4, 0)),
                    horizon_s=rng.choice((None, None, rng.uniform(3.0, 30.0))))
    return specs, reqs, cfg


@pytest.mark.parametrize("seed", range(24))
def test_engine_equals_the_straightforward_simulator(seed, cat, perf):
    """Guards every speed shortcut of the engine (inlined scheduling, shared step-cost memo,
    float step-end heap with ties in push order, arrivals off the heap, block-drawn round
    robin, kept load counts, results built at the end): same results, bit for bit."""
    specs, reqs, cfg = random_case(seed, cat)
    got = Simulator(specs, perf=perf, catalog=cat, config=cfg).run(reqs)
    want, busy, end_s, events, steps = Reference(specs, perf, cat, cfg).run(reqs)
    assert [tuple(r) for r in got.requests] == want
    assert [n.busy_s for n in got.nodes] == busy
    assert (got.end_s, got.events, got.steps) == (end_s, events, steps)


def test_random_cases_cover_the_rare_paths(cat, perf):
    """The random cases above do reach preemption, rejection, horizon cuts and both modes."""
    seen = set()
    for seed in range(24):
        specs, reqs, cfg = random_case(seed, cat)
        res = Simulator(specs, perf=perf, catalog=cat, config=cfg).run(reqs)
        seen.add(cfg.mode)
        seen |= {r.status for r in res.requests}
        if any(r.preemptions for r in res.requests):
            seen.add("preempted")
    assert {"fast", "naive", "done", "rejected", "unfinished", "preempted"} <= seen


def test_swrr_picks_numpy_and_python_paths_agree_across_blocks():
    rng = random.Random(3)
    for n in (1, 3, 17, 60):
        weights = [rng.choice((2.653438578656314, 5.802305527480194, rng.uniform(0.1, 9)))
                   for _ in range(n)]
        # the reference: the loop the router used to run per arrival
        cur, want = [0.0] * n, []
        for _ in range(2000):
            best = 0
            for k, w in enumerate(weights):
                cur[k] += w
                if cur[k] > cur[best]:
                    best = k
            cur[best] -= sum(weights)
            want.append(best)
        state, got = [0.0] * n, []
        for size in (1, 700, 512, 787):  # blocks carry the state over
            got += swrr_picks(weights, state, size)
        assert got == want and state == cur


def test_router_load_counts_match_the_queues(cat, perf):
    """The router's kept (waiting + running) counts equal the queues, mid-run (horizon)."""
    specs, reqs, _ = random_case(5, cat)
    reqs = synthetic(MODELS[0], rate_rps=40.0, duration_s=20, seed=2, prompt_tokens=2000,
                     output_tokens=300)
    specs = [random_spec(random.Random(k), MODELS[0], f"i{k}", cat) for k in range(4)]
    sim = Simulator(specs, perf=perf, catalog=cat, config=SimConfig(horizon_s=15.0))
    sim.run(reqs)
    for router in sim.routers.values():
        assert router.inflight == [len(i.waiting) + len(i.running) for i in router.insts]
    assert sum(router.inflight) > 0


def test_unsorted_requests_are_sorted_and_duplicates_refused(cat, perf):
    specs = [random_spec(random.Random(1), MODELS[0], "a", cat)]
    reqs = synthetic(MODELS[0], rate_rps=5.0, duration_s=10, seed=4)
    shuffled = reqs[:]
    random.Random(0).shuffle(shuffled)
    a = Simulator(specs, perf=perf, catalog=cat).run(reqs)
    b = Simulator(specs, perf=perf, catalog=cat).run(shuffled)
    assert a.requests == b.requests
    # ties in time are ordered by id, whatever the ids' order in the list
    tied = [Request(9, MODELS[0], 1.0, 10, 2), Request(4, MODELS[0], 1.0, 10, 2)]
    assert [r.id for r in Simulator(specs, perf=perf, catalog=cat).run(tied).requests] == [4, 9]
    with pytest.raises(ValueError, match="unique"):
        Simulator(specs, perf=perf, catalog=cat).run([reqs[0], reqs[0]])


def test_results_are_immutable_named_records(cat, perf):
    specs = [random_spec(random.Random(1), MODELS[0], "a", cat)]
    r = Simulator(specs, perf=perf, catalog=cat).run([Request(0, MODELS[0], 0.5, 100, 9)])
    r = r.requests[0]
    assert (r.status, r.instance) == ("done", "a")
    assert r.ttft_s == pytest.approx(r.first_token_s - 0.5)
    assert r.tpot_s == pytest.approx((r.end_s - r.first_token_s) / 8)
    with pytest.raises(AttributeError):
        r.status = "rejected"
    assert np.isfinite(r.end_s)


@pytest.mark.parametrize("seed", [0, 7, 11])
def test_worker_processes_give_the_same_results(seed, cat, perf):
    """Guards `SimConfig.workers`: models simulated in forked processes come out as in one
    (requests, node busy times, end time, event and step counts), horizon included."""
    rng = random.Random(seed)
    specs = [random_spec(rng, m, f"{m}#{k}", cat) for m in MODELS for k in range(2)]
    parts = [synthetic(m, rate_rps=6.0, duration_s=20, seed=seed + k, prompt_tokens=900,
                       output_tokens=120, length_dist="lognormal")
             for k, m in enumerate(MODELS + ("unserved-model",))]
    reqs = merge(*parts)
    for horizon in (None, 12.0):
        one = Simulator(specs, perf=perf, catalog=cat,
                        config=SimConfig(horizon_s=horizon)).run(reqs)
        two = Simulator(specs, perf=perf, catalog=cat,
                        config=SimConfig(horizon_s=horizon, workers=2)).run(reqs)
        assert two.requests == one.requests
        assert [n.busy_s for n in two.nodes] == [n.busy_s for n in one.nodes]
        assert (two.end_s, two.events, two.steps) == (one.end_s, one.events, one.steps)
    assert {r.status for r in one.requests} >= {"done", "rejected", "unfinished"}


def test_workers_split_models_by_request_count(cat, perf):
    specs = [random_spec(random.Random(k), m, f"{m}#{k}", cat)
             for k, m in enumerate(MODELS)]
    sim = Simulator(specs, perf=perf, catalog=cat, config=SimConfig(workers=4))
    reqs = [Request(k, MODELS[1] if k % 3 == 0 else MODELS[0], 0.1 * k, 10, 2) for k in range(30)]
    groups = sim._model_groups(reqs)
    assert sorted(map(sorted, groups)) == [[MODELS[0]], [MODELS[1]]]  # at most one per model
    assert len(Simulator(specs, perf=perf, catalog=cat)._model_groups(reqs)) == 1
    with pytest.raises(ValueError, match="workers must be >= 1"):
        SimConfig(workers=0)


def test_a_failing_worker_is_reported(cat, perf, monkeypatch):
    import os

    parent = os.getpid()
    run = Simulator._run

    def failing(self, reqs, progress):
        if os.getpid() != parent:
            raise RuntimeError("boom")
        return run(self, reqs, progress)

    monkeypatch.setattr(Simulator, "_run", failing)
    specs = [random_spec(random.Random(k), m, f"{m}#{k}", cat) for k, m in enumerate(MODELS)]
    reqs = merge(*(synthetic(m, rate_rps=2.0, duration_s=5, seed=k) for k, m in enumerate(MODELS)))
    sim = Simulator(specs, perf=perf, catalog=cat, config=SimConfig(workers=2))
    with pytest.raises(RuntimeError, match="worker .* failed: RuntimeError: boom"):
        sim.run(reqs)
