"""One model on its own when it may be served by prefill/decode (PD) pairs: the cheapest cover.

    minimise   sum_i cost_i x_i
    subject to sum_{i agg} cap_i x_i + sum_r min(P_r(x), D_r(x)) >= demand
               lo_i <= x_i <= hi_i, integer

where `P_r(x)` and `D_r(x)` are the requests/s the prefill and the decode instances of region
`r` carry (each half's capacity over its tokens per request): a region serves what both its
halves can, since a prompt prefilled there has its KV cache decoded in the same region. It is
the per-model piece of the allocator's decomposition (`lagrange.py`) for PD models, as
`knapsack.knapsack_dp` is for aggregated ones; the LP relaxation of the same rows lets a
region's demand be split into fractions of instances in every region at once and lies 3-5 %
below the optimum on `core`-size problems, the per-model covers do not.

Solved exactly, by Pareto frontiers (capacity up, cost up):

- each group of items (the aggregated items; each region's prefill items; its decode items)
  gets the frontier of its covers: every (capacity, cost) no other cover of the group beats on
  both counts, capacity capped at the demand (more is worth nothing), by a dynamic programme
  over the items (compiled, `_frontier`);
- a region's frontier is the sum of its halves' at each capacity both reach (serving q takes
  a prefill cover of q and a decode cover of q);
- the groups' frontiers are combined one after another (min-plus: each pair of states, the
  frontier of the sums kept), and the cheapest state that reaches the demand is the optimum.

States are dropped as they appear when even the cheapest completion of them (every request/s
still missing at the least cost per request/s any item left could serve it) costs more than a
plan known beforehand (a hint, or one group covering everything alone, by `knapsack_dp`): no
cover through them can be cheaper. The loops are compiled (`kernels/pd_cover_kernel.py`, numba).
"""

from __future__ import annotations

import math

import numpy as np

from coral.allocator.decomposition.knapsack import DEMAND_TOL, KnapsackSolution, cover_dp

#: Aggregated items' half.
AGG = -1
PREFILL, DECODE = 0, 1
#: States kept per frontier (those of least completion bound when there are more; the least
#: bound of the dropped ones then bounds the answer, which may no longer be exact).
MAX_STATES = 4_000
#: Costs within this relative distance are equal (a state must be dearer than its better by
#: more to be kept).
COST_TOL = 1e-12


def _rebuild(state: int, lo: np.ndarray, hist_par: np.ndarray, hist_k: np.ndarray,
             offsets: np.ndarray) -> np.ndarray:
    """Units per item of a final state of `_frontier`."""
    n = len(lo)
    x = lo.astype(np.int64).copy()
    for i in range(n - 1, -1, -1):
        pos = offsets[i] + state
        x[i] += hist_k[pos]
        state = int(hist_par[pos])
    return x


def served(cap: np.ndarray, half: np.ndarray, region: np.ndarray, x: np.ndarray) -> float:
    """Requests/s the units `x` serve: aggregated capacity plus, per region, the lesser of
    its halves."""
    x = np.asarray(x, dtype=float)
    total = float(cap[half == AGG] @ x[half == AGG])
    pd = half != AGG
    if pd.any():
        regions = np.unique(region[pd])
        for r in regions:
            p = (half == PREFILL) & (region == r)
            d = (half == DECODE) & (region == r)
            total += min(float(cap[p] @ x[p]), float(cap[d] @ x[d]))
    return total


def pd_cover(cost: np.ndarray, cap: np.ndarray, lo: np.ndarray, hi: np.ndarray,
             half: np.ndarray, region: np.ndarray, demand: float, *,
             hints: tuple[np.ndarray, ...] = ()) -> KnapsackSolution:
    """Cheapest units within `lo`..`hi` that serve `demand` (see the module's docstring);
    `cost` >= 0. Exact (the lower bound is the value) unless a frontier outgrew `MAX_STATES`;
    the lower bound is proven either way. `x` None when nothing serves it."""
    # imported on first use: numba and the compiled code take a while to load
    from coral.allocator.kernels import pd_cover_kernel as _kernel

    cost, cap, lo, hi, half, region = _arrays(cost, cap, lo, hi, half, region)
    n = len(cost)
    if (lo > hi).any():
        return KnapsackSolution(None, math.inf, math.inf)
    tol = DEMAND_TOL * max(1.0, demand)
    groups = _groups(cost, cap, half, region)

    def value_of(x: np.ndarray) -> float:  # cost of a cover, inf for a shortfall
        short = max(0.0, demand - served(cap, half, region, x))
        return float(cost @ x) if short <= tol else math.inf

    limit = math.inf
    best_x: np.ndarray | None = None
    for h in hints:
        h = np.asarray(h, dtype=np.int64)
        if len(h) == n and (h >= lo).all() and (h <= hi).all():
            value = value_of(h)
            if value < limit:
                limit, best_x = value, h.copy()
    quick = [] if best_x is not None else _one_group_plans(
        cost, cap, lo, hi, half, region, groups, demand, tol)
    for x in quick:
        value = value_of(x)
        if value < limit:
            limit, best_x = value, x
    if best_x is None:  # not even every unit serves it
        if served(cap, half, region, hi) < demand - tol:
            return KnapsackSolution(None, math.inf, math.inf)
    limit_in = limit * (1.0 + 1e-12) + 1e-12 if math.isfinite(limit) else math.inf
    hi = _undominated(cost, cap, lo, hi, groups, demand)
    # what each group can add beyond its least units at best (per request/s), and serves
    # for nothing at most
    rates, frees, half_rates, half_frees = [], [], [], []
    for kind, items in groups:
        per_half = [(_rate(cost[idx], cap[idx], lo[idx], hi[idx]), float(cap[idx] @ lo[idx]))
                    for idx in items]
        half_rates.append([r for r, _ in per_half])
        half_frees.append([f for _, f in per_half])
        rates.append(sum(r for r, _ in per_half))
        frees.append(max(f for _, f in per_half))

    def rest(skip: set[int]) -> tuple[float, float]:
        others = [g for g in range(len(groups)) if g not in skip]
        return (min((rates[g] for g in others), default=math.inf),
                sum(frees[g] for g in others))

    # each group's frontier, regions as the sum of their halves
    fronts = []
    dropped = math.inf  # least completion bound of the states dropped by the state cap
    for g, (kind, items) in enumerate(groups):
        rest_rate, rest_free = rest({g})
        if kind == "agg":
            (idx,) = items
            q, c, par, kk, off, cut = _kernel.frontier(
                cost[idx], cap[idx], lo[idx], hi[idx], demand, limit_in, COST_TOL, 0.0,
                math.inf, rest_rate, rest_free, MAX_STATES)
            dropped = min(dropped, cut)
            fronts.append((q, c, [(idx, par, kk, off, np.arange(len(q)))]))
        else:
            built = []
            for h, idx in enumerate(items):
                *front, cut = _kernel.frontier(
                    cost[idx], cap[idx], lo[idx], hi[idx], demand, limit_in, COST_TOL,
                    half_rates[g][1 - h], half_frees[g][1 - h], rest_rate, rest_free,
                    MAX_STATES)
                dropped = min(dropped, cut)
                built.append(front)
            (qp, cp, parp, kp, offp), (qd, cd, pard, kd, offd) = built
            q, c, ip, idd = _pair(qp, cp, qd, cd, limit_in)
            p_idx, d_idx = items
            fronts.append((q, c, [(p_idx, parp, kp, offp, ip), (d_idx, pard, kd, offd, idd)]))
    # min-plus over the groups, keeping where each state came from; the last group only
    # completes each state to the demand at least cost
    if any(not len(q) for q, _, _ in fronts):
        return _fallback(best_x, cost, dropped)
    if len(fronts) == 1:  # nothing to pair with: the empty state
        fronts.insert(0, (np.zeros(1), np.zeros(1), []))
    q_all, c_all, trail, cut = _combined(fronts[:-2], rest, demand, limit_in)
    dropped = min(dropped, cut)
    if not len(q_all):
        return _fallback(best_x, cost, dropped)
    (qb, cb, _), (qc, cc, _) = fronts[-2], fronts[-1]
    total, a, b, k = _kernel.finish(q_all, c_all, qb, cb, qc, cc, demand, limit_in, tol)
    if not math.isfinite(total):
        return _fallback(best_x, cost, dropped)
    trail.append((np.array([a]), np.array([b])))
    trail.append((np.array([0]), np.array([k])))
    x = _units(fronts, trail, 0, lo)
    value = float(cost @ x)
    if best_x is not None and float(cost @ best_x) <= value:
        x, value = best_x, float(cost @ best_x)
    return KnapsackSolution(x, value, min(value, dropped))


def _units(fronts: list, trail: list[tuple[np.ndarray, np.ndarray]], state: int,
           lo: np.ndarray) -> np.ndarray:
    """Units per item of the combined state `state`, group by group back to the first."""
    x = lo.copy()
    for g in range(len(fronts) - 1, -1, -1):
        ia, ib = trail[g]
        own = int(ib[state])
        state = int(ia[state])
        for idx, par, kk, off, pick in fronts[g][2]:
            x[idx] = _rebuild(int(pick[own]), lo[idx], par, kk, off)
    return x


def _combined(fronts: list, rest, demand: float, limit: float
              ) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]], float]:
    """The min-plus frontier of `fronts` in order, with where each step's states came from
    and the least bound of the states the cap dropped; empty when every state was cut off."""
    from coral.allocator.kernels import pd_cover_kernel as _kernel

    q_all = np.zeros(1)
    c_all = np.zeros(1)
    trail: list[tuple[np.ndarray, np.ndarray]] = []
    dropped = math.inf
    for g, (q, c, _) in enumerate(fronts):
        rest_rate, rest_free = rest(set(range(g + 1)))
        q_all, c_all, ia, ib, cut = _kernel.combine(q_all, c_all, q, c, demand, limit,
                                                    COST_TOL, rest_rate, rest_free, MAX_STATES)
        dropped = min(dropped, cut)
        trail.append((ia, ib))
        if not len(q_all):
            break
    return q_all, c_all, trail, dropped


def _undominated(cost: np.ndarray, cap: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                 groups: list[tuple[str, tuple[np.ndarray, ...]]], demand: float
                 ) -> np.ndarray:
    """`hi` with no units left to the items another item of their group beats (at least
    as much capacity for no more cost) when that one has units enough to serve the demand
    alone: a cover using the first is no cheaper with the second instead."""
    hi = hi.copy()
    for _, items in groups:
        for idx in items:
            free = idx[(hi[idx] > lo[idx]) & (cap[idx] > 0)]
            if len(free) < 2:
                continue
            order = free[np.lexsort((free, cost[free], -cap[free]))]  # most capacity first
            enough = hi[order] - lo[order] >= np.ceil(demand / cap[order] - 1e-12)
            cheapest = np.minimum.accumulate(np.where(enough, cost[order], np.inf))
            beaten = np.zeros(len(order), dtype=bool)
            beaten[1:] = cheapest[:-1] <= cost[order[1:]]
            hi[order[beaten]] = lo[order[beaten]]
    return hi


def _fallback(best_x: np.ndarray | None, cost: np.ndarray, dropped: float = math.inf
              ) -> KnapsackSolution:
    """Nothing cheaper than the known plan among the states kept: it is optimal unless a
    dropped state's bound is lower (or nothing serves the demand)."""
    if best_x is None:
        return KnapsackSolution(None, math.inf, dropped)
    value = float(cost @ best_x)
    return KnapsackSolution(best_x, value, min(value, dropped))


def _rate(cost: np.ndarray, cap: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    """Least cost per request/s of the items with units left (inf when none has)."""
    free = (hi > lo) & (cap > 0)
    return float((cost[free] / cap[free]).min()) if free.any() else math.inf


def _pair(qp: np.ndarray, cp: np.ndarray, qd: np.ndarray, cd: np.ndarray, limit: float
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A region's frontier from its halves': at each capacity either half's frontier has,
    the cheapest prefill cover of it plus the cheapest decode cover of it."""
    if not len(qp) or not len(qd):
        return np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64)
    top = min(qp[-1], qd[-1])
    levels = np.unique(np.concatenate([qp, qd]))
    levels = levels[levels <= top]
    ip = np.searchsorted(qp, levels, side="left")
    idd = np.searchsorted(qd, levels, side="left")
    c = cp[ip] + cd[idd]
    ok = c <= limit
    levels, c, ip, idd = levels[ok], c[ok], ip[ok], idd[ok]
    # the frontier: cost strictly rising with capacity (equal cost: the larger capacity)
    keep = np.ones(len(c), dtype=bool)
    keep[:-1] = c[1:] > c[:-1]
    return levels[keep], c[keep], ip[keep], idd[keep]


def _arrays(cost: np.ndarray, cap: np.ndarray, lo: np.ndarray, hi: np.ndarray,
            half: np.ndarray, region: np.ndarray) -> tuple[np.ndarray, ...]:
    """The items' figures as the kernels take them: costs and capacities as floats, the rest
    as integers."""
    return (np.asarray(cost, dtype=float), np.asarray(cap, dtype=float),
            *(np.asarray(a, dtype=np.int64) for a in (lo, hi, half, region)))


def _groups(cost: np.ndarray, cap: np.ndarray, half: np.ndarray, region: np.ndarray
            ) -> list[tuple[str, tuple[np.ndarray, ...]]]:
    """The aggregated items, then each region's (prefill, decode) items; each group's items
    by cost per request/s, cheapest first (the frontier then prunes on the dearer rest)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(cap > 0, cost / np.where(cap > 0, cap, 1.0), np.inf)

    def by_ratio(idx: np.ndarray) -> np.ndarray:
        return idx[np.argsort(ratio[idx], kind="stable")]

    out: list[tuple[str, tuple[np.ndarray, ...]]] = []
    agg = np.flatnonzero(half == AGG)
    if len(agg):
        out.append(("agg", (by_ratio(agg),)))
    for r in np.unique(region[half != AGG]):
        p = np.flatnonzero((half == PREFILL) & (region == r))
        d = np.flatnonzero((half == DECODE) & (region == r))
        out.append(("pd", (by_ratio(p), by_ratio(d))))
    return out


def _one_group_plans(cost: np.ndarray, cap: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                     half: np.ndarray, region: np.ndarray,
                     groups: list[tuple[str, tuple[np.ndarray, ...]]], demand: float,
                     tol: float) -> list[np.ndarray]:
    """Plans where every item keeps its least units and one group serves what they leave
    (each half covered at least cost by `cover_dp`): a first bound to prune by."""
    base_served = served(cap, half, region, lo)
    need = demand - base_served
    if need <= tol:
        return [lo.copy()]
    out = []
    for kind, items in groups:
        x = lo.copy()
        ok = True
        if kind == "agg":
            targets = [(items[0], need)]
        else:
            p_idx, d_idx = items
            p0 = float(cap[p_idx] @ lo[p_idx])
            d0 = float(cap[d_idx] @ lo[d_idx])
            goal = min(p0, d0) + need
            targets = [(p_idx, goal - p0), (d_idx, goal - d0)]
        for idx, extra in targets:
            if extra <= tol:
                continue
            sol = cover_dp(cost[idx], cap[idx], hi[idx] - lo[idx], extra, rel_gap=1e-3)
            if sol.x is None:
                ok = False
                break
            x[idx] = lo[idx] + sol.x
        if ok:
            out.append(x)
    return out


def pd_cover_rest(cost: np.ndarray, cap: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                  half: np.ndarray, region: np.ndarray, demand: float) -> KnapsackSolution:
    """A quick cover on top of units already placed (`lo`): the cheapest single group (the
    aggregated items, or one region's pair of halves) serving all the rest, else the group
    adding the most serves what it can and the next one the rest. A heuristic for models too
    large for `pd_cover`'s frontiers (its lower bound is only the cost of `lo`); it is cheap
    when `lo` already serves most of the demand, as after rounding down an LP optimum."""
    cost, cap, lo, hi, half, region = _arrays(cost, cap, lo, hi, half, region)
    if (lo > hi).any():
        return KnapsackSolution(None, math.inf, math.inf)
    tol = DEMAND_TOL * max(1.0, demand)
    groups = _groups(cost, cap, half, region)
    bound = float(cost @ lo)
    x = lo.copy()
    for _ in range(len(groups) + 1):
        plans = _one_group_plans(cost, cap, x, hi, half, region, groups, demand, tol)
        if plans:
            best = min(plans, key=lambda y: float(cost @ y))
            return KnapsackSolution(best, float(cost @ best), bound)
        # no group serves the rest alone: the one that can add the most takes all it can,
        # at least cost, and the next round covers what is left
        have = served(cap, half, region, x)
        gains = []
        for _kind, items in groups:
            top = x.copy()
            for idx in items:
                top[idx] = hi[idx]
            gains.append(served(cap, half, region, top) - have)
        g = int(np.argmax(gains))
        if gains[g] <= tol:
            break
        step = _one_group_plans(cost, cap, x, hi, half, region, [groups[g]], have + gains[g],
                                tol)
        if not step:
            break
        x = step[0]
    return KnapsackSolution(None, math.inf, math.inf)
