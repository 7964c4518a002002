"""Planned capacity: the request rate a template instance takes while TTFT holds at the SLO.

A template's throughput is the rate at which its batches are full. Fed at that rate, requests
queue without bound (a queue at utilisation 1 never settles), so TTFT — which includes the
wait for a free batch slot — misses its target by minutes. The allocator therefore plans each
instance at a *utilisation* below 1 that leaves enough free slots for the SLO percentile of
waits to fit in the TTFT budget left over by the prefill itself.

The queue model (an approximation; the simulator is the judge): an instance is a multi-server
queue whose servers are its batch slots. With throughput `X` req/s and a request's time in
service `T = TTFT + (output_tokens - 1) * TPOT` (the template's predicted figures), it has
`c = X * T` slots (Little's law at full load: one pipeline stage of batch 32 has 32, two such
stages in a pipeline 64). At arrival rate `lambda = rho * X`, the wait `W` of a G/G/c queue
has the Allen-Cunneen tail

    P(W > t) ~= C(c, a) * exp(-2 (c - a) t / (T (ca^2 + cs^2))),   a = lambda * T,

where `C` is Erlang's C formula (the probability of waiting at all), `ca` the coefficient of
variation of inter-arrival gaps (1 for Poisson) and `cs` that of service times (output
lengths' spread; 0 for fixed lengths). With `ca = cs = 1` it is the exact M/M/c tail. The
planned utilisation is the largest `rho` with `P(W > TTFT_slo - TTFT_predicted)` at most
`WINDOW_TAIL_FACTOR * (1 - p)` (see there for why, and how it compares with the simulator).

Multi-stage templates: the solver's flow model of a pipeline is more optimistic than the way
the simulator (and vLLM) run one, so when the planner is given the perf model the rate and TPOT
are taken from the simulator's own step-cost model at full occupancy where those are worse
(`coral.perf.step`). TPOT is judged at the SLO's percentile, not the mean: near its planned
rate an instance is full for more than the SLO's tail of the time, and a request decoding
then sees the busy step with the prompt chunks the scheduler forms (`Saturation.tail_step_s`:
steps with a full token budget and steps with none, dearer on average than steps of mean
prompts), so that step must meet the target and sets the rate.

It is per instance: a load-aware router that pools instances of a model does at least as
well, so with many instances the plan errs safe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from coral.errors import CoralError

#: Inter-arrival coefficient of variation planned for when a scenario names none (Poisson).
DEFAULT_ARRIVAL_CV = 1.0
#: Output-length coefficient of variation planned for when a scenario names none. Measured on
#: the Azure LLM inference traces (2023): conversation 0.77, code 2.15; 1.0 sits between.
DEFAULT_OUTPUT_CV = 1.0
#: An SLO is judged over a window (tens of minutes), not in the steady state: near saturation
#: the p90 of waits over such a window swings well above its steady-state value. So the
#: steady-state tail is planned at this share of the SLO's (p97.5 for a p90 target): with it,
#: the planned load of one-node instances sits at the highest load at which simulated
#: 30-minute windows still meet the SLO (figures in benchmarks/results/refactoring.md,
#: "Figures moved here from the code's comments").
WINDOW_TAIL_FACTOR = 0.25
#: Smallest tail planned for: a p100 target cannot hold under random arrivals, so p100 is
#: planned as p99.99.
MIN_TAIL = 1e-4
#: Share of a NIC's bandwidth a PD half is planned to fill with KV-cache hand-overs: they
#: queue at the NIC (one at a time), and the waits count in the request's TPOT.
NIC_UTILISATION = 0.8
#: Rounds a prompt sent to a busy prefill instance waits before the queue model's wait: a
#: prefill instance serves its prompts in rounds (a step of its whole token chunk), not in
#: slots that free one by one, so an arrival first waits out the round in progress, between
#: none and one round (half on average, the share planned for).
PREFILL_RESIDUAL_ROUNDS = 0.5
#: Below this share of the percentile's tail budget the bisection stops refining, so the
#: planned utilisation is within this of the exact root.
_RHO_TOL = 1e-4


class HeadroomError(CoralError, ValueError):
    """A queueing parameter is out of range."""


_LOG_FACTORIALS = np.zeros(1)  # log(k!) for k = 0, 1, ...; grown on demand


def _log_factorials(n: int) -> np.ndarray:
    """log(k!) for k = 0..n (a view of a table kept between calls: the planner asks for the
    same slot counts thousands of times)."""
    global _LOG_FACTORIALS
    if len(_LOG_FACTORIALS) <= n:
        size = max(n + 1, 2 * len(_LOG_FACTORIALS))
        table = np.zeros(size)
        np.cumsum(np.log(np.arange(1, size, dtype=float)), out=table[1:])
        _LOG_FACTORIALS = table
    return _LOG_FACTORIALS[:n + 1]


def erlang_c(c: int, a: float) -> float:
    """Erlang's C: probability that an arrival waits in an M/M/c queue with offered load `a`
    (in servers); 1 when `a >= c`. Computed from the Poisson pmf/cdf in log space, so it is
    stable for thousands of servers."""
    if c < 1:
        raise HeadroomError(f"servers must be >= 1, got {c}")
    if a <= 0:
        return 0.0
    if a >= c:
        return 1.0
    k = np.arange(c + 1, dtype=float)
    log_pmf = k * math.log(a) - a - _log_factorials(c)
    top = log_pmf[-1]
    peak = float(log_pmf.max())
    log_cdf = peak + math.log(float(np.exp(log_pmf - peak).sum()))
    erlang_b = math.exp(top - log_cdf)
    rho = a / c
    return erlang_b / (1.0 - rho * (1.0 - erlang_b))


def wait_tail(c: int, a: float, t: float, service_s: float, cv2_sum: float) -> float:
    """Allen-Cunneen approximation of P(W > t) in a G/G/c queue (exact M/M/c tail when
    `cv2_sum` = 2). `cv2_sum` is ca^2 + cs^2."""
    if a >= c:
        return 1.0
    if cv2_sum <= 0:  # deterministic arrivals and service: no queue below full load
        return 0.0
    return erlang_c(c, a) * math.exp(-2.0 * (c - a) * t / (service_s * cv2_sum))


@lru_cache(maxsize=65536)
def max_utilisation(c: int, slack_s: float, service_s: float, cv2_sum: float,
                    tail: float) -> float:
    """Largest rho in [0, 1) with P(W > slack_s) <= tail when `c` slots each serve for
    `service_s` on average and the offered load is rho * c."""
    if slack_s <= 0 or tail <= 0:
        return 0.0
    if tail >= 1.0:
        return 1.0 - _RHO_TOL
    lo, hi = 0.0, 1.0
    while hi - lo > _RHO_TOL:
        mid = 0.5 * (lo + hi)
        if wait_tail(c, mid * c, slack_s, service_s, cv2_sum) <= tail:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class Headroom:
    """How hard one instance of a template is planned to run."""

    utilisation: float  # planned rate / throughput, in [0, 1)
    slots: int  # requests in service at full load (c)
    service_s: float  # mean time a request holds a slot (T)
    slack_s: float  # TTFT budget left for queueing


def template_headroom(template: Any, *, arrival_cv: float = DEFAULT_ARRIVAL_CV,
                      output_cv: float = DEFAULT_OUTPUT_CV,
                      saturation: Any = None) -> Headroom:
    """The planned utilisation of one instance of `template` (a
    `coral.templates.template.Template`).

    Modes: aggregated as in the module docstring; PD halves as `_pd_headroom` says (the
    prefill queue against the TTFT slack, the hand-over and the decode queue against the TPOT
    slack of the later tokens, each half within its NIC).

    `saturation` (a `coral.perf.step.Saturation`): the rate and TPOT the instance reaches at
    full occupancy as the simulator runs it; when lower / longer than the template's own
    figures they are used instead, and `utilisation` is still relative to the template's
    throughput (so it also carries that shortfall). An aggregated instance is judged by its
    step with the prompt chunks the scheduler forms when it is full (`tail_step_s`, not the
    step of mean prompts): near its planned rate it is full more than the SLO's tail of the
    time, so the percentile's requests see that step for TPOT, and it sets the rate the
    queue is sized against for TTFT. A template whose step at full occupancy exceeds the
    TPOT target gets utilisation 0: busy, it would miss TPOT.
    """
    if arrival_cv < 0 or output_cv < 0:
        raise HeadroomError(f"coefficients of variation must be >= 0, got arrival_cv="
                            f"{arrival_cv!r}, output_cv={output_cv!r}")
    slo = template.slo
    ttft = float(template.ttft_s or 0.0)
    tpot = float(template.tpot_s or 0.0)
    tokens_after_first = max(slo.output_tokens - 1, 0)
    decode_s = tokens_after_first * tpot
    rps = float(template.throughput_rps)
    if template.mode in ("prefill", "decode"):
        return _pd_headroom(template, rps, ttft, tpot, arrival_cv, output_cv, saturation)
    service, slack = ttft + decode_s, slo.ttft_s - ttft
    cs = output_cv * decode_s / service if service > 0 else 0.0
    scale = 1.0
    if saturation is not None and rps > 0:
        step_s, busy = saturation.tail_step_s, saturation.tail_rps
        if step_s > slo.tpot_s * (1.0 + 1e-9):
            # busy, it would miss TPOT as the simulator runs it: not plannable
            return Headroom(0.0, 0, service, slack)
        if busy < rps:
            scale, rps = busy / rps, busy
        if step_s > tpot:
            decode_s = max(slo.output_tokens - 1, 0) * step_s
            service = ttft + decode_s
            cs = output_cv * decode_s / service if service > 0 else 0.0
    return _queue_headroom(slo, rps, scale, service, slack, arrival_cv, cs)


def _queue_headroom(slo: Any, rps: float, scale: float, service: float, slack: float,
                    arrival_cv: float, cs: float) -> Headroom:
    """The utilisation at which waits for one of `rps * service` slots fit in `slack` at the
    SLO percentile (the window-tail rule), times `scale` (shortfall against the template)."""
    if not (rps > 0 and service > 0):
        return Headroom(0.0, 0, service, slack)
    slots = max(1, int(rps * service))
    tail = max((1.0 - float(slo.percentile)) * WINDOW_TAIL_FACTOR, MIN_TAIL)
    rho = max_utilisation(slots, round(slack, 9), round(service, 9),
                          round(arrival_cv**2 + cs**2, 9), round(tail, 12))
    return Headroom(rho * scale, slots, service, slack)


def _pd_headroom(template: Any, rps: float, ttft: float, tpot: float, arrival_cv: float,
                 output_cv: float, saturation: Any) -> Headroom:
    """PD halves, judged as the simulator measures them (`coral.sim.pd`): TTFT ends when the
    prefill instance emits the first token, so a prefill instance's queue may take the slack
    its prefill leaves, less the rest of the round in progress (`PREFILL_RESIDUAL_ROUNDS`):
    a prefill instance serves its prompts in rounds, so on top of the wait for a place in a
    round (the queue model's `c` slots) a prompt waits out the round it arrived in; the KV
    hand-over and the wait for a decode slot fall between
    the first and second token, so a decode instance's queue and the transfer share the
    TPOT slack of the tokens after the first, `(O - 1) (TPOT target - step)`. Both halves
    send or receive every prompt's KV cache over their slowest NIC: each is planned at no
    more than `NIC_UTILISATION` of the rate that NIC carries (`saturation.kv_transfer_s`
    per prompt)."""
    slo = template.slo
    after_first = max(slo.output_tokens - 1, 0)
    scale = 1.0
    transfer = 0.0
    if saturation is not None and rps > 0:
        if template.mode == "decode" and saturation.step_s > slo.tpot_s * (1.0 + 1e-9):
            return Headroom(0.0, 0, after_first * saturation.step_s, 0.0)
        if saturation.rps < rps:
            scale, rps = saturation.rps / rps, saturation.rps
        if template.mode == "decode":
            tpot = max(tpot, saturation.step_s)
        else:
            ttft = max(ttft, saturation.step_s)
        transfer = float(saturation.kv_transfer_s)
        if transfer > 0 and rps > NIC_UTILISATION / transfer:
            nic_rps = NIC_UTILISATION / transfer
            scale, rps = scale * nic_rps / rps, nic_rps
    if template.mode == "prefill":
        slack = slo.ttft_s - (1.0 + PREFILL_RESIDUAL_ROUNDS) * ttft
        return _queue_headroom(slo, rps, scale, ttft, slack, arrival_cv, 0.0)
    slack = after_first * (slo.tpot_s - tpot) - transfer
    return _queue_headroom(slo, rps, scale, after_first * tpot, slack, arrival_cv, output_cv)


def planned_capacity(template: Any, *, arrival_cv: float = DEFAULT_ARRIVAL_CV,
                     output_cv: float = DEFAULT_OUTPUT_CV, saturation: Any = None) -> float:
    """The template's capacity (in its own unit) that the allocator plans one instance for."""
    h = template_headroom(template, arrival_cv=arrival_cv, output_cv=output_cv,
                          saturation=saturation)
    return float(template.throughput) * h.utilisation
