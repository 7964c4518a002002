"""One model on its own: the bounded covering knapsack, solved exactly.

    minimise   sum_i cost_i x_i
    subject to sum_i cap_i x_i >= demand
               lo_i <= x_i <= ub_i, integer

It is one model's demand row: the cheapest cover, and the allocator's workhorse: the per-model
fast path solves it with true prices, branch and price (`branch_price.py`) completes plans
with it, and the Lagrangian bound (`lagrange.py`) solves it once per model and round with
every node priced at its shadow price.

Its instances are hard for LP-based branch and bound: a model has a hundred or more templates
whose cost per request/s differ by a fraction of a percent, so the LP bound is almost met
everywhere and a tree over the items cannot prune (HiGHS 1.16 takes seconds on one such row,
a depth-first search over the items tenths of a second). `knapsack_dp` is a dynamic programme
over Pareto states instead:

- items are taken best cost per capacity first; a state is (capacity so far, cost so far);
  after each step only the states that no other state beats on both counts are kept (more
  capacity for no more cost), and only those whose value plus the LP bound of the items still
  to come can beat the best solution found;
- before that, reduced-cost fixing against the LP optimum takes the units that any solution as
  good as the first one must use, and drops those it cannot afford, so the programme runs only
  over the few items near the LP's critical ratio;
- items of equal capacity (one template in several regions, or with and without a start-up
  penalty) form one group whose k units cost the k cheapest units: one step per group.

Every answer carries a proven lower bound: the least bound of a pruned state, or the best
value when nothing was pruned below it. A state cap (`max_states`) keeps the states of best
bound and folds the least bound of the dropped ones into the lower bound, so even a capped run
gives a valid bound.

The loops are compiled (numba): the sort by ratio, the quick solutions and the fixing in
`kernels/knapsack_kernel.py`, the programme in `kernels/knapsack_programme.py`; the dot products
stay here, in numpy, so that the answers are those of the array code it replaced, bit for bit
(`tests/knapsack_reference.py` is that code, and the tests hold the two to it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: States kept after each step of the programme (those of least bound, when there are more).
MAX_STATES = 2_000
#: Relative tolerance with which capacity meets demand (as the ILP's row tolerance).
DEMAND_TOL = 1e-9


@dataclass(frozen=True)
class KnapsackSolution:
    """The best solution found, and what is proven about the optimum."""

    x: np.ndarray | None  # units per item (None: the items cannot cover the demand)
    value: float  # objective of `x` (inf when None)
    lower_bound: float  # proven: no solution has a lower objective (inf when none exists)
    pool: tuple[tuple[float, np.ndarray], ...] = ()  # other good solutions, (value, x)

    @property
    def complete(self) -> bool:
        """`x` is optimal (its value meets the lower bound up to rounding)."""
        return self.x is None or self.value <= self.lower_bound + 1e-9 * max(1.0, abs(
            self.value))

    @property
    def cost(self) -> float:  # the covering problem's name for the value
        return self.value


def cover_dp(cost: np.ndarray, cap: np.ndarray, ub: np.ndarray, demand: float, *,
             rel_gap: float = 0.0, max_states: int = MAX_STATES, pool: int = 0,
             hints: tuple[np.ndarray, ...] = ()) -> KnapsackSolution:
    """Cheapest cover of `demand` by items of `cost`, `cap` and at most `ub` units each
    (`knapsack_dp` without least units)."""
    return knapsack_dp(cost, cap, ub, demand, rel_gap=rel_gap, max_states=max_states,
                       pool=pool, hints=hints)


def knapsack_dp(cost: np.ndarray, cap: np.ndarray, ub: np.ndarray, demand: float, *,
                lo: np.ndarray | None = None, rel_gap: float = 0.0,
                max_states: int = MAX_STATES, pool: int = 0,
                hints: tuple[np.ndarray, ...] = ()) -> KnapsackSolution:
    """Solve the problem of the module docstring. Costs must be >= 0 and capacities > 0.

    With `rel_gap`, states whose bound is within that relative distance of the best value are
    pruned too (faster; the lower bound says what was given up). With `pool`, up to that many
    distinct solutions besides the best (the best complete states met on the way) come back
    too, for heuristics that combine models. `hints` are solutions known beforehand (e.g. the
    last solve's, at other costs): the best valid one starts the search, and a good start
    fixes more units.
    """
    cost = np.ascontiguousarray(cost, dtype=float)
    cap = np.ascontiguousarray(cap, dtype=float)
    ub = np.ascontiguousarray(ub, dtype=np.int64)
    n = len(cost)
    base = np.zeros(n, dtype=np.int64) if lo is None else np.asarray(lo, dtype=np.int64)
    if (base > ub).any():
        return KnapsackSolution(None, math.inf, math.inf)
    # x = base + y: y's demand is what `base` leaves
    base_cap = float(cap @ base)
    offset = float(cost @ base)
    rest = max(0.0, demand - base_cap)
    sol = _solve(cost, cap, ub - base, rest, float(rel_gap), int(max_states), int(pool),
                 tuple(np.asarray(h, dtype=np.int64) - base for h in hints),
                 DEMAND_TOL * max(1.0, demand))
    if sol.x is None:
        return sol
    return KnapsackSolution(sol.x + base, sol.value + offset, sol.lower_bound + offset,
                            tuple((v + offset, x + base) for v, x in sol.pool))


def _solve(cost: np.ndarray, cap: np.ndarray, ub: np.ndarray, demand: float, rel_gap: float,
           max_states: int, pool: int, hints: tuple[np.ndarray, ...], tol: float
           ) -> KnapsackSolution:
    # imported on first use: numba and the compiled code take a few tenths of a second to load
    from coral.allocator.kernels import knapsack_kernel as _kernel
    from coral.allocator.kernels import knapsack_programme as _programme

    n = len(cost)
    zero = np.zeros(n, dtype=np.int64)
    if demand <= tol:
        return KnapsackSolution(zero, 0.0, 0.0)
    # items by ratio, the LP optimum (dual `lam`, value `z_lp`) and the quick solutions
    feasible, order, c, a, u, lam, z_lp, taken, starts, n_starts = _kernel.start(
        cost, cap, ub, demand, tol)
    if not feasible:
        return KnapsackSolution(None, math.inf, math.inf)
    best, best_x = math.inf, zero
    for x in starts[:n_starts]:
        if not a @ x >= demand - tol:
            continue
        v = float(c @ x)
        if v < best:
            best, best_x = v, x
    for hint in hints:
        h = hint[order]
        if (h >= 0).all() and (h <= u).all() and a @ h >= demand - tol:
            v = float(c @ h)
            if v < best:
                best, best_x = v, h.copy()

    # Reduced-cost fixing: value(x) >= z_lp + sum_j |d_j| * |x_j - x_lp_j| with
    # d_j = c_j - lam a_j, so a solution no worse than `best` keeps x_j within
    # slack / |d_j| of the LP's value.
    # (With a gap, only solutions better than `best` by more than it are looked for, so the
    # fixing is tighter, and what it excludes is worth at least max(z_lp, target).)
    target = best - rel_gap * abs(best) if math.isfinite(best) else best
    slack = target - z_lp + 1e-9 * max(1.0, abs(best))
    lo, hi, any_free = _kernel.fix(c, a, u, lam, slack, taken)
    lower = math.inf
    found_values: np.ndarray = np.empty(0)
    found_xs: np.ndarray = np.empty((0, n), dtype=np.int64)
    pre_cap = float(a @ lo)
    pre_cost = float(c @ lo)
    if slack < 0:  # nothing beats `best` by more than the gap
        pass
    elif pre_cap >= demand - tol or not any_free:
        if pre_cap >= demand - tol and pre_cost < best:
            best, best_x = pre_cost, lo.copy()
    else:
        best, improved, x_dp, lower, found_values, found_xs = _programme.programme(
            c, a, lo, hi, demand, tol, pre_cap, pre_cost, best, rel_gap, max_states, pool)
        if improved:
            best_x = x_dp
    lower = min(lower, best)
    if rel_gap > 0.0:
        lower = min(lower, max(z_lp, target))
    x = np.zeros(n, dtype=np.int64)
    x[order] = best_x
    kept: list[tuple[float, np.ndarray]] = []
    if pool:
        seen = {best_x.tobytes()}
        for value, xs in zip(found_values.tolist(), found_xs):  # best first
            key = xs.tobytes()
            if key in seen:
                continue
            seen.add(key)
            full = np.zeros(n, dtype=np.int64)
            full[order] = xs
            kept.append((value, full))
            if len(kept) >= pool:
                break
    return KnapsackSolution(x, best, lower, tuple(kept))
