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

Plans without the search: `round_and_repair` (per model, from the master's counts),
`improve_by_model` (the cost problem's local search), and for goodput `goodput_plan`: the
counts rounded down, the nodes left filled greedily, most goodput per shadow price of the
nodes first (`fill_goodput`), then one instance out and the nodes filled again while that
gains. The scarcity phases (`scarcity.py`) start from it.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from dataclasses import dataclass, field, replace

import highspy
import numpy as np

from coral.allocator.knapsack import knapsack_dp
from coral.allocator.lagrange import (
    Bounds,
    Decomposition,
    Master,
    ModelItems,
    Pattern,
    Pricer,
    column_generation,
)
from coral.allocator.pd_cover import AGG, pd_cover, pd_cover_rest
from coral.solvers import quiet_highs

log = logging.getLogger(__name__)

_INF = highspy.kHighsInf
#: Bound and objective this close (relative) are equal: the bound sums LP duals times
#: availability, which carries the LP's tolerances.
ROUNDING_REL = 1e-7
#: A fractional master value closer than this to an integer counts as integral.
INTEGRALITY_TOL = 1e-6
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
#: Passes of `round_and_repair` over the models.
REPAIR_PASSES = 4
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
    if incumbent is not None and _feasible(dec, incumbent):
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
        if _feasible(dec, counts):
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
                            finished, notes)


def _better(value: float, best: float) -> bool:
    return not math.isfinite(best) or value < best - 1e-9 * max(1.0, abs(best))


def _feasible(dec: Decomposition, counts: np.ndarray) -> bool:
    return dec.fits(counts) and dec.covers(counts)


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


def _solve_binary(cost: np.ndarray, mat: np.ndarray, lower: np.ndarray, upper: np.ndarray, *,
                  time_limit_s: float, rel_gap: float, cutoff: float = math.inf,
                  target: float = -math.inf) -> np.ndarray | None:
    """The chosen columns of min `cost y`, `lower <= y mat <= upper`, y in {0, 1} (rows of
    `mat` are columns), by HiGHS; None when no solution is found in time."""
    n, rows = mat.shape
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = rows
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.ones(n)
    lp.row_lower_ = lower
    lp.row_upper_ = upper
    nz_col, nz_row = np.nonzero(mat)
    start = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(nz_col, minlength=n), out=start[1:])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = start
    lp.a_matrix_.index_ = nz_row.astype(np.int32)
    lp.a_matrix_.value_ = mat[nz_col, nz_row]
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    h = quiet_highs()
    h.setOptionValue("time_limit", float(max(time_limit_s, 1e-3)))
    h.setOptionValue("mip_rel_gap", float(rel_gap))
    if math.isfinite(cutoff):
        h.setOptionValue("objective_bound", float(cutoff))
    if math.isfinite(target):
        h.setOptionValue("objective_target", float(target))
    h.passModel(lp)
    h.run()
    if h.getInfo().primal_solution_status != 2:
        return None
    return np.flatnonzero(np.rint(np.array(h.getSolution().col_value)) > 0)


def best_pattern_plan(dec: Decomposition, patterns: list[Pattern], *, time_limit_s: float,
                      cutoff: float = math.inf) -> np.ndarray | None:
    """The cheapest plan made of one pattern per model within availability, by a 0/1
    programme over the patterns; None when none is found in time."""
    by_model = np.array([p.model for p in patterns], dtype=np.int64)
    if not len(patterns) or len(np.unique(by_model)) < dec.n_models:
        return None
    n = len(patterns)
    used = np.array([dec.used(p.counts) for p in patterns]).reshape(n, dec.n_rows)
    rows = dec.n_rows + dec.n_models
    mat = np.zeros((n, rows))
    mat[:, :dec.n_rows] = used
    mat[np.arange(n), dec.n_rows + by_model] = 1.0
    lower = np.concatenate([np.full(dec.n_rows, -_INF), np.ones(dec.n_models)])
    upper = np.concatenate([dec.avail.astype(float), np.ones(dec.n_models)])
    pick = _solve_binary(np.array([p.cost for p in patterns]), mat, lower, upper,
                         time_limit_s=time_limit_s, rel_gap=1e-7, cutoff=cutoff)
    if pick is None:
        return None
    counts = np.zeros(dec.n_cols, dtype=np.int64)
    for i in pick:
        counts += patterns[i].counts
    if not _feasible(dec, counts):
        log.warning("a pattern plan failed a row; ignored")
        return None
    return counts


def best_part_plan(dec: Decomposition, patterns: list[Pattern], *, time_limit_s: float,
                   cutoff: float = math.inf, rel_gap: float = 1e-4,
                   target: float = -math.inf) -> np.ndarray | None:
    """The cheapest plan meeting every demand made of parts of patterns: each pattern split
    by region and by kind (its aggregated instances, its prefill/decode pairs), and for every
    (model, region, kind) at most one part, by a 0/1 programme. A part's cost and capacity
    are its own (columns are per region, and a region's pairs serve what both halves carry),
    so they add up; patterns from different search nodes recombine into plans no single one
    of them is part of. None when none is found in time."""
    parts: list[np.ndarray] = []
    group_of: list[int] = []
    groups: dict[tuple[int, int, bool], int] = {}
    seen: set[tuple[int, bytes]] = set()
    pd_col = dec.col_half != AGG
    for p in patterns:
        on = np.flatnonzero(p.counts)
        if not len(on):
            continue
        for r in np.unique(dec.col_region[on]):
            for is_pd in (False, True):
                cols = on[(dec.col_region[on] == r) & (pd_col[on] == is_pd)]
                if not len(cols):
                    continue
                sub = np.zeros(dec.n_cols, dtype=np.int64)
                sub[cols] = p.counts[cols]
                key = (p.model, sub.tobytes())
                if key in seen:
                    continue
                seen.add(key)
                g = groups.setdefault((p.model, int(r), is_pd), len(groups))
                parts.append(sub)
                group_of.append(g)
    n = len(parts)
    if not n:
        return None
    mat_parts = np.array(parts)
    model_of = np.array([k[0] for k in sorted(groups, key=groups.get)], dtype=np.int64)
    part_model = model_of[np.array(group_of)]
    used = mat_parts @ dec.usage  # (parts, rows)
    cap = np.array([dec.capacity(x)[m] for x, m in zip(parts, part_model)])
    cost = np.array([dec.cost(x) for x in parts])
    need = np.flatnonzero(dec.demand > 0)
    n_avail, n_group = dec.n_rows, len(groups)
    rows = n_avail + n_group + len(need)
    mat = np.zeros((n, rows))
    mat[:, :n_avail] = used
    mat[np.arange(n), n_avail + np.array(group_of)] = 1.0
    need_row = np.full(dec.n_models, -1)
    need_row[need] = n_avail + n_group + np.arange(len(need))
    on = need_row[part_model] >= 0
    mat[np.flatnonzero(on), need_row[part_model[on]]] = cap[on]
    lower = np.concatenate([np.full(n_avail + n_group, -_INF), dec.demand[need]])
    upper = np.concatenate([dec.avail.astype(float), np.ones(n_group),
                            np.full(len(need), _INF)])
    pick = _solve_binary(cost, mat, lower, upper, time_limit_s=time_limit_s, rel_gap=rel_gap,
                         cutoff=cutoff, target=target)
    if pick is None:
        return None
    counts = mat_parts[pick].sum(axis=0).astype(np.int64)
    if not _feasible(dec, counts):
        log.warning("a plan of pattern parts failed a row; ignored")
        return None
    return counts


def round_and_repair(dec: Decomposition, xbar: np.ndarray, *, exact_pd: bool = True
                     ) -> np.ndarray | None:
    """A plan near the master's fractional counts: round them down (which keeps availability,
    the counts being a mix of patterns within it), then cover each model's uncovered demand
    at least cost from the nodes left, model by model (`knapsack_dp` with each column
    bounded by the nodes left for it). None when that does not make a plan meeting demand.
    """
    x = np.floor(xbar + INTEGRALITY_TOL).astype(np.int64)
    left = dec.avail - dec.used(x)
    order = np.argsort(-dec.priority, kind="stable")
    # a model whose columns share a row may be trimmed short: a few passes cover the rest
    for _ in range(REPAIR_PASSES):
        for m in order:
            cols = np.flatnonzero(dec.col_model == m)
            have = float(dec.capacity(x)[m])
            need = float(dec.demand[m]) - have
            if need <= 1e-9 * max(1.0, float(dec.demand[m])):
                continue
            use = dec.usage[cols]
            with np.errstate(divide="ignore", invalid="ignore"):
                fit = np.where(use > 0, np.floor(left[None, :] / use + 1e-9), np.inf).min(
                    axis=1)
            room = np.minimum(np.where(np.isfinite(fit), fit, dec.col_ub[cols]),
                              dec.col_ub[cols] - x[cols]).astype(np.int64)
            room = np.maximum(room, 0)
            if not room.any():
                continue
            price = dec.col_price[cols] + dec.col_penalty[cols] * (x[cols] >= dec.col_current[
                cols])
            if dec.is_pd(m) and not exact_pd:
                sol = pd_cover_rest(price, dec.col_cap[cols], x[cols], x[cols] + room,
                                    dec.col_half[cols], dec.col_region[cols],
                                    float(dec.demand[m]))
                if sol.x is not None:
                    sol = replace(sol, x=sol.x - x[cols])
            elif dec.is_pd(m):  # on top of the units there now (its pairs are per region)
                sol = pd_cover(price, dec.col_cap[cols], x[cols], x[cols] + room,
                               dec.col_half[cols], dec.col_region[cols], float(dec.demand[m]))
                if sol.x is not None:
                    sol = replace(sol, x=sol.x - x[cols])
            else:
                sol = knapsack_dp(price, dec.col_cap[cols], room, need)
            if sol.x is None or not sol.x.any():
                continue
            add = sol.x
            if (add @ use > left + 1e-9).any():  # columns sharing a row overdraw it: trim
                add = _trim(add, use, left, dec.col_cap[cols] / np.maximum(price, 1e-12))
            x[cols] += add
            left -= add @ use
    if not _feasible(dec, x):
        return None
    return x


def running_plan(dec: Decomposition) -> np.ndarray | None:
    """A plan meeting every demand from the deployment running now (`dec.col_current`): what
    still fits the availability, most capacity per $ first, and each model's rest covered as
    in `round_and_repair`. A re-plan after a small change starts from it; None when nothing
    runs or no such plan is found."""
    if not dec.col_current.any():
        return None
    keep = np.minimum(dec.col_current, dec.col_ub).astype(np.int64)
    if not dec.fits(keep):
        keep = _trim(keep, dec.usage, dec.avail.astype(float),
                     dec.col_cap / np.maximum(dec.col_price, 1e-12))
    return round_and_repair(dec, keep.astype(float))


def _trim(add: np.ndarray, use: np.ndarray, left: np.ndarray, value: np.ndarray) -> np.ndarray:
    """As many of `add`'s instances as fit in `left`, most valuable columns first."""
    out = np.zeros_like(add)
    room = left.astype(float).copy()
    for j in np.argsort(-value, kind="stable"):
        if add[j] <= 0:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            fit = np.where(use[j] > 0, np.floor(room / use[j] + 1e-9), np.inf).min()
        take = int(min(add[j], fit))
        if take > 0:
            out[j] = take
            room -= take * use[j]
    return out


def improve_by_model(dec: Decomposition, counts: np.ndarray, *, node_price: np.ndarray,
                     sweeps: int = 2) -> np.ndarray:
    """Local search on a plan meeting every demand: take one model out, cover
    its demand again at least cost with the nodes the others leave (`knapsack_dp`, each
    column bounded by the nodes left for it), keep the change when it is cheaper and fits.
    Where the model's own columns share a row and overdraw it, the row is priced at
    `node_price` (raised on each retry) and the cover solved again."""
    x = counts.copy()
    items = {m: ModelItems(dec, m) for m in range(dec.n_models)}
    for _ in range(sweeps):
        better = False
        for m in range(dec.n_models):
            cols = np.flatnonzero(dec.col_model == m)
            rest = x.copy()
            rest[cols] = 0
            left = dec.avail - dec.used(rest)
            use = dec.usage[cols]
            with np.errstate(divide="ignore", invalid="ignore"):
                fit = np.where(use > 0, np.floor(left[None, :] / use + 1e-9), np.inf).min(
                    axis=1)
            room = np.minimum(np.where(np.isfinite(fit), fit, np.inf), dec.col_ub[cols])
            hi = dec.col_ub.copy()
            hi[cols] = np.maximum(room, 0).astype(np.int64)
            bounds = Bounds(np.zeros(dec.n_cols, dtype=np.int64), hi)
            it = items[m]
            lo_i, hi_i = it.bounds(bounds)
            price = np.zeros(dec.n_rows)
            for attempt in range(3):
                extra = dec.usage[it.col] @ price
                if it.pd:  # the model's units now are a cover (a hint, when within bounds)
                    sol = pd_cover(it.cost + extra, it.cap, lo_i, hi_i, it.half, it.region,
                                   float(dec.demand[m]), hints=(it.units(x),))
                else:
                    sol = knapsack_dp(it.cost + extra, it.cap, hi_i, float(dec.demand[m]),
                                      lo=lo_i, rel_gap=1e-6)
                if sol.x is None:
                    break
                new = np.zeros(dec.n_cols, dtype=np.int64)
                np.add.at(new, it.col, sol.x)
                over = dec.used(new) > left + 1e-9
                if not over.any():
                    trial = rest + new
                    if dec.cost(trial) < dec.cost(x) - 1e-9 * max(1.0, dec.cost(x)):
                        x, better = trial, True
                    break
                price = price + np.where(over, np.maximum(node_price, 1e-3 * (attempt + 1)
                                                          * float(dec.col_price.max())), 0.0)
        if not better:
            break
    return x


def fill_goodput(dec: Decomposition, counts: np.ndarray, node_value: np.ndarray, *,
                 skip: int = -1) -> np.ndarray:
    """Add instances to `counts` while any fits in the nodes left and serves demand not yet
    served: each time the one of most goodput per node value (`node_value`: a price per node
    of each row, e.g. the LP's shadow prices) first. `skip`: a column not to add to."""
    x = counts.copy()
    left = dec.avail - dec.used(x)
    need = np.maximum(dec.demand - dec.capacity(x), 0.0)
    use = dec.usage
    value = use @ node_value
    value = value + 1e-6 * max(float(value.max(initial=0.0)), 1e-9)
    weight = dec.priority[dec.col_model]
    room = dec.col_ub - x
    if skip >= 0:
        room[skip] = 0
    fits = (use <= left[None, :] + 1e-9).all(axis=1) & (room > 0)
    while True:
        gain = weight * np.minimum(dec.col_cap, need[dec.col_model])
        ok = fits & (gain > 1e-12)
        if not ok.any():
            return x
        j = int(np.argmax(np.where(ok, gain / value, -np.inf)))
        x[j] += 1
        room[j] -= 1
        left -= use[j]
        m = dec.col_model[j]
        need[m] = max(0.0, need[m] - dec.col_cap[j])
        touched = use[:, use[j] > 0]  # only columns sharing a row with j can stop fitting
        fits &= (touched <= left[use[j] > 0][None, :] + 1e-9).all(axis=1)
        fits[j] &= room[j] > 0


def goodput_plan(dec: Decomposition, xbar: np.ndarray, node_value: np.ndarray, *,
                 deadline: float) -> np.ndarray:
    """A plan of high goodput near fractional counts `xbar` (e.g. the LP optimum): round down,
    fill the nodes left (`fill_goodput`), then, until no move gains or `deadline`, take one
    instance out and fill again without it, keeping the change when goodput rises."""
    x = np.clip(np.floor(xbar + INTEGRALITY_TOL).astype(np.int64), 0, dec.col_ub)
    if not dec.fits(x):
        x = np.zeros(dec.n_cols, dtype=np.int64)
    x = fill_goodput(dec, x, node_value)
    best = dec.goodput(x)
    value = dec.usage @ node_value + 1e-9
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        on = np.flatnonzero(x > 0)
        per_value = dec.col_cap[on] * dec.priority[dec.col_model[on]] / value[on]
        for j in on[np.argsort(per_value, kind="stable")]:  # least goodput per value first
            if time.perf_counter() >= deadline:
                break
            y = x.copy()
            y[j] -= 1
            y = fill_goodput(dec, y, node_value, skip=j)
            got = dec.goodput(y)
            if got > best + 1e-9 * max(1.0, best):
                x, best, improved = y, got, True
                break
    return x
