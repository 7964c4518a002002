"""Plans that meet the spot risk target, found without the ILP: the naive spot plan
repaired greedily (`repair`), and the failure sets a plan leaves a model short in
(`uncovered`), which `spot_ilp.scenario_generation` adds to its relaxation.

The repair judges a model on a fixed table of failure sets of all its spot pools `K_m`
(`ModelRisk`: every set of up to `depth` pools down, the sets beyond counted as short), so a
plan it accepts meets the target exactly too: the exact risk is never above the table's.
"""

from __future__ import annotations

import math
import time
from typing import Mapping, Sequence

import numpy as np

from coral.allocator.spot.ilp import CAPACITY_REL_TOL, SpotArrays
from coral.allocator.spot.risk import (
    EXACT_POOLS,
    Pool,
    ScenarioTable,
    scenario_depth,
)


class ModelRisk:
    """Model `m`'s probability of being short on a table of failure sets of `K_m`."""

    def __init__(self, a: SpotArrays, m: int, prob_down: Mapping[Pool, float],
                 tolerance: float, max_scenarios: int):
        self.entries = np.flatnonzero(a.model == m)
        self.pools = a.spot_pools_of(m)
        depth, _ = scenario_depth([prob_down[p] for p in self.pools], tolerance, max_scenarios)
        self.table = ScenarioTable.build(self.pools, prob_down, depth)
        self.alive = self.table.alive([a.pools[j] for j in self.entries])  # bool
        self.cap = a.cap[self.entries]
        self.need = float(a.demand[m]) * (1.0 - CAPACITY_REL_TOL)
        self.pairing = a.pairing(self.entries)
        self.paired = self.pairing.paired
        # per entry: its PD region's column in the pairing (-1: aggregated) and its half
        self.col = np.where(self.pairing.agg > 0, -1,
                            np.argmax(self.pairing.prefill + self.pairing.decode, axis=1)
                            if self.paired else -1)
        self.is_prefill = self.pairing.prefill.sum(axis=1) > 0 if self.paired else None

    def _held(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The positions in `entries` that `x` holds, and (failure sets, those) the capacity
        each keeps: a plan holds a few dozen of a model's hundreds of entries, so the
        tables are read at those columns only."""
        used = np.flatnonzero(x[self.entries] != 0)
        return used, self.alive[:, used] * (self.cap[used] * x[self.entries[used]])

    def scenario_capacity(self, x: np.ndarray) -> np.ndarray:
        """Requests/s served in each failure set of the table."""
        used, held = self._held(x)
        if not self.paired:
            return held.sum(axis=1)
        return (held @ self.pairing.agg[used]
                + np.minimum(held @ self.pairing.prefill[used],
                             held @ self.pairing.decode[used]).sum(axis=1))

    def after(self, x: np.ndarray, moves: Sequence[Sequence[int]], step: int = 1,
              rows: np.ndarray | None = None) -> np.ndarray:
        """(failure sets, moves): requests/s served in each failure set after `step`
        instances of each of a move's entries (positions in `entries`; a move adds one
        entry, or a prefill and a decode half of one region) are added to `x`; only the
        failure sets `rows` (row numbers of the table; default all)."""
        alive = self.alive if rows is None else self.alive[rows]
        first = np.array([mv[0] for mv in moves], dtype=int)
        delta = step * alive[:, first] * self.cap[first]
        used = np.flatnonzero(x[self.entries] != 0)
        held = alive[:, used] * (self.cap[used] * x[self.entries[used]])
        if not self.paired:
            return held.sum(axis=1)[:, None] + delta
        pre, dec = held @ self.pairing.prefill[used], held @ self.pairing.decode[used]
        cap_s = held @ self.pairing.agg[used] + np.minimum(pre, dec).sum(axis=1)
        k = np.maximum(self.col[first], 0)
        isp = self.is_prefill[first]
        p0, d0 = pre[:, k], dec[:, k]
        paired_gain = (np.minimum(p0 + delta * isp, d0 + delta * ~isp) - np.minimum(p0, d0))
        out = cap_s[:, None] + np.where(self.col[first] < 0, delta, paired_gain)
        for c, mv in enumerate(moves):
            k = self.col[mv[0]]
            if k < 0 or len(mv) == 1:
                continue
            out[:, c] = cap_s
            p, d = pre[:, k].copy(), dec[:, k].copy()
            for e in mv:
                add = step * alive[:, e] * self.cap[e]
                if self.is_prefill[e]:
                    p += add
                else:
                    d += add
            out[:, c] += np.minimum(p, d) - np.minimum(pre[:, k], dec[:, k])
        return out

    def pair_moves(self, cand: np.ndarray, unit: np.ndarray, per_half: int = 6
                   ) -> list[tuple[int, int]]:
        """(prefill, decode) moves of one region among candidates `cand` (positions in
        `entries`), the `per_half` cheapest per request/s of each half and region: where a
        region holds one half only, adding one instance alone serves nothing more."""
        if not self.paired:
            return []
        moves = []
        for k in range(self.pairing.prefill.shape[1]):
            mine = cand[self.col[cand] == k]
            halves = [mine[self.is_prefill[mine]], mine[~self.is_prefill[mine]]]
            best = [h[np.argsort(unit[h] / self.cap[h])[:per_half]] for h in halves]
            moves.extend((int(p), int(d)) for p in best[0] for d in best[1])
        return moves

    def risk(self, x: np.ndarray) -> float:
        return float(self.table.prob @ (self.scenario_capacity(x) < self.need)) + self.table.left


def repair(a: SpotArrays, risks: Sequence[ModelRisk | None], x0: np.ndarray, budget: float,
           deadline: float = math.inf) -> np.ndarray | None:
    """`x0` (a plan within availability; it may be short of demand, the set with every pool
    up then counting as a failure) with instances added where a model's risk exceeds
    `budget` — each time the one that removes the most expected
    shortfall (probability x requests/s short) per $ — then instances removed, dearest per
    request/s first, while the model stays within budget. None when no instance that still
    fits helps, or when `deadline` (a `time.perf_counter()` instant) passes before every
    model is within budget; past it while removing, the plan as it stands (every model
    within budget) is returned."""
    x = x0.copy()
    rows_of: list[list[tuple[int, float]]] = [[] for _ in a.keys]
    for i, (_, idx, nodes) in enumerate(a.usage):
        for j, n in zip(idx, nodes):
            rows_of[j].append((i, float(n)))
    free = a.avail.astype(float).copy()
    for i, (_, idx, nodes) in enumerate(a.usage):
        free[i] -= float(nodes @ x[idx])
    unit = a.hourly + a.penalty

    def fits(j: int) -> bool:
        return all(free[i] >= n for i, n in rows_of[j])

    def move(j: int, step: int) -> None:
        x[j] += step
        for i, n in rows_of[j]:
            free[i] -= step * n

    order = sorted((m for m, r in enumerate(risks) if r is not None),
                   key=lambda m: -risks[m].risk(x))  # type: ignore[union-attr]
    for m in order:
        r = risks[m]
        assert r is not None
        if r.risk(x) <= budget:
            continue
        while r.risk(x) > budget:
            if time.perf_counter() > deadline:
                return None
            cand = np.array([k for k, j in enumerate(r.entries) if fits(int(j))], dtype=int)
            if not len(cand):
                return None
            cap_s = r.scenario_capacity(x)
            # adding capacity changes nothing where the model is covered: only the failure
            # sets it is short in are read
            rows = np.flatnonzero(cap_s < r.need)
            short = r.need - cap_s[rows]
            if r.paired:
                moves = [(int(k),) for k in cand]
                after = np.maximum(r.need - r.after(x, moves, rows=rows), 0.0)
            else:
                gain = r.alive[np.ix_(rows, cand)] * r.cap[cand]
                after = np.maximum(r.need - cap_s[rows, None] - gain, 0.0)
            less = r.table.prob[rows] @ (short[:, None] - after)
            best = int(np.argmax(less / unit[r.entries[cand]]))
            if less[best] <= 0:
                pairs = r.pair_moves(cand, unit[r.entries])
                if not pairs:
                    return None
                after = np.maximum(r.need - r.after(x, pairs, rows=rows), 0.0)
                less = r.table.prob[rows] @ (short[:, None] - after)
                cost = np.array([unit[r.entries[list(mv)]].sum() for mv in pairs])
                best = int(np.argmax(less / cost))
                if less[best] <= 0:
                    return None
                for k in pairs[best]:
                    move(int(r.entries[k]), +1)
                continue
            move(int(r.entries[cand[best]]), +1)
        per_rps = unit[r.entries] / r.cap
        for k in np.argsort(-per_rps):
            j = int(r.entries[k])
            while x[j] > 0 and time.perf_counter() <= deadline:
                move(j, -1)
                if r.scenario_capacity(x)[0] < r.need or r.risk(x) > budget:
                    move(j, +1)
                    break
    return x


def exact_table(a: SpotArrays, m: int, x: np.ndarray, prob_down: Mapping[Pool, float]
                ) -> tuple[ScenarioTable, np.ndarray, float] | None:
    """Every failure set of the spot pools model `m`'s instances in `x` use (sets of at most
    two pools beyond `EXACT_POOLS` pools, as `spot_risk.shortfall_probability`), the
    capacity left in each, and the demand to meet. None when it holds no spot instance."""
    mine = np.flatnonzero((a.model == m) & (x > 0))
    pools = sorted({p for j in mine for p in a.pools[j]})
    if not pools:
        return None
    table = ScenarioTable.build(pools, prob_down, len(pools) if len(pools) <= EXACT_POOLS
                                else 2)
    alive = table.alive([a.pools[j] for j in mine])
    pairing = a.pairing(mine)
    cap = (pairing.served(alive * (a.cap[mine] * x[mine])) if pairing.paired
           else alive @ (a.cap[mine] * x[mine]))
    return table, cap, float(a.demand[m]) * (1.0 - CAPACITY_REL_TOL)


def uncovered(a: SpotArrays, x: np.ndarray, prob_down: Mapping[Pool, float], budget: float,
              k_pools: Sequence[Sequence[Pool] | None]
              ) -> dict[int, tuple[list[tuple[int, ...]], list[int]]]:
    """Per model whose exact risk under plan `x` exceeds `budget`: the failure sets of the
    pools its instances use that leave it short, likeliest first, and those pools, as
    indices into its `k_pools[m]`."""
    out: dict[int, tuple[list[tuple[int, ...]], list[int]]] = {}
    for m, k_m in enumerate(k_pools):
        if k_m is None:
            continue
        judged = exact_table(a, m, x, prob_down)
        if judged is None:
            continue
        table, cap, need = judged
        short = cap < need
        if float(table.prob @ short) + table.left <= budget:
            continue
        index = {p: k for k, p in enumerate(k_m)}
        rows = np.flatnonzero(short)
        rows = rows[np.argsort(-table.prob[rows])]
        out[m] = ([tuple(sorted(index[table.pools[k]] for k in np.flatnonzero(table.down[s])))
                   for s in rows], sorted(index[p] for p in table.pools))
    return out


def best_candidate(a: SpotArrays, candidates: Sequence[tuple[str, np.ndarray | None]],
                   prob_down: Mapping[Pool, float], budget: float,
                   k_pools: Sequence[Sequence[Pool] | None]) -> tuple[np.ndarray | None, str]:
    """The cheapest of `candidates` (name, plan) that fits, meets demand and meets the
    target exactly, and its name; (None, "") when none does."""
    best, best_from = None, ""
    for name, x in candidates:
        if x is None or not a.fits(x) or (a.capacity(x) < a.demand * (1 - 1e-9)).any():
            continue
        if uncovered(a, x, prob_down, budget, k_pools):
            continue
        if best is None or a.objective(x) < a.objective(best):
            best, best_from = x, name
    return best, best_from


def local_search(a: SpotArrays, risks: Sequence[ModelRisk | None], x: np.ndarray,
                 budget: float, deadline: float, max_moves: int = 2000) -> np.ndarray:
    """`x` (meeting demand and the target) improved by single moves inside each model: drop
    the instance whose removal saves most, else swap one instance for another that saves
    most (the target and demand kept, as `ModelRisk` judges them, within availability),
    until no move saves or `deadline` (a `time.perf_counter()` instant) passes."""
    x = x.copy()
    usage = np.zeros((len(a.keys), len(a.usage)))
    for i, (_, idx, nodes) in enumerate(a.usage):
        usage[idx, i] = nodes
    free = a.avail - usage.T @ x
    for m, r in enumerate(risks):
        if r is None:
            continue
        ent = r.entries
        for _ in range(max_moves):
            if time.perf_counter() > deadline:
                return x
            cap_s = r.scenario_capacity(x)
            used = np.flatnonzero(x[ent] > 0)
            # what dropping one instance saves, and adding one costs ($/hour plus a start-up,
            # or less the stop of a running one it keeps)
            save = a.hourly[ent] + np.where(x[ent] > a.current[ent], 1.0, -1.0) * a.penalty[ent]
            spend = a.hourly[ent] + np.where(x[ent] >= a.current[ent], 1.0, -1.0) * a.penalty[ent]
            if r.paired:
                base = r.after(x, [(int(k),) for k in used], -1)
            else:
                base = cap_s[:, None] - r.alive[:, used] * r.cap[used]  # (scenarios, used)
            ok = (base[0] >= r.need) & (r.table.prob @ (base < r.need) + r.table.left <= budget)
            if ok.any():
                k = used[np.argmax(np.where(ok, save[used], -np.inf))]
                _step(x, free, usage, int(ent[k]), -1)
                continue
            best, move = 1e-9, None
            for u, k in enumerate(used):
                room = free + usage[ent[k]]
                fits = (usage[ent] <= room + 1e-9).all(axis=1)
                gain = save[k] - spend
                cand = np.flatnonzero(fits & (gain > best))
                cand = cand[cand != k]
                if not len(cand):
                    continue
                # adding never uncovers a failure set: only those short without `k` are read
                rows = np.flatnonzero(base[:, u] < r.need)
                if r.paired:
                    x[ent[k]] -= 1
                    if len(rows) and rows[0] == 0:  # demand first: one row, then the rest
                        up = r.after(x, [(int(c),) for c in cand], rows=rows[:1])[0]
                        cand = cand[up >= r.need]
                    after = (r.after(x, [(int(c),) for c in cand], rows=rows) if len(cand)
                             else np.zeros((len(rows), 0)))
                    x[ent[k]] += 1
                else:
                    after = base[rows, u:u + 1] + r.alive[np.ix_(rows, cand)] * r.cap[cand]
                all_up = after[0] >= r.need if len(rows) and rows[0] == 0 else True
                good = all_up & (
                    r.table.prob[rows] @ (after < r.need) + r.table.left <= budget)
                if good.any():
                    c = cand[np.argmax(np.where(good, gain[cand], -np.inf))]
                    best, move = gain[c], (int(ent[k]), int(ent[c]))
            if move is None:
                break
            _step(x, free, usage, move[0], -1)
            _step(x, free, usage, move[1], +1)
    return x


def _step(x: np.ndarray, free: np.ndarray, usage: np.ndarray, j: int, by: int) -> None:
    x[j] += by
    free -= by * usage[j]
