"""Presolve of the allocation ILP: the problem as arrays (`Index`), templates that others
dominate (`dominated_templates`, from `dominance`, remembered per template set), and the
(template, region) columns the ILP keeps (`presolve_columns`) with the bounds that lose nothing.

Bounds that lose nothing: `u[t,r]` is the fewest of (a) nodes available over nodes needed, for
each of `t`'s node types, and (b) `ceil(demand / capacity)` instances, more of which would only
add cost (every price is positive) without serving more.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from coral.allocator.core.dominance import dominated_templates
from coral.allocator.problem import MODES, AllocationProblem, TemplateColumn

MODE_INDEX = {mode: i for i, mode in enumerate(MODES)}


MODE_AGG, MODE_PREFILL, MODE_DECODE = (MODE_INDEX[m] for m in MODES)


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
