"""A busy prefill instance's rounds, as its scheduler forms them under a backlog.

A prefill instance (PD) runs its prompts in rounds: one step of up to its token chunk
(stages x the smallest stage's batch), after which every prompt finished in it hands its KV
cache over to a decode instance. The cache blocks stay taken until that transfer lands, and
the next round is formed at once, so a round's prompts must fit in what the *previous*
round's prompts leave free. An instance whose KV room holds fewer than two chunks therefore
cannot run full rounds back to back: its rounds alternate between what fits beside the last
one (1024-token prompts, a 3,072-token chunk and room for 4,075 tokens: rounds of 1 and 2
prompts, not 3). Rating it by full rounds overstates its rate by the share it cannot fill.

`busy_prefill` replays the simulator's own rules (`coral.sim.scheduler.SimInstance.schedule`
on a `coral.sim.pd.PrefillInstance`: chunks of prompts in progress first, then waiting
prompts first come first served while the whole prompt fits in the free cache, each round's
transfers sent one after another over the instance's NIC, an idle instance starting a round
when a transfer lands) for an endless queue of prompts of one length, and gives the rate and
a prompt's time in service (its rounds), averaged over the rounds after a warm-up. Decode
instances are assumed to take every transfer at once (the planner sizes them to).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

#: Rounds replayed before the averages start (the first rounds start from an empty cache).
WARMUP_ROUNDS = 16
#: Rounds averaged over (the replay settles into a short cycle within a few rounds).
MEASURED_ROUNDS = 48


@dataclass(frozen=True)
class BusyPrefill:
    """A prefill instance under a backlog of prompts."""

    rps: float  # prompts finished per second
    service_s: float  # mean time from a prompt's first chunk to its first token
    prompts_per_round: float  # mean prompts finished per round


def busy_prefill(layout: Any, input_tokens: int, send_s: float, latency_s: float
                 ) -> BusyPrefill:
    """Replay a backlogged prefill instance of `layout` (a `coral.perf.step.StepModel`) on
    prompts of `input_tokens` tokens whose KV cache takes `send_s` on the NIC plus
    `latency_s` to land. A prompt that cannot fit in the cache even alone is never served
    (rate 0), as the simulator rejects it."""
    cap, chunk, stages = layout.kv_cap, layout.max_seqs, layout.n_stages
    if input_tokens < 1 or input_tokens + 1 > cap:
        return BusyPrefill(0.0, 0.0, 0.0)
    now = 0.0
    nic_free = 0.0
    held: list[tuple[float, int]] = []  # (lands at, tokens) of handed-over prompts
    held_tokens = 0
    progress: list[list[float]] = []  # [tokens cached so far, round it started] per prompt
    rounds = 0
    t0 = 0.0
    done = in_service = 0.0
    while rounds < WARMUP_ROUNDS + MEASURED_ROUNDS:
        while held and held[0][0] <= now:
            held_tokens -= heapq.heappop(held)[1]
        free = cap - held_tokens - int(sum(p[0] for p in progress))
        budget = chunk
        chunks: list[int] = []
        for p in progress:
            if budget <= 0 or free <= 0:
                break
            k = min(input_tokens - int(p[0]), budget, free)
            chunks.append(k)
            p[0] += k
            budget -= k
            free -= k
        while budget > 0 and len(progress) < chunk and input_tokens <= free:
            k = min(input_tokens, budget)
            chunks.append(k)
            progress.append([k, now])
            budget -= k
            free -= k
        if not chunks:
            if not held:
                return BusyPrefill(0.0, 0.0, 0.0)  # the cache is full of partial prompts
            now = held[0][0]  # idle until a transfer lands
            continue
        dt = layout.step_cost(sum(chunks), 0, 0, min(stages, len(chunks)))[0]
        now += dt
        starts = [p[1] for p in progress if p[0] >= input_tokens]
        finished = len(starts)
        progress = [p for p in progress if p[0] < input_tokens]
        for _ in range(finished):
            nic_free = max(now, nic_free) + send_s
            heapq.heappush(held, (nic_free + latency_s, input_tokens))
            held_tokens += input_tokens
        rounds += 1
        if rounds == WARMUP_ROUNDS:
            t0 = now
        elif rounds > WARMUP_ROUNDS:
            done += finished
            in_service += sum(now - start for start in starts)
    if done == 0:
        return BusyPrefill(0.0, 0.0, 0.0)
    return BusyPrefill(done / (now - t0), in_service / done, done / MEASURED_ROUNDS)
