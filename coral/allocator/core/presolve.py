"""Presolve of the allocation ILP: the problem as arrays (`Index`), templates that others
dominate (`dominated_templates`), and the (template, region) columns the ILP keeps
(`presolve_columns`) with the bounds that lose nothing.

Bounds that lose nothing: `u[t,r]` is the fewest of (a) nodes available over nodes needed, for
each of `t`'s node types, and (b) `ceil(demand / capacity)` instances, more of which would only
add cost (every price is positive) without serving more.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

import numpy as np

from coral.allocator.problem import MODES, AllocationProblem, TemplateColumn

MODE_INDEX = {mode: i for i, mode in enumerate(MODES)}


MODE_AGG, MODE_PREFILL, MODE_DECODE = (MODE_INDEX[m] for m in MODES)


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


def _dominance_of_useful(templates: tuple[TemplateColumn, ...], useful: np.ndarray
                         ) -> dict[str, tuple[str, ...]]:
    """Dominance among the templates some region can run for a model with demand (`useful`,
    per template), or the whole set's where that is cached already.

    A collection dominating `t` sits on a sub-multiset of `t`'s nodes, so it fits wherever
    `t` fits; every relation found among the useful templates holds by the same test as over
    all of them, and the others are dropped anyway. On n_max-6 libraries the whole set's
    dominance takes much of a solve's time limit, and at scarce levels most templates fit
    nowhere (benchmarks/results/scarcity.md, "Per phase at the paper's scale")."""
    key = tuple(map(id, templates))
    if key in _DOMINANCE_CACHE or useful.all():
        return _cached_dominance(templates)
    return _cached_dominance(tuple(t for t, on in zip(templates, useful) if on))


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
class Index:
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
    def build(cls, p: AllocationProblem) -> "Index":
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
            t_mode=np.array([MODE_INDEX[t.mode] for t in p.templates], dtype=np.int64),
            cap=np.array([t.capacity for t in p.templates], dtype=float),
            counts=counts,
            price=price,
            avail=avail,
            current=current,
        )


@dataclass
class Columns:
    """The x variables kept by presolve: template index, region index, upper bound."""

    t: np.ndarray
    r: np.ndarray
    ub: np.ndarray
    report: PresolveReport


def presolve_columns(problem: AllocationProblem, *, dominance: bool = True) -> PresolveReport:
    """Which (template, region) pairs the ILP keeps, and why the others go."""
    return run_presolve(problem, Index.build(problem), dominance=dominance).report


def run_presolve(problem: AllocationProblem, ix: Index, *, dominance: bool) -> Columns:
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
        dominated_by = _dominance_of_useful(ix.templates, useful.any(axis=1))
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
        paired = half[:, MODE_PREFILL, :] & half[:, MODE_DECODE, :]
        is_pd = ix.t_mode != MODE_AGG
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
    return Columns(t=tt, r=rr, ub=ub[tt, rr], report=report)
