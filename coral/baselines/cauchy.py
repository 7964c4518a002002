"""Cauchy as the paper runs it: PD-disaggregated GPU combos, ranked by Token/USD, and an ILP
that deploys a set of them per model.

Cauchy (SoCC 2025) serves each model with prefill and decode instances on separate GPUs. Its
allocation unit is a "GPU combo": a prefill configuration and a decode configuration that
serve requests together, valued by its cost efficiency, Token/USD. As the paper extends it,
one prefill instance may feed several decode instances, so a combo here is

    one prefill instance of P + `b` decode instances of D, in one region,
    `b` in 1..MAX_DECODE_PER_PREFILL (the combo's prefill:decode ratio 1:b),

where P and D are each `k` copies of one node type (homogeneous, as Cauchy's configurations
are), solved by the template builder in `prefill` mode (prompt tokens/s under TTFT) and
`decode` mode (output tokens/s under TPOT). With mean prompt `I` and output `O` tokens a
combo serves

    rps = min(prefill_capacity / I, b * decode_capacity / O)   requests/s

(the allocator's PD pairing rule) at `price(P) + b * price(D)` $/hour, and its cost
efficiency is `rps * (I + O) * 3600 / price` tokens per USD.

Allocation, as Cauchy does it in two steps:

1. candidates: per model and region, the `CANDIDATES_PER_REGION` combos of highest Token/USD
   (Cauchy's "top performers of cost efficiency") among those of which the region's
   availability holds at least one copy (a combo no region can rent is no candidate);
2. an ILP over whole copies `x_c` of the candidates: every model's demand covered
   (`sum_c rps_c x_c >= demand_m`), every (node type, region) within availability, and as
   objective the models' cost efficiencies, each model's $/hour over its own demanded
   tokens per hour, summed over models: `sum_m sum_(c of m) price_c x_c / tokens_m`, i.e.
   minimise the sum of each model's USD per token (the inverse of its Token/USD), scaled
   by the total demanded tokens (a constant, so dollars' size coefficients). With one
   model, or availability to spare, this is the cheapest cover of the candidates; when models
   compete for nodes it favours the one whose USD per token each node lowers most.

When the ILP has no solution (availability short) the result deploys nothing and says so;
the scarcity rule (`coral.baselines.scale`) then scales the demand down until it has one.

Approximations: the ratio is capped at `MAX_DECODE_PER_PREFILL`; the KV transfer between the
halves is not costed (as in the allocator's pairing); the candidate cut means no optimality
is claimed on cost (the result is marked heuristic). Cauchy's runtime scheduling
(opportunistic, goodput-weighted round robin) is not modelled: served share comes from the
same pairing rule as every PD plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import highspy
import numpy as np

from coral.allocator.problem import (
    DEFAULT_MIP_GAP,
    DEFAULT_TIME_LIMIT_S,
    ModelDemand,
    TemplateColumn,
    TemplateRegion,
)
from coral.allocator.scenario.load import Scenario
from coral.baselines.common import (
    BaselineResult,
    columns_of,
    deployment_of,
    heuristic_plan,
    result_of,
    scenario_problem,
)
from coral.solvers.highs import quiet_highs
from coral.templates.builder.build import Template

#: Most decode instances one prefill instance feeds in a combo (the ratio 1:b, b <= this).
MAX_DECODE_PER_PREFILL = 8
#: Combos kept per (model, region), best Token/USD first, as the ILP's candidates.
CANDIDATES_PER_REGION = 64


@dataclass(frozen=True)
class PdUnit:
    """A GPU combo: `n_prefill` (1) prefill plus `n_decode` decode instances of one model in
    one region."""

    model: str
    region: str
    prefill: TemplateColumn
    decode: TemplateColumn
    n_prefill: int
    n_decode: int
    rps: float  # requests/s the unit serves
    usd_per_hour: float
    tokens_per_usd: float  # (prompt + output) tokens served per dollar

    def nodes(self) -> dict[str, int]:
        """Node type -> nodes of the whole unit."""
        out: dict[str, int] = {}
        for col, n in ((self.prefill, self.n_prefill), (self.decode, self.n_decode)):
            for g, k in col.node_counts.items():
                out[g] = out.get(g, 0) + k * n
        return out


def _single_type(col: TemplateColumn) -> tuple[str, int]:
    if len(col.node_counts) != 1:
        raise ValueError(f"column {col.id!r} mixes node types; Cauchy-like units pair "
                         "homogeneous configurations only")
    ((g, k),) = col.node_counts.items()
    return g, k


class UnitTable:
    """Every combo of one model as arrays (one prefill instance feeding 1..`max_decode`
    decode instances), best tokens per dollar first."""

    def __init__(self, demand: ModelDemand, prefill: Sequence[TemplateColumn],
                 decode: Sequence[TemplateColumn], regions: Sequence[str], *,
                 max_decode: int = MAX_DECODE_PER_PREFILL):
        if max_decode < 1:
            raise ValueError(f"max_decode must be >= 1, got {max_decode}")
        self.demand = demand
        self.prefill, self.decode, self.regions = list(prefill), list(decode), list(regions)
        inp, out = float(demand.input_tokens), float(demand.output_tokens)
        rows: list[np.ndarray] = []
        for r, region in enumerate(self.regions):
            pi = [i for i, c in enumerate(self.prefill) if region in c.price_usd_per_hour]
            di = [j for j, c in enumerate(self.decode) if region in c.price_usd_per_hour]
            if not pi or not di:
                continue
            p, d, a, b = np.meshgrid(pi, di, [1], np.arange(1, max_decode + 1), indexing="ij")
            p, d, a, b = p.ravel(), d.ravel(), a.ravel(), b.ravel()
            p_cap = np.array([c.capacity for c in self.prefill])[p]
            d_cap = np.array([c.capacity for c in self.decode])[d]
            p_usd = np.array([c.price_usd_per_hour.get(region, np.nan) for c in self.prefill])[p]
            d_usd = np.array([c.price_usd_per_hour.get(region, np.nan) for c in self.decode])[d]
            rps = np.minimum(a * p_cap / inp, b * d_cap / out)
            usd = a * p_usd + b * d_usd
            rows.append(np.stack([np.full(len(p), r), p, d, a, b, rps, usd]))
        table = np.concatenate(rows, axis=1) if rows else np.zeros((7, 0))
        value = table[5] * (inp + out) * 3600.0 / np.where(table[6] > 0, table[6], np.inf)
        # best tokens per dollar first; ties: cheaper, then fewer instances
        order = np.lexsort((table[3] + table[4], table[6], -value))
        table, value = table[:, order], value[order]
        self.region = table[0].astype(np.int64)
        self.p, self.d = table[1].astype(np.int64), table[2].astype(np.int64)
        self.a, self.b = table[3].astype(np.int64), table[4].astype(np.int64)
        self.rps, self.usd, self.tokens_per_usd = table[5], table[6], value
        # node type and node count of each half (homogeneous configurations)
        p_type = [_single_type(c) for c in self.prefill]
        d_type = [_single_type(c) for c in self.decode]
        self.node_types = sorted({g for g, _ in p_type + d_type})
        g_of = {g: i for i, g in enumerate(self.node_types)}
        self.p_g = np.array([g_of[g] for g, _ in p_type], dtype=np.int64)[self.p] \
            if p_type else np.zeros(0, np.int64)
        self.d_g = np.array([g_of[g] for g, _ in d_type], dtype=np.int64)[self.d] \
            if d_type else np.zeros(0, np.int64)
        self.p_n = (np.array([k for _, k in p_type], dtype=np.int64)[self.p] * self.a
                    if p_type else np.zeros(0, np.int64))
        self.d_n = (np.array([k for _, k in d_type], dtype=np.int64)[self.d] * self.b
                    if d_type else np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.rps)

    def unit(self, i: int) -> PdUnit:
        return PdUnit(
            model=self.demand.model, region=self.regions[self.region[i]],
            prefill=self.prefill[self.p[i]], decode=self.decode[self.d[i]],
            n_prefill=int(self.a[i]), n_decode=int(self.b[i]), rps=float(self.rps[i]),
            usd_per_hour=float(self.usd[i]), tokens_per_usd=float(self.tokens_per_usd[i]),
        )


def candidates(table: UnitTable, availability: Mapping[tuple[str, str], int],
               per_region: int = CANDIDATES_PER_REGION) -> np.ndarray:
    """Indices of the `per_region` best-Token/USD combos of each region among those one copy
    of which the region's availability holds (table order)."""
    if not len(table):
        return np.zeros(0, np.int64)
    avail = np.array([[availability.get((g, r), 0) for r in table.regions]
                      for g in table.node_types], dtype=np.int64)
    have_p = avail[table.p_g, table.region]
    have_d = avail[table.d_g, table.region]
    fits = np.where(table.p_g == table.d_g, table.p_n + table.d_n <= have_p,
                    (table.p_n <= have_p) & (table.d_n <= have_d))
    keep = [np.flatnonzero((table.region == r) & fits)[:per_region]
            for r in range(len(table.regions))]
    return np.sort(np.concatenate(keep))


@dataclass(frozen=True)
class CauchyAllocation:
    """The ILP's answer: combo copies per model, or why there is none."""

    units: dict[str, list[tuple[PdUnit, int]]]  # model -> (combo, copies)
    status: str  # HiGHS's model status
    solved: bool  # a plan meeting every demand was found
    solve_s: float = 0.0  # the ILP's wall time


def allocate(tables: Sequence[UnitTable], availability: Mapping[tuple[str, str], int], *,
             per_region: int = CANDIDATES_PER_REGION, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
             mip_gap: float = DEFAULT_MIP_GAP) -> CauchyAllocation:
    """Cauchy's ILP (module docstring) over each table's candidates."""
    cand = [candidates(t, availability, per_region) for t in tables]
    cols: list[tuple[int, int]] = [(k, int(i)) for k, idx in enumerate(cand) for i in idx]
    if not cols:
        empty = all(t.demand.requests_per_s <= 0 for t in tables)
        return CauchyAllocation({}, "no candidate combos", empty)
    h = quiet_highs()
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    n = len(cols)
    tokens = [t.demand.requests_per_s * (t.demand.input_tokens + t.demand.output_tokens)
              for t in tables]
    # each model's $/hour over its own demanded tokens, times the total demanded tokens:
    # the same optimum, with coefficients of dollars' size (HiGHS's absolute tolerances
    # would stop at once on coefficients of 1e-7)
    total = sum(tokens)
    cost = np.empty(n)
    for j, (k, i) in enumerate(cols):
        cost[j] = tables[k].usd[i] * (total / tokens[k] if tokens[k] > 0 else 1.0)
    h.addVars(n, np.zeros(n), np.full(n, highspy.kHighsInf))
    idx_all = np.arange(n, dtype=np.int32)
    h.changeColsCost(n, idx_all, cost)
    h.changeColsIntegrality(n, idx_all, np.full(n, highspy.HighsVarType.kInteger))
    for k, t in enumerate(tables):
        mine = np.array([j for j, (kk, _) in enumerate(cols) if kk == k], dtype=np.int32)
        if t.demand.requests_per_s > 0:
            if not len(mine):
                return CauchyAllocation({}, f"no combo of {t.demand.model}", False)
            rps = np.array([t.rps[cols[j][1]] for j in mine])
            h.addRow(float(t.demand.requests_per_s), highspy.kHighsInf, len(mine), mine, rps)
    usage: dict[tuple[str, str], dict[int, float]] = {}
    for j, (k, i) in enumerate(cols):
        t = tables[k]
        r = t.regions[t.region[i]]
        for g, nodes in ((t.node_types[t.p_g[i]], t.p_n[i]), (t.node_types[t.d_g[i]], t.d_n[i])):
            row = usage.setdefault((g, r), {})
            row[j] = row.get(j, 0.0) + float(nodes)
    for key, row in sorted(usage.items()):
        idx = np.array(sorted(row), dtype=np.int32)
        h.addRow(-highspy.kHighsInf, float(availability.get(key, 0)), len(idx), idx,
                 np.array([row[j] for j in idx]))
    t0 = time.perf_counter()
    h.run()
    solve_s = time.perf_counter() - t0
    status = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    if info.primal_solution_status != 2:  # no feasible solution
        return CauchyAllocation({}, status, False, solve_s)
    x = np.round(np.asarray(h.getSolution().col_value)).astype(np.int64)
    units: dict[str, list[tuple[PdUnit, int]]] = {}
    for j in np.flatnonzero(x > 0):
        k, i = cols[j]
        units.setdefault(tables[k].demand.model, []).append((tables[k].unit(i), int(x[j])))
    return CauchyAllocation(units, status, True, solve_s)


def cauchy(
    scenario: Scenario,
    prefill: Mapping[str, Sequence[Template]],
    decode: Mapping[str, Sequence[Template]],
    *,
    name: str = "cauchy",
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    mip_gap: float = DEFAULT_MIP_GAP,
    max_decode: int = MAX_DECODE_PER_PREFILL,
    per_region: int = CANDIDATES_PER_REGION,
) -> BaselineResult:
    """Cauchy's combos and ILP for every model at once, within availability."""
    demands = {d.model: d for d in scenario.demands()}
    columns: dict[str, TemplateColumn] = {}
    tables: list[UnitTable] = []
    for m in scenario.models:
        pre = columns_of(scenario, prefill.get(m.name, ()), prefix=name)
        dec = columns_of(scenario, decode.get(m.name, ()), prefix=name)
        columns.update({c.id: c for c in pre + dec})
        tables.append(UnitTable(demands[m.name], pre, dec, scenario.regions,
                                max_decode=max_decode))
    found = allocate(tables, scenario.availability, per_region=per_region,
                     time_limit_s=time_limit_s, mip_gap=mip_gap)
    instances: dict[TemplateRegion, int] = {}
    used: list[str] = []
    for model, taken in found.units.items():
        for unit, copies in taken:
            for col, n in ((unit.prefill, unit.n_prefill), (unit.decode, unit.n_decode)):
                key = (col.id, unit.region)
                instances[key] = instances.get(key, 0) + n * copies
            used.append(f"{model}: {copies} x (1 x {unit.prefill.id.split(':', 3)[-1]} prefill "
                        f"+ {unit.n_decode} x {unit.decode.id.split(':', 3)[-1]} decode) in "
                        f"{unit.region}")
    problem = scenario_problem(scenario, list(columns.values()))
    notes = (
        "Cauchy's GPU combos (one homogeneous prefill instance feeding 1 to "
        f"{max_decode} homogeneous decode instances, one region), the {per_region} of best "
        "Token/USD per model and region as candidates, and an ILP minimising the sum of "
        "each model's USD per demanded token within availability",
        "KV transfer between prefill and decode is not costed",
        f"ILP: {found.status} in {found.solve_s:.2f} s" + ("" if found.solved else
                                  "; no plan meets the demand, nothing deployed"),
    )
    plan = heuristic_plan(problem, instances, notes=notes)
    halves = (t for side in (prefill, decode) for tpls in side.values() for t in tpls)
    return result_of(name, plan, notes + (("combos: " + "; ".join(used)) if used
                                          else "no combo deployed",),
                     instances=deployment_of(scenario, plan, halves, prefix=name))
