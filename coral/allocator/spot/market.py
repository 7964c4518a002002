"""The spot planner's inputs: its options, the market of the pools a problem can use, the
problem with spot copies of its columns (`spot_columns`), and that problem as the arrays
the ILP and the repair read (`spot_arrays`). See `coral.allocator.spot.planner` for the model."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from coral.allocator.problem import AllocationProblem, TemplateColumn
from coral.allocator.spot.ilp import SpotArrays
from coral.allocator.spot.risk import AGGREGATED, DECODE, PREFILL, Pool, pool_down_probability
from coral.errors import CoralError

SPOT_SUFFIX = "@spot"
HALF = {"aggregated": AGGREGATED, "prefill": PREFILL, "decode": DECODE}
"""A column's mode as the half it is in `spot_risk.Pairing`."""
DEFAULT_RISK_TARGET = 0.99
DEFAULT_RISK_WINDOW_S = 3600.0


class SpotPlanError(CoralError, ValueError):
    """A spot plan cannot be made as asked (bad option, no spot price, target out of reach)."""


@dataclass(frozen=True)
class SpotOptions:
    """`coral plan --spot [--risk-target P] [--risk-window S]`."""

    risk_target: float = DEFAULT_RISK_TARGET
    window_s: float = DEFAULT_RISK_WINDOW_S

    def __post_init__(self) -> None:
        if not (isinstance(self.risk_target, (int, float)) and 0.0 <= self.risk_target < 1.0):
            raise SpotPlanError(f"--risk-target must be in [0, 1), got {self.risk_target!r}")
        if not (isinstance(self.window_s, (int, float)) and math.isfinite(self.window_s)
                and self.window_s > 0):
            raise SpotPlanError(f"--risk-window must be a number of seconds > 0, got "
                                f"{self.window_s!r}")


@dataclass(frozen=True)
class SpotMarket:
    """The spot figures of the pools a problem can use: price, rate, probability down."""

    price: Mapping[Pool, float]  # $/hour of one spot node
    rate_per_hour: Mapping[Pool, float]  # preemption events per node-hour
    prob_down: Mapping[Pool, float]  # probability down over the window (`spot_risk`)

    @classmethod
    def from_catalog(cls, catalog: Any, pools: Sequence[Pool], options: SpotOptions,
                     startup_s: float) -> "SpotMarket":
        price, rate, prob = {}, {}, {}
        for node_type, region in pools:
            spot = catalog.node_type(node_type).spot_price_in(region)
            if spot is None:
                continue
            key = (node_type, region)
            price[key] = float(spot)
            rate[key] = float(catalog.preemption_rate_per_hour(node_type, region))
            prob[key] = pool_down_probability(rate[key], options.window_s, startup_s,
                                              float(catalog.preemption_notice_s(region)))
        return cls(price, rate, prob)


@dataclass(frozen=True)
class SpotColumns:
    """The problem with spot copies added, and what each copy stands for."""

    problem: AllocationProblem
    base: Mapping[str, str]  # spot column id -> the template column it copies


def spot_columns(problem: AllocationProblem, market: SpotMarket) -> SpotColumns:
    """`problem` with a spot copy of every column (aggregated, prefill or decode) in each
    region where all its node types have a spot price (see the module)."""
    extra: list[TemplateColumn] = []
    base: dict[str, str] = {}
    for t in problem.templates:
        prices: dict[str, float] = {}
        for region in t.price_usd_per_hour:
            each = [market.price.get((g, region)) for g in t.node_counts]
            if all(p is not None for p in each):
                prices[region] = sum(n * p for n, p in zip(t.node_counts.values(), each))
        if not prices:
            continue
        sid = t.id + SPOT_SUFFIX
        extra.append(TemplateColumn(sid, t.model, t.mode, dict(t.node_counts), t.capacity,
                                    prices))
        base[sid] = t.id
    full = AllocationProblem(
        demands=problem.demands, templates=(*problem.templates, *extra),
        regions=problem.regions, availability=problem.availability, current=problem.current,
        startup_s=problem.startup_s, time_limit_s=problem.time_limit_s,
        mip_gap=problem.mip_gap)
    return SpotColumns(full, base)


def instance_pools(col: TemplateColumn, region: str) -> frozenset[Pool]:
    return frozenset((g, region) for g in col.node_counts)


def spot_arrays(cols: SpotColumns, market: SpotMarket) -> SpotArrays:
    """The entries (column, region) of the spot problem that availability allows and whose
    model has demand, as `spot_ilp.SpotArrays`."""
    full = cols.problem
    models = tuple(d.model for d in full.demands)
    m_of = {m: i for i, m in enumerate(models)}
    entries = [(t, r) for t in full.templates for r in t.price_usd_per_hour
               if t.model in m_of and _upper_bound(full, t, r) > 0]
    pools = tuple(instance_pools(t, r) if t.id in cols.base else frozenset()
                  for t, r in entries)
    demand_of = {d.model: d for d in full.demands}
    region_of = {r: k for k, r in enumerate(sorted({r for _, r in entries}))}
    price = np.array([t.price_usd_per_hour[r] for t, r in entries])
    rate = np.array([sum(market.rate_per_hour[p] for p in ps) for ps in pools])
    hourly = price * (1.0 + rate * full.startup_s / 3600.0)
    usage: dict[Pool, list[tuple[int, float]]] = {}
    for j, (t, r) in enumerate(entries):
        for g, n in t.node_counts.items():
            usage.setdefault((g, r), []).append((j, float(n)))
    rows = sorted(usage)
    return SpotArrays(
        keys=tuple((t.id, r) for t, r in entries),
        model=np.array([m_of[t.model] for t, _ in entries], dtype=int),
        cap=np.array([t.capacity / demand_of[t.model].tokens_per_request(t.mode)
                      for t, _ in entries], dtype=float),
        hourly=hourly,
        penalty=hourly * full.startup_s / 3600.0,
        current=np.array([full.current.get((t.id, r), 0) for t, r in entries], dtype=float),
        ub=np.array([_upper_bound(full, t, r) for t, r in entries]),
        pools=pools,
        usage=tuple((p, np.array([j for j, _ in usage[p]], dtype=int),
                     np.array([n for _, n in usage[p]])) for p in rows),
        avail=np.array([float(full.availability.get(p, 0)) for p in rows]),
        models=models,
        demand=np.array([d.requests_per_s for d in full.demands]),
        half=np.array([HALF[t.mode] for t, _ in entries], dtype=int),
        region=np.array([region_of[r] for _, r in entries], dtype=int),
    )


def expected_price_problem(cols: SpotColumns, market: SpotMarket) -> AllocationProblem:
    """The spot problem as the allocator's problem: every spot column priced at its expected
    $/hour with replacements (`spot_ilp`), so that `solve_allocation`'s objective (price and
    start-ups beyond the current deployment) is the spot planner's."""
    full = cols.problem
    share = full.startup_s / 3600.0
    templates = []
    for t in full.templates:
        if t.id in cols.base:
            t = replace(t, price_usd_per_hour={
                r: p * (1.0 + share * sum(market.rate_per_hour[(g, r)] for g in t.node_counts))
                for r, p in t.price_usd_per_hour.items()})
        templates.append(t)
    return replace(full, templates=tuple(templates))


def _upper_bound(problem: AllocationProblem, t: TemplateColumn, region: str) -> float:
    most = math.inf
    for g, n in t.node_counts.items():
        most = min(most, problem.availability.get((g, region), 0) // n)
    return float(most)
