"""Exact search over the decomposition: branch and price, with a pattern-mixing heuristic.

`solve_decomposed` solves the cost problem of `lagrange.py` to a relative gap:

1. Root: column generation from the LP's node prices gives the Lagrangian bound, and a pool of
   per-model patterns (every knapsack solve returns its best few solutions).
2. Plans: `best_pattern_plan` picks one pattern per model within availability — a 0/1
   programme with one row per (node type, region) and one per model, which HiGHS solves in
   milliseconds (set-partitioning structure, unlike the knapsack rows of the full ILP). It is
   exact over the pool, and the pool holds each model's near-best covers at every price tried,
   so its plans are within hundredths of a percent of the optimum on the benchmark problems.
3. Search, while the gap is above the target: branch on a column whose master value is
   fractional (`x_j <= floor` / `x_j >= ceil`); every node prices with its bounds, so its
   bound is valid, and is cut off as soon as it reaches the incumbent. A node whose master
   solution is integral in x is solved (the plan it mixes is feasible and no dearer than the
   master value: costs are convex in the counts). Nodes are taken best
   bound first, diving into the child nearer the master value, so incumbents come early and
   the global bound (the least open bound) rises.

The answer says what is proven: the best plan, its objective and the least bound.

The plans themselves (the pattern programmes, rounding and repair, the local search, and the
goodput plans the scarcity phases start from) are `plan_search.py`'s.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from coral.allocator.decomposition.lagrange import (
    Bounds,
    Decomposition,
    Master,
    Pattern,
    Pricer,
    column_generation,
)
# the plans, importable from here too
from coral.allocator.decomposition.plan_search import (  # noqa: F401
    INTEGRALITY_TOL,
    best_part_plan,
    best_pattern_plan,
    feasible,
    fill_goodput,
    goodput_plan,
    improve_by_model,
    round_and_repair,
    running_plan,
)

log = logging.getLogger(__name__)

#: Bound and objective this close (relative) are equal: the bound sums LP duals times
#: availability, which carries the LP's tolerances.
ROUNDING_REL = 1e-7
#: Share of the remaining time one run of the pattern programme may take (and its cap).
PLAN_SEARCH_SHARE = 0.25
PLAN_SEARCH_MAX_S = 1.0
#: Cost searches with PD models also run the programme over pattern parts
#: (`best_part_plan`) at the root and again once this many new patterns are known, each run
#: for at most `PART_SEARCH_MAX_S`: it finds plans within the root bound's reach in fewer
#: nodes. Problems without PD models do not run it (it costs them more time than it saves).
RECOMBINE = True
RECOMBINE_EVERY = 40
PART_SEARCH_MAX_S = 0.5
#: The pattern programme runs again in the search once this many new patterns are known.
PLAN_SEARCH_EVERY = 400
#: Each model's knapsack is solved to this gap in column generation (or a twentieth of the
#: search's gap, when smaller): its proven bound enters the Lagrangian bound, so a little is
#: given up for much less work on models of large demand.
PRICING_REL_GAP = 1e-5
#: Plans dearer than the best by more than this share are not improved by model (each
#: model's cover solved again: the dearest step of a PD plan).
IMPROVE_WITHIN = 0.02


@dataclass
class DecomposedResult:
    counts: np.ndarray | None  # best plan found (instances per column)
    objective: float  # its objective in the minimising form (inf when none)
    bound: float  # proven lower bound of the optimum (inf: proven infeasible)
    nodes: int
    rounds: int
    patterns: int
    finished: bool  # the search ended (not the deadline)
    notes: list[str] = field(default_factory=list)
    #: columns the root master's mix uses (None when the search ended before it): with the
    #: plan's, a neighbourhood where HiGHS finds cheaper plans fast
    root_support: np.ndarray | None = None

    @property
    def gap(self) -> float:
        if self.counts is None or not math.isfinite(self.objective):
            return math.inf
        return relative_gap(self.objective, self.bound)


def relative_gap(objective: float, bound: float) -> float:
    """(objective - bound) / |objective|; 0 within rounding (`ROUNDING_REL`)."""
    if not math.isfinite(objective):
        return math.inf
    if bound >= objective - ROUNDING_REL * max(1.0, abs(objective)):
        return 0.0
    if not math.isfinite(bound):
        return math.inf
    return (objective - bound) / max(abs(objective), 1e-9)


@dataclass(order=True)
class _Node:
    bound: float
    depth: int
    seq: int
    bounds: Bounds = field(compare=False)


def solve_decomposed(dec: Decomposition, *, deadline: float, rel_gap: float,
                     start_price: np.ndarray | None = None,
                     start_bound: float = -math.inf, start_patterns: tuple[Pattern, ...] = (),
                     incumbent: np.ndarray | None = None) -> DecomposedResult:
    """The cheapest plan meeting every demand over `dec`, to `rel_gap`, or until `deadline`
    (a `time.perf_counter()` value). `incumbent` is a feasible plan known beforehand, and
    `start_bound` a bound already proven (e.g. the LP relaxation's)."""
    pricer = Pricer(dec, rel_gap=min(PRICING_REL_GAP, rel_gap / 20))
    master = Master(dec)
    root = Bounds.root(dec)
    for p in start_patterns:
        master.add(p)
    best_x, best = None, math.inf
    if incumbent is not None and feasible(dec, incumbent):
        incumbent = improve_by_model(dec, incumbent, node_price=start_price if
                                     start_price is not None else np.zeros(dec.n_rows))
        best_x, best = incumbent.copy(), dec.cost(incumbent)
        for p in _split(dec, incumbent):
            master.add(p)

    def cutoff() -> float:
        return best - rel_gap * abs(best) if math.isfinite(best) else math.inf

    if math.isfinite(best) and start_bound >= cutoff():  # the LP bound proves it already
        return DecomposedResult(best_x, best, start_bound, 0, 0, len(master.patterns), True,
                                ["the LP bound proves the first plan"])
    node = column_generation(master, pricer, root, deadline=deadline, cutoff=cutoff(),
                             start_price=start_price, bound=start_bound)
    rounds, nodes = node.rounds, 1
    root_bound = node.bound
    root_support = None if node.master is None else _mix(master, node.master) > INTEGRALITY_TOL
    notes = [f"root: {node.rounds} pricing rounds, bound {node.bound:.6g}"]
    if node.master is not None and node.master.artificial > 1e-9 and node.converged \
            and not math.isfinite(best):
        notes.append("the patterns cannot be mixed within availability: infeasible")
        return DecomposedResult(None, math.inf, math.inf, nodes, rounds,
                                len(master.patterns), True, notes)
    seen_patterns = 0

    def plan_search(time_cap: float) -> None:
        nonlocal seen_patterns
        seen_patterns = len(master.patterns)
        budget = min(PLAN_SEARCH_MAX_S, time_cap)
        got = best_pattern_plan(dec, master.patterns, time_limit_s=budget, cutoff=best)
        if got is not None:
            consider(got)
    seen_parts = 0

    def part_search(time_cap: float) -> None:
        nonlocal seen_parts
        seen_parts = len(master.patterns)
        budget = min(PART_SEARCH_MAX_S, time_cap)
        got = best_part_plan(dec, master.patterns, time_limit_s=budget, cutoff=best,
                             rel_gap=rel_gap, target=root_bound / (1.0 - rel_gap))
        if got is not None:
            consider(got)

    def consider(counts: np.ndarray, price: np.ndarray | None = None) -> None:
        nonlocal best_x, best
        if feasible(dec, counts):
            if not math.isfinite(best) or dec.cost(counts) < best * (1.0 + IMPROVE_WITHIN):
                counts = improve_by_model(dec, counts, node_price=np.zeros(dec.n_rows)
                                          if price is None else price)
            value = dec.cost(counts)
            if _better(value, best):
                best_x, best = counts.copy(), value

    # ---- search: best bound first, diving into the child nearer the master value
    closed = math.inf  # least bound of a node closed without branching (cut off or solved)
    heap: list[_Node] = []
    seq = 0
    current: _Node | None = _Node(node.bound, 0, seq, root)
    result = node
    finished = True
    unproven = False
    first = True
    while current is not None:
        if result.bound >= cutoff() or result.master is None or (
                result.converged and result.master.artificial > 1e-9):
            # cut off, or nothing in the node fits (the converged master needs artificial
            # nodes); a master that could not be solved closes the node unproven
            unproven |= result.master is None and result.bound < cutoff()
            closed = min(closed, result.bound)
            current = None
        else:
            xbar = _mix(master, result.master)
            if _integral(xbar):
                consider(np.rint(xbar).astype(np.int64))
                # converged, the master's value is the node's Dantzig-Wolfe bound
                closed = min(closed, max(result.bound, result.master.value)
                             if result.converged else result.bound)
                current = None
            else:
                repaired = round_and_repair(dec, xbar)
                if repaired is not None:
                    consider(repaired)
                if first or len(master.patterns) - seen_patterns >= PLAN_SEARCH_EVERY:
                    plan_search(PLAN_SEARCH_SHARE * max(0.0, deadline - time.perf_counter()))
                if RECOMBINE and dec.has_pd and (
                        first or len(master.patterns) - seen_parts >= RECOMBINE_EVERY):
                    part_search(PLAN_SEARCH_SHARE * max(0.0, deadline - time.perf_counter()))
                if result.bound >= cutoff():
                    closed = min(closed, result.bound)
                    current = None
                else:
                    j = _branch_column(dec, xbar)
                    down = current.bounds.with_hi(j, int(math.floor(xbar[j])))
                    up = current.bounds.with_lo(j, int(math.ceil(xbar[j])))
                    near, far = (up, down) if xbar[j] - math.floor(xbar[j]) >= 0.5 \
                        else (down, up)
                    seq += 1
                    heapq.heappush(heap, _Node(result.bound, current.depth + 1, seq, far))
                    seq += 1
                    current = _Node(result.bound, current.depth + 1, seq, near)
        first = False
        if current is None:
            while heap and heap[0].bound >= cutoff():
                closed = min(closed, heapq.heappop(heap).bound)
            if heap:
                current = heapq.heappop(heap)
        if current is None:
            break
        if time.perf_counter() >= deadline:
            heapq.heappush(heap, current)
            finished = False
            break
        result = column_generation(master, pricer, current.bounds, deadline=deadline,
                                   cutoff=cutoff(), bound=current.bound)
        rounds += result.rounds
        nodes += 1
        if not result.converged and time.perf_counter() >= deadline:
            heapq.heappush(heap, _Node(result.bound, current.depth, current.seq,
                                       current.bounds))
            finished = False
            break
    bound = min([closed, best] + [n.bound for n in heap])
    if not math.isfinite(best) and finished and not unproven:
        bound = math.inf  # every node infeasible: proven
    notes.append(f"search: {nodes} nodes, {rounds} pricing rounds, {len(master.patterns)} "
                 f"patterns{'' if finished else ', stopped by the time limit'}")
    return DecomposedResult(best_x, best, bound, nodes, rounds, len(master.patterns),
                            finished, notes, root_support)


def _better(value: float, best: float) -> bool:
    return not math.isfinite(best) or value < best - 1e-9 * max(1.0, abs(best))


def _split(dec: Decomposition, counts: np.ndarray) -> list[Pattern]:
    """A plan as one pattern per model."""
    out = []
    for m in range(dec.n_models):
        part = np.where(dec.col_model == m, counts, 0)
        served = float(dec.served(part)[m])
        out.append(Pattern(m, part, dec.cost(part), float(dec.priority[m]) * served))
    return out


def _mix(master: Master, sol) -> np.ndarray:
    weights = sol.weights
    on = np.flatnonzero(weights > 1e-12)
    if not len(on):
        return np.zeros(master.dec.n_cols)
    return weights[on] @ np.array([master.patterns[i].counts for i in on], dtype=float)


def _integral(xbar: np.ndarray) -> bool:
    return bool((np.abs(xbar - np.rint(xbar)) <= INTEGRALITY_TOL).all())


def _branch_column(dec: Decomposition, xbar: np.ndarray) -> int:
    """The fractional column that matters most: fractionality times price."""
    frac = xbar - np.floor(xbar)
    score = np.minimum(frac, 1.0 - frac) * (dec.col_price + 1e-9)
    score[np.minimum(frac, 1.0 - frac) <= INTEGRALITY_TOL] = -1.0
    return int(np.argmax(score))
