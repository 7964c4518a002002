"""Plans that cover every scenario of a robust problem without proving anything: the starts
`solve_robust` searches below, and the exhaustive oracle the tests compare it with.

- `conservative_problem`: every column at its least capacity over the nominal case and the
  scenarios, as if every GPU type were slow at once. Its plans cover every scenario (each
  scenario's capacity is at least that), and it is an ordinary allocation problem, one cover
  row per model, which the nominal solver's decomposition (`ilp.solve_allocation`) solves
  well; it costs more than the robust optimum only where a model's plan mixes GPU types (or a
  column several), which the one-slow-type scenarios do not all derate at once.
- `greedy_cover`: a plan (e.g. the nominal one) with aggregated instances added until every
  scenario is covered.
- `robust_start`: the cheapest of such plans that covers every scenario within availability.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace
from typing import Any, Mapping, Sequence

from coral.allocator.problem import (
    DEMAND_REL_TOL,
    AllocationPlan,
    AllocationProblem,
    PlanStatus,
    TemplateRegion,
    make_plan,
)
from coral.allocator.robust.problem import RobustProblem, capacity_rps_under, robust_shortfall


def conservative_problem(rp: RobustProblem) -> AllocationProblem:
    """The problem with each column at its least capacity over the nominal case and every
    scenario; columns at 0 somewhere are left out (see the module docstring)."""
    caps = rp.capacity_matrix()
    templates = []
    for i, t in enumerate(rp.problem.templates):
        low = min(t.capacity, float(caps[:, i].min())) if len(caps) else t.capacity
        if low > 0:
            templates.append(t if low >= t.capacity else replace(t, capacity=low))
    return replace(rp.problem, templates=tuple(templates))


def robust_start(rp: RobustProblem, starts: Sequence[Mapping[TemplateRegion, int]]
                 ) -> AllocationPlan | None:
    """The cheapest of `starts` (instances per (column id, region); ids the problem lacks are
    dropped) that covers every scenario within availability, as a plan; None when none does."""
    ids = {t.id for t in rp.problem.templates}
    best = None
    for start in starts:
        kept = {(tid, r): int(n) for (tid, r), n in start.items()
                if tid in ids and r in rp.problem.regions and int(n) > 0}
        if not kept:
            continue
        plan = make_plan(rp.problem, kept, status=PlanStatus.TIME_LIMIT, gap=math.inf,
                         solve_s=0.0)
        fits = all(n <= rp.problem.availability.get(key, 0)
                   for key, n in plan.nodes_used.items())
        if fits and plan.meets_demand and not robust_shortfall(rp, plan.instances) \
                and (best is None or plan.objective < best.objective):
            best = plan
    return best


def greedy_cover(rp: RobustProblem, base: Mapping[TemplateRegion, int], *,
                 max_added: int = 2_000) -> dict[TemplateRegion, int] | None:
    """`base` (e.g. the nominal plan) with aggregated instances added one at a time until
    every scenario is covered: each time the (column, region) with room for one more instance
    that covers the most of the shortfalls of its model (each scenario's capped at what is
    short) per $/hour. A start for `solve_robust`, not an optimum; None when it gets stuck
    (no room left, or a short model without aggregated columns)."""
    p = rp.problem
    counts = {k: int(n) for k, n in base.items() if int(n) > 0}
    scenario_caps = [{}] + [rp.scenario_capacity[s] for s in rp.scenarios]
    used: dict[tuple[str, str], int] = {}
    for (tid, region), n in counts.items():
        for g, k in p.template(tid).node_counts.items():
            used[(g, region)] = used.get((g, region), 0) + n * k
    if any(n > p.availability.get(key, 0) for key, n in used.items()):
        return None
    candidates = [(t, r) for t in p.templates if t.mode == "aggregated"
                  for r in p.regions if r in t.price_usd_per_hour]
    for _ in range(max_added):
        short = [[max(0.0, d.requests_per_s - got[d.model]) for d in p.demands]
                 for got in (capacity_rps_under(p, caps, counts) for caps in scenario_caps)]
        need = {d.model: [row[j] for row in short] for j, d in enumerate(p.demands)}
        if not any(v > DEMAND_REL_TOL * max(1.0, d.requests_per_s)
                   for d in p.demands for v in need[d.model]):
            return counts
        best, best_score = None, 0.0
        for t, r in candidates:
            gaps = need.get(t.model)
            if not gaps or not any(gaps):
                continue
            if any(used.get((g, r), 0) + k > p.availability.get((g, r), 0)
                   for g, k in t.node_counts.items()):
                continue
            gain = sum(min(caps.get(t.id, t.capacity), gap)
                       for caps, gap in zip(scenario_caps, gaps))
            score = gain / t.price_usd_per_hour[r]
            if score > best_score:
                best, best_score = (t, r), score
        if best is None:
            return None
        t, r = best
        counts[(t.id, r)] = counts.get((t.id, r), 0) + 1
        for g, k in t.node_counts.items():
            used[(g, r)] = used.get((g, r), 0) + k
    return None


# ---------------------------------------------------------------------------------------------
# The exhaustive oracle
# ---------------------------------------------------------------------------------------------


def robust_bruteforce(rp: RobustProblem, *, max_vectors: int = 200_000
                      ) -> AllocationPlan | None:
    """The cheapest plan (price plus start-up penalty) covering every demand nominally and in
    every scenario, by enumerating every instance vector within availability; None when no
    vector does. From the definitions alone (no presolve, no bounds but availability): for
    tiny problems only (`max_vectors`)."""
    t0 = time.perf_counter()
    p = rp.problem
    pairs: list[tuple[Any, str, int]] = []
    for t in p.templates:
        for region in p.regions:
            if region in t.price_usd_per_hour:
                most = min(p.availability.get((g, region), 0) // n
                           for g, n in t.node_counts.items())
                if most > 0:
                    pairs.append((t, region, most))
    total = math.prod(most + 1 for _, _, most in pairs)
    if total > max_vectors:
        raise ValueError(f"{total} instance vectors exceed the oracle's limit of {max_vectors}")
    best: tuple[float, dict[TemplateRegion, int]] | None = None
    scenarios = [{}] + [dict(rp.scenario_capacity[s]) for s in rp.scenarios]
    for counts in itertools.product(*[range(most + 1) for _, _, most in pairs]):
        used: dict[tuple[str, str], int] = {}
        for (t, region, _), n in zip(pairs, counts):
            for g, k in t.node_counts.items():
                used[(g, region)] = used.get((g, region), 0) + n * k
        if any(n > p.availability.get(key, 0) for key, n in used.items()):
            continue
        instances = {(t.id, region): n for (t, region, _), n in zip(pairs, counts) if n}
        covered = all(
            capacity_rps_under(p, caps, instances)[d.model]
            >= d.requests_per_s - 1e-9 * max(1.0, d.requests_per_s)
            for caps in scenarios for d in p.demands)
        if not covered:
            continue
        cost = sum(n * (t.price_usd_per_hour[region]
                        + max(0, n - p.current.get((t.id, region), 0)) / n
                        * p.penalty_usd(t, region))
                   for (t, region, _), n in zip(pairs, counts) if n)
        if best is None or cost < best[0] - 1e-9:
            best = (cost, instances)
    if best is None:
        return None
    return make_plan(p, best[1], status=PlanStatus.OPTIMAL, gap=0.0,
                     solve_s=time.perf_counter() - t0, notes=("robust bruteforce",))
