"""Saturated rate of a template as the simulator runs it, in closed form.

The template solver treats each node's batch as its own (a flow model: a node serves `b /
step` sequences) with TPOT the sum of step times along a path. The simulator runs what vLLM
runs: one micro-batch size per pipeline (the smallest stage's total batch), as many
micro-batches as stages, a step lasting `max(sum of stage times, stages x slowest stage)`. For
a single node the two agree; for pipelines of unequal stages the simulator's rate is lower and
its TPOT longer. And the solver spreads each prompt evenly over decode steps, while chunked
prefill puts a whole prompt into one step (a slow step among fast ones). This module evaluates
the simulator's own step-cost model at full occupancy — every slot decoding, `b / O` whole
prompts per step on average — so that the planner can size instances by what they will
deliver; and the scheduler's token budget per step, which caps how many prompts get in.
Mean request shapes; an approximation of a busy steady state.

The halves of a PD deployment (`coral.sim.pd`) are sized with the same step model: a prefill
instance busy runs steps of its whole token chunk (stages x the smallest stage's batch, which
counts prompt tokens), so it serves `chunk / (I x step)` requests/s and a prompt sees one such
step; a decode instance busy runs every slot decoding with no prompt in its steps, so it serves
`b / (O x step)` requests/s (per `O` output tokens, as the planner pairs decode capacity) at
TPOT `step`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from coral.sim.deployment import DeploymentError, instance_from_template
from coral.sim.engine import DEFAULT_MAX_BATCHED_TOKENS, build_layout


@dataclass(frozen=True)
class Saturation:
    """An instance of a template at full occupancy, as simulated."""

    rps: float  # requests/s of the template's workload mix
    step_s: float  # one step: the TPOT every sequence sees (prefill: a prompt's time in it)
    sequences: int  # sequences in flight (prefill: prompts per step, rounded up)
    #: PD halves: one prompt's KV cache over this instance's slowest NIC, with the fixed
    #: hand-over latency (0 for aggregated instances, which hand nothing over)
    kv_transfer_s: float = 0.0


def saturation(template: Any, *, perf: Any, catalog: Any,
               max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS) -> Saturation | None:
    """The simulator's rate and step for `template` at full occupancy, in any mode; None
    for an infeasible template or one the simulator cannot run as one instance."""
    from coral.templates.operating_points import NET_LATENCY_S

    if not template.feasible:
        return None
    try:
        spec = instance_from_template(template)
    except DeploymentError:  # pipelines side by side: not one instance the simulator runs
        return None
    layout = build_layout(spec, perf, catalog, NET_LATENCY_S)
    b = layout.max_seqs
    slo = template.slo
    i_tok, o_tok = slo.input_tokens, slo.output_tokens
    if template.mode in ("prefill", "decode"):
        from coral.sim.pd import kv_bytes_per_token, nic_bytes_per_s, transfer_seconds

        nic = nic_bytes_per_s(spec, catalog)
        kv_s = transfer_seconds(i_tok, kv_bytes_per_token(catalog.model(template.model)),
                                nic, nic)
    if template.mode == "prefill":  # b counts prompt tokens per step here
        prompts = -(-b // i_tok)
        dt = layout.step_cost(b, 0, 0, min(layout.n_stages, prompts))[0]
        return Saturation(rps=b / (i_tok * dt), step_s=dt, sequences=prompts, kv_transfer_s=kv_s)
    context = int(b * (i_tok + o_tok / 2))
    m = min(layout.n_stages, b)
    if template.mode == "decode":  # prompts are prefilled elsewhere: pure decode steps
        dt = layout.step_cost(0, b, context, m)[0]
        return Saturation(rps=b / (o_tok * dt), step_s=dt, sequences=b, kv_transfer_s=kv_s)
    # a step takes whole prompts (chunked prefill fills the step's token budget first come,
    # first served), b / O of them on average: mix the steps with k and k + 1 prompts
    per_step = b / o_tok
    k = math.floor(per_step)
    frac = per_step - k
    dt = (1.0 - frac) * layout.step_cost(k * i_tok, b, context, m)[0]
    if frac > 0:
        dt += frac * layout.step_cost((k + 1) * i_tok, b, context, m)[0]
    # a step's token budget holds every decoding sequence's token and then prompt chunks:
    # a request spends I + O budget tokens, so no more than budget / ((I + O) dt) requests/s
    # get through, however many slots there are
    rps = min(b / (o_tok * dt), max_batched_tokens / ((i_tok + o_tok) * dt))
    return Saturation(rps=rps, step_s=dt, sequences=b)
