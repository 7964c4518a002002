"""The risk model of spot capacity: how likely each pool is down over a window, the failure
scenarios a plan is judged on, and the exact shortfall probability of a given plan.

Model
-----
A *pool* is one node type in one region. Preemptions come as pool events, a Poisson process
at the catalog's rate `lambda` (events per node-hour, `Catalog.preemption_rate_per_hour`), and
an event reclaims every spot node of the pool at once: correlation inside a pool is total,
pools are independent. A spot instance is lost when any of its pools has an event.

A reclaimed instance is replaced by the re-plan: the replacement is started at the notice
(`notice_s` before the kill) and serves `startup_s` after it was started, so the capacity is
missing for `max(startup_s - notice_s, 0)` seconds after the kill. Over a window of `W`
seconds a pool leaves the plan short at some moment if it has an event inside the window, or
within that replacement time before the window starts (the replacement is still loading when
the window opens). So the pool is *down* in the window with probability::

    p = 1 - exp(-lambda * (W + max(startup_s - notice_s, 0)) / 3600)

A model is short in a scenario (a set of pools down) when the capacity its on-demand
instances and its spot instances outside the down pools serve is below its demand; its
shortfall probability is the total probability of the scenarios in which it is short.

What a set of instances serves (`Pairing`): aggregated instances serve their capacity;
prefill/decode (PD) halves pair inside one region, so region `r` serves
`min(prefill_r / input_tokens, decode_r / output_tokens)` requests/s of the surviving
halves, as `problem.model_capacity_rps` pairs a plan's halves with every pool up. Capacities
here are in requests/s: a half's tokens/s divided by the tokens one request takes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

Pool = tuple[str, str]
"""(node type, region)."""

#: Most failure sets `shortfall_probability` enumerates exactly (2^16 scenarios of 16 pools).
EXACT_POOLS = 16


def pool_down_probability(rate_per_hour: float, window_s: float, startup_s: float,
                          notice_s: float) -> float:
    """Probability that a pool is short at some moment of a `window_s`-second window (see the
    module): an event inside the window, or one that close before it whose replacement is
    still starting."""
    exposure_s = window_s + max(startup_s - notice_s, 0.0)
    return -math.expm1(-rate_per_hour * exposure_s / 3600.0)


def scenarios(probs: Sequence[float], max_down: int) -> list[tuple[tuple[int, ...], float]]:
    """Every set of at most `max_down` pools down (indices into `probs`), with its
    probability (the pools outside the set up)."""
    up = math.prod(1.0 - p for p in probs)
    out: list[tuple[tuple[int, ...], float]] = []
    for k in range(0, min(max_down, len(probs)) + 1):
        for down in itertools.combinations(range(len(probs)), k):
            prob = up
            for i in down:
                prob *= probs[i] / (1.0 - probs[i]) if probs[i] < 1.0 else math.inf
            out.append((down, prob if math.isfinite(prob) else _direct(probs, down)))
    return out


def _direct(probs: Sequence[float], down: Sequence[int]) -> float:
    s = set(down)
    return math.prod(p if i in s else 1.0 - p for i, p in enumerate(probs))


def mass_beyond(probs: Sequence[float], max_down: int) -> float:
    """Probability that more than `max_down` pools are down (the Poisson-binomial tail)."""
    dist = [1.0]  # dist[k]: probability that exactly k pools are down so far
    for p in probs:
        nxt = [0.0] * (len(dist) + 1)
        for k, q in enumerate(dist):
            nxt[k] += q * (1.0 - p)
            nxt[k + 1] += q * p
        dist = nxt
    return max(0.0, 1.0 - sum(dist[: max_down + 1]))


def scenario_depth(probs: Sequence[float], tolerance: float, max_scenarios: int
                   ) -> tuple[int, float]:
    """The fewest pools down to enumerate so that the scenarios left out weigh at most
    `tolerance` (every set when the pools are few enough), capped at `max_scenarios`
    scenarios; returns (depth, probability of the scenarios left out)."""
    n = len(probs)
    count = 0
    for depth in range(0, n + 1):
        count += math.comb(n, depth)
        beyond = mass_beyond(probs, depth) if depth < n else 0.0
        if beyond <= tolerance or depth == n:
            return depth, beyond
        if count + math.comb(n, depth + 1) > max_scenarios:
            return depth, beyond
    return n, 0.0


AGGREGATED, PREFILL, DECODE = 0, 1, 2
"""A capacity's half (`Pairing`): an aggregated instance, or a prefill or decode half."""


@dataclass(frozen=True)
class Pairing:
    """How capacities of one model's holdings combine into requests/s served: `agg[h]` is 1
    for an aggregated holding, `prefill[h, r]` (`decode[h, r]`) 1 for a prefill (decode)
    half in the model's `r`-th PD region. Served = the aggregated sum plus, per region, the
    lesser of its two halves' sums."""

    agg: np.ndarray  # (holdings,)
    prefill: np.ndarray  # (holdings, regions)
    decode: np.ndarray  # (holdings, regions)

    @classmethod
    def of(cls, half: Sequence[int], region: Sequence[object]) -> "Pairing":
        """From each holding's half (`AGGREGATED`, `PREFILL`, `DECODE`) and region (any
        hashable; read for the halves only)."""
        half = np.asarray(half, dtype=int).reshape(-1)
        regions = sorted({region[h] for h in np.flatnonzero(half != AGGREGATED)}, key=str)
        col = {r: k for k, r in enumerate(regions)}
        prefill = np.zeros((len(half), len(regions)))
        decode = np.zeros((len(half), len(regions)))
        for h in np.flatnonzero(half != AGGREGATED):
            (prefill if half[h] == PREFILL else decode)[h, col[region[h]]] = 1.0
        return cls((half == AGGREGATED).astype(float), prefill, decode)

    @property
    def paired(self) -> bool:
        """True when some holding is a PD half (served is then not a plain sum)."""
        return self.prefill.shape[1] > 0

    def served(self, capacity: np.ndarray) -> np.ndarray:
        """Requests/s served from per-holding capacities `capacity` (..., holdings)."""
        out = capacity @ self.agg
        if self.paired:
            out = out + np.minimum(capacity @ self.prefill, capacity @ self.decode).sum(-1)
        return out


@dataclass(frozen=True)
class Holding:
    """Capacity of one model held by a plan's instances of one kind: `pools` empty for
    on-demand instances, the pools of its nodes for spot ones; `half` and `region` say how
    it pairs (`Pairing`)."""

    capacity: float  # requests/s of all these instances together
    pools: frozenset[Pool]
    half: int = AGGREGATED
    region: str = ""


def shortfall_probability(holdings: Sequence[Holding], demand: float,
                          pool_prob: Mapping[Pool, float], *, rel_tol: float = 1e-9
                          ) -> tuple[float, float]:
    """(probability that `holdings` serve less than `demand`, probability left unjudged).

    Every failure set of the pools the holdings use is enumerated when they are at most
    `EXACT_POOLS` (the second figure is then 0 and the first exact); beyond that, sets of at
    most two pools down are judged and the rest (the second figure) counted as short, so the
    first figure is an upper bound within the second.
    """
    pools = sorted({p for h in holdings for p in h.pools})
    need = demand * (1.0 - rel_tol)
    depth = len(pools) if len(pools) <= EXACT_POOLS else 2
    pairing = Pairing.of([h.half for h in holdings], [h.region for h in holdings])
    # every failure set at once (up to 2^16 of them): the plan's last check stays short
    table = ScenarioTable.build(pools, pool_prob, depth)
    held = table.alive([h.pools for h in holdings]) * np.array(
        [h.capacity for h in holdings], dtype=float)
    cap = pairing.served(held) if pairing.paired else held.sum(axis=1)
    short = float(table.prob @ (cap < need))
    return min(1.0, short + table.left), table.left


@dataclass(frozen=True)
class ScenarioTable:
    """Failure sets of some pools as arrays: `down[s, k]` is True when pool `k` is down in
    scenario `s` (every pool outside the set up), `prob[s]` its probability, `left` the
    probability of the sets not listed (more than `depth` pools down). Row 0 is the empty
    set."""

    pools: tuple[Pool, ...]
    down: np.ndarray  # (scenarios, pools) bool
    prob: np.ndarray  # (scenarios,)
    depth: int
    left: float

    @classmethod
    def build(cls, pools: Sequence[Pool], pool_prob: Mapping[Pool, float], depth: int
              ) -> "ScenarioTable":
        probs = [pool_prob[p] for p in pools]
        sets = scenarios(probs, depth)
        down = np.zeros((len(sets), len(pools)), dtype=bool)
        for s, (idx, _) in enumerate(sets):
            down[s, list(idx)] = True
        left = mass_beyond(probs, depth) if depth < len(pools) else 0.0
        return cls(tuple(pools), down, np.array([p for _, p in sets]), depth, left)

    def alive(self, pool_sets: Sequence[frozenset[Pool]]) -> np.ndarray:
        """(scenarios, holdings) bool: holding `j` (its pools `pool_sets[j]`) keeps serving
        in scenario `s` (none of its pools down)."""
        index = {p: k for k, p in enumerate(self.pools)}
        uses = np.zeros((len(self.pools), len(pool_sets)), dtype=np.float32)
        for j, ps in enumerate(pool_sets):
            for p in ps:
                uses[index[p], j] = 1.0
        # a float product (BLAS) of 0/1 entries counts the down pools exactly (at most a
        # few dozen, far below float32's integers)
        return (self.down.astype(np.float32) @ uses) == 0
