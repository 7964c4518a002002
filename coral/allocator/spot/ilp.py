"""The spot planner's arrays and its chance-constrained ILP, solved by scenario generation.

Objective
---------
A spot instance is reclaimed `rate` times an hour (its pools' rates summed) and each time a
replacement is started, so its expected $/hour is `price (1 + rate startup_s / 3600)`; an
on-demand instance's is its price. An instance beyond the current deployment pays its
start-up once, `startup_s` seconds of its expected $/hour (a start-up cut short by a
preemption is paid again). Keeping a running instance is free, as in `core/formulation.py`; one
stopped pays as much as a start-up, since it serves until the instances that take over
from it have started (make before break: `coral.sim.preemption`, the controller)::

    minimise  sum_j hourly_j x_j + sum_j penalty_j |x_j - current_j|

With nothing running (a first plan) this is the on-demand ILP's objective, so the naive
spot problem (no risk rows) is an ordinary `AllocationProblem` whose spot columns are priced
at their expected $/hour, and `ilp.solve_allocation` solves it; with a deployment running,
that problem leaves the stops out, so its optimum is still a lower bound.

Scenario generation
-------------------
The chance constraint of model `m` over its spot pools `K_m` (`planner.py`) needs a row and a
binary `z_{m,S}` for every failure set `S` of `K_m`: 2^24 of them for a model of `core`.
This ILP keeps, per model, a family `E_m` of sets and lets every set outside it count as
covered::

    sum_{j in m, pools_j disjoint from S} cap_j x_j >= demand_m z_{m,S}      S in E_m
    sum_{S in E_m} pi_S (1 - z_{m,S})                <= 1 - target
    z_{m,S} <= z_{m,S - {k}}                        S, S - {k} in E_m

The last rows say that losing more pools never helps; they cut fractional points of the LP.
This is a relaxation of the exact ILP (fewer sets judged, every one of them judged
exactly), so its optimum is a lower bound, and a plan it returns whose exact risk
(`spot_risk.shortfall_probability`, every failure set of the pools the plan uses) meets the
target is feasible for the exact ILP, and optimal when the relaxation was solved to
optimality. A plan that fails the check adds the failure sets it does not cover to `E_m` and
the relaxation is solved again. `E_m` starts with the single pools of `K_m`. Every round is
cut off at the best plan known to meet the target (the on-demand plan, the repaired naive
plan of `spot_repair`), so a round proves that plan optimal when it finds nothing cheaper.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import highspy
import numpy as np

from coral.allocator.spot.risk import AGGREGATED, DECODE, PREFILL, Pairing, Pool
from coral.solvers import quiet_highs

_INF = highspy.kHighsInf
#: Most failure sets one failing plan adds to a model's family per round.
MAX_ADDED_PER_ROUND = 512
#: Relative slack with which a capacity counts as meeting its demand (solver tolerances).
CAPACITY_REL_TOL = 1e-9


@dataclass(frozen=True)
class SpotArrays:
    """The spot problem's entries (column, region) as arrays, for the ILP and the repair."""

    keys: tuple[tuple[str, str], ...]  # (column id, region) per entry
    model: np.ndarray  # index into `models` per entry
    cap: np.ndarray  # requests/s per instance (a PD half: its tokens/s per request's tokens)
    hourly: np.ndarray  # expected $/hour per instance (with replacements)
    penalty: np.ndarray  # $ per instance started
    current: np.ndarray  # instances running now
    ub: np.ndarray  # most instances the availability allows, each column alone
    pools: tuple[frozenset[Pool], ...]  # spot pools per entry (empty: on demand)
    usage: tuple[tuple[Pool, np.ndarray, np.ndarray], ...]  # (pool, entries, nodes each)
    avail: np.ndarray  # nodes per usage row
    models: tuple[str, ...]
    demand: np.ndarray  # requests/s per model
    half: np.ndarray  # AGGREGATED, PREFILL or DECODE per entry (`spot_risk.Pairing`)
    region: np.ndarray  # region index per entry (PD halves pair inside one region)

    def pairing(self, entries: np.ndarray) -> Pairing:
        """How the capacities of `entries` (of one model) combine into requests/s served."""
        return Pairing.of(self.half[entries], self.region[entries])

    def objective(self, x: np.ndarray) -> float:
        return float(self.hourly @ x + self.penalty @ np.abs(x - self.current))

    def fits(self, x: np.ndarray) -> bool:
        return all(float(n @ x[idx]) <= cap for (_, idx, n), cap in zip(self.usage, self.avail))

    def capacity(self, x: np.ndarray) -> np.ndarray:
        """Requests/s each model serves with every pool up (PD halves paired per region)."""
        if not (self.half != AGGREGATED).any():
            return np.bincount(self.model, weights=self.cap * x, minlength=len(self.models))
        out = np.zeros(len(self.models))
        for m in range(len(self.models)):
            mine = np.flatnonzero(self.model == m)
            out[m] = float(self.pairing(mine).served(self.cap[mine] * x[mine]))
        return out

    def counts(self, x: np.ndarray) -> dict[tuple[str, str], int]:
        return {self.keys[j]: int(x[j]) for j in np.flatnonzero(x > 0)}

    def vector(self, counts: Mapping[tuple[str, str], int]) -> np.ndarray | None:
        """A plan as an x vector; None when it holds a key these entries do not."""
        pos = {k: j for j, k in enumerate(self.keys)}
        x = np.zeros(len(self.keys))
        for key, n in counts.items():
            if n and key not in pos:
                return None
            if n:
                x[pos[key]] = n
        return x

    def one_model(self, m: int, x: np.ndarray) -> tuple["SpotArrays", np.ndarray]:
        """Model `m` alone, with the nodes plan `x` gives the other models taken out of the
        availability; and the positions of its entries here."""
        mine = np.flatnonzero(self.model == m)
        pos = np.full(len(self.keys), -1)
        pos[mine] = np.arange(len(mine))
        usage, avail = [], []
        for (pool, idx, nodes), most in zip(self.usage, self.avail):
            keep = pos[idx] >= 0
            if keep.any():
                others = float(nodes[~keep] @ x[idx[~keep]])
                usage.append((pool, pos[idx[keep]], nodes[keep]))
                avail.append(most - others)
        sub = SpotArrays(
            keys=tuple(self.keys[j] for j in mine), model=np.zeros(len(mine), dtype=int),
            cap=self.cap[mine], hourly=self.hourly[mine], penalty=self.penalty[mine],
            current=self.current[mine], ub=self.ub[mine],
            pools=tuple(self.pools[j] for j in mine), usage=tuple(usage),
            avail=np.array(avail), models=(self.models[m],), demand=self.demand[m:m + 1],
            half=self.half[mine], region=self.region[mine])
        return sub, mine

    def spot_pools_of(self, m: int) -> list[Pool]:
        return sorted({p for j in np.flatnonzero(self.model == m) for p in self.pools[j]})


@dataclass
class ScenarioFamily:
    """`E_m` of one model: failure sets of its pools `K_m` (tuples of indices into `pools`)
    with their probability (those pools down, the rest of `K_m` up)."""

    pools: tuple[Pool, ...]
    prob_down: tuple[float, ...]
    sets: dict[tuple[int, ...], float] = field(default_factory=dict)

    @classmethod
    def singles(cls, pools: Sequence[Pool], prob_down: Mapping[Pool, float]
                ) -> "ScenarioFamily":
        """The family every model starts with: each pool of `K_m` down alone."""
        fam = cls(tuple(pools), tuple(prob_down[p] for p in pools))
        for k in range(len(pools)):
            fam.add((k,))
        return fam

    def add(self, down: tuple[int, ...]) -> bool:
        if down in self.sets or not down:
            return False
        s = set(down)
        self.sets[down] = math.prod(p if k in s else 1.0 - p
                                    for k, p in enumerate(self.prob_down))
        return True

    def cut(self, short: Sequence[tuple[int, ...]], used: Sequence[int], budget: float) -> int:
        """Add failure sets so that a plan is no longer feasible in the relaxation, given
        the sets `short` of the pools it uses (`used`) it leaves the model short in: each of
        those sets with every pool outside `used` up, then with one of them down, and more
        (likeliest first) while the sets it is short in weigh at most `budget`."""
        inside = set(used)
        free = [k for k in range(len(self.pools)) if k not in inside]
        failing = set(short)
        added = 0
        for s in short:
            for k in (None, *free):
                added += self.add(s if k is None else tuple(sorted((*s, k))))
        mass = sum(p for s, p in self.sets.items()
                   if tuple(k for k in s if k in inside) in failing)
        if mass > budget:
            return added
        deeper: list[tuple[int, ...]] = []
        for t in range(2, len(free) + 1):
            if len(deeper) > MAX_ADDED_PER_ROUND * 8:
                break
            for s in short:
                deeper.extend(tuple(sorted((*s, *extra)))
                              for extra in itertools.combinations(free, t))
        deeper = sorted({d for d in deeper if d not in self.sets}, key=self._prob, reverse=True)
        for d in deeper:
            if mass > budget:
                break
            added += self.add(d)
            mass += self.sets[d]
        return added

    def _prob(self, down: tuple[int, ...]) -> float:
        s = set(down)
        return math.prod(p if k in s else 1.0 - p for k, p in enumerate(self.prob_down))


def add_cover_row(h: highspy.Highs, a: SpotArrays, alive: np.ndarray, demand: float,
                  z: int | None, n_col: int) -> int:
    """One model's capacity row over the entries `alive` (those outside the failure set)::

        sum_{j in alive, aggregated} cap_j x_j + sum_r d_r >= demand z    (z = 1: all pools up)
        sum_{j in alive, prefill in r} cap_j x_j >= d_r,  likewise decode,  d_r >= 0

    `d_r` are this row's own pairing variables (requests/s that region `r`'s surviving
    halves pair, as `formulation.add_pd_pairing_rows` pairs them with every pool up): at an
    optimum `d_r` is the lesser half, so the row holds exactly when the plan serves `demand`
    in the failure set. A region missing one of its halves pairs nothing and gets no `d_r`.
    Returns the next free column."""
    pd = alive[a.half[alive] != AGGREGATED]
    agg = alive[a.half[alive] == AGGREGATED]
    cols, vals = [agg], [a.cap[agg]]
    for r in np.unique(a.region[pd]):
        pre = pd[(a.region[pd] == r) & (a.half[pd] == PREFILL)]
        dec = pd[(a.region[pd] == r) & (a.half[pd] == DECODE)]
        if not len(pre) or not len(dec):
            continue
        h.addVar(0.0, demand)
        for half in (pre, dec):
            h.addRow(0.0, _INF, len(half) + 1, np.append(half, n_col).astype(np.int32),
                     np.append(a.cap[half], -1.0))
        cols.append(np.array([n_col]))
        vals.append(np.array([1.0]))
        n_col += 1
    if z is None:
        lb = demand
    else:
        lb = 0.0
        cols.append(np.array([z]))
        vals.append(np.array([-demand]))
    idx = np.concatenate(cols).astype(np.int32)
    h.addRow(lb, _INF, len(idx), idx, np.concatenate(vals).astype(float))
    return n_col


@dataclass
class RoundResult:
    x: np.ndarray | None  # the relaxation's plan (None: nothing below the cut-off)
    bound: float  # proven lower bound of the relaxation (so of the exact ILP)
    optimal: bool  # solved to the gap asked (or proven nothing below the cut-off)
    detail: str


def solve_round(a: SpotArrays, families: Sequence[ScenarioFamily | None], budget: float,
                *, cutoff: float, time_limit_s: float, mip_gap: float) -> RoundResult:
    """One relaxation (see the module), searching only below `cutoff`."""
    h = quiet_highs()
    n = len(a.keys)
    new_cost = np.where(a.current == 0, a.penalty, 0.0)
    h.addVars(n, np.zeros(n), a.ub.astype(float))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), a.hourly + new_cost)
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32),
                            np.full(n, highspy.HighsVarType.kInteger))
    n_col = n
    # start-ups beyond the running instances: y_j >= x_j - current_j
    for j in np.flatnonzero((a.current > 0) & (a.penalty > 0) & (a.ub > a.current)):
        h.addVar(0.0, float(a.ub[j] - a.current[j]))
        h.changeColCost(n_col, float(a.penalty[j]))
        h.addRow(-float(a.current[j]), _INF, 2, np.array([n_col, j], dtype=np.int32),
                 np.array([1.0, -1.0]))
        n_col += 1
    # running instances stopped: s_j >= current_j - x_j
    for j in np.flatnonzero((a.current > 0) & (a.penalty > 0)):
        h.addVar(0.0, float(a.current[j]))
        h.changeColCost(n_col, float(a.penalty[j]))
        h.addRow(float(a.current[j]), _INF, 2, np.array([n_col, j], dtype=np.int32),
                 np.array([1.0, 1.0]))
        n_col += 1
    for (_, idx, nodes), most in zip(a.usage, a.avail):
        h.addRow(-_INF, float(most), len(idx), idx.astype(np.int32), nodes.astype(float))
    for m, fam in enumerate(families):
        mine = np.flatnonzero(a.model == m)
        n_col = add_cover_row(h, a, mine, float(a.demand[m]), None, n_col)
        if fam is None or not fam.sets:
            continue
        index = {p: k for k, p in enumerate(fam.pools)}
        masks = np.array([sum(1 << index[p] for p in a.pools[j]) for j in mine], dtype=np.int64)
        z_of: dict[tuple[int, ...], int] = {}
        for down in fam.sets:
            dmask = sum(1 << k for k in down)
            alive = mine[(masks & dmask) == 0]
            z = n_col
            h.addVar(0.0, 1.0)
            h.changeColIntegrality(z, highspy.HighsVarType.kInteger)
            n_col += 1
            z_of[down] = z
            n_col = add_cover_row(h, a, alive, float(a.demand[m]), z, n_col)
        for down, z in z_of.items():
            for k in down:
                sub = tuple(i for i in down if i != k)
                if sub in z_of:
                    h.addRow(-_INF, 0.0, 2, np.array([z, z_of[sub]], dtype=np.int32),
                             np.array([1.0, -1.0]))
        probs = np.array([fam.sets[d] for d in z_of])
        h.addRow(float(probs.sum() - budget), _INF, len(z_of),
                 np.array(list(z_of.values()), dtype=np.int32), probs)
    h.setOptionValue("time_limit", float(max(time_limit_s, 1e-3)))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    if math.isfinite(cutoff):
        h.setOptionValue("objective_bound", float(cutoff))
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    detail = h.modelStatusToString(status)
    bound = float(info.mip_dual_bound)
    if status in (highspy.HighsModelStatus.kInfeasible,
                  highspy.HighsModelStatus.kUnboundedOrInfeasible,
                  highspy.HighsModelStatus.kObjectiveBound):
        # nothing below the cut-off: the plan at the cut-off is optimal
        return RoundResult(None, cutoff, True, detail)
    if not math.isfinite(bound):
        bound = -math.inf
    bound = min(bound, cutoff)
    if info.primal_solution_status != 2:
        return RoundResult(None, bound, False, detail)
    x = np.round(np.asarray(h.getSolution().col_value[:n])).astype(float)
    return RoundResult(x, bound, status == highspy.HighsModelStatus.kOptimal, detail)


@dataclass
class GenerationResult:
    x: np.ndarray | None  # the best plan meeting the target (None: none known)
    bound: float  # proven lower bound of the exact ILP
    rounds: int
    scenario_rows: int
    notes: list[str]


def scenario_generation(a: SpotArrays, families: Sequence[ScenarioFamily | None],
                        budget: float, best: np.ndarray | None,
                        uncovered: Callable[[np.ndarray], Mapping[int, tuple[
                            Sequence[tuple[int, ...]], Sequence[int]]]],
                        *, deadline: float, mip_gap: float) -> GenerationResult:
    """Relaxations until one's plan meets the target or time runs out (see the module).

    `best`: a plan known to meet the target (its cost cuts every round off); `uncovered(x)`:
    per model whose exact risk misses the target, the failure sets of the pools plan `x`
    uses that leave it short and those pools (indices into `K_m`; empty when `x` meets the
    target)."""
    best_obj = a.objective(best) if best is not None else math.inf
    bound = -math.inf
    notes: list[str] = []
    rounds = 0
    while True:
        left = deadline - time.perf_counter()
        if left <= 0 or (best is not None and gap_of(best_obj, bound) <= mip_gap):
            break
        rounds += 1
        res = solve_round(a, families, budget, cutoff=best_obj, time_limit_s=left,
                          mip_gap=mip_gap)
        bound = max(bound, res.bound)
        if res.x is None:
            if not res.optimal:
                notes.append(f"round {rounds}: no plan below the best known ({res.detail})")
            break
        short = uncovered(res.x)
        if not short:
            if a.objective(res.x) < best_obj:
                best, best_obj = res.x, a.objective(res.x)
            if res.optimal:
                break
            continue  # time is left only if HiGHS stopped early: try again from this cut-off
        added = 0
        for m, (sets, used) in short.items():
            fam = families[m]
            assert fam is not None
            added += fam.cut(sets[:MAX_ADDED_PER_ROUND], used, budget)
        if not added:  # within the solver's tolerances only: nothing to add
            notes.append(f"round {rounds}: a plan short by tolerances only; search stopped")
            break
    rows = sum(len(f.sets) for f in families if f is not None)
    return GenerationResult(best, bound, rounds, rows, notes)


def gap_of(objective: float, bound: float) -> float:
    """(objective - bound) / objective; 0 within rounding."""
    if not math.isfinite(objective):
        return math.inf
    if bound >= objective - 1e-9 * max(1.0, abs(objective)):
        return 0.0
    return (objective - bound) / max(abs(objective), 1e-9) if math.isfinite(bound) else math.inf
