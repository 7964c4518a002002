"""The online allocation ILP, solved with HiGHS.

Variables (index sets after presolve, see `presolve_columns`):

- `x[t,r]` integer in `[0, u[t,r]]`: instances of template `t` in region `r`;
- `y[t,r] >= 0`: instances of `t` started in `r` beyond the current deployment (only where some
  run now; elsewhere every instance is new and its start-up penalty is folded into `x`'s cost);
- `d[m,r] >= 0`: requests/s of PD-mode model `m` served in region `r`;
- `s[m]`: requests/s of model `m` served, in `[demand_m, demand_m]` when demand must be met and
  in `[0, demand_m]` under scarcity.

Cost problem::

    minimise   sum_{t,r} price[t,r] x[t,r] + sum_{t,r} penalty[t,r] y[t,r]
    subject to capacity, PD pairing, availability and start-up rows (one function each below)

When it is infeasible, the scarcity problem runs in two phases on the same rows:
phase 1 maximises goodput `G = sum_m w_m s[m]` with `s[m]` free in `[0, demand_m]`; phase 2 adds
`G >= G1 (1 - 1e-9)` (G1: phase 1's best) and minimises the cost again. So the plan is the
cheapest among the plans of most priority-weighted goodput, and it names each model's
shortfall.

Bounds that lose nothing: `u[t,r]` is the fewest of (a) nodes available over nodes needed, for
each of `t`'s node types, and (b) `ceil(demand / capacity)` instances, more of which would only
add cost (every price is positive) without serving more.

How it is solved
----------------
HiGHS on this ILP is slow whenever availability binds: each demand row is a knapsack over a
hundred columns of almost equal cost per request/s, the LP bound sits 1-2% below the optimum,
and neither HiGHS's cuts and tree nor its sub-MIP heuristics close that to 0.1% in seconds
(`lagrange.py` says why in full). With PD models it is worse: the LP splits a model's demand
into fractions of instances in every region at once and lies 3-5% below the optimum on
`core`-size problems, and HiGHS stopped at its 10 s limit with 1-3% gaps. The cost problem is
therefore solved by decomposition instead (`decompose=True`, the default):

1. each model's cheapest cover on its own (`knapsack.knapsack_dp`; for a PD model the exact
   cover of `pd_cover.py`, regions serving what both their halves carry); if their union fits
   within availability it is optimal;
2. else the LP relaxation: infeasible means the demand cannot be met; feasible, it gives a
   bound, node prices, and a first plan (its counts rounded down, each model's rest covered);
3. the Lagrangian bound by column generation, plans from mixing the patterns it meets, and
   branch and price until the gap target or `DECOMPOSED_SHARE` of the time limit
   (`branch_price.solve_decomposed`);
4. when that stops short of the gap (problems without PD models, whose ILPs HiGHS handles
   far worse), HiGHS on the whole ILP for the rest of the time, below the plan found and
   stopping at the first plan the Lagrangian bound proves; the better plan and the better
   bound of the two come back. Real libraries need it: many templates of a model cost almost
   the same per request/s, and on `benchmarks/allocator.py --library real` draws branch and
   price alone left one plan short of demand (no plan meeting it found in time, 16.8% gap)
   where HiGHS finds one.

The scarcity phases (without PD models) start from the LP and a plan of their own, and call
HiGHS only for the gap those leave (`_scarcity_bounded`):

5. phase 1: the goodput LP bounds the goodput (it is within 0.5% of the best plan on most
   benchmark problems); its counts rounded down and the nodes left filled, most goodput per
   shadow price first, then a local search (`branch_price.goodput_plan`), give a plan. When
   the LP bound does not prove it within the gap, HiGHS searches the columns that reduced
   costs allow a better plan to use (`_fix_by_reduced_cost`), for plans better than it, and
   stops at the gap from the LP bound or from its own;
6. phase 2: the same on the cost LP with the goodput floor, from phase 1's plan. Its LP bound
   is weak (1-5% below the best plan on core, where HiGHS's cuts and tree do the rest), so
   HiGHS runs on nearly every draw; a cutoff at phase 1's cost and the columns fixed by
   reduced cost are what it is given. The bound is what takes the time, not the search:
   handed the optimal plan, HiGHS still needs a median 0.24 s (0.01-0.9 s) to prove 0.5% on
   the synthetic core scarce draws. The LP's slack is phase 1's (its goodput bound up to 0.7%
   above the best plan, which the cost LP spends on leaving nodes unused), and bounds by
   region blocks do not remove it (column generation over each region's integer plans:
   280.28 against the LP's 279.95 and an optimum of 292.36 on one draw).

Phase 1 may take `PHASE1_SHARE` of the time left, so that phase 2 always gets some. The
scarcity phases of PD problems, and PD problems whose per-model covers are too large to solve
exactly many times a solve (`PD_MAX_REGIONS`, `PD_MAX_UNITS`: `advanced`-size), run on this ILP
with HiGHS throughout, and `decompose=False` solves every phase with HiGHS on the full ILP, as
the reference the tests compare against.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

import highspy

from coral.solvers import quiet_highs, set_threads
import numpy as np

from coral.allocator.jit import warm_up
from coral.allocator.branch_price import (
    INTEGRALITY_TOL,
    goodput_plan,
    relative_gap,
    round_and_repair,
    running_plan,
    solve_decomposed,
)
from coral.allocator.lagrange import Bounds, Decomposition, Pattern, Pricer
from coral.allocator.pd_cover import AGG, DECODE, PREFILL
from coral.allocator.problem import (
    MODES,
    AllocationPlan,
    AllocationProblem,
    PlanStatus,
    TemplateColumn,
    TemplateRegion,
    make_plan,
)

log = logging.getLogger(__name__)

#: Phase 2 keeps goodput within this relative distance of phase 1's.
GOODPUT_REL_TOL = 1e-9
#: Least time given to a scarcity phase even when the budget is spent (seconds).
MIN_PHASE_S = 0.05
#: Share of the time left that scarcity phase 1 may take (phase 2 gets the rest).
PHASE1_SHARE = 0.5
#: Columns of least reduced cost added to the LP's support, one HiGHS run each, when
#: searching near a rounded PD plan (`_rounded_start`).
SUPPORT_GROWTH = (0, 100, 300, 1000)
#: Up to this many columns the search near a rounded PD plan ends with HiGHS on the whole
#: ILP, whose bound then holds; beyond it HiGHS's root cuts alone outrun the time limit.
WHOLE_ILP_MAX_COLUMNS = 5_000
#: Where the whole ILP follows, the share of the time left each search near the rounded plan
#: may take, so that the whole ILP (which brings the bound) always runs.
NEIGHBOURHOOD_SHARE = 0.25
#: Share of a scarcity phase's time HiGHS may take on the columns the LP and the plan so far
#: use, before the run on every column reduced costs leave (which brings the bound).
SUPPORT_SHARE = 0.5
#: Scarcity phase 2 on problems of at least this many columns: HiGHS on the LP's and phase
#: 1's columns, then on them and these shares of all columns (least reduced cost first), each
#: run stopping at the first plan the LP bound proves, before the run on every column reduced
#: costs leave. On large problems the gap is the plan's, on small ones the bound's (where
#: these runs only add time).
PHASE2_GROWTH_MIN_COLUMNS = 2_000
PHASE2_GROWTH = (0.03, 0.15)
#: Share of phase 2's time left that each of those runs may take.
GROWTH_TIME_SHARE = 0.25
#: Share of the cost problem's time branch and price may take (without PD models) before
#: HiGHS on the whole ILP gets the rest, below its plan and stopping at the first plan the
#: Lagrangian bound proves (`_highs_after_decomposition`): branch and price alone can end
#: without a plan meeting demand where HiGHS finds one.
DECOMPOSED_SHARE = 0.4
#: Share of scarcity phase 1's time the goodput heuristic may take.
HEURISTIC_SHARE = 0.1
#: Where the demand is nearly met (the LP bound serves at least `NEAR_FULL` of the
#: priority-weighted demand), scarcity phase 1 keeps its heuristic plan only within this
#: share of the gap target, else HiGHS looks for a better one (to the gap target): a plan
#: 0.5% short of the best goodput leaves phase 2 so many plans at its floor that HiGHS runs
#: out the clock. Elsewhere a plan within the gap target is kept.
ACCEPT_SHARE_NEAR_FULL = 0.02
NEAR_FULL = 0.9
_INF = highspy.kHighsInf
_INSIDE = 1.0 - 1e-6
_MODE_INDEX = {mode: i for i, mode in enumerate(MODES)}
_AGG, _PREFILL, _DECODE = (_MODE_INDEX[m] for m in MODES)


class InfeasiblePlanError(RuntimeError):
    """Strict mode: the demand cannot be met; `plan` is the best scarcity plan found."""

    def __init__(self, message: str, plan: AllocationPlan) -> None:
        super().__init__(message)
        self.plan = plan


# ---------------------------------------------------------------------------------------------
# Dominance and presolve
# ---------------------------------------------------------------------------------------------


Multiset = tuple[tuple[str, int], ...]
"""A node multiset as sorted (node type, count) pairs."""


def _multiset(t: TemplateColumn) -> Multiset:
    return tuple(sorted(t.node_counts.items()))


def _sub_multisets(key: Multiset) -> Iterator[Multiset]:
    names = [g for g, _ in key]
    for combo in itertools.product(*[range(n + 1) for _, n in key]):
        yield tuple((g, k) for g, k in zip(names, combo) if k)


def _minus(a: Multiset, b: Multiset) -> Multiset:
    take = dict(b)
    return tuple((g, n - take.get(g, 0)) for g, n in a if n > take.get(g, 0))


def dominated_templates(templates: Sequence[TemplateColumn]) -> dict[str, tuple[str, ...]]:
    """Templates that others dominate: template id -> ids of a collection that dominates it.

    A collection of templates (repeats allowed) dominates template `t` when all serve the same
    model in the same mode, their nodes together form a sub-multiset of `t`'s nodes, their
    capacities sum to at least `t`'s and their prices to at most `t`'s in every region `t` runs
    in (always so when prices are sums of node prices). The collection then needs no more of
    any node type, costs no more, and its start-up penalty (proportional to price) is no
    larger: replacing each `t` by it keeps a plan feasible and costs no more, so dropping `t`
    loses nothing — as long as `t` is not running now (see `presolve_columns`).

    This covers one template on a sub-multiset of the nodes (the library's own rule) and also
    a multi-node template that does no better than data parallelism over its parts, e.g.
    `2x(1x-l4)` at exactly twice one `1x-l4` replica. Of identical templates the one of highest
    capacity, then first by id, is kept.

    Price per unit of capacity is *not* a dominance rule: with whole instances the cheaper
    per-unit template can overshoot demand.
    """
    out: dict[str, tuple[str, ...]] = {}
    groups: dict[tuple[str, str], list[TemplateColumn]] = {}
    for t in templates:
        groups.setdefault((t.model, t.mode), []).append(t)
    for group in groups.values():
        first: dict[Multiset, TemplateColumn] = {}
        for t in sorted(group, key=lambda t: (-t.capacity, t.id)):
            key = _multiset(t)
            if key not in first:
                first[key] = t
            elif _no_dearer(t, [first[key]]):
                out[t.id] = (first[key].id,)
        cap = {key: t.capacity for key, t in first.items()}
        memo: dict[Multiset, tuple[float, tuple[Multiset, ...]]] = {(): (0.0, ())}

        def best(q: Multiset, *, proper: bool = False) -> tuple[float, tuple[Multiset, ...]]:
            """Most capacity a collection of templates fits in `q` (excluding `q` itself
            when `proper`)."""
            if not proper and q in memo:
                return memo[q]
            value, parts = (0.0, ())
            if not proper and q in cap:
                value, parts = cap[q], (q,)
            for p in _sub_multisets(q):
                if p and p != q and p in cap:
                    rest_value, rest_parts = best(_minus(q, p))
                    if cap[p] + rest_value > value:
                        value, parts = cap[p] + rest_value, (p,) + rest_parts
            if not proper:
                memo[q] = (value, parts)
            return value, parts

        for key, t in first.items():
            if len(key) == 1 and key[0][1] == 1:
                continue  # one node: nothing smaller to dominate it
            value, parts = best(key, proper=True)
            if parts and value >= t.capacity and _no_dearer(t, [first[p] for p in parts]):
                out[t.id] = tuple(first[p].id for p in parts)
    return out


def _no_dearer(t: TemplateColumn, parts: Sequence[TemplateColumn]) -> bool:
    """The parts together cost no more than `t` in every region `t` is priced in. Always true
    when prices are sums of node prices; checked because a column's prices may be anything."""
    for region, usd in t.price_usd_per_hour.items():
        total = sum(p.price_usd_per_hour.get(region, math.inf) for p in parts)
        if total > usd * (1.0 + 1e-12):
            return False
    return True


_DOMINANCE_CACHE: OrderedDict[tuple[int, ...], tuple[tuple[TemplateColumn, ...],
                                                       dict[str, tuple[str, ...]]]]
_DOMINANCE_CACHE = OrderedDict()
_DOMINANCE_CACHE_SIZE = 4


def _cached_dominance(templates: tuple[TemplateColumn, ...]) -> dict[str, tuple[str, ...]]:
    """`dominated_templates`, remembered for the last few template sets: re-planning with new
    demand, prices or availability reuses the same templates, and dominance depends on
    nothing else. Keyed by the templates' identities (the entry holds them, so no id is
    reused while it is cached)."""
    key = tuple(map(id, templates))
    hit = _DOMINANCE_CACHE.get(key)
    if hit is not None:
        _DOMINANCE_CACHE.move_to_end(key)
        return hit[1]
    result = dominated_templates(templates)
    _DOMINANCE_CACHE[key] = (templates, result)
    while len(_DOMINANCE_CACHE) > _DOMINANCE_CACHE_SIZE:
        _DOMINANCE_CACHE.popitem(last=False)
    return result


@dataclass(frozen=True)
class PresolveReport:
    """What presolve dropped, in (template, region) pairs."""

    priced: int  # pairs where every node type of the template is priced
    unavailable: int  # dropped: some node type has too few nodes available for one instance
    unneeded: int  # dropped: no demand for the model, or a PD half with no other half there
    dominated: int  # dropped: a dominating template is available in the same region
    columns: int  # pairs left: the ILP's x variables
    dominated_by: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def describe(self) -> str:
        return (
            f"{self.columns} template-region columns of {self.priced} priced "
            f"({self.dominated} dominated, {self.unavailable} unavailable, "
            f"{self.unneeded} unneeded)"
        )


@dataclass
class _Index:
    """The problem as arrays: templates x node types x regions."""

    models: list[str]  # models with demand > 0
    demand: np.ndarray  # (M,) requests/s
    tokens: np.ndarray  # (M, 3) capacity units per request/s, by mode
    priority: np.ndarray  # (M,)
    regions: list[str]
    templates: tuple[TemplateColumn, ...]
    t_model: np.ndarray  # (T,) model index, -1 when the model has no demand
    t_mode: np.ndarray  # (T,)
    cap: np.ndarray  # (T,)
    counts: np.ndarray  # (T, G) nodes per instance
    price: np.ndarray  # (T, R) $/hour, nan where not priced
    avail: np.ndarray  # (G, R)
    current: np.ndarray  # (T, R)

    @classmethod
    def build(cls, p: AllocationProblem) -> "_Index":
        live = [d for d in p.demands if d.requests_per_s > 0]
        models = [d.model for d in live]
        m_of = {m: i for i, m in enumerate(models)}
        node_types = sorted(
            {g for t in p.templates for g in t.node_counts} | {g for g, _ in p.availability}
        )
        g_of = {g: i for i, g in enumerate(node_types)}
        r_of = {r: i for i, r in enumerate(p.regions)}
        n_t, n_g, n_r = len(p.templates), len(node_types), len(p.regions)
        counts = np.zeros((n_t, n_g), dtype=np.int64)
        price = np.full((n_t, n_r), np.nan)
        t_of: dict[str, int] = {}
        for i, t in enumerate(p.templates):
            t_of[t.id] = i
            for g, n in t.node_counts.items():
                counts[i, g_of[g]] = n
            for r, usd in t.price_usd_per_hour.items():
                if r in r_of:
                    price[i, r_of[r]] = usd
        avail = np.zeros((n_g, n_r), dtype=np.int64)
        for (g, r), n in p.availability.items():
            if r in r_of:
                avail[g_of[g], r_of[r]] = n
        current = np.zeros((n_t, n_r), dtype=np.int64)
        for (tid, r), n in p.current.items():
            if tid in t_of and r in r_of:
                current[t_of[tid], r_of[r]] = n
        return cls(
            models=models,
            demand=np.array([d.requests_per_s for d in live], dtype=float),
            tokens=np.array(
                [[d.tokens_per_request(mode) for mode in MODES] for d in live], dtype=float
            ).reshape(len(live), len(MODES)),
            priority=np.array([d.priority for d in live], dtype=float),
            regions=list(p.regions),
            templates=p.templates,
            t_model=np.array([m_of.get(t.model, -1) for t in p.templates], dtype=np.int64),
            t_mode=np.array([_MODE_INDEX[t.mode] for t in p.templates], dtype=np.int64),
            cap=np.array([t.capacity for t in p.templates], dtype=float),
            counts=counts,
            price=price,
            avail=avail,
            current=current,
        )


@dataclass
class _Columns:
    """The x variables kept by presolve: template index, region index, upper bound."""

    t: np.ndarray
    r: np.ndarray
    ub: np.ndarray
    report: PresolveReport


def presolve_columns(problem: AllocationProblem, *, dominance: bool = True) -> PresolveReport:
    """Which (template, region) pairs the ILP keeps, and why the others go."""
    return _presolve(problem, _Index.build(problem), dominance=dominance).report


def _presolve(problem: AllocationProblem, ix: _Index, *, dominance: bool) -> _Columns:
    n_t, n_r = ix.price.shape
    priced = ~np.isnan(ix.price)
    # (a) whole instances the region's availability allows, per node type
    ub = np.full((n_t, n_r), np.iinfo(np.int64).max // 4, dtype=np.int64)
    for g in range(ix.counts.shape[1]):
        need = ix.counts[:, g]
        on = need > 0
        if on.any():
            ub[on] = np.minimum(ub[on], ix.avail[g][None, :] // need[on, None])
    # (b) instances beyond what the model's demand alone calls for
    has_model = ix.t_model >= 0
    ub_demand = np.zeros(n_t, dtype=np.int64)
    if has_model.any():
        m = ix.t_model[has_model]
        units = ix.demand[m] * ix.tokens[m, ix.t_mode[has_model]]
        need = np.ceil(units / ix.cap[has_model] - 1e-9)
        ub_demand[has_model] = np.maximum(need, 1).astype(np.int64)
    available = priced & (ub > 0)
    ub = np.minimum(ub, ub_demand[:, None])
    useful = available & has_model[:, None]

    dominated_by: dict[str, tuple[str, ...]] = {}
    keep = useful.copy()
    if dominance:
        dominated_by = _cached_dominance(ix.templates)
        if dominated_by:
            dom = np.array([t.id in dominated_by for t in ix.templates], dtype=bool)
            protected = (ix.current > 0) & (problem.startup_s > 0)  # running now: kept
            keep &= ~(dom[:, None] & ~protected)
    n_dominated = int((useful & ~keep).sum())

    # A PD half is useless in a region where the model's other half has no column.
    if ix.models:
        n_m = len(ix.models)
        half = np.zeros((n_m, len(MODES), n_r), dtype=bool)
        tt, rr = np.nonzero(keep)
        half[ix.t_model[tt], ix.t_mode[tt], rr] = True
        paired = half[:, _PREFILL, :] & half[:, _DECODE, :]
        is_pd = ix.t_mode != _AGG
        pd_mask = np.zeros_like(keep)
        pd_mask[is_pd & has_model] = paired[ix.t_model[is_pd & has_model]]
        unpaired = keep & is_pd[:, None] & ~pd_mask
        keep &= ~unpaired
    else:
        unpaired = np.zeros_like(keep)
    n_unneeded = int((available & ~has_model[:, None]).sum()) + int(unpaired.sum())
    tt, rr = np.nonzero(keep)
    report = PresolveReport(
        priced=int(priced.sum()),
        unavailable=int((priced & ~available).sum()),
        unneeded=n_unneeded,
        dominated=n_dominated,
        columns=int(tt.size),
        dominated_by=dominated_by,
    )
    return _Columns(t=tt, r=rr, ub=ub[tt, rr], report=report)


# ---------------------------------------------------------------------------------------------
# Model building: variables, then one function per constraint family
# ---------------------------------------------------------------------------------------------


class _LpBuilder:
    """Columns and rows in blocks of numpy arrays, assembled column-wise for HiGHS once."""

    def __init__(self) -> None:
        self.n_col = 0
        self.n_row = 0
        self.col_blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray, bool]] = []
        self.row_blocks: list[tuple[np.ndarray, np.ndarray]] = []
        self.entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.availability_rows: tuple[np.ndarray, np.ndarray, np.ndarray] = (
            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))  # rows, g, r

    def add_cols(self, lb: np.ndarray, ub: np.ndarray, cost: np.ndarray, integer: bool
                 ) -> np.ndarray:
        n = len(lb)
        self.col_blocks.append((np.asarray(lb, float), np.asarray(ub, float),
                                np.asarray(cost, float), integer))
        idx = np.arange(self.n_col, self.n_col + n)
        self.n_col += n
        return idx

    def add_rows(self, lb: np.ndarray, ub: np.ndarray) -> np.ndarray:
        n = len(lb)
        self.row_blocks.append((np.asarray(lb, float), np.asarray(ub, float)))
        idx = np.arange(self.n_row, self.n_row + n)
        self.n_row += n
        return idx

    def add_entries(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> None:
        self.entries.append((np.asarray(rows, np.int64), np.asarray(cols, np.int64),
                             np.asarray(vals, float)))

    def arrays(self) -> "_LpArrays":
        def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

        rows = cat([e[0] for e in self.entries], np.int64)
        cols = cat([e[1] for e in self.entries], np.int64)
        vals = cat([e[2] for e in self.entries], float)
        order = np.lexsort((rows, cols))
        start = np.zeros(self.n_col + 1, dtype=np.int32)
        np.cumsum(np.bincount(cols, minlength=self.n_col), out=start[1:])
        return _LpArrays(
            col_lb=cat([b[0] for b in self.col_blocks], float),
            col_ub=cat([b[1] for b in self.col_blocks], float),
            cost=cat([b[2] for b in self.col_blocks], float),
            integer=cat([np.full(len(b[0]), b[3]) for b in self.col_blocks], bool),
            row_lb=cat([b[0] for b in self.row_blocks], float),
            row_ub=cat([b[1] for b in self.row_blocks], float),
            start=start,
            index=rows[order].astype(np.int32),
            value=vals[order],
        )


@dataclass
class _LpArrays:
    col_lb: np.ndarray
    col_ub: np.ndarray
    cost: np.ndarray
    integer: np.ndarray
    row_lb: np.ndarray
    row_ub: np.ndarray
    start: np.ndarray
    index: np.ndarray
    value: np.ndarray

    def highs_lp(self, cost: np.ndarray, col_lb: np.ndarray, row_lb: np.ndarray,
                 maximise: bool, col_ub: np.ndarray | None = None) -> highspy.HighsLp:
        lp = highspy.HighsLp()
        lp.num_col_ = len(cost)
        lp.num_row_ = len(self.row_lb)
        lp.col_cost_ = cost
        lp.col_lower_ = col_lb
        lp.col_upper_ = self.col_ub if col_ub is None else col_ub
        lp.row_lower_ = row_lb
        lp.row_upper_ = self.row_ub
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = self.start
        lp.a_matrix_.index_ = self.index
        lp.a_matrix_.value_ = self.value
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous
            for b in self.integer
        ]
        lp.sense_ = highspy.ObjSense.kMaximize if maximise else highspy.ObjSense.kMinimize
        return lp


@dataclass
class _Vars:
    """Column indices of each variable family and what they stand for."""

    x: np.ndarray  # per kept column
    x_t: np.ndarray
    x_r: np.ndarray
    y: np.ndarray  # start-up variables
    y_of_x: np.ndarray  # position in x of each y
    d: np.ndarray  # PD served requests/s
    d_m: np.ndarray
    d_r: np.ndarray
    s: np.ndarray  # per model in `_Index.models`
    price: np.ndarray  # $/hour per x
    penalty: np.ndarray  # $ per new instance per x
    x_ub: np.ndarray  # upper bound per x


def _add_variables(lp: _LpBuilder, problem: AllocationProblem, ix: _Index, cols: _Columns
                   ) -> _Vars:
    """x (integer), y (start-ups beyond the running ones), d (PD share per region), s (served)."""
    price = ix.price[cols.t, cols.r]
    penalty = price * problem.startup_s / 3600.0
    current = ix.current[cols.t, cols.r]
    # Where nothing runs now, y = x: fold the penalty into x's cost.
    x_cost = price + np.where(current == 0, penalty, 0.0)
    x = lp.add_cols(np.zeros(len(cols.t)), cols.ub, x_cost, integer=True)
    with_y = np.flatnonzero((current > 0) & (penalty > 0) & (cols.ub > current))
    y = lp.add_cols(np.zeros(len(with_y)), (cols.ub - current)[with_y], penalty[with_y],
                    integer=False)
    n_m, n_r = len(ix.models), len(ix.regions)
    half = np.zeros((n_m, len(MODES), n_r), dtype=bool)
    half[ix.t_model[cols.t], ix.t_mode[cols.t], cols.r] = True
    d_m, d_r = np.nonzero(half[:, _PREFILL, :] & half[:, _DECODE, :])
    d = lp.add_cols(np.zeros(len(d_m)), ix.demand[d_m], np.zeros(len(d_m)), integer=False)
    s = lp.add_cols(ix.demand.copy(), ix.demand.copy(), np.zeros(n_m), integer=False)
    return _Vars(x=x, x_t=cols.t, x_r=cols.r, y=y, y_of_x=with_y, d=d, d_m=d_m, d_r=d_r, s=s,
                 price=price, penalty=penalty, x_ub=cols.ub)


def add_capacity_rows(lp: _LpBuilder, ix: _Index, v: _Vars) -> int:
    """Served requests/s are within capacity, for every model `m` with demand::

        sum_{t in T_m^agg, r} cap_t x[t,r] + sum_r d[m,r] - s[m] >= 0

    With `s[m]` fixed at the demand this is the demand row of the design; under scarcity it
    bounds what can count as served.
    """
    n_m = len(ix.models)
    rows = lp.add_rows(np.zeros(n_m), np.full(n_m, _INF))
    agg = np.flatnonzero(ix.t_mode[v.x_t] == _AGG)
    lp.add_entries(rows[ix.t_model[v.x_t[agg]]], v.x[agg], ix.cap[v.x_t[agg]])
    lp.add_entries(rows[v.d_m], v.d, np.ones(len(v.d)))
    lp.add_entries(rows, v.s, -np.ones(n_m))
    return n_m


def add_pd_pairing_rows(lp: _LpBuilder, ix: _Index, v: _Vars) -> int:
    """Prefill and decode capacity in one region carry that region's share, for every PD
    model `m` and region `r` where both halves can run::

        sum_{t in T_m^prefill} cap_t x[t,r] - input_tokens_m  d[m,r] >= 0
        sum_{t in T_m^decode}  cap_t x[t,r] - output_tokens_m d[m,r] >= 0
    """
    n_pairs = len(v.d)
    if not n_pairs:
        return 0
    rows = lp.add_rows(np.zeros(2 * n_pairs), np.full(2 * n_pairs, _INF))
    n_r = len(ix.regions)
    row_of = np.full((len(ix.models), 2, n_r), -1, dtype=np.int64)
    row_of[v.d_m, 0, v.d_r] = rows[:n_pairs]
    row_of[v.d_m, 1, v.d_r] = rows[n_pairs:]
    for half, mode in ((0, _PREFILL), (1, _DECODE)):
        sel = np.flatnonzero(ix.t_mode[v.x_t] == mode)
        target = row_of[ix.t_model[v.x_t[sel]], half, v.x_r[sel]]
        assert (target >= 0).all(), "presolve left a PD half without its pair"
        lp.add_entries(target, v.x[sel], ix.cap[v.x_t[sel]])
        lp.add_entries(row_of[v.d_m, half, v.d_r], v.d, -ix.tokens[v.d_m, mode])
    return 2 * n_pairs


def add_availability_rows(lp: _LpBuilder, ix: _Index, v: _Vars) -> int:
    """Nodes used stay within availability, for every node type `g` and region `r` that
    some column uses and whose bound is not implied by the columns' own bounds::

        sum_t nodes[t,g] x[t,r] <= avail[g,r]
    """
    n_g, n_r = ix.avail.shape
    tt, gg = np.nonzero(ix.counts)  # node types of each template
    per_t = np.bincount(tt, minlength=len(ix.templates))
    first = np.concatenate([[0], np.cumsum(per_t)[:-1]])
    reps = per_t[v.x_t]
    col_pos = np.repeat(np.arange(len(v.x)), reps)
    offset = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
    k = np.repeat(first[v.x_t], reps) + offset
    g_of = gg[k]
    r_of = v.x_r[col_pos]
    n_of = ix.counts[v.x_t[col_pos], g_of]
    ub = v.x_ub[col_pos]
    most = np.zeros((n_g, n_r))
    np.add.at(most, (g_of, r_of), n_of * ub)
    binding = most > ix.avail
    row_of = np.full((n_g, n_r), -1, dtype=np.int64)
    gs, rs = np.nonzero(binding)
    rows = lp.add_rows(np.full(len(gs), -_INF), ix.avail[gs, rs].astype(float))
    row_of[gs, rs] = rows
    lp.availability_rows = (rows, gs, rs)
    on = binding[g_of, r_of]
    lp.add_entries(row_of[g_of[on], r_of[on]], v.x[col_pos[on]], n_of[on])
    return len(rows)


def add_startup_rows(lp: _LpBuilder, ix: _Index, v: _Vars) -> int:
    """Instances beyond the running ones are started, for every (t, r) that runs now::

        y[t,r] - x[t,r] >= -current[t,r],   y[t,r] >= 0
    """
    n = len(v.y)
    if not n:
        return 0
    xs = v.y_of_x
    current = ix.current[v.x_t[xs], v.x_r[xs]].astype(float)
    rows = lp.add_rows(-current, np.full(n, _INF))
    lp.add_entries(rows, v.y, np.ones(n))
    lp.add_entries(rows, v.x[xs], -np.ones(n))
    return n


def add_goodput_floor_row(lp: _LpBuilder, ix: _Index, v: _Vars) -> int:
    """Scarcity phase 2 keeps phase 1's goodput (the bound is set per phase)::

        sum_m w_m s[m] >= G1 (1 - 1e-9)
    """
    rows = lp.add_rows(np.array([-_INF]), np.array([_INF]))
    lp.add_entries(np.full(len(v.s), rows[0]), v.s, ix.priority)
    return 1


# ---------------------------------------------------------------------------------------------
# The decomposition: per-model covers tied by availability
# ---------------------------------------------------------------------------------------------


def _decomposition(ix: _Index, v: _Vars, lp: _LpBuilder) -> Decomposition:
    """The problem as `lagrange.Decomposition`: the x columns and the availability rows the
    ILP kept (those some combination of columns within their bounds could overdraw)."""
    _, gs, rs = lp.availability_rows
    row_of = np.full(ix.avail.shape, -1, dtype=np.int64)
    row_of[gs, rs] = np.arange(len(gs))
    need = ix.counts[v.x_t]  # (columns, node types)
    usage = np.zeros((len(v.x), len(gs)))
    for g in np.flatnonzero(need.any(axis=0)):
        on = (need[:, g] > 0) & (row_of[g, v.x_r] >= 0)
        usage[on, row_of[g, v.x_r[on]]] = need[on, g]
    mode = ix.t_mode[v.x_t]
    model = ix.t_model[v.x_t]
    # PD halves in requests/s (tokens/s over tokens per request), as aggregated capacity
    per_request = np.where(mode == _AGG, 1.0, ix.tokens[model, mode])
    half = np.select([mode == _PREFILL, mode == _DECODE], [PREFILL, DECODE], AGG)
    return Decomposition(
        demand=ix.demand.copy(),
        priority=ix.priority.copy(),
        col_model=model,
        col_cap=ix.cap[v.x_t] / per_request,
        col_price=v.price,
        col_penalty=v.penalty,
        col_current=ix.current[v.x_t, v.x_r],
        col_ub=v.x_ub.astype(np.int64),
        usage=usage,
        avail=ix.avail[gs, rs].astype(float),
        col_half=half.astype(np.int64),
        col_region=v.x_r.astype(np.int64),
    )


#: The decomposition prices a PD model by its exact per-model cover (`pd_cover.py`), whose
#: frontiers grow with the regions it pairs in and the instances its demand takes: measured
#: on `core` (3 regions, up to ~43 instances of the median template) 0.3-10 ms a cover; on
#: `advanced` (12 regions, up to ~170) one round of pricing took minutes. Beyond these sizes
#: HiGHS solves the ILP alone (as every PD problem before).
PD_MAX_REGIONS = 4
PD_MAX_UNITS = 100.0


def _pd_covers_small(dec: Decomposition) -> bool:
    """Whether every PD model's cover is small enough to solve exactly, many times a solve."""
    for m in dec.pd_models:
        own = (dec.col_model == m) & (dec.col_half != AGG)
        if len(np.unique(dec.col_region[own])) > PD_MAX_REGIONS:
            return False
        if dec.demand[m] / float(np.median(dec.col_cap[own])) > PD_MAX_UNITS:
            return False
    return True


def _solve_by_model(dec: Decomposition, rel_gap: float
                    ) -> tuple[str, np.ndarray, list[Pattern], float]:
    """Solve each model's demand on its own (`knapsack.knapsack_dp`, to half the gap).

    The models share only the availability rows, so when the union of the
    per-model covers fits within availability it is a plan, and the sum of their proven
    bounds bounds every plan. Returns (outcome, counts per x column, the per-model covers,
    the bound): "optimal" when the union fits, "short" when some model cannot be served even
    alone, "coupled" when the union does not fit.
    """
    got = Pricer(dec).price(np.zeros(dec.n_rows), Bounds.root(dec),
                                       rel_gap=rel_gap / 2)
    if not got.patterns:
        return "short", np.zeros(dec.n_cols, dtype=np.int64), [], math.inf
    counts = np.sum([p.counts for p in got.patterns], axis=0)
    return ("optimal" if dec.fits(counts) else "coupled"), counts, got.patterns, got.bound


# ---------------------------------------------------------------------------------------------
# Solving
# ---------------------------------------------------------------------------------------------


@dataclass
class _Run:
    ok: bool  # a primal solution exists
    infeasible: bool  # proven infeasible
    optimal: bool
    values: np.ndarray | None
    objective: float
    bound: float  # proven dual bound (nan when none)
    gap: float
    detail: str


def _run_highs(lp_in: highspy.HighsLp, *, time_limit_s: float, mip_gap: float,
               threads: int | None, cutoff: float = math.inf,
               target: float = -math.inf) -> _Run:
    """One HiGHS run (minimising). `cutoff`: only solutions of lower objective are looked
    for (a plan known beforehand); `target`: stop at the first solution this good.

    No start solution is passed: HiGHS 1.16 with presolve on mis-values one (measured on an
    advanced-size scarcity phase 2: a start of cost 5799.46 reported at 5523.21, below the LP
    bound, and "optimal" with that as the dual bound), so neither its objective nor its bound
    could be trusted. A cutoff keeps what a start would prune by."""
    h = quiet_highs()
    h.setOptionValue("time_limit", float(max(time_limit_s, 1e-3)))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    # Feasibility jump costs more than it finds on these covering problems (measured with
    # benchmarks/allocator.py: 0.9 s -> 0.3 s on a core-size problem, same optimum).
    h.setOptionValue("mip_heuristic_run_feasibility_jump", False)
    set_threads(h, threads)
    if math.isfinite(cutoff):
        h.setOptionValue("objective_bound", float(cutoff))
    if math.isfinite(target):
        h.setOptionValue("objective_target", float(target))
    h.passModel(lp_in)
    outcome = h.run()
    status = h.getModelStatus()
    if outcome == highspy.HighsStatus.kError and status == highspy.HighsModelStatus.kNotset:
        raise RuntimeError("HiGHS did not run the allocation MILP (it rejected its options "
                           "or model)")
    info = h.getInfo()
    has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
    infeasible = status in (highspy.HighsModelStatus.kInfeasible,
                            highspy.HighsModelStatus.kUnboundedOrInfeasible)
    values = np.array(h.getSolution().col_value) if has_sol and not infeasible else None
    gap = float(info.mip_gap) if values is not None else math.inf
    if not math.isfinite(gap) or gap < 0:
        gap = 0.0 if status == highspy.HighsModelStatus.kOptimal else math.inf
    bound = float(info.mip_dual_bound)
    return _Run(
        ok=values is not None,
        infeasible=infeasible,
        optimal=status == highspy.HighsModelStatus.kOptimal,
        values=values,
        objective=float(info.objective_function_value) if values is not None else math.nan,
        bound=bound if math.isfinite(bound) else math.nan,
        gap=gap,
        detail=h.modelStatusToString(status),
    )


def solve_allocation(
    problem: AllocationProblem,
    *,
    strict: bool = False,
    presolve: bool = True,
    decompose: bool = True,
    threads: int | None = None,
    starts: Sequence[Mapping[TemplateRegion, int]] = (),
) -> AllocationPlan:
    """Cheapest deployment meeting every model's demand; under scarcity, the most goodput.

    Honours `problem.time_limit_s` over all phases (each scarcity phase gets at least
    `MIN_PHASE_S`) and returns the best plan found with its proven gap. With `strict`, a plan
    that does not meet every demand raises `InfeasiblePlanError` naming the models short.

    `starts` are plans known beforehand (instances per (column id, region) of this problem;
    ids it does not hold are ignored, and a start overdrawing availability is no plan): the
    best of them seeds the search, and the plan returned is never worse than it (demand met,
    then more priority-weighted goodput, then cheaper), whatever the time limit cuts short.
    """
    warm_up()  # the kernels are compiled or loaded before the clock starts, not inside it
    t0 = time.perf_counter()
    plan = _solve(problem, presolve=presolve, decompose=decompose, threads=threads,
                  starts=starts, t0=t0)
    given = best_start(problem, starts)
    if given is not None and _better(given, plan):
        plan = _adopt(problem, plan, given, solve_s=time.perf_counter() - t0)
    return _finish(problem, plan, strict)


def best_start(problem: AllocationProblem, starts: Sequence[Mapping[TemplateRegion, int]]
               ) -> AllocationPlan | None:
    """The best of `starts` as a plan of `problem` (None when none is a plan): instances of
    ids or regions the problem lacks are dropped, and a start that needs more nodes than
    are available is left out."""
    ids = {t.id: t for t in problem.templates}
    best = None
    for start in starts:
        counts = {(tid, r): int(n) for (tid, r), n in start.items()
                  if int(n) > 0 and tid in ids and r in ids[tid].price_usd_per_hour
                  and r in problem.regions}
        plan = make_plan(problem, counts, status=PlanStatus.TIME_LIMIT, gap=math.inf,
                         solve_s=0.0, goodput_gap=math.inf)
        if any(n > problem.availability.get(key, 0) for key, n in plan.nodes_used.items()):
            continue
        if best is None or _better(plan, best):
            best = plan
    return best


def _better(a: AllocationPlan, b: AllocationPlan) -> bool:
    """`a` is the better plan of one problem: it meets demand where `b` does not, or serves
    more priority-weighted goodput, or as much at a lower cost."""
    if a.meets_demand != b.meets_demand:
        return a.meets_demand
    tol = GOODPUT_REL_TOL * max(1.0, abs(b.goodput))
    if not a.meets_demand and abs(a.goodput - b.goodput) > tol:
        return a.goodput > b.goodput
    return a.objective < b.objective * (1.0 - 1e-9)


def _adopt(problem: AllocationProblem, solved: AllocationPlan, given: AllocationPlan, *,
           solve_s: float) -> AllocationPlan:
    """`given` (better than `solved`) with the gaps the solve's bounds prove for it: the cost
    bound `solved` was proven against holds for every plan of at least its goodput, and the
    goodput bound for every plan."""
    def bound_of(value: float, gap: float, sign: float) -> float:
        return value * (1.0 - sign * gap) if math.isfinite(gap) else -sign * math.inf

    note = "a plan given as a start is better than the search's: kept"
    if given.meets_demand and not solved.meets_demand:
        return make_plan(problem, given.instances, status=PlanStatus.TIME_LIMIT, gap=math.inf,
                         solve_s=solve_s, notes=solved.notes + (note,))
    cost_bound = bound_of(solved.objective, solved.gap, 1.0)
    gap = relative_gap(given.objective, cost_bound)
    if given.meets_demand:
        status = PlanStatus.OPTIMAL if gap <= problem.mip_gap else PlanStatus.TIME_LIMIT
        return make_plan(problem, given.instances, status=status, gap=gap, solve_s=solve_s,
                         notes=solved.notes + (note,))
    goodput_bound = bound_of(solved.goodput, solved.goodput_gap, -1.0)
    goodput_gap = relative_gap(-given.goodput, -goodput_bound)
    return make_plan(problem, given.instances, status=solved.status, gap=gap,
                     solve_s=solve_s, goodput_gap=goodput_gap, notes=solved.notes + (note,))


@dataclass
class _Seed:
    """The best start as counts of the ILP's x columns, with what it serves and costs."""
    x: np.ndarray
    goodput: float
    objective: float
    meets_demand: bool


def _seed_of(problem: AllocationProblem, ix: _Index, v: _Vars, cols: _Columns,
             starts: Sequence[Mapping[TemplateRegion, int]]) -> _Seed | None:
    """The best start on the columns presolve kept: a dominated column becomes the columns
    that dominate it (no more nodes, no dearer, as much capacity), counts are held to their
    bounds (which lose nothing), and columns presolve found useless are dropped."""
    if not starts or not len(v.x):
        return None
    t_of = {t.id: i for i, t in enumerate(ix.templates)}
    r_of = {r: i for i, r in enumerate(ix.regions)}
    pos = {(int(t), int(r)): i for i, (t, r) in enumerate(zip(v.x_t, v.x_r))}
    dominated = cols.report.dominated_by
    best = None
    for start in starts:
        x = np.zeros(len(v.x), dtype=np.int64)

        def put(tid: str, r: int, n: int, depth: int = 0) -> None:
            i = pos.get((t_of[tid], r))
            if i is not None:
                x[i] += n
            elif tid in dominated and depth < 8:
                for part in dominated[tid]:
                    put(part, r, n, depth + 1)

        for (tid, region), n in start.items():
            if tid in t_of and region in r_of and int(n) > 0:
                put(tid, r_of[region], int(n))
        x = np.minimum(x, v.x_ub.astype(np.int64))
        used = np.zeros_like(ix.avail)
        for i in np.flatnonzero(x):
            used[:, v.x_r[i]] += ix.counts[v.x_t[i]] * x[i]
        if (used > ix.avail).any():
            continue
        instances = {(ix.templates[v.x_t[i]].id, ix.regions[v.x_r[i]]): int(x[i])
                     for i in np.flatnonzero(x)}
        plan = make_plan(problem, instances, status=PlanStatus.TIME_LIMIT, gap=math.inf,
                         solve_s=0.0)
        if best is None or _better(plan, best[1]):
            best = (x, plan)
    if best is None:
        return None
    x, plan = best
    return _Seed(x, plan.goodput, plan.objective, plan.meets_demand)


def _solve(problem: AllocationProblem, *, presolve: bool, decompose: bool,
           threads: int | None, starts: Sequence[Mapping[TemplateRegion, int]], t0: float
           ) -> AllocationPlan:
    ix = _Index.build(problem)
    cols = _presolve(problem, ix, dominance=presolve)
    notes = [cols.report.describe()]
    if not ix.models:
        plan = make_plan(problem, {}, status=PlanStatus.OPTIMAL, gap=0.0,
                         solve_s=time.perf_counter() - t0, notes=notes + ["no demand"])
        return plan

    lp = _LpBuilder()
    v = _add_variables(lp, problem, ix, cols)
    rows = {
        "capacity": add_capacity_rows(lp, ix, v),
        "pd_pairing": add_pd_pairing_rows(lp, ix, v),
        "availability": add_availability_rows(lp, ix, v),
        "startup": add_startup_rows(lp, ix, v),
        "goodput_floor": add_goodput_floor_row(lp, ix, v),
    }
    arr = lp.arrays()
    floor_row = lp.n_row - 1
    notes.append(
        f"ilp: {len(v.x)} integer + {lp.n_col - len(v.x)} continuous columns, rows "
        + ", ".join(f"{k} {n}" for k, n in rows.items() if n)
    )
    log.debug("allocation %s", "; ".join(notes))

    def remaining() -> float:
        return problem.time_limit_s - (time.perf_counter() - t0)

    def to_instances(counts: np.ndarray) -> dict[tuple[str, str], int]:
        on = np.flatnonzero(counts > 0)
        return {
            (ix.templates[v.x_t[i]].id, ix.regions[v.x_r[i]]): int(counts[i]) for i in on
        }

    def x_of(values: np.ndarray) -> np.ndarray:
        return np.rint(values[v.x]).astype(np.int64)

    def plan_of(counts: np.ndarray, status: PlanStatus, gap: float,
                goodput_gap: float = 0.0) -> AllocationPlan:
        return make_plan(problem, to_instances(counts), status=status, gap=gap,
                         solve_s=time.perf_counter() - t0, goodput_gap=goodput_gap,
                         notes=notes)

    seed = _seed_of(problem, ix, v, cols, starts)
    if seed is not None:
        notes.append(f"seeded with a given plan: goodput {seed.goodput:.6g}, cost "
                     f"{seed.objective:.6g}")
    dec = _decomposition(ix, v, lp) if decompose else None
    large_pd = None  # PD models past exact covers: HiGHS, from a rounded LP plan
    if dec is not None and not _pd_covers_small(dec):
        notes.append("PD models too large for exact per-model covers: HiGHS from a rounded "
                     "LP plan")
        large_pd, dec = dec, None

    # ---- cost problem: every demand met
    proven_short = _capacity_bound_short(ix, v)
    if proven_short:
        notes.append("demand cannot be met in full (capacity or per-model bound)")
    elif dec is not None:
        outcome, counts, covers, bound = _solve_by_model(dec, problem.mip_gap)
        notes.append(f"per-model covers: {outcome}")
        if outcome == "optimal":
            return plan_of(counts, PlanStatus.OPTIMAL, relative_gap(dec.cost(counts), bound))
        proven_short = outcome == "short"
    if not proven_short and dec is not None:
        relaxed = _lp_relaxation(arr, arr.cost, arr.col_lb, arr.row_lb, lp, len(v.x))
        if relaxed is None:
            proven_short = True
            notes.append("demand cannot be met in full (LP relaxation infeasible)")
        else:
            # a first plan: the LP's counts rounded down, each model's rest covered
            first = round_and_repair(dec, relaxed.x)
            # a re-plan starts from the running plan where it (repaired) is the cheaper
            warm = running_plan(dec)
            if warm is not None and (first is None or dec.cost(warm) < dec.cost(first)):
                first = warm
                notes.append("started from the running plan")
            if seed is not None and seed.meets_demand and dec.fits(seed.x) \
                    and (first is None or dec.cost(seed.x) < dec.cost(first)):
                first = seed.x
                notes.append("started from a given plan")
            # PD models keep branch and price throughout: HiGHS on their ILPs is far behind
            # (real `core` limited: PD 10 s at a 1.8% gap, mixed 2.8%, where it proves 0.5%)
            share = 1.0 if dec.has_pd else DECOMPOSED_SHARE
            res = solve_decomposed(dec, deadline=_phase_deadline(problem, t0, share),
                                   rel_gap=problem.mip_gap, start_price=relaxed.node_price,
                                   start_bound=relaxed.value, start_patterns=tuple(covers),
                                   incumbent=first)
            notes.extend(res.notes)
            counts, cost, bound = res.counts, res.objective, res.bound
            proven_short = res.finished and res.bound == math.inf
            if not proven_short and relative_gap(cost, bound) > problem.mip_gap \
                    and remaining() > MIN_PHASE_S:
                counts, cost, bound = _highs_after_decomposition(
                    arr, v, dec, counts, cost, bound, mip_gap=problem.mip_gap,
                    time_limit_s=remaining(), threads=threads, notes=notes)
                proven_short = bound == math.inf
            if counts is not None:
                gap = relative_gap(cost, bound)
                status = PlanStatus.OPTIMAL if gap <= problem.mip_gap else PlanStatus.TIME_LIMIT
                return plan_of(counts, status, gap)
            notes.append("demand cannot be met in full (Lagrangian bound)" if proven_short
                         else "no plan meeting every demand found in time")
    elif not proven_short:
        if large_pd is not None:
            relaxed, start = _rounded_start(large_pd, arr, lp, v, mip_gap=problem.mip_gap,
                                            deadline=t0 + problem.time_limit_s,
                                            threads=threads, notes=notes, seed=seed)
            proven_short = relaxed is None
            if start is not None:
                return plan_of(start.counts, start.status, relative_gap(start.cost,
                                                                        start.bound))
    if not proven_short and dec is None:
        run = _run_highs(arr.highs_lp(arr.cost, arr.col_lb, arr.row_lb, maximise=False),
                         time_limit_s=remaining(), mip_gap=problem.mip_gap, threads=threads)
        if run.ok and not run.infeasible:
            assert run.values is not None
            if not run.optimal:
                notes.append(f"HiGHS: {run.detail}")
            return plan_of(x_of(run.values),
                           PlanStatus.OPTIMAL if run.optimal else PlanStatus.TIME_LIMIT, run.gap)
        proven_short = run.infeasible
        notes.append(f"demand cannot be met in full (HiGHS: {run.detail})" if run.infeasible
                     else f"no plan meeting every demand found in time (HiGHS: {run.detail})")
    final_status = PlanStatus.INFEASIBLE if proven_short else PlanStatus.TIME_LIMIT

    # ---- scarcity: most goodput (phase 1), then the cheapest plan at it (phase 2)
    col_lb = arr.col_lb.copy()
    col_lb[v.s] = 0.0
    # PD models past exact covers (`large_pd`) go to HiGHS on the whole ILP: measured on
    # `coral plan advanced --level scarce --mode pd --nmax 2`, it proves a 0.50 % gap in 8.5 s
    # where `_scarcity_bounded` ends at the 10 s limit 1.3 % from its bound
    if dec is not None:
        best, gap, goodput_gap = _scarcity_bounded(problem, dec, arr, lp, ix, v, col_lb,
                                                   floor_row, t0=t0, notes=notes,
                                                   threads=threads, seed=seed)
    else:
        best, gap, goodput_gap = _scarcity_highs(problem, arr, lp, ix, v, col_lb, floor_row,
                                                 t0=t0, notes=notes, threads=threads,
                                                 seed=seed)
    if best is None:
        plan = plan_of(np.zeros(len(v.x), dtype=np.int64), final_status, math.inf, math.inf)
    else:
        plan = plan_of(best, final_status, gap, goodput_gap)
        if plan.meets_demand:  # the cost phase found no plan in time; the goodput phases did
            plan = plan_of(best, PlanStatus.TIME_LIMIT, gap, goodput_gap)
    return plan


def _highs_after_decomposition(arr: "_LpArrays", v: _Vars, dec: Decomposition,
                               counts: np.ndarray | None, cost: float, bound: float, *,
                               mip_gap: float, time_limit_s: float, threads: int | None,
                               notes: list[str]
                               ) -> tuple[np.ndarray | None, float, float]:
    """HiGHS on the whole cost ILP after branch and price stopped short of the gap: below
    its plan's cost, stopping at the first plan its bound proves. Returns the better plan
    (counts, cost; None and inf when neither found one) and the better bound of the two
    (each holds for every plan; inf when HiGHS proves that none meets demand)."""
    target = bound / (1.0 - mip_gap * _INSIDE) if math.isfinite(bound) else -math.inf
    run = _run_highs(arr.highs_lp(arr.cost, arr.col_lb, arr.row_lb, maximise=False),
                     time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads,
                     cutoff=cost, target=target)
    x = _plan_of_run(run, v)
    if x is not None and dec.fits(x) and dec.covers(x) and dec.cost(x) < cost:
        counts, cost = x, dec.cost(x)
    if run.infeasible:
        # nothing cheaper than `cost` meets demand: `cost` is optimal, or no plan exists
        bound = cost
    elif math.isfinite(run.bound):
        bound = max(bound, min(run.bound, cost))
    notes.append(f"HiGHS after branch and price: {run.detail}, cost {cost:.6g}, bound "
                 f"{bound:.6g}")
    return counts, cost, bound


@dataclass
class _Start:
    """A plan meeting every demand found by rounding the LP optimum."""
    counts: np.ndarray
    cost: float
    bound: float  # proven: the LP relaxation's value, or HiGHS's on the whole ILP
    status: PlanStatus


def _rounded_start(dec: Decomposition, arr: "_LpArrays", lp: _LpBuilder, v: _Vars, *,
                   mip_gap: float, deadline: float, threads: int | None, notes: list[str],
                   seed: _Seed | None = None
                   ) -> tuple["_Relaxation | None", _Start | None]:
    """A plan for problems whose PD models are past exact covers: the LP optimum rounded
    down, each model's rest covered by one group at a time (`round_and_repair` without
    exact PD covers), then HiGHS on the columns that plan or the LP use (the LP's support, a
    few dozen columns) and on more of those of least reduced cost (`SUPPORT_GROWTH`), the
    whole ILP last when it has at most `WHOLE_ILP_MAX_COLUMNS`.

    Past that HiGHS on the whole ILP is not run: on synthetic `advanced`-size PD problems
    (15,000 columns) it found no plan in 10 s, and its root cut rounds, which nothing
    interrupts, ran 20-36 s against a 10 s limit; measured on 3 of those draws at the limited
    level: rounding 5 % above the LP bound, the support 3.1-3.6 %, 1,000 more columns
    2.8-3.2 %, the gap then proven against the LP bound alone. Returns (the LP relaxation, None when infeasible; the plan, None when
    rounding found none)."""
    relaxed = _lp_relaxation(arr, arr.cost, arr.col_lb, arr.row_lb, lp, len(v.x))
    if relaxed is None:
        notes.append("demand cannot be met in full (LP relaxation infeasible)")
        return None, None
    x = round_and_repair(dec, relaxed.x, exact_pd=False)
    if x is None:  # HiGHS near the LP optimum may still find one, without a cutoff
        x, cost = np.zeros(len(v.x), dtype=np.int64), math.inf
        how = ["rounding: none (the nodes left after rounding down fall short)"]
    else:
        cost = dec.cost(x)
        how = ["rounded down, rest covered"]
    if seed is not None and seed.meets_demand and dec.fits(seed.x) \
            and dec.cost(seed.x) < cost:
        x, cost = seed.x.copy(), dec.cost(seed.x)
        how = ["a given plan"]
    bound, stopped = relaxed.value, False
    cheapest = np.argsort(relaxed.col_dual[v.x], kind="stable")
    growth = SUPPORT_GROWTH + ((len(v.x),) if len(v.x) <= WHOLE_ILP_MAX_COLUMNS else ())
    for extra in growth:
        left = deadline - time.perf_counter()
        if relative_gap(cost, bound) <= mip_gap or left <= MIN_PHASE_S:
            stopped = left <= MIN_PHASE_S
            break
        support = _support(relaxed, x, cheapest[:extra])
        # a neighbourhood may not take the time of the whole ILP that follows it
        share = 1.0 if support.all() or len(growth) == len(SUPPORT_GROWTH) \
            else NEIGHBOURHOOD_SHARE
        run, better = _run_on_support(arr, v, arr.cost, arr.col_lb, arr.row_lb, support,
                                      cutoff=cost, time_limit_s=share * left,
                                      mip_gap=mip_gap, threads=threads)
        if support.all():  # the whole ILP: HiGHS's bound holds for every plan
            bound = max(bound, _bound_with_limit(run, cost, relaxed.value))
        if better is not None and dec.fits(better) and dec.covers(better) \
                and dec.cost(better) < cost:
            x, cost = better, dec.cost(better)
            how.append(f"HiGHS on {int(support.sum())} columns: {cost:.6g} ({run.detail})")
        stopped = not (run.optimal or run.infeasible)
        if support.all():
            break
    if not math.isfinite(cost):
        notes.append("rounded LP plan: none (" + "; ".join(how) + ")")
        return relaxed, None
    gap = relative_gap(cost, bound)
    notes.append(f"rounded LP plan: cost {cost:.6g}, bound {bound:.6g} ("
                 + "; ".join(how) + ")")
    status = (PlanStatus.OPTIMAL if gap <= mip_gap else
              PlanStatus.TIME_LIMIT if stopped else PlanStatus.FEASIBLE)
    return relaxed, _Start(x, cost, bound, status)


def _support(relaxed: "_Relaxation", x: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """The x columns an LP optimum or a plan use, and `extra` ones."""
    support = (relaxed.x > INTEGRALITY_TOL) | (x > 0)
    support[extra] = True
    return support


def _run_on_support(arr: "_LpArrays", v: _Vars, cost: np.ndarray, col_lb: np.ndarray,
                    row_lb: np.ndarray, support: np.ndarray, *, cutoff: float,
                    time_limit_s: float, mip_gap: float, threads: int | None,
                    target: float = -math.inf) -> tuple["_Run", np.ndarray | None]:
    """HiGHS with the x columns outside `support` held at their lower bounds (a neighbourhood
    of an LP optimum and a plan, small enough to solve fast); its run and plan, if any."""
    hi = arr.col_ub.astype(float).copy()
    hi[v.x] = np.where(support, hi[v.x], col_lb[v.x])
    run = _run_highs(arr.highs_lp(cost, col_lb, row_lb, maximise=False, col_ub=hi),
                     time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads,
                     cutoff=cutoff, target=target)
    return run, _plan_of_run(run, v)


def _phase_deadline(problem: AllocationProblem, t0: float, share: float) -> float:
    """When a scarcity phase must stop: `share` of the time left (at least `MIN_PHASE_S`)."""
    now = time.perf_counter()
    left = t0 + problem.time_limit_s - now
    return now + max(share * left, MIN_PHASE_S)


def _scarcity_highs(problem: AllocationProblem, arr: "_LpArrays", lp: _LpBuilder, ix: _Index,
                    v: _Vars, col_lb: np.ndarray, floor_row: int, *, t0: float,
                    notes: list[str], threads: int | None, seed: _Seed | None = None
                    ) -> tuple[np.ndarray | None, float, float]:
    """Both scarcity phases by HiGHS on the full ILP, phase 1's plan the better of HiGHS's
    and `seed`. Returns (counts, cost gap, goodput gap); counts None when neither phase 1 nor
    the seed gives a plan."""
    goodput_cost = np.zeros(lp.n_col)
    goodput_cost[v.s] = ix.priority
    end = _phase_deadline(problem, t0, PHASE1_SHARE)
    run1 = _run_highs(arr.highs_lp(goodput_cost, col_lb, arr.row_lb, maximise=True),
                      time_limit_s=end - time.perf_counter(), mip_gap=problem.mip_gap,
                      threads=threads)
    x1, g1, cutoff, gap1 = None, -math.inf, math.inf, math.inf
    if run1.ok:
        assert run1.values is not None
        x1 = np.rint(run1.values[v.x]).astype(np.int64)
        g1 = float(np.dot(ix.priority, run1.values[v.s]))
        gap1 = run1.gap
        if not run1.optimal:
            notes.append(f"scarcity phase 1: HiGHS {run1.detail}")
    if seed is not None and seed.goodput > g1 * (1.0 + GOODPUT_REL_TOL) + 1e-12:
        # HiGHS's bound still holds: it bounds every plan, the seed's too
        bound1 = g1 * (1.0 + gap1) if run1.ok and math.isfinite(gap1) else math.inf
        gap1 = relative_gap(-seed.goodput, -bound1)
        x1, g1, cutoff = seed.x.copy(), seed.goodput, seed.objective
        notes.append(f"scarcity phase 1: the given plan serves more (goodput {g1:.6g})")
    if x1 is None:
        notes.append(f"scarcity phase 1 found no plan (HiGHS: {run1.detail})")
        return None, math.inf, math.inf
    row_lb = arr.row_lb.copy()
    row_lb[floor_row] = g1 * (1.0 - GOODPUT_REL_TOL)
    end = _phase_deadline(problem, t0, 1.0)
    run2 = _run_highs(arr.highs_lp(arr.cost, col_lb, row_lb, maximise=False),
                      time_limit_s=end - time.perf_counter(), mip_gap=problem.mip_gap,
                      threads=threads, cutoff=cutoff)
    if not run2.optimal:
        notes.append(f"scarcity phase 2: HiGHS {run2.detail}")
    if run2.ok and not run2.infeasible:
        assert run2.values is not None
        return np.rint(run2.values[v.x]).astype(np.int64), run2.gap, gap1
    # phase 1's plan keeps its goodput; phase 2's bound (HiGHS's, else its LP relaxation's)
    # still says how far its cost may be from the cheapest at that goodput
    cost = float(v.price @ x1 + v.penalty @ np.maximum(x1 - ix.current[v.x_t, v.x_r], 0))
    bound = cost if run2.infeasible and math.isfinite(cutoff) else run2.bound
    if not math.isfinite(bound):
        relaxed = _lp_relaxation(arr, arr.cost, col_lb, row_lb, lp, len(v.x))
        bound = relaxed.value if relaxed is not None else math.inf
    return x1, relative_gap(cost, bound), gap1


def _scarcity_bounded(problem: AllocationProblem, dec: Decomposition, arr: "_LpArrays",
                      lp: _LpBuilder, ix: _Index, v: _Vars, col_lb: np.ndarray, floor_row: int,
                      *, t0: float, notes: list[str], threads: int | None,
                      seed: _Seed | None = None
                      ) -> tuple[np.ndarray | None, float, float]:
    """Both scarcity phases from the LP bound and a heuristic plan, with HiGHS only where
    they leave the gap open: first on the columns the LP and the plan use, then on those that
    can still matter (`_fix_by_reduced_cost`).
    Returns (counts, cost gap, goodput gap) as `_scarcity_highs`."""
    gap = problem.mip_gap
    # ---- phase 1: most goodput, minimising -goodput
    end = _phase_deadline(problem, t0, PHASE1_SHARE)
    neg_goodput = np.zeros(lp.n_col)
    neg_goodput[v.s] = -ix.priority
    relaxed = _lp_relaxation(arr, neg_goodput, col_lb, arr.row_lb, lp, len(v.x))
    if relaxed is None or relaxed.col_value is None:
        notes.append("scarcity: no LP optimum; HiGHS on the full ILP")
        return _scarcity_highs(problem, arr, lp, ix, v, col_lb, floor_row, t0=t0, notes=notes,
                               threads=threads, seed=seed)
    heuristic_end = time.perf_counter() + HEURISTIC_SHARE * max(0.0, end - time.perf_counter())
    x1 = goodput_plan(dec, relaxed.x, relaxed.node_price, deadline=heuristic_end)
    f1, bound1 = -dec.goodput(x1), relaxed.value
    how = "heuristic plan, LP bound"
    if seed is not None and dec.fits(seed.x) and dec.goodput(seed.x) > -f1:
        x1, f1 = seed.x.copy(), -dec.goodput(seed.x)
        how = "the given plan, LP bound"
    near_full = -bound1 >= NEAR_FULL * float(ix.priority @ ix.demand)
    accept = ACCEPT_SHARE_NEAR_FULL if near_full else 1.0
    if relative_gap(f1, bound1) > accept * gap:
        # first the columns the LP and the heuristic use: a better plan to cut off by, and so
        # more columns fixed below (the heuristic's PD plans are far from the bound)
        run, x = _run_on_support(arr, v, neg_goodput, col_lb, arr.row_lb,
                                 _support(relaxed, x1, np.zeros(0, dtype=np.int64)),
                                 cutoff=f1,
                                 time_limit_s=SUPPORT_SHARE * (end - time.perf_counter()),
                                 mip_gap=gap, threads=threads)
        if x is not None and dec.fits(x) and -dec.goodput(x) < f1:
            x1, f1 = x, -dec.goodput(x)
            how = "HiGHS on the LP's and the heuristic's columns, LP bound"
    if relative_gap(f1, bound1) > accept * gap:
        # every plan of goodput above g1 (1 + share gap) keeps to the LP's reduced-cost limits
        # (a hair inside the gap, so that the gap proven is within the target after rounding)
        limit = min(f1 * (1.0 + accept * gap * _INSIDE), f1 - 1e-9 * max(1.0, abs(f1)))
        lo, hi = _fix_by_reduced_cost(arr, relaxed, col_lb, limit)
        run = _run_highs(arr.highs_lp(neg_goodput, lo, arr.row_lb, maximise=False, col_ub=hi),
                         time_limit_s=end - time.perf_counter(), mip_gap=gap, threads=threads,
                         cutoff=f1, target=bound1 / (1.0 + accept * gap * _INSIDE))
        x = _plan_of_run(run, v)
        if x is not None and dec.fits(x) and -dec.goodput(x) < f1:
            x1, f1 = x, -dec.goodput(x)
        bound1 = _bound_with_limit(run, limit, bound1)
        how = f"HiGHS on {_free(lo, hi, v)} of {len(v.x)} columns ({run.detail})"
    gap1 = relative_gap(f1, bound1)
    notes.append(f"scarcity phase 1: goodput {-f1:.6g}, bound {-bound1:.6g} ({how})")

    # ---- phase 2: the cheapest plan of at least that goodput
    floor = -f1 * (1.0 - GOODPUT_REL_TOL)
    row_lb = arr.row_lb.copy()
    row_lb[floor_row] = floor
    end = _phase_deadline(problem, t0, 1.0)
    relaxed = _lp_relaxation(arr, arr.cost, col_lb, row_lb, lp, len(v.x))
    x2, c2 = x1, dec.cost(x1)
    bound2 = -math.inf if relaxed is None else relaxed.value
    how = "phase 1's plan, LP bound"
    if relative_gap(c2, bound2) > gap and relaxed is not None:
        # first the columns the LP and phase 1's plan use: fast, and a lower cutoff below.
        # Measured (benchmarks/allocator.py, scarce, 20 draws, gap 0.5%): core median
        # 0.25 -> 0.21 s; advanced 8.1 -> 3.4 s, largest gap 3.1 -> 0.9%
        run, x = _run_on_support(arr, v, arr.cost, col_lb, row_lb,
                                 _support(relaxed, x2, np.zeros(0, dtype=np.int64)),
                                 cutoff=c2,
                                 time_limit_s=SUPPORT_SHARE * (end - time.perf_counter()),
                                 mip_gap=gap, threads=threads)
        if _cheaper_at_floor(dec, x, floor, c2):
            x2, c2 = x, dec.cost(x)
            how = "HiGHS on the LP's and phase 1's columns, LP bound"
        if len(v.x) >= PHASE2_GROWTH_MIN_COLUMNS and relaxed.col_dual is not None:
            cheapest = np.argsort(relaxed.col_dual[v.x], kind="stable")
            for share in PHASE2_GROWTH:
                if relative_gap(c2, bound2) <= gap:
                    break
                # a plan the LP bound proves ends the run at once
                run, x = _run_on_support(
                    arr, v, arr.cost, col_lb, row_lb,
                    _support(relaxed, x2, cheapest[:int(share * len(v.x))]),
                    cutoff=c2, time_limit_s=GROWTH_TIME_SHARE * (end - time.perf_counter()),
                    mip_gap=gap, threads=threads, target=bound2 / (1.0 - gap * _INSIDE))
                if _cheaper_at_floor(dec, x, floor, c2):
                    x2, c2 = x, dec.cost(x)
                    how = (f"HiGHS on the LP's and phase 1's columns and {share:.0%} more, "
                           "LP bound")
    if relative_gap(c2, bound2) > gap:
        limit = c2 * (1.0 - gap * _INSIDE)
        if relaxed is not None and relaxed.col_value is not None:
            lo, hi = _fix_by_reduced_cost(arr, relaxed, col_lb, limit)
        else:  # no LP optimum (not expected: phase 1's plan is feasible)
            lo, hi, limit = col_lb, arr.col_ub, math.inf
        run = _run_highs(arr.highs_lp(arr.cost, lo, row_lb, maximise=False, col_ub=hi),
                         time_limit_s=end - time.perf_counter(), mip_gap=gap, threads=threads,
                         cutoff=c2)
        x = _plan_of_run(run, v)
        if _cheaper_at_floor(dec, x, floor, c2):
            x2, c2 = x, dec.cost(x)
        bound2 = _bound_with_limit(run, limit, bound2)
        how = f"HiGHS on {_free(lo, hi, v)} of {len(v.x)} columns ({run.detail})"
    notes.append(f"scarcity phase 2: cost {c2:.6g}, bound {bound2:.6g} ({how})")
    return x2, relative_gap(c2, bound2), gap1


def _cheaper_at_floor(dec: Decomposition, x: np.ndarray | None, floor: float,
                      cost: float) -> bool:
    """`x` is a plan that fits, keeps the goodput floor (up to rounding) and costs less."""
    return x is not None and dec.fits(x) and dec.goodput(x) >= floor - 1e-9 * max(1.0, floor) \
        and dec.cost(x) < cost


def _plan_of_run(run: "_Run", v: _Vars) -> np.ndarray | None:
    return None if not run.ok or run.values is None else np.rint(run.values[v.x]).astype(
        np.int64)


def _free(lo: np.ndarray, hi: np.ndarray, v: _Vars) -> int:
    return int((hi[v.x] > lo[v.x]).sum())


def _fix_by_reduced_cost(arr: "_LpArrays", relaxed: _Relaxation, col_lb: np.ndarray,
                         limit: float) -> tuple[np.ndarray, np.ndarray]:
    """Column bounds within which lies every solution of objective at most `limit`
    (minimising): moving an integer column off the LP optimum's bound by k costs at least k
    times its reduced cost, on top of the LP's value."""
    assert relaxed.col_value is not None and relaxed.col_dual is not None
    lo, hi = col_lb.astype(float).copy(), arr.col_ub.astype(float).copy()
    slack = limit - relaxed.value
    slack += 1e-9 * max(1.0, abs(limit)) + 1e-9  # the LP's own tolerances
    if slack < 0:
        slack = 0.0
    x, d = relaxed.col_value, relaxed.col_dual
    tol = 1e-7
    at_lo = arr.integer & (np.abs(x - lo) <= tol) & (d > tol)
    at_hi = arr.integer & (np.abs(x - hi) <= tol) & (d < -tol)
    with np.errstate(divide="ignore", invalid="ignore"):
        move = np.floor(slack / np.abs(d) + 1e-6)
    hi[at_lo] = np.minimum(hi[at_lo], lo[at_lo] + move[at_lo])
    lo[at_hi] = np.maximum(lo[at_hi], hi[at_hi] - move[at_hi])
    return lo, hi


def _bound_with_limit(run: "_Run", limit: float, fallback: float) -> float:
    """The proven bound of a run over columns fixed for `limit`: a plan outside them costs
    more than `limit`, one inside no less than the run's bound (HiGHS's, else `fallback`, a
    bound of the whole problem)."""
    if run.infeasible:
        inside = math.inf
    elif math.isfinite(run.bound):
        inside = max(run.bound, fallback)
    else:
        inside = fallback
    return min(inside, limit)


@dataclass
class _Relaxation:
    value: float  # the LP's optimum: a bound of the ILP (-inf when HiGHS gave none)
    node_price: np.ndarray  # shadow price of one node per availability row
    x: np.ndarray  # the LP's values of the x columns
    col_value: np.ndarray | None = None  # every column's value (None when not optimal)
    col_dual: np.ndarray | None = None  # every column's reduced cost


def _lp_relaxation(arr: "_LpArrays", cost: np.ndarray, col_lb: np.ndarray,
                   row_lb: np.ndarray, lp: _LpBuilder, n_x: int) -> _Relaxation | None:
    """The LP relaxation, minimising `cost`: its bound, where column generation starts, and
    counts to round. None when it is infeasible (proven by HiGHS)."""
    relaxed = arr.highs_lp(cost, col_lb, row_lb, maximise=False)
    relaxed.integrality_ = [highspy.HighsVarType.kContinuous] * len(cost)
    h = quiet_highs()
    h.passModel(relaxed)
    h.run()
    status = h.getModelStatus()
    rows, _, _ = lp.availability_rows
    if status != highspy.HighsModelStatus.kOptimal:
        if status == highspy.HighsModelStatus.kInfeasible:
            return None
        return _Relaxation(-math.inf, np.zeros(len(rows)), np.zeros(n_x))
    sol = h.getSolution()
    duals = np.array(sol.row_dual)
    return _Relaxation(
        value=float(h.getInfo().objective_function_value),
        node_price=np.maximum(0.0, -duals[rows]),  # a <= row's dual is <= 0 when minimising
        x=np.array(sol.col_value)[:n_x],
        col_value=np.array(sol.col_value),
        col_dual=np.array(sol.col_dual),
    )


def _capacity_bound_short(ix: _Index, v: _Vars) -> bool:
    """True when some model's demand exceeds what all its columns at their bounds could serve,
    each model on its own (a quick, sure sign of scarcity)."""
    n_m, n_r = len(ix.models), len(ix.regions)
    cap = ix.cap[v.x_t] * v.x_ub
    by_mode = np.zeros((n_m, len(MODES), n_r))
    np.add.at(by_mode, (ix.t_model[v.x_t], ix.t_mode[v.x_t], v.x_r), cap)
    paired = np.minimum(by_mode[:, _PREFILL, :] / ix.tokens[:, _PREFILL, None],
                        by_mode[:, _DECODE, :] / ix.tokens[:, _DECODE, None])
    most = by_mode[:, _AGG, :].sum(axis=1) + paired.sum(axis=1)
    return bool((most < ix.demand * (1.0 - 1e-9)).any())


def _finish(problem: AllocationProblem, plan: AllocationPlan, strict: bool) -> AllocationPlan:
    if plan.meets_demand:
        return plan
    log.info("allocation short on %s", ", ".join(plan.short_models))
    if strict:
        raise InfeasiblePlanError(infeasibility_message(problem, plan), plan)
    return plan


def infeasibility_message(problem: AllocationProblem, plan: AllocationPlan) -> str:
    """Which models' demand cannot be met, and why, in words."""
    lines = []
    if plan.status is PlanStatus.INFEASIBLE:
        lines.append("the demand cannot be met with the availability given; the plan of most "
                     "priority-weighted goodput leaves these models short:")
    else:
        lines.append(f"no plan meeting every demand was found within the time limit "
                     f"({problem.time_limit_s:g} s); the best plan found leaves these models "
                     "short:")
    for model in plan.short_models:
        demand = plan.demand_rps[model]
        served = plan.served_rps[model]
        templates = [t for t in problem.templates if t.model == model]
        reason = ""
        if not templates:
            reason = " (no template serves it)"
        elif not any(
            all(problem.availability.get((g, r), 0) >= n for g, n in t.node_counts.items())
            for t in templates
            for r in t.price_usd_per_hour
            if r in problem.regions
        ):
            reason = (f" (none of its {len(templates)} templates can run: their node types "
                      "are not priced or not available together in any region)")
        lines.append(f"  {model}: {served:.4g} of {demand:.4g} req/s served, short by "
                     f"{demand - served:.4g}{reason}")
    lines.append("To fix: add availability of these models' node types or regions, lower their "
                 "demand, or raise their priority over the others.")
    return "\n".join(lines)
