"""The per-model knapsack as plain numpy array code: the oracle the compiled kernels
(`coral/allocator/kernels/knapsack_kernel.py`, `kernels/knapsack_programme.py`) are checked
against in `test_allocator_knapsack_kernel.py`.

It is `coral/allocator/decomposition/knapsack.py` as it was before its loops were compiled,
with one change:
the pool's candidates of equal value are taken in the stable order (the default sort left
their order to the numpy build). Its goodput mode (`reward`, `hard=False`) is gone from the
package, which never called it; the tests call this code as a cover only. Nothing in the
package imports it.
"""

from __future__ import annotations

import math

import numpy as np

from coral.allocator.decomposition.knapsack import DEMAND_TOL, MAX_STATES, KnapsackSolution


def knapsack_dp(cost: np.ndarray, cap: np.ndarray, ub: np.ndarray, demand: float, *,
                reward: float = 0.0, hard: bool = True, lo: np.ndarray | None = None,
                rel_gap: float = 0.0, max_states: int = MAX_STATES, pool: int = 0,
                hints: tuple[np.ndarray, ...] = ()) -> KnapsackSolution:
    """Solve the problem of the module docstring. Costs must be >= 0 and capacities > 0.

    With `rel_gap`, states whose bound is within that relative distance of the best value are
    pruned too (faster; the lower bound says what was given up). With `pool`, up to that many
    distinct solutions besides the best (the best complete states met on the way) come back
    too, for heuristics that combine models. `hints` are solutions known beforehand (e.g. the
    last solve's, at other costs): the best valid one starts the search, and a good start
    fixes more units.
    """
    cost = np.asarray(cost, dtype=float)
    cap = np.asarray(cap, dtype=float)
    ub = np.asarray(ub, dtype=np.int64)
    n = len(cost)
    base = np.zeros(n, dtype=np.int64) if lo is None else np.asarray(lo, dtype=np.int64)
    if (base > ub).any():
        return KnapsackSolution(None, math.inf, math.inf)
    # x = base + y: y's demand is what `base` leaves, and the reward on base's capacity is paid
    base_cap = float(cap @ base)
    offset = float(cost @ base) - reward * min(demand, base_cap)
    if hard:  # every solution meets the demand: the reward is a constant
        offset = float(cost @ base) - reward * demand
        reward = 0.0
    rest = max(0.0, demand - base_cap)
    sol = _solve(cost, cap, ub - base, rest, reward, hard, rel_gap, max_states, pool,
                 tuple(np.asarray(h, dtype=np.int64) - base for h in hints),
                 DEMAND_TOL * max(1.0, demand))
    if sol.x is None:
        return sol
    return KnapsackSolution(sol.x + base, sol.value + offset, sol.lower_bound + offset,
                            tuple((v + offset, x + base) for v, x in sol.pool))


def _objective(c: np.ndarray, a: np.ndarray, x: np.ndarray, demand: float, reward: float
               ) -> float:
    return float(c @ x) - reward * min(demand, float(a @ x))


def _solve(cost: np.ndarray, cap: np.ndarray, ub: np.ndarray, demand: float, reward: float,
           hard: bool, rel_gap: float, max_states: int, pool: int,
           hints: tuple[np.ndarray, ...], tol: float) -> KnapsackSolution:
    n = len(cost)
    zero = np.zeros(n, dtype=np.int64)
    if demand <= tol or (not hard and reward <= 0.0):
        return KnapsackSolution(zero, 0.0, 0.0)
    order = np.lexsort((-cap, cost / cap))
    c, a, u = cost[order], cap[order], ub[order]
    ratio = c / a
    cum_a = np.concatenate([[0.0], np.cumsum(a * u)])
    cum_c = np.concatenate([[0.0], np.cumsum(c * u)])
    if hard and cum_a[-1] < demand - tol:
        return KnapsackSolution(None, math.inf, math.inf)

    # LP optimum. Items by ratio; with `hard`, up to the one that meets demand; without, the
    # items dearer than the reward are never worth taking.
    b = int(np.searchsorted(cum_a, demand - tol, side="left")) - 1  # critical item
    q = n if hard else int(np.searchsorted(ratio, reward, side="left"))  # worth taking
    if b < q:
        lam = ratio[b]
        z_lp = cum_c[b] + (demand - cum_a[b]) * lam - (0.0 if hard else reward * demand)
        taken = b
    else:  # every item worth taking fits under the demand
        lam = reward
        z_lp = cum_c[q] - reward * cum_a[q]
        taken = q
    best, best_x = (math.inf, zero) if hard else (0.0, zero)
    for x in _first_solutions(c, a, u, demand, tol, hard, q):
        v = _objective(c, a, x, demand, reward)
        if v < best:
            best, best_x = v, x
    for hint in hints:
        h = hint[order]
        if (h >= 0).all() and (h <= u).all() and (not hard or a @ h >= demand - tol):
            v = _objective(c, a, h, demand, reward)
            if v < best:
                best, best_x = v, h.copy()

    # Reduced-cost fixing: value(x) >= z_lp + sum_j |d_j| * |x_j - x_lp_j| with
    # d_j = c_j - lam a_j, so a solution no worse than `best` keeps x_j within
    # slack / |d_j| of the LP's value.
    # (With a gap, only solutions better than `best` by more than it are looked for, so the
    # fixing is tighter, and what it excludes is worth at least max(z_lp, target).)
    target = best - rel_gap * abs(best) if math.isfinite(best) else best
    slack = target - z_lp + 1e-9 * max(1.0, abs(best))
    d = np.abs(c - lam * a)
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.where(d > 1e-15, np.floor(slack / d), np.inf)
    room = np.minimum(np.maximum(room, 0.0), float(2**40)).astype(np.int64)
    idx = np.arange(n)
    lo = np.where(idx < taken, np.maximum(0, u - room), 0)
    hi = np.where(idx > taken, np.minimum(u, room), u)
    if not hard:
        hi = np.where(idx >= q, 0, hi)  # dearer than the reward: never worth a unit
    hi = np.maximum(hi, lo)
    found: list[tuple[float, np.ndarray]] = []
    lower = math.inf
    pre_cap = float(a @ lo)
    pre_value = float(c @ lo) - (0.0 if hard else reward * min(demand, pre_cap))
    if slack < 0:  # nothing beats `best` by more than the gap
        pass
    elif pre_cap >= demand - tol or not (hi > lo).any():
        if (not hard or pre_cap >= demand - tol) and pre_value < best:
            best, best_x = pre_value, lo.copy()
    else:
        if not hard and pre_value < best:
            best, best_x = pre_value, lo.copy()
        best, best_x, lower = _programme(
            c, a, lo, hi, demand, tol, pre_cap, float(c @ lo), best, best_x,
            rel_gap, max_states, pool, found, reward, hard)
    lower = min(lower, best)
    if rel_gap > 0.0:
        lower = min(lower, max(z_lp, target))
    x = np.zeros(n, dtype=np.int64)
    x[order] = best_x
    kept: list[tuple[float, np.ndarray]] = []
    if pool:
        seen = {best_x.tobytes()}
        for value, xs in sorted(found, key=lambda item: item[0]):
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


def _first_solutions(c: np.ndarray, a: np.ndarray, u: np.ndarray, demand: float, tol: float,
                     hard: bool, q: int) -> list[np.ndarray]:
    """Quick solutions (items sorted by ratio): as many of each item worth taking as fit
    under the demand; with `hard`, completed by the cheapest single item, and the cheapest
    cover by one item alone."""
    n = len(c)
    out = []
    x = np.zeros(n, dtype=np.int64)
    rest = demand
    for j in range(q):
        take = min(int(u[j]), int(math.floor(rest / a[j] + 1e-12)))
        if take > 0:
            x[j] = take
            rest -= take * a[j]
        if rest <= tol:
            break
    out.append(x)
    if rest > tol:
        k = np.ceil(rest / a[:q] - 1e-12)
        ok = k <= u[:q] - x[:q]
        if ok.any():
            total = np.where(ok, k * c[:q], np.inf)
            j = int(np.argmin(total))
            done = x.copy()
            done[j] += int(k[j])
            out.append(done)
    if hard:
        k = np.ceil(demand / a - 1e-12)
        ok = k <= u
        if ok.any():
            j = int(np.argmin(np.where(ok, k * c, np.inf)))
            one = np.zeros(n, dtype=np.int64)
            one[j] = int(k[j])
            out.append(one)
        out = [x for x in out if a @ x >= demand - tol]
    return out


def _programme(c: np.ndarray, a: np.ndarray, lo: np.ndarray, hi: np.ndarray, demand: float,
               tol: float, pre_cap: float, pre_cost: float, best: float, best_x: np.ndarray,
               rel_gap: float, max_states: int, pool: int,
               found: list[tuple[float, np.ndarray]], reward: float, hard: bool
               ) -> tuple[float, np.ndarray, float]:
    """The Pareto-state programme over the free units `hi - lo` (items sorted by ratio).
    Returns (best value, its x, least bound of a pruned state)."""
    free = np.flatnonzero(hi > lo)
    units = (hi - lo)[free]
    # steps: free items of equal capacity, in order of their cheapest unit
    caps, group_of = np.unique(a[free], return_inverse=True)
    first_pos = np.full(len(caps), len(free))
    np.minimum.at(first_pos, group_of, np.arange(len(free)))
    step_of = np.empty(len(caps), dtype=np.int64)
    step_of[np.argsort(first_pos, kind="stable")] = np.arange(len(caps))
    item_step = step_of[group_of]
    n_steps = len(caps)
    by_step = np.lexsort((np.arange(len(free)), item_step))  # positions in `free`, by step
    step_start = np.searchsorted(item_step[by_step], np.arange(n_steps + 1))
    members = [by_step[step_start[s]:step_start[s + 1]] for s in range(n_steps)]
    step_cap = a[free[by_step[step_start[:-1]]]]

    def unit_cost(s: int) -> np.ndarray:
        """Cost of k units of step s, k = 0.. (its cheapest units first)."""
        m = members[s]
        return np.concatenate([[0.0], np.cumsum(np.repeat(c[free[m]], units[m]))])

    # LP bound of what steps s.. can add: their free units, by ratio
    fa, fc = a[free] * units, c[free] * units
    later = item_step[None, :] >= np.arange(n_steps + 1)[:, None]
    cum_a = np.concatenate([np.zeros((n_steps + 1, 1)), np.cumsum(later * fa, axis=1)], axis=1)
    cum_c = np.concatenate([np.zeros((n_steps + 1, 1)), np.cumsum(later * fc, axis=1)], axis=1)
    f_ratio = c[free] / a[free]
    n_free = len(free)

    def lp_rest(s: int, rest: np.ndarray) -> np.ndarray:
        """Least cost (minus reward) with which steps s.. add to `rest` of capacity: with
        `hard`, covering all of it; without, as much of it as pays."""
        ca, cc = cum_a[s], cum_c[s]
        pos = np.searchsorted(ca, rest - tol, side="left") - 1  # the item that fills `rest`
        pos_c = np.minimum(pos, n_free - 1)
        fill = cc[pos_c] + np.maximum(0.0, rest - ca[pos_c]) * f_ratio[pos_c]
        if hard:
            return np.where(pos < n_free, fill, np.inf)
        # the items worth taking: f_ratio < reward, a prefix of the ratio order
        q = int(np.searchsorted(f_ratio, reward, side="left"))
        full = cc[q] - reward * ca[q]  # all of them, when they fit under `rest`
        return np.where(pos < q, fill - reward * rest, full)

    def value_of(cap: np.ndarray, cost: np.ndarray) -> np.ndarray:
        return cost if hard else cost - reward * np.minimum(demand, cap)

    def rebuild(s: int, k: int, parent: int, hist: list[tuple[np.ndarray, np.ndarray]]
                ) -> np.ndarray:
        counts = np.zeros(n_steps, dtype=np.int64)
        counts[s] = k
        for back in range(s - 1, -1, -1):
            par, kk = hist[back]
            counts[back] = kk[parent]
            parent = par[parent]
        x = lo.copy()
        for step in np.flatnonzero(counts):
            left = int(counts[step])
            for pos in members[step]:  # cheapest units first
                t = min(left, int(units[pos]))
                x[free[pos]] += t
                left -= t
                if not left:
                    break
        return x

    threshold = best - rel_gap * abs(best)
    lower = math.inf
    s_cap = np.full(1, pre_cap)
    s_cost = np.full(1, pre_cost)
    hist: list[tuple[np.ndarray, np.ndarray]] = []
    raw: list[tuple[float, int, int, int]] = []  # good states: (value, step, k, parent)
    for s in range(n_steps):
        if not len(s_cap):
            break
        table = unit_cost(s)
        most = len(table) - 1
        kmax = np.minimum(most, np.ceil((demand - s_cap) / step_cap[s] - 1e-12)).astype(np.int64)
        par, kk = np.nonzero(np.arange(int(kmax.max()) + 1)[None, :] <= kmax[:, None])
        cap2 = s_cap[par] + kk * step_cap[s]
        cost2 = s_cost[par] + table[kk]
        done = cap2 >= demand - tol
        value = value_of(cap2, cost2)
        # every state is a solution without `hard`; with it, only the complete ones
        sols = np.flatnonzero(done) if hard else np.flatnonzero(kk > 0)
        if len(sols):
            i = int(sols[np.argmin(value[sols])])
            if value[i] < best:
                best = float(value[i])
                best_x = rebuild(s, int(kk[i]), int(par[i]), hist)
                threshold = best - rel_gap * abs(best)
            if pool:
                for i in sols[np.argsort(value[sols], kind="stable")[:pool]]:
                    raw.append((float(value[i]), s, int(kk[i]), int(par[i])))
        if done.any():
            live = ~done
            par, kk, cap2, cost2, value = par[live], kk[live], cap2[live], cost2[live], value[live]
        if not len(cap2):
            s_cap = cap2
            hist.append((par, kk))
            break
        if s + 1 < n_steps:
            bound = value + lp_rest(s + 1, demand - cap2)
        else:
            bound = np.full(len(cap2), np.inf) if hard else value
        cut = bound >= threshold
        if cut.any():
            lower = min(lower, float(bound[cut].min()))
            live = ~cut
            par, kk, cap2, cost2, bound = par[live], kk[live], cap2[live], cost2[live], bound[live]
        if len(cost2) > 1:
            o = np.lexsort((cost2, -cap2))
            par, kk, cap2, cost2, bound = par[o], kk[o], cap2[o], cost2[o], bound[o]
            front = np.ones(len(cost2), dtype=bool)
            front[1:] = cost2[1:] < np.minimum.accumulate(cost2)[:-1]
            par, kk, cap2, cost2, bound = (par[front], kk[front], cap2[front], cost2[front],
                                           bound[front])
        if len(cost2) > max_states:
            o = np.argsort(bound, kind="stable")
            lower = min(lower, float(bound[o[max_states]]))
            o = np.sort(o[:max_states])
            par, kk, cap2, cost2 = par[o], kk[o], cap2[o], cost2[o]
        hist.append((par, kk))
        s_cap, s_cost = cap2, cost2
    if raw:
        raw.sort(key=lambda item: item[0])
        for value_, s, k, parent in raw[:2 * pool + 1]:
            found.append((value_, rebuild(s, k, parent, hist)))
    return best, best_x, lower
