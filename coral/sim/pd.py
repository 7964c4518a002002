"""Prefill/decode-disaggregated (PD) serving in the simulator.

A PD model is served by `prefill` and `decode` instances (`InstanceSpec.role`), paired inside a
region as the planner pairs them (`coral.allocator.problem`):

1. A request is routed to a prefill instance by the model's router (the same smooth weighted,
   load-aware round robin as aggregated instances, weighted by planned requests/s). It runs
   its prompt there with chunked prefill and the same step model; a prefill instance's node
   batch counts prompt tokens per iteration (the template's chunk), so its token budget per
   step is that chunk (stages x the smallest stage's), not `SimConfig.max_batched_tokens`.
   The planner pairs the halves per region, so a region serves the smaller of its prefill
   and its decode capacity: the prefill weights of a region whose decode capacity is the
   smaller are scaled down to it, so that regions get traffic in proportion to what they
   serve and no region's decode instances are sent more than they were planned for.
2. The prompt's last chunk emits the first token. A one-token request is done there. Any
   other leaves the prefill instance's batch (its slot is free) and a second router, over the
   model's decode instances *in the prefill instance's region*, picks where it goes (weighted
   by their planned requests/s, load-aware; the request counts in that instance's load from
   now on). Its KV cache (the prompt's tokens) travels there in

       transfer_s = prompt tokens x KV bytes per token / slowest NIC + KV_TRANSFER_LATENCY_S

   with KV bytes per token `2 x layers x kv_dim x dtype bytes` (the model's logical cache, as
   the receiving side lays it out) and the slowest NIC over every node of both instances (a
   pipeline's stages send their layers in parallel, so this overstates a pipeline's transfer
   a little). Each end's NIC moves its transfers one after another, first come first served,
   at its own rate (the sender's NIC is busy `bytes / its bandwidth`, the receiver's likewise),
   and the cache has landed when both ends are through with it: alone, a transfer takes the
   formula above; a prefill instance whose KV output outruns its NIC (or a decode instance fed
   faster than its NIC takes in) builds a queue, and `transfer_s` counts that wait too. So
   each NIC is a resource of its own bandwidth, as the planner caps each half by its own
   (at `headroom.NIC_UTILISATION` of the prompts per second it carries). The prefill
   instance keeps the request's KV blocks until the transfer ends.
3. When the KV lands, the request queues at the decode instance; at the next scheduler step
   it joins the decode batch (FCFS) when a slot is free and the cache holds its prompt plus the
   step's token (else it waits there). A decode instance never prefills a landed request; it
   decodes the remaining `output_tokens - 1` tokens with the same step model and closed-form
   decode runs as an aggregated instance. When its cache cannot take a step's tokens it
   preempts the most recently admitted request, which is then recomputed *there* (prompt and
   tokens so far as a prefill), as vLLM does and as the aggregated engine does: the KV was
   lost on that instance. A prompt larger than a decode instance's whole cache is rejected
   there, as an aggregated instance rejects one.

Latency accounting
    TTFT is measured when the prefill instance emits the first token (the end of the prompt's
    last chunk), as Splitwise and DistServe measure it. The KV transfer and any wait for a
    decode slot fall in the gap between the first and the second token, so they count in TPOT
    (`(end - first token) / (output_tokens - 1)`): a hand-over of `w` seconds adds `w / (O - 1)`
    to that request's TPOT.

    The planner (`coral.allocator.headroom._pd_headroom`) budgets each half against what
    this accounting measures. A prefill instance's queue may take the TTFT slack its prefill
    leaves, less the rest of the round in progress (an arrival waits out the round it came
    in): `TTFT target - (1 + PREFILL_RESIDUAL_ROUNDS) x prefill`. A
    decode instance's queue and the KV transfer share the TPOT slack of the tokens after the
    first, `(O - 1) x (TPOT target - decode step) - transfer`; a decode template whose step
    exceeds the TPOT target is not planned. Each half runs at most `NIC_UTILISATION` of the
    prompts per second its slowest NIC carries. So:

    - TTFT is the prefill wait plus the prefill, within the budget above at planned load: a
      pair bound by either half meets its SLO at planned capacity and not at 130 % of it
      (`tests/test_sim_pd.py`).
    - The decode-side wait and the transfer show in TPOT divided by `O - 1`; both fit the
      decode half's slack at planned load and grow without bound when the decode instances
      (or a NIC) are overloaded, which is how overload of that half shows.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from coral.perf.step import (
    KV_TRANSFER_LATENCY_S,
    StepCost,
    StepModel,
    kv_transfer_bytes,
    slowest_nic_bytes_per_s,
)
from coral.sim.config import SimConfig
from coral.sim.deployment import DeploymentError, InstanceSpec
from coral.sim.routing import SimRouter
from coral.sim.scheduler import NO_CHUNKS, Seq, SimInstance


class Landing:
    """A KV cache in flight from a prefill to a decode instance, due at its heap time."""

    __slots__ = ("seq", "src", "dst")

    def __init__(self, seq: Seq, src: "PrefillInstance", dst: "DecodeInstance"):
        self.seq, self.src, self.dst = seq, src, dst

    def land(self, t: float) -> None:
        """The transfer ends at `t`: the prefill instance frees the request's KV blocks (and
        may now admit a prompt that did not fit), the decode instance queues the request."""
        s, src, dst = self.seq, self.src, self.dst
        src.kv_used -= s.ctx
        if not src.step_n and src.waiting:
            src.schedule(t)
        dst.enqueue(s, t)


class PrefillInstance(SimInstance):
    """A prefill instance: chunked prefill only, its token budget the template's chunk; a
    request whose prompt is done goes on to a decode instance (`hand_over`)."""

    __slots__ = ("decode_router", "kv_arch", "nic", "nic_free")

    def __init__(self, spec: InstanceSpec, index: int, layout: StepModel, cfg: SimConfig):
        super().__init__(spec, index, layout, cfg)
        # the nodes' batches count prompt tokens per iteration: stages x the smallest stage's
        self.max_tokens = self.max_seqs = layout.max_seqs
        self.handoff = self.hand_over
        self.decode_router: SimRouter | None = None  # set by `wire`
        self.kv_arch: Any = None  # the model's architecture (its KV bytes a sequence)
        self.nic = 0.0  # slowest NIC, bytes/s
        self.nic_free = 0.0  # when the NIC has sent every transfer started so far

    def hand_over(self, s: Seq, t: float) -> None:
        """`s` has its first token at `t`: free its slot, pick its decode instance and start
        sending its KV cache (the blocks stay taken here until it lands)."""
        del self.running[s]
        self.inflight[self.slot] -= 1
        router = self.decode_router
        dst = router.pick()
        router.inflight[dst.slot] += 1
        # each NIC sends (receives) its transfers one after another at its own rate; the
        # cache has landed when both ends are through with it
        nbytes = kv_transfer_bytes(self.kv_arch, s.ctx)
        self.nic_free = max(t, self.nic_free) + nbytes / self.nic
        dst.nic_free = max(t, dst.nic_free) + nbytes / dst.nic
        end = max(self.nic_free, dst.nic_free) + KV_TRANSFER_LATENCY_S
        s.decode_instance = dst.spec.name
        s.transfer_s = end - t
        self.push_due(end, Landing(s, self, dst))


class DecodeInstance(SimInstance):
    """A decode instance: requests arrive with their prompt's KV cache and join the decode
    batch directly; only requests preempted here are recomputed in prompt chunks."""

    __slots__ = ("nic", "nic_free")

    def __init__(self, spec: InstanceSpec, index: int, layout: StepModel, cfg: SimConfig):
        super().__init__(spec, index, layout, cfg)
        self.nic = 0.0  # slowest NIC, bytes/s
        self.nic_free = 0.0  # when the NIC has taken in every transfer started so far

    def schedule(self, now: float) -> None:
        """Form the next step from `now` (see `SimInstance.schedule`, which this follows):

        1. preempt while the cache cannot take this step's decode tokens;
        2. landed requests at the head of the queue join the decode batch, FCFS, while a slot
           is free and the cache holds their prompt plus this step's token;
        3. the rest of the token budget recomputes requests preempted here (partial ones
           first, then the queue's head while it is a preempted request that fits);
        4. in fast mode, a pure-decode step that no queued request could join repeats as in
           the aggregated engine. A landed request that could not join now cannot join before
           a sequence finishes (slots and free cache only shrink until then), and a run ends
           at the first finish."""
        running, waiting, kv_cap = self.running, self.waiting, self.kv_cap
        if self.kv_used + self.n_decode > kv_cap and running:
            self.preempt()
        max_seqs = self.max_seqs
        while waiting and len(running) < max_seqs:
            s = waiting[0]
            if s.ctx < s.target:
                break  # preempted here: recomputed below
            if s.ctx + 1 > kv_cap:  # its prompt can never fit, even alone
                waiting.popleft()
                self.inflight[self.slot] -= 1
                self.on_reject(s)
                continue
            if self.kv_used + self.n_decode + s.ctx + 1 > kv_cap:
                break
            waiting.popleft()
            running[s] = None
            self.kv_used += s.ctx
            self.start_decoding(s)
        b = self.n_decode
        kv_used = self.kv_used
        budget = self.max_tokens - b
        free = kv_cap - kv_used - b
        chunks: Sequence[tuple[Seq, int]] = NO_CHUNKS
        p = 0
        if self.prefilling or (waiting and waiting[0].ctx < waiting[0].target):
            chunks = []
            for s in self.prefilling:
                if budget <= 0 or free <= 0:
                    break
                k = min(s.target - s.ctx, budget, free)
                chunks.append((s, k))
                budget -= k
                free -= k
                p += k
            while budget > 0 and waiting and len(running) < max_seqs:
                s = waiting[0]
                need = s.target - s.ctx
                if need <= 0:
                    break  # landed: joins at a later step
                if need + 1 > kv_cap:
                    waiting.popleft()
                    self.inflight[self.slot] -= 1
                    self.on_reject(s)
                    continue
                if need > free:
                    break
                waiting.popleft()
                running[s] = None
                self.prefilling[s] = None
                k = min(need, budget)
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
        m = min(b + len(chunks), self.n_stages)
        cost: StepCost = self.costs.get((p, b, c, m)) or self.layout.step_cost(p, b, c, m)
        n = 1
        if not p and self.closed_form and not self._head_may_join(kv_used):
            fc, fin = self.fin_clocks, self.fin
            while True:  # the first clock with a live entry (dropping stale ones)
                f = fc[0]
                if any(s.off >= 0 and s.fin == f for s in fin[f]):
                    break
                del fc[0]
                del fin[f]
            n = max(1, min(f - self.clock, (kv_cap - kv_used) // b, (c - c_raw) // b + 1))
        dt, self.step_busy = cost
        self.step_start, self.step_dt, self.step_n = now, dt, n
        self.step_decode, self.step_chunks = b, chunks
        self.queue(now + n * dt)

    def _head_may_join(self, kv_used: int) -> bool:
        """Whether the queue's head could join a later step of a run formed now."""
        waiting = self.waiting
        if not waiting or len(self.running) >= self.max_seqs:
            return False
        s = waiting[0]
        if s.ctx >= s.target:
            return False  # landed and did not fit now: not before a sequence finishes
        return kv_used + (s.target - s.ctx) <= self.kv_cap


def instance_class(role: str) -> type[SimInstance]:
    """The instance class of a PD role."""
    if role == "prefill":
        return PrefillInstance
    if role == "decode":
        return DecodeInstance
    raise DeploymentError(f"no PD instance class for role {role!r}")


def wire(instances: Sequence[SimInstance], routers: dict[str, SimRouter],
         catalog: Any) -> dict[tuple[str, str], SimRouter]:
    """Connect a deployment's PD halves: one decode router per (model, region), given to the
    prefill instances of that model and region, with the KV bytes per token and the NIC
    speeds that the transfers take; and the weights of the models' prefill `routers` scaled
    by what their regions serve paired (see the module docstring). A model may also run
    aggregated instances (a `mixed` plan): its router holds them beside its prefill
    instances, each at its planned requests/s, and only the prefill weights are scaled.
    Raises `DeploymentError` when prefill instances have no decode instance in their region,
    or decode instances no prefill instance."""
    roles: dict[str, set[str]] = {}
    decode: dict[tuple[str, str], list[SimInstance]] = {}
    for inst in instances:
        spec = inst.spec
        roles.setdefault(spec.model, set()).add(spec.role)
        if spec.role == "decode":
            decode.setdefault((spec.model, spec.region), []).append(inst)
    for model, rs in sorted(roles.items()):
        if "decode" in rs and "prefill" not in rs:
            raise DeploymentError(
                f"model {model} has decode instances but no prefill instance to feed them")
    decode_routers = {key: SimRouter(v) for key, v in sorted(decode.items())}
    kv_arch = {m: catalog.model(m) for m, rs in roles.items() if "prefill" in rs}
    for inst in instances:
        if isinstance(inst, (PrefillInstance, DecodeInstance)):
            inst.nic = slowest_nic_bytes_per_s(inst.spec.node_types, catalog)
        if isinstance(inst, PrefillInstance):
            spec = inst.spec
            router = decode_routers.get((spec.model, spec.region))
            if router is None:
                where = f"region {spec.region!r}" if spec.region else "its (unnamed) region"
                raise DeploymentError(
                    f"prefill instance {spec.name} of {spec.model} has no decode instance of "
                    f"its model in {where} to hand its requests to")
            inst.decode_router = router
            inst.kv_arch = kv_arch[spec.model]
    for model in kv_arch:
        _pair_weights(routers[model], decode_routers)
    return decode_routers


def _pair_weights(router: SimRouter, decode_routers: Mapping[tuple[str, str], SimRouter]) -> None:
    """Scale a model's prefill weights by `min(1, decode / prefill capacity)` of their region
    (its aggregated instances keep theirs)."""
    prefill: dict[str, float] = {}
    for inst, w in zip(router.insts, router.weights):
        if inst.spec.role == "prefill":
            prefill[inst.spec.region] = prefill.get(inst.spec.region, 0.0) + w
    scale = {}
    for region, total in prefill.items():
        dec = sum(decode_routers[(router.insts[0].spec.model, region)].weights)
        scale[region] = min(1.0, dec / total) if total > 0 else 1.0
    router.weights = [max(w * scale[i.spec.region], 1e-12) if i.spec.role == "prefill" else w
                      for i, w in zip(router.insts, router.weights)]
