"""A strong lower bound for the coupled allocation problems, by pricing out nodes.

Why the ILP alone is slow
-------------------------
Every allocation problem is one knapsack per model (its demand row; for PD models, one per
half and region, paired) tied together only by the availability rows::

    minimise   sum_t cost_t(x_t)
    subject to sum_{t in T_m} cap_t x_t >= D_m             for every model m
               sum_t nodes[g,t] x_t      <= A[g]            for every (node type, region) g

Its LP relaxation is weak exactly where it matters: a model's demand row is met with a fraction
of one large instance where a whole one (or a dearer mix of small ones) is needed. On core-size
problems at limited availability the LP bound is 1-2% below the optimum and HiGHS's root cuts
leave 0.25%; its tree cannot close the rest, because each row is a knapsack over a hundred
near-identical columns (cost per request/s within a fraction of a percent of each other) that
no LP bound prunes, and its sub-MIP heuristics spend seconds on the same knapsacks. A 0.1% gap
takes minutes.

The bound
---------
Price every node at `pi[g] >= 0` and drop the availability rows: the problem falls apart into
one knapsack per model with costs `cost_t + sum_g pi[g] nodes[g,t]`, each solved exactly by
`knapsack_dp`, and::

    L(pi) = sum_m z_m(pi) - sum_g pi[g] A[g]   <=   optimum, for every pi >= 0

(z_m: the least value of model m's knapsack; a proven lower bound of it is enough.) A PD
model's piece is its cover with each region serving the lesser of its prefill and decode
capacity (`pd_cover.py`, exact); its rows to pair the halves per region stay inside the
piece, so the decomposition is the same. Its maximum
over `pi` is the LP over the convex hulls of the per-model knapsacks (the Dantzig-Wolfe bound),
which on the benchmark problems lies 0.02-0.2% below the optimum. `pi` comes from column
generation: a master LP mixes known per-model solutions ("patterns") within availability, its
availability duals are the next prices, and each model's best knapsack at those prices is the
next pattern. Every round's `L(pi)` is valid; the master's value is where they converge.

The problem is the cost problem: minimise $/hour + start-up penalty, every demand met (hard
covering rows). The scarcity phases (most goodput, then the cheapest plan at it) are not
decomposed: `scarcity/phases.py` solves them from the LP bound, a heuristic plan and HiGHS.

Branch-and-price bounds (`Bounds`) restrict instance counts per column; the pricing honours
them, so every node of the search in `branch_price.py` has its own valid bound.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import highspy
import numpy as np

from coral.allocator.decomposition.knapsack import knapsack_dp
from coral.allocator.decomposition.pd_cover import AGG, pd_cover
from coral.solvers import quiet_highs

_INF = highspy.kHighsInf
#: Good solutions kept per knapsack solve besides the best (patterns for the plan search).
POOL_PER_SOLVE = 8
#: Master columns standing for "nodes beyond availability" cost this many times the dearest
#: price per node: never used when avoidable.
ARTIFICIAL_PRICE_FACTOR = 100.0
#: Relative distance at which the master's value and the bound count as met.
CONVERGED_REL = 1e-7


@dataclass
class Decomposition:
    """An allocation problem as per-model covers and coupling rows.

    Columns are the ILP's x variables; rows are the availability rows that some combination
    of columns within their bounds could overdraw (the others never bind). A model's columns
    are aggregated instances (capacity adds up) or halves of prefill/decode pairs
    (`col_half`, `col_region`: a region serves what both its halves carry, `pd_cover.py`);
    PD columns' capacity is in requests/s too (tokens/s over tokens per request).
    """

    demand: np.ndarray  # (models,) requests/s to serve
    priority: np.ndarray  # (models,) goodput weight
    col_model: np.ndarray  # (columns,) model index
    col_cap: np.ndarray  # (columns,) requests/s of one instance
    col_price: np.ndarray  # (columns,) $/hour of one instance
    col_penalty: np.ndarray  # (columns,) start-up $ of one new instance
    col_current: np.ndarray  # (columns,) instances running now
    col_ub: np.ndarray  # (columns,) most instances
    usage: np.ndarray  # (columns, rows) nodes of the row's (node type, region) per instance
    avail: np.ndarray  # (rows,) nodes available
    col_half: np.ndarray | None = None  # (columns,) AGG, PREFILL or DECODE (None: all AGG)
    col_region: np.ndarray | None = None  # (columns,) region index (for PD columns)

    def __post_init__(self) -> None:
        if self.col_half is None:
            self.col_half = np.full(self.n_cols, AGG, dtype=np.int64)
        if self.col_region is None:
            self.col_region = np.zeros(self.n_cols, dtype=np.int64)
        pd = self.col_half != AGG
        self.pd_models = np.unique(self.col_model[pd])
        self._pd_cols = np.flatnonzero(pd)

    @property
    def has_pd(self) -> bool:
        return bool(len(self.pd_models))

    def is_pd(self, m: int) -> bool:
        return bool(np.isin(m, self.pd_models))

    @property
    def n_models(self) -> int:
        return len(self.demand)

    @property
    def n_cols(self) -> int:
        return len(self.col_model)

    @property
    def n_rows(self) -> int:
        return len(self.avail)

    def cost(self, counts: np.ndarray) -> float:
        """$/hour plus start-up penalty of instance counts per column."""
        return float(self.col_price @ counts
                     + self.col_penalty @ np.maximum(counts - self.col_current, 0))

    def capacity(self, counts: np.ndarray) -> np.ndarray:
        """Requests/s each model's instances can serve: aggregated capacity plus, per region,
        the lesser of its prefill and decode halves."""
        got = np.zeros(self.n_models)
        if not self.has_pd:
            np.add.at(got, self.col_model, self.col_cap * counts)
            return got
        agg = self.col_half == AGG
        np.add.at(got, self.col_model[agg], self.col_cap[agg] * counts[agg])
        j = self._pd_cols
        halves = np.zeros((self.n_models, int(self.col_region.max()) + 1, 2))
        np.add.at(halves, (self.col_model[j], self.col_region[j], self.col_half[j]),
                  self.col_cap[j] * counts[j])
        return got + halves.min(axis=2).sum(axis=1)

    def served(self, counts: np.ndarray) -> np.ndarray:
        """Requests/s served per model: min(demand, capacity)."""
        return np.minimum(self.capacity(counts), self.demand)

    def goodput(self, counts: np.ndarray) -> float:
        return float(self.priority @ self.served(counts))

    def used(self, counts: np.ndarray) -> np.ndarray:
        """Nodes used per row."""
        on = np.flatnonzero(counts)
        return counts[on] @ self.usage[on]

    def fits(self, counts: np.ndarray) -> bool:
        return bool((self.used(counts) <= self.avail + 1e-9).all())

    def covers(self, counts: np.ndarray) -> bool:
        return bool((self.capacity(counts) >= self.demand * (1.0 - 1e-9)).all())



@dataclass(frozen=True)
class Bounds:
    """Instance counts allowed per column (a node of the search)."""

    lo: np.ndarray
    hi: np.ndarray

    @classmethod
    def root(cls, dec: Decomposition) -> "Bounds":
        return cls(np.zeros(dec.n_cols, dtype=np.int64), dec.col_ub.astype(np.int64))

    def allows(self, pattern: "Pattern", col_model: np.ndarray) -> bool:
        """Whether the pattern's counts are within bounds on its model's columns."""
        own = col_model == pattern.model
        c = pattern.counts[own]
        return bool((c >= self.lo[own]).all() and (c <= self.hi[own]).all())

    def with_hi(self, j: int, value: int) -> "Bounds":
        hi = self.hi.copy()
        hi[j] = value
        return Bounds(self.lo, hi)

    def with_lo(self, j: int, value: int) -> "Bounds":
        lo = self.lo.copy()
        lo[j] = value
        return Bounds(lo, self.hi)


@dataclass(frozen=True)
class Pattern:
    """One model's instance counts per column, with what they cost and serve."""

    model: int
    counts: np.ndarray
    cost: float
    goodput: float


class ModelItems:
    """One model's knapsack items: each column once, or twice when it runs now and new
    instances pay a start-up penalty (the running ones first, at no penalty)."""

    def __init__(self, dec: Decomposition, m: int) -> None:
        cols = np.flatnonzero(dec.col_model == m)
        current = dec.col_current[cols]
        penalty = dec.col_penalty[cols]
        split = (current > 0) & (penalty > 0)
        self.cols = cols
        self.split = split
        self.current = current
        self.col = np.concatenate([cols, cols[split]])
        price = dec.col_price[cols]
        self.cost = np.concatenate([price + np.where(current > 0, 0.0, penalty),
                                    price[split] + penalty[split]])
        self.cap = dec.col_cap[self.col]
        self.half = dec.col_half[self.col]
        self.region = dec.col_region[self.col]
        self.pd = dec.is_pd(m)

    def units(self, counts: np.ndarray) -> np.ndarray:
        """Item units of instance counts per column: a running column's first units on its
        cheap item."""
        own = counts[self.cols].astype(np.int64)
        first = np.where(self.split, np.minimum(own, self.current), own)
        return np.concatenate([first, (own - first)[self.split]])

    def bounds(self, b: Bounds) -> tuple[np.ndarray, np.ndarray]:
        """Item bounds for column bounds `b`. A running column's first units are its cheap
        item: any solution can be rearranged to use them first at no more cost."""
        lo, hi = b.lo[self.cols], b.hi[self.cols]
        kept = np.where(self.split, np.minimum(self.current, hi), hi)
        first_lo = np.minimum(lo, kept)
        s = self.split
        item_lo = np.concatenate([first_lo, np.maximum(0, lo[s] - kept[s])])
        item_hi = np.concatenate([kept, hi[s] - kept[s]])
        return item_lo, item_hi


@dataclass
class PriceRound:
    """One round of pricing: the bound it proves and each model's best solution."""

    bound: float  # L(pi); inf when some model has no solution within the bounds
    patterns: list[Pattern]  # best per model
    values: np.ndarray  # (models,) each model's best value at these prices
    pool: list[Pattern] = field(default_factory=list)


class Pricer:
    """Each model's cheapest cover at given node prices."""

    def __init__(self, dec: Decomposition, rel_gap: float = 0.0) -> None:
        self.dec = dec
        self.rel_gap = rel_gap  # each knapsack to this gap (its proven bound is what counts)
        self.items = [ModelItems(dec, m) for m in range(dec.n_models)]
        self.hints: list[list[np.ndarray]] = [[] for _ in range(dec.n_models)]
        # each model's last knapsack: (costs, lo, hi, solution)
        self.last: list[tuple | None] = [None] * dec.n_models

    def price(self, node_price: np.ndarray, bounds: Bounds, *, pool: int = 0,
              rel_gap: float = 0.0) -> PriceRound:
        dec = self.dec
        extra = dec.usage @ node_price
        bound = -float(node_price @ dec.avail)
        best: list[Pattern] = []
        values = np.zeros(dec.n_models)
        more: list[Pattern] = []
        for m, it in enumerate(self.items):
            lo, hi = it.bounds(bounds)
            cost = it.cost + extra[it.col]
            last = self.last[m]
            if last is not None and np.array_equal(last[0], cost) \
                    and np.array_equal(last[1], lo) and np.array_equal(last[2], hi):
                sol = last[3]  # nothing this model sees has changed
            elif it.pd:
                sol = pd_cover(cost, it.cap, lo, hi, it.half, it.region, float(dec.demand[m]),
                               hints=tuple(self.hints[m]))
                self.last[m] = (cost, lo, hi, sol)
            else:
                sol = knapsack_dp(cost, it.cap, hi, float(dec.demand[m]), lo=lo, pool=pool,
                                  rel_gap=max(rel_gap, self.rel_gap),
                                  hints=tuple(self.hints[m]))
                self.last[m] = (cost, lo, hi, sol)
            if sol.x is None:
                return PriceRound(math.inf, [], values)
            self.hints[m] = [sol.x]
            bound += sol.lower_bound
            values[m] = sol.value
            best.append(self._pattern(m, it, sol.x))
            more.extend(self._pattern(m, it, x) for _, x in sol.pool)
        return PriceRound(bound, best, values, more)

    def _pattern(self, m: int, it: ModelItems, x: np.ndarray) -> Pattern:
        counts = np.zeros(self.dec.n_cols, dtype=np.int64)
        k = len(it.cols)  # `np.add.at(counts, it.col, x)`: each column, then its dear units
        counts[it.cols] = x[:k]
        counts[it.cols[it.split]] += x[k:]
        served = float(self.dec.served(counts)[m])
        return Pattern(m, counts, self.dec.cost(counts), float(self.dec.priority[m]) * served)


@dataclass
class MasterSolution:
    value: float
    node_price: np.ndarray  # (rows,)
    convexity: np.ndarray  # (models,) duals
    weights: np.ndarray  # per pattern
    artificial: float  # artificial units in use (> 0: the patterns cannot be mixed feasibly)


class Master:
    """The restricted master LP over the patterns known so far; HiGHS keeps its basis from
    one solve to the next (new patterns, and pattern bounds switched by the search)."""

    def __init__(self, dec: Decomposition) -> None:
        self.dec = dec
        self.h = quiet_highs()
        self.h.setOptionValue("solver", "simplex")
        k, m = dec.n_rows, dec.n_models
        none_i, none_v = np.zeros(0, dtype=np.int32), np.zeros(0)
        self.h.addRows(k, np.full(k, -_INF), dec.avail.astype(float), 0, none_i, none_i, none_v)
        self.h.addRows(m, np.ones(m), np.ones(m), 0, none_i, none_i, none_v)
        # Artificial columns keep the master feasible whatever the search's bounds: extra
        # nodes at a price no plan would pay.
        big = ARTIFICIAL_PRICE_FACTOR * max(1.0, float(dec.col_price.max(initial=1.0)))
        for row in range(k):
            self._col(big, [row], [-1.0])
        self.n_art = k
        self.patterns: list[Pattern] = []
        self._seen: dict[tuple[int, bytes], int] = {}
        self._enabled: list[bool] = []  # per pattern: its column may be used
        # each model's columns (what `Bounds.allows` looks at)
        self._own = [np.flatnonzero(dec.col_model == i) for i in range(dec.n_models)]

    def _col(self, cost: float, rows: list[int] | np.ndarray, values: list[float] | np.ndarray
             ) -> None:
        self.h.addCol(float(cost), 0.0, _INF, len(rows), np.asarray(rows, dtype=np.int32),
                      np.asarray(values, dtype=float))

    def add(self, pattern: Pattern, bounds: Bounds | None = None) -> bool:
        """Add a pattern unless known; it is enabled when `bounds` allow it."""
        key = (pattern.model, pattern.counts.tobytes())
        if key in self._seen:
            return False
        self._seen[key] = len(self.patterns)
        on = np.flatnonzero(pattern.counts)
        used = pattern.counts[on] @ self.dec.usage[on]
        nz = np.flatnonzero(used)
        rows = np.concatenate([nz, [self.dec.n_rows + pattern.model]])
        values = np.concatenate([used[nz], [1.0]])
        self._col(pattern.cost, rows, values)
        self.patterns.append(pattern)
        on = True
        if bounds is not None:  # `bounds.allows`, over the model's columns
            own = self._own[pattern.model]
            c = pattern.counts[own]
            on = bool((c >= bounds.lo[own]).all() and (c <= bounds.hi[own]).all())
        self._enabled.append(on)
        if not on:
            col = self.n_art + len(self.patterns) - 1
            self.h.changeColBounds(col, 0.0, 0.0)
        return True

    def restrict(self, bounds: Bounds) -> None:
        """Enable exactly the patterns that `bounds` allow."""
        if not self.patterns:
            return
        counts = np.array([p.counts for p in self.patterns])
        other = self.dec.col_model[None, :] != np.array([p.model for p in self.patterns])[:, None]
        on = (other | ((counts >= bounds.lo) & (counts <= bounds.hi))).all(axis=1)
        changed = np.flatnonzero(on != np.array(self._enabled, dtype=bool))
        if len(changed):
            cols = (self.n_art + changed).astype(np.int32)
            upper = np.where(on[changed], _INF, 0.0)
            self.h.changeColsBounds(len(cols), cols, np.zeros(len(cols)), upper)
            self._enabled = on.tolist()

    def solve(self) -> MasterSolution | None:
        self.h.run()
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None  # only when no pattern of some model is enabled
        sol = self.h.getSolution()
        duals = np.array(sol.row_dual)
        k, m = self.dec.n_rows, self.dec.n_models
        cols = np.array(sol.col_value)
        return MasterSolution(
            value=float(self.h.getInfo().objective_function_value),
            node_price=np.maximum(0.0, -duals[:k]),  # a <= row's dual is <= 0 (minimising)
            convexity=duals[k:k + m],
            weights=cols[self.n_art:],
            artificial=float(cols[:self.n_art].sum()),
        )


@dataclass
class NodeResult:
    bound: float  # proven lower bound of this node's problem (inf: infeasible or cut off)
    master: MasterSolution | None
    rounds: int
    converged: bool


def column_generation(master: Master, pricer: Pricer, bounds: Bounds, *, deadline: float,
                      cutoff: float = math.inf, bound: float = -math.inf,
                      start_price: np.ndarray | None = None, pool: int = POOL_PER_SOLVE,
                      max_rounds: int = 500) -> NodeResult:
    """Raise the Lagrangian bound of the node `bounds` until the master and the bound meet,
    the bound reaches `cutoff` (nothing in the node can beat the incumbent), or `deadline`
    (a `time.perf_counter()` value). `bound` is what is already known (the parent's).
    """
    master.restrict(bounds)
    rounds = 0
    sol: MasterSolution | None = None
    price: np.ndarray | None = (
        np.asarray(start_price, dtype=float) if start_price is not None else None)
    exact = False  # this round prices at the master's duals
    while rounds < max_rounds:
        rounds += 1
        if price is None:
            sol = master.solve()
            if sol is None:
                price, exact = np.zeros(master.dec.n_rows), False
            else:
                price, exact = sol.node_price, True
        got = pricer.price(price, bounds, pool=pool)
        if not got.patterns:  # some model has no solution within the bounds
            return NodeResult(math.inf, sol, rounds, True)
        bound = max(bound, got.bound)
        added = False
        for p in got.patterns + got.pool:
            added |= master.add(p, bounds)
        if bound >= cutoff:
            return NodeResult(bound, sol, rounds, True)
        if sol is not None:
            scale = max(1.0, abs(sol.value))
            met = sol.value - bound <= CONVERGED_REL * scale
            if exact:
                met |= bool((got.values - sol.convexity >= -CONVERGED_REL * scale).all())
            if met and (sol.artificial <= 1e-9 or not added):
                return NodeResult(bound, sol, rounds, True)
        if time.perf_counter() >= deadline:
            break
        if not added and sol is None and rounds > 1:
            break  # the master cannot mix the patterns at all (not expected)
        price = None
    sol = master.solve()
    return NodeResult(bound, sol, rounds, False)
