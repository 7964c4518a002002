"""Helix-like: one model on a fixed heterogeneous cluster, max-flow placement without the SLO.

Helix places a model's layers over a cluster to maximise throughput (a max flow through the
layer pipeline) and does not bound the latency of a request's path. We model that with the
same placement solver and operating points as Coral, with the SLO made as loose as `SloSpec`
allows (`NO_SLO_TPOT_S`, `NO_SLO_TTFT_S`), then judge the result under the real SLO:

- `slo_share(template, slo)`: of the placement's flow, the most that can be routed over
  source-to-sink paths whose summed step time meets TPOT and summed prefill time meets TTFT
  (a path LP over the placement's own edge flows). Requests on the other paths miss the SLO.
- `helix_placement(model, nodes, ...)`: both placements on one cluster, the no-SLO one judged
  that way, and Coral's SLO-bound placement on the same nodes for comparison.
- `helix(...)` (the `run_baselines` entry): per model, the cluster is the combination with
  the most no-SLO req/s per $/hour among the candidates (Coral's template combinations and the
  homogeneous ones), found best-first by the operating points' throughput bound; it is
  replicated to meet the demand by its no-SLO throughput, through the allocation ILP, and the
  served share is what meets the SLO.

Approximations: the placement is Coral's `flow` topology (replicas of pipelines of
data-parallel stages) unless the builder uses `dag`, not Helix's own MILP; "meets the SLO" is
judged on mean-shaped iterations, without queueing (the simulator judges it properly); with
no TPOT target a node reserves KV memory for a sequence per pipeline stage, so the no-SLO
placement may run smaller batches than the SLO-bound one where memory binds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import highspy
import numpy as np

from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.problem import TemplateColumn
from coral.allocator.scenario.load import Scenario, scenario_slo
from coral.baselines.common import (
    BaselineResult,
    TemplateBuilder,
    check_model,
    check_node_types,
    scenario_problem,
    template_column,
)
from coral.catalog.loader import Catalog
from coral.solvers import quiet_highs
from coral.templates.builder.build import Template
from coral.templates.space.enumerate import Combo, combo_key, node_counts
from coral.templates.space.operating_points import OperatingPointTables, PerfLike
from coral.templates.slo import SloSpec
from coral.templates.types import SINK, SOURCE, Topology

#: The loosest targets `SloSpec` accepts: in effect no latency bound.
NO_SLO_TPOT_S = 60.0
NO_SLO_TTFT_S = 3600.0
#: Most placements solved per model when searching for the best no-SLO cluster.
MAX_HELIX_SOLVES = 64
#: Most source-to-sink paths the path LP enumerates (a 6-node placement has a handful).
MAX_PATHS = 20_000
_FLOW_EPS = 1e-9
_LATENCY_RTOL = 1e-9


def no_slo(slo: SloSpec) -> SloSpec:
    """`slo` with its latency targets dropped (request shape kept)."""
    return slo.with_overrides(tpot_s=NO_SLO_TPOT_S, ttft_s=NO_SLO_TTFT_S)


@dataclass(frozen=True)
class HelixPlacement:
    """One model on one cluster: the no-SLO placement judged under the SLO, and Coral's."""

    model: str
    combo: Combo
    slo: SloSpec  # the real SLO
    no_slo: Template  # best throughput with no latency target
    with_slo: Template  # best throughput under `slo` (Coral's template on these nodes)
    slo_share: float  # share of `no_slo`'s flow on paths that meet `slo`, in [0, 1]

    @property
    def throughput_no_slo_rps(self) -> float:
        return self.no_slo.throughput_rps if self.no_slo.feasible else 0.0

    @property
    def throughput_slo_rps(self) -> float:
        return self.with_slo.throughput_rps if self.with_slo.feasible else 0.0

    @property
    def served_under_slo_rps(self) -> float:
        """Requests/s of the no-SLO placement that meet the SLO."""
        return self.throughput_no_slo_rps * self.slo_share

    def describe(self) -> str:
        return (f"{self.model} on {combo_key(self.combo)}: {self.throughput_no_slo_rps:.4g} "
                f"req/s without SLO, of which {self.served_under_slo_rps:.4g} "
                f"({self.slo_share:.0%}) meet it; {self.throughput_slo_rps:.4g} req/s placed "
                "under the SLO")


def _paths(succ: dict[int, list[tuple[int, int]]], what: str
           ) -> list[tuple[list[int], list[int]]]:
    """Source-to-sink paths of the graph `succ` (node -> (next node, edge)): (node indices,
    edge indices)."""
    out: list[tuple[list[int], list[int]]] = []

    def walk(u: int, nodes: list[int], edges: list[int]) -> None:
        if len(out) > MAX_PATHS:
            raise ValueError(f"{what} has more than {MAX_PATHS} source-to-sink paths")
        for v, e in succ.get(u, []):
            if v == SINK:
                out.append((list(nodes), edges + [e]))
            elif v not in nodes:  # a DAG; the guard only protects against malformed input
                walk(v, nodes + [v], edges + [e])

    walk(SOURCE, [], [])
    return out


def _extreme_path(succ: dict[int, list[tuple[int, int]]], cost: Sequence[float],
                  longest: bool) -> float:
    """The longest (or shortest) source-to-sink path by summed node `cost`."""
    pick = max if longest else min
    memo: dict[int, float] = {}

    def best(u: int) -> float:
        if u == SINK:
            return 0.0
        if u not in memo:
            own = 0.0 if u == SOURCE else cost[u]
            tails = [best(v) for v, _ in succ.get(u, [])]
            memo[u] = own + pick(tails) if tails else (-math.inf if longest else math.inf)
        return memo[u]

    return best(SOURCE)


def path_share(step_s: Sequence[float], prefill_s: Sequence[float],
               edges: Sequence[tuple[int, int, float]], throughput: float, *, tpot_s: float | None,
               ttft_s: float | None, what: str) -> float:
    """Of the flow on `edges` (node indices, `SOURCE`/`SINK`), the most that can be routed
    over source-to-sink paths whose summed `step_s` is at most `tpot_s` and summed
    `prefill_s` at most `ttft_s` (None: unchecked), as a share of `throughput`.

    Maximise `sum_p f_p` over those paths `p`, subject to `sum_{p through e} f_p <= flow_e`
    on every edge `e`. When the longest paths meet both bounds the share is 1, when the
    shortest miss one it is 0, and only otherwise are the paths enumerated.
    """
    if throughput <= 0:
        return 0.0
    scale = max((f for _, _, f in edges), default=0.0)
    succ: dict[int, list[tuple[int, int]]] = {}
    for e, (u, v, f) in enumerate(edges):
        if f > _FLOW_EPS * max(scale, 1.0):
            succ.setdefault(u, []).append((v, e))
    if SOURCE not in succ:
        return 0.0
    checks = [(c, b) for c, b in ((step_s, tpot_s), (prefill_s, ttft_s)) if b is not None]
    limit = [b * (1 + _LATENCY_RTOL) for _, b in checks]
    if all(_extreme_path(succ, c, True) <= lim for (c, _), lim in zip(checks, limit)):
        return 1.0
    if any(_extreme_path(succ, c, False) > lim for (c, _), lim in zip(checks, limit)):
        return 0.0
    paths = _paths(succ, what)

    def meets(nodes: list[int]) -> bool:
        return all(sum(c[i] for i in nodes) <= lim for (c, _), lim in zip(checks, limit))

    good = [edges_ for nodes, edges_ in paths if meets(nodes)]
    if not good:
        return 0.0
    if len(good) == len(paths):
        return 1.0
    flow = np.array([f for _, _, f in edges], dtype=float)
    lp = highspy.HighsLp()
    lp.num_col_ = len(good)
    lp.num_row_ = len(flow)
    lp.col_cost_ = np.ones(len(good))
    lp.col_lower_ = np.zeros(len(good))
    lp.col_upper_ = np.full(len(good), highspy.kHighsInf)
    lp.row_lower_ = np.full(len(flow), -highspy.kHighsInf)
    lp.row_upper_ = np.maximum(flow, 0.0)
    start = np.zeros(len(good) + 1, dtype=np.int32)
    start[1:] = np.cumsum([len(set(p)) for p in good])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = start
    lp.a_matrix_.index_ = np.array([e for p in good for e in sorted(set(p))], dtype=np.int32)
    lp.a_matrix_.value_ = np.ones(int(start[-1]))
    lp.sense_ = highspy.ObjSense.kMaximize
    h = quiet_highs()
    h.passModel(lp)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:  # pragma: no cover
        raise RuntimeError(f"path LP of {what}: {h.modelStatusToString(h.getModelStatus())}")
    routed = float(h.getInfo().objective_function_value)
    return min(1.0, max(0.0, routed / throughput))


def slo_share(template: Template, slo: SloSpec) -> float:
    """Of `template`'s flow, the most that can be routed over paths meeting `slo`, as a share
    (`path_share` over the template's own edge flows)."""
    if not template.feasible or template.throughput <= 0:
        return 0.0
    return path_share(
        [n.step_s for n in template.nodes], [n.prefill_s for n in template.nodes],
        template.edges, template.throughput,
        tpot_s=slo.tpot_s if template.mode in ("aggregated", "decode") else None,
        ttft_s=slo.ttft_s if template.mode in ("aggregated", "prefill") else None,
        what=f"placement of {template.model} on {combo_key(template.combo)}")


def helix_placement(
    model: str,
    cluster_node_types: Sequence[str],
    *,
    slo: SloSpec,
    catalog: Catalog,
    perf: PerfLike,
    tables: OperatingPointTables | None = None,
    topology: Topology = "flow",
    builder: TemplateBuilder | None = None,
) -> HelixPlacement:
    """`model` on the nodes `cluster_node_types` (one entry per node): the throughput of the
    best placement without the SLO, how much of it meets `slo`, and Coral's placement under
    `slo` on the same nodes."""
    check_model(catalog, model)
    if not cluster_node_types:
        raise ValueError("the cluster needs at least one node")
    check_node_types(catalog, cluster_node_types)
    if builder is None:
        builder = TemplateBuilder(catalog, perf, tables, topology=topology)
    combo = tuple(sorted(cluster_node_types))
    loose = builder.get(model, combo, no_slo(slo), "aggregated", one_pipeline=False)
    bound = builder.get(model, combo, slo, "aggregated", one_pipeline=False)
    return HelixPlacement(model, combo, slo, loose, bound, slo_share(loose, slo))


def _cheapest_price(scenario: Scenario, model: str, combo: Combo) -> float | None:
    col = scenario.column("probe", model, "aggregated", node_counts(combo), 1.0)
    return min(col.price_usd_per_hour.values()) if col.price_usd_per_hour else None


def best_no_slo_cluster(
    scenario: Scenario,
    model: str,
    candidates: Sequence[Combo],
    builder: TemplateBuilder,
    *,
    max_solves: int = MAX_HELIX_SOLVES,
) -> tuple[HelixPlacement | None, str]:
    """The candidate with the most no-SLO req/s per $/hour (cheapest region), best-first.

    Candidates are visited in decreasing order of the operating points' throughput bound per
    $/hour; the search stops when that bound cannot beat the best found (exact), or after
    `max_solves` placements (said in the returned note).
    """
    assert builder.tables is not None
    slo = scenario_slo(scenario, model)
    loose = no_slo(slo)
    ranked: list[tuple[float, float, Combo]] = []
    for combo in dict.fromkeys(tuple(sorted(c)) for c in candidates):
        price = _cheapest_price(scenario, model, combo)
        if price is None:
            continue
        bound = builder.tables.throughput_bound(model, combo, loose, "aggregated")
        if bound > 0:
            ranked.append((bound / price, price, combo))
    ranked.sort(key=lambda r: (-r[0], r[1], r[2]))
    best: tuple[float, Combo] | None = None
    solves = 0
    note = f"{model}: searched {len(ranked)} candidate clusters"
    for bound_ratio, price, combo in ranked:
        if best is not None and bound_ratio <= best[0]:
            break
        if solves >= max_solves:
            note += f" (stopped after {max_solves} placements: best found, not proven)"
            break
        solves += 1
        t = builder.get(model, combo, loose, "aggregated", one_pipeline=False)
        if t.feasible and (best is None or t.throughput / price > best[0]):
            best = (t.throughput / price, combo)
    if best is None:
        return None, note + ", none can hold the model"
    hp = helix_placement(model, list(best[1]), slo=slo, catalog=builder.catalog,
                         perf=builder.perf, builder=builder)
    return hp, note + f", {solves} placed without SLO"


def helix(
    scenario: Scenario,
    candidates: Mapping[str, Sequence[Combo]],
    builder: TemplateBuilder,
    *,
    time_limit_s: float,
    mip_gap: float,
    name: str = "helix",
) -> tuple[BaselineResult, dict[str, HelixPlacement]]:
    """Each model's best no-SLO cluster, replicated to its demand by its no-SLO throughput;
    served share = what meets the SLO."""
    placements: dict[str, HelixPlacement] = {}
    notes: list[str] = [
        f"placement without latency targets (TPOT {NO_SLO_TPOT_S:g} s, TTFT "
        f"{NO_SLO_TTFT_S:g} s), same solver and operating points as Coral ({builder.topology} "
        "topology); cluster per model = the candidate combination with the most no-SLO req/s "
        "per $/hour; replicas sized by the no-SLO throughput (the plan's capacity_rps)",
        "served_fraction counts only the flow on paths meeting TPOT and TTFT with mean-shaped "
        "iterations, no queueing",
    ]
    columns: list[TemplateColumn] = []
    share: dict[str, float] = {}
    for m in scenario.models:
        if m.demand_rps <= 0:
            continue
        hp, note = best_no_slo_cluster(scenario, m.name, candidates.get(m.name, ()), builder)
        notes.append(note)
        if hp is None:
            continue
        placements[m.name] = hp
        notes.append(hp.describe())
        # No headroom: the Helix-like baseline plans at full throughput (it knows no SLO).
        col = template_column(scenario, hp.no_slo, prefix=name,
                              capacity=hp.no_slo.throughput)
        if col is not None:
            columns.append(col)
            share[col.id] = hp.slo_share
    plan = solve_allocation(scenario_problem(scenario, columns, time_limit_s=time_limit_s,
                                             mip_gap=mip_gap))
    by_id = {c.id: c for c in columns}
    under_slo: dict[str, float] = {}
    for (tid, _region), n in plan.instances.items():
        col = by_id[tid]
        under_slo[col.model] = under_slo.get(col.model, 0.0) + n * col.capacity * share[tid]
    served = {}
    for model, demand in plan.demand_rps.items():
        served[model] = 1.0 if demand <= 0 else min(1.0, under_slo.get(model, 0.0) / demand)
    result = BaselineResult(name=name, cost_per_hour=float(plan.cost_usd_per_hour),
                            served_fraction=served, plan=plan, notes=tuple(notes))
    return result, placements

