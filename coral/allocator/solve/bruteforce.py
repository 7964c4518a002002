"""Exhaustive allocation oracle for tiny problems: the reference the ILP is tested against.

It enumerates every vector of instance counts within availability — every template in every
region where it is priced, from 0 up to what the region's nodes allow — and evaluates each one
directly from the definitions (nodes used, $/hour, start-up penalty, PD pairing per region),
without presolve, bounds or a solver:

- when some vector meets every demand, the answer is the cheapest of those
  (price + start-up penalty);
- otherwise, by the problem's scarcity objective: `goodput`, the cheapest among the vectors
  of most priority-weighted goodput (`sum_m priority_m * min(demand_m, capacity_m)`, within a
  relative 1e-9 of the best); `fair`, among the vectors of the highest fairness level (the
  smallest `min(1, served_m / (weight_m demand_m))`, `problem.fair_weights`), those of the most
  priority-weighted generated tokens/s, and of those the cheapest (each within a relative 1e-9 of the best).

Meant for <= 2 regions, <= 4 templates and single-digit counts; `max_vectors` guards against
calling it on anything larger.
"""

from __future__ import annotations

import time

import numpy as np

from coral.allocator.problem import (
    AllocationPlan,
    AllocationProblem,
    PlanStatus,
    fair_weights,
    make_plan,
)

#: Default cap on the number of vectors enumerated.
MAX_VECTORS = 2_000_000
#: Relative slack of the goodput tie (as in the ILP's phase 2) and of demand met.
GOODPUT_REL_TOL = 1e-9
DEMAND_TOL = 1e-9


class TooLargeError(ValueError):
    """The problem has more vectors than the oracle is allowed to enumerate."""


def solve_bruteforce(problem: AllocationProblem, *, max_vectors: int = MAX_VECTORS
                     ) -> AllocationPlan:
    """The optimal plan, by enumerating every instance vector within availability."""
    t0 = time.perf_counter()
    pairs: list[tuple[int, str]] = []  # (template index, region)
    bounds: list[int] = []
    for i, t in enumerate(problem.templates):
        for region in problem.regions:
            if region not in t.price_usd_per_hour:
                continue
            most = min(problem.availability.get((g, region), 0) // n
                       for g, n in t.node_counts.items())
            if most > 0:
                pairs.append((i, region))
                bounds.append(most)
    total = int(np.prod([b + 1 for b in bounds], dtype=np.float64)) if bounds else 1
    if total > max_vectors:
        raise TooLargeError(
            f"{total} instance vectors exceed the oracle's limit of {max_vectors}; it is meant "
            "for tiny problems (<= 2 regions, <= 4 templates, small counts)"
        )
    # every vector, one per row
    grid = np.indices([b + 1 for b in bounds]).reshape(len(bounds), -1).T if bounds else \
        np.zeros((1, 0), dtype=np.int64)
    x = grid.astype(np.int64)
    tmpl = [problem.templates[i] for i, _ in pairs]

    # nodes used per (node type, region) within availability
    fits = np.ones(len(x), dtype=bool)
    keys = {(g, r) for t, (_, r) in zip(tmpl, pairs) for g in t.node_counts}
    for g, r in keys:
        use = np.array([t.node_counts.get(g, 0) if pr == r else 0
                        for t, (_, pr) in zip(tmpl, pairs)])
        fits &= x @ use <= problem.availability.get((g, r), 0)
    x = x[fits]

    price = np.array([t.price_usd_per_hour[r] for t, (_, r) in zip(tmpl, pairs)])
    current = np.array([problem.current.get((t.id, r), 0) for t, (_, r) in zip(tmpl, pairs)])
    penalty = price * problem.startup_s / 3600.0
    objective = x @ price + np.maximum(x - current, 0) @ penalty

    weights = fair_weights(problem.demands)
    level = np.ones(len(x))
    tokens = np.zeros(len(x))
    served = np.zeros((len(x), len(problem.demands)))
    short = np.zeros(len(x), dtype=bool)
    goodput = np.zeros(len(x))
    for j, d in enumerate(problem.demands):
        capacity = np.zeros(len(x))
        for t, (_, r), k in zip(tmpl, pairs, range(len(pairs))):
            if t.model == d.model and t.mode == "aggregated":
                capacity += x[:, k] * t.capacity
        for region in problem.regions:
            prefill = np.zeros(len(x))
            decode = np.zeros(len(x))
            for t, (_, r), k in zip(tmpl, pairs, range(len(pairs))):
                if t.model != d.model or r != region:
                    continue
                if t.mode == "prefill":
                    prefill += x[:, k] * t.capacity
                elif t.mode == "decode":
                    decode += x[:, k] * t.capacity
            capacity += np.minimum(prefill / d.input_tokens, decode / d.output_tokens)
        served[:, j] = np.minimum(capacity, d.requests_per_s)
        short |= capacity < d.requests_per_s - DEMAND_TOL * max(1.0, d.requests_per_s)
        goodput += d.priority * served[:, j]
        tokens += d.priority * d.output_tokens * served[:, j]
        if d.requests_per_s > 0:
            level = np.minimum(level, served[:, j] / (weights[d.model] * d.requests_per_s))

    if (~short).any():
        status = PlanStatus.OPTIMAL
        candidates = np.flatnonzero(~short)
    else:
        status = PlanStatus.INFEASIBLE
        candidates = np.arange(len(x))
        for value in ((level, tokens) if problem.scarcity == "fair" else (goodput,)):
            best = value[candidates].max()
            candidates = candidates[value[candidates] >= best * (1.0 - GOODPUT_REL_TOL)]
    pick = int(candidates[np.argmin(objective[candidates])])
    instances = {(tmpl[k].id, pairs[k][1]): int(x[pick, k]) for k in range(len(pairs))
                 if x[pick, k] > 0}
    return make_plan(problem, instances, status=status, gap=0.0,
                     solve_s=time.perf_counter() - t0,
                     notes=(f"bruteforce: {len(x)} vectors within availability",))
