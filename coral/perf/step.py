"""How long one step of a pipeline takes, and what a pipeline delivers when busy.

This is the one step model of a running instance: the simulator steps it event by event
(`coral.sim.event_loop`) and the planner sizes templates by it at full occupancy (`saturation`),
so both judge a template the same way.

A step runs the instance's sequences as `m = min(stages, sequences)` equal micro-batches that
flow through the stages; a stage's micro-batch is split over its data-parallel nodes by their
shares; a node's time is the perf model's iteration plus, when it is not the last stage, the
activation send (`tokens x hidden bytes / NIC + NET_LATENCY_S`). With stage times `T_s`, one
step (every micro-batch one token further) lasts `max(sum_s T_s, m * max_s T_s)`: the latency
of the path, or the bottleneck stage busy with every micro-batch (the period of a cyclic
pipeline with `m` identical jobs). `max_seqs = stages x the smallest stage batch`.

Busy, an aggregated instance's steps are not all alike: chunked prefill fills a step's token
budget first come, first served, so steps carry no prompt or a full budget (`prompt_mix`);
`saturation` gives the rate and step both by mean prompts per step (`busy_steps`, what the
template search rates by) and by that mix (what a request at the SLO percentile sees).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np

from coral.perf.pipeline import PipelineShape
from coral.perf.prefill_rounds import busy_prefill

#: Latency of one activation hand-over between two nodes, s (one network hop plus the
#: send/receive software path; approximate, of the order of a TCP/ZeroMQ round on a cloud VPC).
NET_LATENCY_S = 0.5e-3
#: Fixed latency of one KV-cache hand-over from a prefill to a decode instance, s: connection
#: set-up, the connector's control messages and block registration on both sides. An
#: assumption (of the order of a couple of network round trips plus software), not measured.
KV_TRANSFER_LATENCY_S = 1e-3
#: Default token budget of one scheduler step (vLLM's chunked-prefill default order).
DEFAULT_MAX_BATCHED_TOKENS = 2048

#: One step's cost: (step seconds, ((node index, busy seconds), ...) for the busy nodes).
StepCost = tuple[float, tuple[tuple[int, float], ...]]
#: iteration(node_type, layers, prompt tokens, decodes, context tokens, first, last) -> s
IterFn = Callable[[str, int, int, int, int, bool, bool], float]


class StepModelError(ValueError):
    """A pipeline that cannot run (e.g. no room for any KV cache)."""


@dataclass(frozen=True)
class StageNode:
    """One node of a pipeline stage."""

    node_type: str
    first_layer: int
    layers: int
    batch: int  # most sequences the node runs per iteration (the template's choice)
    share: float  # fraction of the stage's sequences and tokens this node takes


@dataclass(frozen=True)
class Stage:
    """Nodes holding the same layers; a micro-batch is split over them by `share`."""

    nodes: tuple[StageNode, ...]

    @property
    def first_layer(self) -> int:
        return self.nodes[0].first_layer

    @property
    def layers(self) -> int:
        return self.nodes[0].layers

    @property
    def batch(self) -> int:
        return sum(n.batch for n in self.nodes)


def stages_from_shape(shape: PipelineShape) -> tuple[Stage, ...]:
    """A pipeline's stages as the step model runs them: each stage's identical nodes share
    its traffic evenly."""
    return tuple(Stage(tuple(StageNode(st.node_type, st.first_layer, st.layers, st.batch,
                                       1.0 / st.count) for _ in range(st.count)))
                 for st in shape.stages)


class StepModel:
    """What instances of the same model and stages share: nodes, KV capacity, step costs."""

    def __init__(self, stages: Sequence[Stage], iteration: IterFn,
                 kv_tokens: Callable[[str, int, bool, bool], int],
                 send: Callable[[str, int], float], name: str = "pipeline"):
        self.iteration, self.send = iteration, send
        self.n_stages = n_st = len(stages)
        self.nodes: list[tuple[int, int, str, int, float, bool, bool]] = []
        cap = math.inf
        for si, st in enumerate(stages):
            first, last = si == 0, si == n_st - 1
            for nd in st.nodes:
                self.nodes.append((si, len(self.nodes), nd.node_type, nd.layers, nd.share,
                                   first, last))
                kv = kv_tokens(nd.node_type, nd.layers, first, last)
                if nd.share > 0:
                    cap = min(cap, kv / nd.share)
        self.kv_cap = int(cap)
        if self.kv_cap < 1:
            raise StepModelError(f"instance {name}: no room for any KV cache")
        self.max_seqs = n_st * min(st.batch for st in stages)
        # (p, b, c, m) -> cost, shared by the copies of a template: a pure function of the
        # stages, looked up once per step and computed once per key
        self.costs: dict[tuple[int, int, int, int], StepCost] = {}

    def step_cost(self, p: int, b: int, c: int, m: int) -> StepCost:
        """Cost of a step with p prompt tokens, b decodes and c decode context tokens (already
        rounded) in m micro-batches."""
        key = (p, b, c, m)
        hit = self.costs.get(key)
        if hit is not None:
            return hit
        pm, bm, cm = micro_batch(p, b, c, m)
        stage_t = [0.0] * self.n_stages
        busy = [0.0] * len(self.nodes)
        for si, ni, node, layers, share, first, last in self.nodes:
            t, it = node_seconds(self.iteration, self.send, node, layers, share, first, last,
                                 pm, bm, cm)
            if t:
                busy[ni] = m * it
                stage_t[si] = max(stage_t[si], t)
        dt = max(sum(stage_t), m * max(stage_t))
        out = (dt, tuple((k, x) for k, x in enumerate(busy) if x))
        self.costs[key] = out
        return out


def micro_batch(p: int, b: int, c: int, m: int) -> tuple[int, int, int]:
    """One of `m` micro-batches of a step of `p` prompt tokens, `b` decodes and `c` context
    tokens (each rounded up)."""
    return -(-p // m), -(-b // m), -(-c // m)


def node_seconds(iteration: IterFn, send: Callable[[str, int], float], node: str, layers: int,
                 share: float, first: bool, last: bool, pm: int, bm: int,
                 cm: int) -> tuple[float, float]:
    """One node's part of a micro-batch of `pm` prompt tokens, `bm` decodes and `cm` context
    tokens: (its time in the stage, send included; its iteration alone), (0, 0) when its
    share is empty. The one place a node's time is costed, for the simulator's steps and the
    template search (`coral.templates.step.search`) alike."""
    return node_part_seconds(iteration, send, node, layers, first, last,
                             *node_part(share, pm, bm, cm))


def node_part(share: float, pm: int, bm: int, cm: int) -> tuple[int, int, int]:
    """A node's part of a micro-batch of `pm` prompt tokens, `bm` decodes and `cm` context
    tokens when it takes `share` of it: (prompt tokens, decodes, context tokens), each
    rounded up."""
    pn, bn = math.ceil(pm * share - 1e-9), math.ceil(bm * share - 1e-9)
    cn = max(bn, math.ceil(cm * share - 1e-9)) if bn else 0
    return pn, bn, cn


def node_part_seconds(iteration: IterFn, send: Callable[[str, int], float], node: str,
                      layers: int, first: bool, last: bool, pn: int, bn: int,
                      cn: int) -> tuple[float, float]:
    """`node_seconds` of a node's part (`node_part`): what it depends on, for callers that
    share the time of one part between several shares of several micro-batches."""
    if pn == 0 and bn == 0:
        return 0.0, 0.0
    it = iteration(node, layers, pn, bn, cn, first, last)
    return (it if last else it + send(node, pn + bn)), it


class IterationCache(dict):
    """Iteration times shared by the step models of many templates (`node_costs`'s
    `iter_cache`): templates of one library share node types and layer splits, so most of an
    instance's iterations are another's. The times are a pure function of their key, so the
    cache empties itself whenever it passes `max_entries` rather than grow with every
    template a scenario holds; a later miss only recomputes."""

    def __init__(self, max_entries: int = 200_000) -> None:
        super().__init__()
        self.max_entries = max_entries

    def __setitem__(self, key: tuple, value: float) -> None:
        if len(self) >= self.max_entries:
            self.clear()
        super().__setitem__(key, value)


def node_costs(model: str, perf: Any, catalog: Any, *, net_latency_s: float = NET_LATENCY_S,
               iter_cache: dict[tuple, float] | None = None
               ) -> tuple[IterFn, Callable[[str, int, bool, bool], int],
                          Callable[[str, int], float]]:
    """(iteration, KV tokens, send) of `model`'s nodes: iteration times from the perf model
    (memoised in `iter_cache`), KV room per node, activation sends over the NIC plus
    `net_latency_s` per hop."""
    arch = catalog.model(model)
    hidden_bytes = arch.hidden_size * arch.dtype_bytes
    cache = {} if iter_cache is None else iter_cache

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
        return perf.max_kv_tokens(model, node, layers, first_stage=first, last_stage=last)

    def send(node: str, tokens: int) -> float:
        nic = catalog.node_type(node).nic_gbps * 1e9 / 8.0
        return tokens * hidden_bytes / nic + net_latency_s

    return iteration, kv_tokens, send


def build_step_model(model: str, stages: Sequence[Stage], perf: Any, catalog: Any, *,
                     net_latency_s: float = NET_LATENCY_S,
                     iter_cache: dict[tuple, float] | None = None,
                     name: str = "pipeline") -> StepModel:
    """The step model of `model` on `stages` (`node_costs` gives its nodes' costs)."""
    iteration, kv_tokens, send = node_costs(model, perf, catalog, net_latency_s=net_latency_s,
                                            iter_cache=iter_cache)
    return StepModel(stages, iteration, kv_tokens, send, name=name)


# ----------------------------------------------------------------- prefill → decode hand-over
def kv_bytes_per_token(arch: Any) -> float:
    """KV-cache bytes of one token over the model's full-attention layers (all of them but
    the sliding-window ones): `2 x layers x kv_dim x dtype`."""
    sliding = arch.sliding_layers_in(0, arch.num_layers) if arch.sliding_window else 0
    return float((arch.num_layers - sliding) * arch.kv_bytes_per_token_per_layer)


def kv_transfer_bytes(arch: Any, tokens: int) -> float:
    """KV-cache bytes of one sequence of `tokens` tokens, what a prefill instance hands over:
    every token in the full-attention layers, the last `sliding_window` in the sliding ones."""
    nbytes = tokens * kv_bytes_per_token(arch)
    if arch.sliding_window:
        window = min(tokens, arch.sliding_window)
        nbytes += (window * arch.sliding_layers_in(0, arch.num_layers)
                   * arch.kv_bytes_per_token_per_layer)
    return nbytes


def slowest_nic_bytes_per_s(node_types: Sequence[str], catalog: Any) -> float:
    """The slowest NIC over an instance's nodes, bytes/s."""
    return min(catalog.node_type(n).nic_gbps for n in node_types) * 1e9 / 8.0


def transfer_seconds(tokens: int, kv_bytes: float, src_nic: float, dst_nic: float) -> float:
    """Seconds to move `tokens` tokens of KV cache (`kv_bytes` each) between two instances
    whose slowest NICs move `src_nic` and `dst_nic` bytes/s."""
    return tokens * kv_bytes / min(src_nic, dst_nic) + KV_TRANSFER_LATENCY_S


# ----------------------------------------------------------------- a busy pipeline
@dataclass(frozen=True)
class Saturation:
    """An instance at full occupancy, under the step model."""

    rps: float  # requests/s of the template's workload mix
    step_s: float  # one step: the TPOT every sequence sees (prefill: a prompt's rounds)
    sequences: int  # sequences in flight (prefill: prompts per round, rounded up)
    #: PD halves: one prompt's KV cache over this instance's slowest NIC, with the fixed
    #: hand-over latency (0 for aggregated instances, which hand nothing over)
    kv_transfer_s: float = 0.0
    #: Aggregated: the mean step and the rate with the prompt chunks the scheduler forms
    #: under a backlog (`prompt_mix`) rather than the mean prompts of `busy_steps`: what a
    #: request sees while the instance is full, as the SLO percentile's requests do when it
    #: runs near its planned rate. None: `step_s` and `rps` (other modes; ratings made
    #: without it)
    chunked_step_s: float | None = None
    chunked_rps: float | None = None

    @property
    def tail_step_s(self) -> float:
        """The step the SLO percentile's requests see: TPOT when the instance is full."""
        return self.step_s if self.chunked_step_s is None else max(self.step_s,
                                                                   self.chunked_step_s)

    @property
    def tail_rps(self) -> float:
        """The rate of a full instance stepping `tail_step_s`."""
        return self.rps if self.chunked_rps is None else min(self.rps, self.chunked_rps)


def busy_steps(mode: str, stages: int, seqs: int, input_tokens: int, output_tokens: int
               ) -> tuple[tuple[float, tuple[int, int, int, int]], ...]:
    """The steps an instance of `stages` stages runs at full occupancy with `seqs` sequences
    (a prefill instance: prompt tokens) in flight, each as (share of the steps, (prompt
    tokens, decodes, context tokens, micro-batches)) — the arguments of
    `StepModel.step_cost`. Every slot decodes, and an aggregated step takes whole prompts,
    `seqs / O` of them on average: a share of steps one more than the rest (chunked prefill
    fills the step's token budget first come, first served). A prefill step is its whole
    token chunk; a decode step has no prompt (prompts are prefilled elsewhere)."""
    i_tok, o_tok = input_tokens, output_tokens
    if mode == "prefill":
        return ((1.0, (seqs, 0, 0, min(stages, -(-seqs // i_tok)))),)
    context = int(seqs * (i_tok + o_tok / 2))
    m = min(stages, seqs)
    if mode == "decode":
        return ((1.0, (0, seqs, context, m)),)
    per_step = seqs / o_tok
    k = math.floor(per_step)
    frac = per_step - k
    steps = ((1.0 - frac, (k * i_tok, seqs, context, m)),)
    if frac > 0:
        steps += ((frac, ((k + 1) * i_tok, seqs, context, m)),)
    return steps


#: Prompt tokens of a busy step are rounded up to a multiple of this (between none and the
#: budget's remainder, which are kept exact) so that a template costs a few dozen steps.
PROMPT_MIX_QUANTUM = 128
#: The prompt mix's chain stops when a step changes no share by more than this.
_MIX_TOL = 1e-7
#: Most steps of the prompt mix's chain (near a full budget it mixes slowly).
_MIX_MAX_STEPS = 5000
#: Carried prompt tokens the chain tracks, in budgets (more is counted as this much).
_MIX_MAX_CARRY = 64
#: Shares below this are dropped from the prompt mix (and the rest renormalised).
_MIX_MIN_SHARE = 1e-5


@lru_cache(maxsize=4096)
def prompt_mix(seqs: int, input_tokens: int, output_tokens: int,
               max_batched_tokens: int) -> tuple[tuple[float, int], ...]:
    """Shares of a busy aggregated instance's steps by prompt tokens, ((share, tokens), ...):
    the steps the scheduler forms under a backlog, where the SLO percentile's requests run.

    Every slot decodes; a sequence finishing frees its slot to the head of the queue, whose
    prompt joins the step's chunks (first come, first served) in the token budget left after
    the decodes, `cap = max_batched_tokens - seqs`; what does not fit waits, as a chunk, for
    the next step. Finishers per step are Poisson with mean `seqs / O` (many sequences at
    every stage of their output), so a step carries `min(carry + F I, cap)` prompt tokens.
    The chain's stationary shares have the mean of `busy_steps` (`seqs I / O` tokens a step)
    but not its steps: a step is cheap with no prompt and dear with a full budget, and the
    step time rises faster than its tokens near a full budget (the matmuls' row tiles and
    waves), so the mean step — every request's TPOT when the instance is full — is longer than the
    step of mean prompts. Tokens between 0 and `cap` are rounded up to `PROMPT_MIX_QUANTUM`,
    and carried chunks to the nearest multiple of it (which bounds the chain's states).
    An approximation of the scheduler with Poisson finishers (fixed output lengths finish in
    step with their admissions, a pattern it does not follow); `busy_steps` when the budget
    cannot take the mean (the budget, not the slots, binds: `busy_rps`)."""
    i_tok, o_tok = input_tokens, output_tokens
    cap = max_batched_tokens - seqs
    lam = seqs / o_tok
    if cap <= 0 or lam * i_tok >= cap:
        return tuple((share, step[0]) for share, step in
                     busy_steps("aggregated", 1, seqs, i_tok, o_tok))
    kmax = int(lam + 10.0 * math.sqrt(lam) + 10.0)
    k = np.arange(kmax + 1)
    pois = np.exp(k * math.log(lam) - lam - np.array([math.lgamma(x + 1) for x in k]))
    q = PROMPT_MIX_QUANTUM
    # carried chunks on a grid of q tokens (nearest), up to _MIX_MAX_CARRY budgets
    n_states = int(_MIX_MAX_CARRY * cap // q) + 1
    total = np.arange(n_states)[:, None] * q + k[None, :] * i_tok
    took = np.minimum(total, cap)
    nxt_state = np.minimum((total - took + q // 2) // q, n_states - 1).ravel()
    carry = np.zeros(n_states)
    carry[0] = 1.0
    for _ in range(_MIX_MAX_STEPS):
        new = np.bincount(nxt_state, weights=(carry[:, None] * pois[None, :]).ravel(),
                          minlength=n_states)
        delta = float(np.abs(new - carry).sum())
        carry = new
        if delta < _MIX_TOL:
            break
    weights = (carry[:, None] * pois[None, :]).ravel()
    grid = np.where((took > 0) & (took < cap), np.minimum(cap, -(-took // q) * q), took).ravel()
    shares: dict[int, float] = {}
    for p, w in zip(grid.tolist(), weights.tolist()):
        shares[p] = shares.get(p, 0.0) + w
    kept = {p: w for p, w in shares.items() if w >= _MIX_MIN_SHARE}
    total_w = sum(kept.values())
    return tuple((w / total_w, p) for p, w in sorted(kept.items()))


#: Busy slots the chunked step is averaged over, in square roots of the slots below full:
#: `BUSY_BAND_POINTS` occupancies from `slots - BUSY_BAND_SQRTS * sqrt(slots)` to `slots`.
BUSY_BAND_SQRTS = 2.0
BUSY_BAND_POINTS = 5


def busy_band(seqs: int) -> tuple[int, ...]:
    """The occupancies a busy instance of `seqs` slots steps at near its planned rate.

    An instance planned so that few requests wait for a slot runs in the square-root
    staffing regime (Halfin-Whitt): its busy slots sit within a few square roots of the
    slots below full, not at full. The occupancy matters beyond the decodes it adds: the
    token budget left to prompt chunks is what the decodes leave, so a step slightly below
    full takes a few more prompt tokens, and the step's cost is a staircase in tokens (the
    matmuls' row tiles and waves), so pricing only at full can land on a cheap stair the
    instance rarely steps on."""
    width = BUSY_BAND_SQRTS * math.sqrt(seqs)
    band = {max(1, int(round(seqs - width * k / (BUSY_BAND_POINTS - 1))))
            for k in range(BUSY_BAND_POINTS)}
    return tuple(sorted(band, reverse=True))


def busy_band_step(layout: StepModel, seqs: int, input_tokens: int, output_tokens: int,
                   max_batched_tokens: int) -> float:
    """The step a busy aggregated instance is rated by: the prompt mix the scheduler forms
    (`prompt_mix`) at each occupancy of `busy_band`, each priced with that many decodes and
    their context; the dearer of the mean over the band (the steps its slots turn over at
    near its planned rate) and the step at full occupancy (what the SLO percentile's
    requests see for TPOT while it is full)."""
    steps = []
    for d in busy_band(seqs):
        context, m = int(d * (input_tokens + output_tokens / 2)), min(layout.n_stages, d)
        steps.append(sum(share * layout.step_cost(p, d, context, m)[0] for share, p in
                         prompt_mix(d, input_tokens, output_tokens, max_batched_tokens)))
    return max(steps[0], sum(steps) / len(steps))  # busy_band starts at full


def busy_rps(mode: str, seqs: int, step_s: float, input_tokens: int, output_tokens: int,
             max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS) -> float:
    """Requests/s of a busy instance whose mean step (`busy_steps`) lasts `step_s`: a
    prefill instance finishes `seqs / I` prompts a step, a decoding one `seqs / O` requests;
    an aggregated step's token budget holds every decoding sequence's token and then prompt
    chunks, and a request spends `I + O` budget tokens, so no more than `budget / ((I + O)
    step)` requests/s get through, however many slots there are."""
    if mode == "prefill":
        return seqs / (input_tokens * step_s)
    rps = seqs / (output_tokens * step_s)
    if mode == "decode":
        return rps
    return min(rps, max_batched_tokens / ((input_tokens + output_tokens) * step_s))


def saturation(model: str, mode: str, shape: PipelineShape, *, input_tokens: int,
               output_tokens: int, perf: Any, catalog: Any,
               max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
               iter_cache: dict[tuple, float] | None = None) -> Saturation:
    """The rate and step of one instance of `shape` at full occupancy, in any mode: every
    slot decoding, `b / O` whole prompts per step on average (mean request shapes; an
    approximation of a busy steady state), within the scheduler's token budget per step.

    A prefill instance busy runs rounds of up to its token chunk (stages x the smallest
    stage's batch, which counts prompt tokens) as far as its KV cache, still holding the last
    round's prompts while their transfers run, lets it (`busy_prefill`: its rate, and a
    prompt's time in its rounds as `step_s`); a decode instance busy runs every slot
    decoding with no prompt in its steps, so it serves `b / (O x step)` requests/s at TPOT
    `step`. An aggregated instance's rate and step are also given with the prompt chunks the
    scheduler forms (`prompt_mix`; `chunked_step_s`, `chunked_rps`): the template search
    rates by the mean prompts, the planner judges TPOT at the SLO percentile by the chunked
    step.
    `iter_cache`: iteration times shared with other templates' step models (`IterationCache`).
    """
    layout = build_step_model(model, stages_from_shape(shape), perf, catalog,
                              iter_cache=iter_cache)
    b = layout.max_seqs
    i_tok, o_tok = input_tokens, output_tokens
    kv_s = 0.0
    if mode in ("prefill", "decode"):
        nic = slowest_nic_bytes_per_s(shape.node_types(), catalog)
        kv_bytes = kv_transfer_bytes(catalog.model(model), i_tok)
        kv_s = transfer_seconds(1, kv_bytes, nic, nic)
    if mode == "prefill":
        busy = busy_prefill(layout, i_tok, kv_bytes / nic, KV_TRANSFER_LATENCY_S)
        return Saturation(rps=busy.rps, step_s=busy.service_s,
                          sequences=math.ceil(busy.prompts_per_round), kv_transfer_s=kv_s,
                          chunked_step_s=busy.service_s, chunked_rps=busy.rps)
    dt = 0.0
    for share, step in busy_steps(mode, layout.n_stages, b, i_tok, o_tok):
        dt += share * layout.step_cost(*step)[0]
    rps = busy_rps(mode, b, dt, i_tok, o_tok, max_batched_tokens)
    chunked_step, chunked_rps = dt, rps
    if mode == "aggregated":
        chunked_step = busy_band_step(layout, b, i_tok, o_tok, max_batched_tokens)
        chunked_rps = busy_rps(mode, b, chunked_step, i_tok, o_tok, max_batched_tokens)
    return Saturation(rps=rps, step_s=dt, sequences=b, kv_transfer_s=kv_s,
                      chunked_step_s=chunked_step, chunked_rps=chunked_rps)


def template_saturation(template: Any, *, perf: Any, catalog: Any,
                        max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
                        iter_cache: dict[tuple, float] | None = None
                        ) -> Saturation | None:
    """`saturation` of one instance of a template (`coral.templates.builder.build.Template`); None
    for an infeasible template or one that is not one pipeline."""
    if not template.feasible or not template.is_pipeline:
        return None
    return saturation(template.model, template.mode, template.shape,
                      input_tokens=template.slo.input_tokens,
                      output_tokens=template.slo.output_tokens, perf=perf, catalog=catalog,
                      max_batched_tokens=max_batched_tokens, iter_cache=iter_cache)
