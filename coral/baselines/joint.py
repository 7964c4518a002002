"""Joint exhaustive: the monolithic rent-and-place problem on a small node pool, solved exactly.

The problem Coral splits in two, stated whole: given models with demand and SLO and a pool of
individual nodes with prices, decide which nodes to rent and place every model over the nodes
it gets, at once, minimising $/hour while every model's demand is met under its SLO. Each
rented node serves one model.

It is solved exactly by enumeration, for small instances only (a handful of nodes):

1. every assignment of the pool's nodes to the models or to "not rented" (nodes of one type
   are interchangeable, so per type only the counts matter);
2. for each model and node multiset `S` it gets, the most req/s its nodes can serve,
   `cap(S) = max(T(S), max over splits S = A + B of cap(A) + cap(B))`: the best placement on
   all of `S` (`T`, the same exact placement solver as the templates) or `S` run as separate
   replicas. The split matters because the operating points size a node's KV reserve by the
   number of nodes of its combination, so one placement over all of `S` can do less than its
   parts side by side;
3. the cheapest assignment whose every model meets its demand.

Comparing its cost with the allocation ILP over the templates of the same pool (availability =
the pool) checks that the two-stage decomposition loses nothing.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from coral.allocator.problem import DEMAND_REL_TOL
from coral.baselines.common import TemplateBuilder, check_model, check_node_types
from coral.catalog.loader import Catalog
from coral.templates.builder.build import Template
from coral.templates.space.operating_points import OperatingPointTables, PerfLike
from coral.templates.slo import SloSpec, default_slo
from coral.templates.types import Topology

METHOD = "joint exhaustive"
#: Most nodes in a pool (the enumeration is exponential in it).
MAX_POOL_NODES = 12
#: Most assignments of nodes to models enumerated.
MAX_ASSIGNMENTS = 2_000_000

Vec = tuple[int, ...]  # nodes per pool node type, in `pool_types` order


class JointInfeasibleError(ValueError):
    """No assignment of the pool meets every model's demand."""


@dataclass(frozen=True)
class JointModel:
    """One model of the joint problem: its demand and SLO (default: the model's default)."""

    name: str
    demand_rps: float
    slo: SloSpec | None = None


@dataclass(frozen=True)
class JointResult:
    """The optimum of the joint problem and how it was found."""

    method: str
    cost_usd_per_hour: float
    nodes: dict[str, dict[str, int]]  # model -> node type -> nodes rented for it
    replicas: dict[str, tuple[Template, ...]]  # model -> the placements its nodes run
    capacity_rps: dict[str, float]  # model -> req/s its nodes serve
    demand_rps: dict[str, float]
    assignments: int  # assignments of nodes to models enumerated
    placements_solved: int  # placements solved for this call (memo misses)
    solve_s: float


def _check_models(catalog: Catalog, models: Mapping[str, float] | Sequence[JointModel]
                  ) -> list[JointModel]:
    items = ([JointModel(n, float(d)) for n, d in models.items()]
             if isinstance(models, Mapping) else list(models))
    if not items:
        raise ValueError("the joint problem needs at least one model")
    seen: set[str] = set()
    out = []
    for m in items:
        check_model(catalog, m.name)
        if m.name in seen:
            raise ValueError(f"model {m.name!r} is listed twice")
        seen.add(m.name)
        if not (isinstance(m.demand_rps, (int, float)) and math.isfinite(m.demand_rps)
                and m.demand_rps >= 0):
            raise ValueError(f"demand of {m.name!r} must be a finite number of req/s >= 0, got "
                             f"{m.demand_rps!r}")
        slo = m.slo if m.slo is not None else default_slo(catalog.model(m.name))
        out.append(JointModel(m.name, float(m.demand_rps), slo))
    return out


def _check_pool(catalog: Catalog, node_pool: Mapping[str, int],
                node_prices: Mapping[str, float] | None) -> tuple[list[str], Vec, list[float]]:
    check_node_types(catalog, node_pool)
    pool = {g: n for g, n in sorted(node_pool.items()) if n}
    for g, n in pool.items():
        if int(n) != n or n < 0:
            raise ValueError(f"pool count of {g!r} must be a whole number >= 0, got {n!r}")
    total = sum(pool.values())
    if total == 0:
        raise ValueError("the node pool is empty")
    if total > MAX_POOL_NODES:
        raise ValueError(f"the pool has {total} nodes; the exhaustive joint search is meant for "
                         f"at most {MAX_POOL_NODES} (use the templates and the allocator)")
    prices = []
    for g in pool:
        if node_prices is not None and g in node_prices:
            usd = float(node_prices[g])
        else:
            listed = [p.usd_per_hour for p in catalog.node_type(g).prices]
            if node_prices is not None or not listed:
                raise ValueError(f"no price for node type {g!r}: give it in node_prices")
            usd = min(listed)
        if not (math.isfinite(usd) and usd > 0):
            raise ValueError(f"price of {g!r} must be a finite number > 0, got {usd!r}")
        prices.append(usd)
    return list(pool), tuple(int(n) for n in pool.values()), prices


def _sub_vectors(vec: Vec) -> list[Vec]:
    return [tuple(v) for v in itertools.product(*(range(n + 1) for n in vec))]


def _splits(total: int, parts: int) -> list[tuple[int, ...]]:
    """Ways to give `total` identical nodes to `parts` takers (the last one: not rented)."""
    if parts == 1:
        return [(total,)]
    return [(k,) + rest for k in range(total + 1) for rest in _splits(total - k, parts - 1)]


class _Capacity:
    """`cap(S)` of one model over the sub-multisets of the pool (step 2 of the module doc)."""

    def __init__(self, model: JointModel, types: list[str], builder: TemplateBuilder):
        self.model, self.types, self.builder = model, types, builder
        self.memo: dict[Vec, tuple[float, tuple[Vec, ...]]] = {}

    def single(self, vec: Vec) -> Template | None:
        combo = [g for g, n in zip(self.types, vec) for _ in range(n)]
        if not combo:
            return None
        assert self.model.slo is not None
        t = self.builder.get(self.model.name, combo, self.model.slo, "aggregated")
        return t if t.feasible else None

    def best(self, vec: Vec) -> tuple[float, tuple[Vec, ...]]:
        """(req/s, the parts run as separate placements)."""
        hit = self.memo.get(vec)
        if hit is not None:
            return hit
        value: tuple[float, tuple[Vec, ...]] = (0.0, ())
        t = self.single(vec)
        if t is not None:
            value = (t.throughput, (vec,))
        for part in _sub_vectors(vec):
            rest = tuple(a - b for a, b in zip(vec, part))
            if not any(part) or not any(rest) or part > rest:
                continue  # each split once
            a, b = self.best(part), self.best(rest)
            if a[0] + b[0] > value[0]:
                value = (a[0] + b[0], a[1] + b[1])
        self.memo[vec] = value
        return value


def joint_optimum(
    models_with_demand: Mapping[str, float] | Sequence[JointModel],
    node_pool: Mapping[str, int],
    *,
    catalog: Catalog,
    perf: PerfLike,
    tables: OperatingPointTables | None = None,
    node_prices: Mapping[str, float] | None = None,
    topology: Topology = "flow",
    builder: TemplateBuilder | None = None,
    max_assignments: int = MAX_ASSIGNMENTS,
) -> JointResult:
    """The cheapest way to rent nodes of `node_pool` and place every model over them.

    `models_with_demand`: model -> req/s (default SLOs), or `JointModel`s with their SLOs.
    `node_pool`: node type -> nodes available. `node_prices`: node type -> $/hour (default:
    the node type's cheapest catalog price). Pass a `builder` to share solved placements
    between calls (e.g. several demands on one pool). Raises `JointInfeasibleError` when no
    assignment meets every demand.
    """
    t0 = time.perf_counter()
    models = _check_models(catalog, models_with_demand)
    types, pool, prices = _check_pool(catalog, node_pool, node_prices)
    if builder is None:
        builder = TemplateBuilder(catalog, perf, tables, topology=topology)
    solved_before = builder.solved
    n_assign = math.prod(math.comb(n + len(models), len(models)) for n in pool)
    if n_assign > max_assignments:
        raise ValueError(f"{n_assign} assignments of {sum(pool)} nodes to {len(models)} models "
                         f"exceed the limit of {max_assignments}; use a smaller instance")

    caps = [_Capacity(m, types, builder) for m in models]
    subs = _sub_vectors(pool)
    table = [{v: c.best(v) for v in subs} for c in caps]  # every sub-multiset, once
    need = [m.demand_rps - DEMAND_REL_TOL * max(1.0, m.demand_rps) for m in models]

    best: tuple[float, int, tuple[Vec, ...]] | None = None
    per_type = [_splits(n, len(models) + 1) for n in pool]
    for choice in itertools.product(*per_type):
        vecs = tuple(tuple(choice[k][i] for k in range(len(types))) for i in range(len(models)))
        if any(m.demand_rps > 0 and table[i][v][0] < need[i]
               for i, (m, v) in enumerate(zip(models, vecs))):
            continue
        cost = sum(prices[k] * sum(v[k] for v in vecs) for k in range(len(types)))
        nodes = sum(sum(v) for v in vecs)
        key = (round(cost, 9), nodes, vecs)
        if best is None or key < best:
            best = key
    if best is None:
        lines = [f"  {m.name}: demand {m.demand_rps:.4g} req/s, the whole pool alone serves "
                 f"{table[i][pool][0]:.4g}" for i, m in enumerate(models)]
        raise JointInfeasibleError(
            "no assignment of the pool's nodes meets every model's demand:\n"
            + "\n".join(lines) + "\nTo fix: add nodes to the pool or lower the demand.")
    _, _, vecs = best
    cost = sum(prices[k] * sum(v[k] for v in vecs) for k in range(len(types)))
    out_nodes, replicas, capacity = {}, {}, {}
    for i, (m, v) in enumerate(zip(models, vecs)):
        out_nodes[m.name] = {g: n for g, n in zip(types, v) if n}
        value, parts = table[i][v]
        capacity[m.name] = value
        replicas[m.name] = tuple(t for p in parts if (t := caps[i].single(p)) is not None)
    return JointResult(
        method=METHOD,
        cost_usd_per_hour=cost,
        nodes=out_nodes,
        replicas=replicas,
        capacity_rps=capacity,
        demand_rps={m.name: m.demand_rps for m in models},
        assignments=n_assign,
        placements_solved=builder.solved - solved_before,
        solve_s=time.perf_counter() - t0,
    )
