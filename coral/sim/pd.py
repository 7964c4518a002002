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
   now on; once its KV has landed, it is queued at the prefill instance too until the
   decode instance takes it in: see "Back-pressure" below). Its KV cache (the prompt's tokens) travels there in

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

Back-pressure
    A region's decode instances can fall behind what its prefill instances send them (a
    decode GPU slower than modelled, a region whose share of the model's traffic is above
    what its decode half was planned for). The model's router sees only its own candidates'
    queues, so a request whose KV has landed and that waits for a decode slot counts as
    queued at the prefill instance that handed it over (`Seq.held_by`,
    `PrefillInstance.held`, the router's `backlog`) until its decode instance admits it to
    the decode batch (or rejects it). While a region's decode instances queue, its prefill
    instances are skipped by the router's overload rule (`coral.routing`), which sends new
    prompts to the model's other regions and aggregated instances, as a gateway that counts
    a request until it is decoding would. At planned load a landed request joins the next
    decode step, so the backlog is near zero.

Latency accounting
    TTFT is measured when the prefill instance emits the first token (the end of the prompt's
    last chunk), as Splitwise and DistServe measure it. The KV transfer and any wait for a
    decode slot fall in the gap between the first and the second token, so they count in TPOT
    (`(end - first token) / (output_tokens - 1)`): a hand-over of `w` seconds adds `w / (O - 1)`
    to that request's TPOT.

    The planner (`coral.allocator.scenario.headroom._pd_headroom`) budgets each half against what
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
    StepModel,
    kv_transfer_bytes,
    slowest_nic_bytes_per_s,
)
from coral.sim.config import SimConfig
from coral.sim.deployment import DeploymentError, InstanceSpec
from coral.sim.model_router import SimModelRouter
from coral.sim.scheduler import Seq, SimInstance


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
        if src.step is None and src.waiting:
            src.schedule(t)
        s.held_by = src  # queued at `src` until `dst` takes it in ("Back-pressure")
        src.held += 1
        src.router.backlog[src.slot] += 1
        dst.enqueue(s, t)


class PrefillInstance(SimInstance):
    """A prefill instance: chunked prefill only, its token budget the template's chunk; a
    request whose prompt is done goes on to a decode instance (`hand_over`)."""

    __slots__ = ("decode_router", "kv_arch", "nic", "nic_free", "held")
    lags_launches = False

    def __init__(self, spec: InstanceSpec, index: int, layout: StepModel, cfg: SimConfig):
        super().__init__(spec, index, layout, cfg)
        # the nodes' batches count prompt tokens per iteration: stages x the smallest stage's
        self.max_tokens = self.max_seqs = layout.max_seqs
        self.handoff = self.hand_over
        self.decode_router: SimModelRouter | None = None  # set by `wire`
        self.kv_arch: Any = None  # the model's architecture (its KV bytes a sequence)
        self.nic = 0.0  # slowest NIC, bytes/s
        self.nic_free = 0.0  # when the NIC has sent every transfer started so far
        self.held = 0  # handed-over requests waiting for a decode slot (`release`)

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


def release(s: Seq) -> None:
    """`s` leaves the backlog of the prefill instance that handed it over (if it is in one):
    its decode instance took it in, rejected it, or it is routed afresh."""
    src = s.held_by
    if src is not None:
        s.held_by = None
        src.held -= 1
        src.router.backlog[src.slot] -= 1


class DecodeInstance(SimInstance):
    """A decode instance: requests arrive with their prompt's KV cache and join the decode
    batch directly (`admit_landed`, before `SimInstance.schedule` forms each step); only
    requests preempted here are recomputed in prompt chunks."""

    __slots__ = ("nic", "nic_free")
    lags_launches = False
    takes_landed = True

    def __init__(self, spec: InstanceSpec, index: int, layout: StepModel, cfg: SimConfig):
        super().__init__(spec, index, layout, cfg)
        self.nic = 0.0  # slowest NIC, bytes/s
        self.nic_free = 0.0  # when the NIC has taken in every transfer started so far

    def admit_landed(self) -> None:
        """Landed requests at the head of the queue join the decode batch, FCFS, while a slot
        is free and the cache holds their prompt plus this step's token (a prompt larger
        than the whole cache is rejected); a request preempted here, at the head, waits for
        `SimInstance.schedule` to recompute it in prompt chunks."""
        running, waiting, kv_cap = self.running, self.waiting, self.kv_cap
        max_seqs = self.max_seqs
        while waiting and len(running) < max_seqs:
            s = waiting[0]
            if s.ctx < s.target:
                break  # preempted here: recomputed as a prompt
            if s.ctx + 1 > kv_cap:  # its prompt can never fit, even alone
                waiting.popleft()
                self.inflight[self.slot] -= 1
                release(s)
                self.on_reject(s)
                continue
            if self.kv_used + self.n_decode + s.ctx + 1 > kv_cap:
                break
            waiting.popleft()
            release(s)
            running[s] = None
            self.kv_used += s.ctx
            self.start_decoding(s)


def instance_class(role: str) -> type[SimInstance]:
    """The instance class of a PD role."""
    if role == "prefill":
        return PrefillInstance
    if role == "decode":
        return DecodeInstance
    raise DeploymentError(f"no PD instance class for role {role!r}")


def wire(instances: Sequence[SimInstance], routers: dict[str, SimModelRouter],
         catalog: Any) -> dict[tuple[str, str], SimModelRouter]:
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
    decode_routers = {key: SimModelRouter(v) for key, v in sorted(decode.items())}
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


def _pair_weights(router: SimModelRouter,
                  decode_routers: Mapping[tuple[str, str], SimModelRouter]) -> None:
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
