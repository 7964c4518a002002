"""Cauchy-like: PD-disaggregated replicas of homogeneous configurations, added greedily.

A replica ("unit") is `a` prefill instances and `b` decode instances in one region, each
instance `k` copies of one node type, solved by the template builder in `prefill` mode
(prompt tokens/s under TTFT) and `decode` mode (output tokens/s under TPOT). With mean prompt
`I` and output `O` tokens, a unit serves

    rps = min(a * prefill_capacity / I, b * decode_capacity / O)   requests/s

(the allocator's PD pairing rule) at `a * prefill_price + b * decode_price` $/hour. Units are
every (prefill configuration, decode configuration, region, `a`, `b`) with `a, b` in
`1..MAX_PD_RATIO`, ranked by tokens per dollar (`rps * (I + O) * 3600 / price`), and added
greedily: as many copies of the best unit that fits in the remaining availability as the
remaining demand calls for, until the demand is met. Small ratios stay in the list, so when
availability is short a smaller unit of the same pair can still be taken. One refinement keeps
the last step from overshooting: when the best fitting unit would cover the rest of the
demand, the cheapest fitting unit that covers it is taken instead. Models go in priority order
and share availability first come, first served.

The units are held as arrays (a core-size scenario has ~10^5 of them per model), and a
`PdUnit` is made only for those taken.

Approximations: the ratio is capped at `MAX_PD_RATIO`; the KV transfer between the halves is
not costed (as in the allocator's pairing); greedy, so no optimality is claimed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from coral.allocator.problem import ModelDemand, TemplateColumn, TemplateRegion
from coral.allocator.scenario import Scenario
from coral.baselines.common import (
    BaselineResult,
    columns_of,
    deployment_of,
    heuristic_plan,
    result_of,
    scenario_problem,
)
from coral.templates.build import Template

#: Largest number of prefill (or decode) instances in one unit.
MAX_PD_RATIO = 4


@dataclass(frozen=True)
class PdUnit:
    """`n_prefill` prefill plus `n_decode` decode instances of one model in one region."""

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
    """Every unit of one model as arrays, best tokens per dollar first."""

    def __init__(self, demand: ModelDemand, prefill: Sequence[TemplateColumn],
                 decode: Sequence[TemplateColumn], regions: Sequence[str]):
        self.demand = demand
        self.prefill, self.decode, self.regions = list(prefill), list(decode), list(regions)
        inp, out = float(demand.input_tokens), float(demand.output_tokens)
        rows: list[np.ndarray] = []
        for r, region in enumerate(self.regions):
            pi = [i for i, c in enumerate(self.prefill) if region in c.price_usd_per_hour]
            di = [j for j, c in enumerate(self.decode) if region in c.price_usd_per_hour]
            if not pi or not di:
                continue
            ratio = np.arange(1, MAX_PD_RATIO + 1)
            p, d, a, b = np.meshgrid(pi, di, ratio, ratio, indexing="ij")
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

    def copies_that_fit(self, left: np.ndarray) -> np.ndarray:
        """Copies of every unit the nodes `left[node type, region]` allow."""
        if not len(self):
            return np.zeros(0, np.int64)
        have_p = left[self.p_g, self.region]
        have_d = left[self.d_g, self.region]
        same = self.p_g == self.d_g
        return np.where(same, have_p // (self.p_n + self.d_n),
                        np.minimum(have_p // self.p_n, have_d // self.d_n))

    def unit(self, i: int) -> PdUnit:
        return PdUnit(
            model=self.demand.model, region=self.regions[self.region[i]],
            prefill=self.prefill[self.p[i]], decode=self.decode[self.d[i]],
            n_prefill=int(self.a[i]), n_decode=int(self.b[i]), rps=float(self.rps[i]),
            usd_per_hour=float(self.usd[i]), tokens_per_usd=float(self.tokens_per_usd[i]),
        )


def greedy_units(table: UnitTable, left: dict[tuple[str, str], int]
                 ) -> list[tuple[PdUnit, int]]:
    """Units (with copies) added best-first until the model's demand is met; takes their
    nodes from `left` ((node type, region) -> nodes)."""
    avail = np.array([[left.get((g, r), 0) for r in table.regions] for g in table.node_types],
                     dtype=np.int64).reshape(len(table.node_types), len(table.regions))
    demand = table.demand.requests_per_s
    remaining, tol = demand, 1e-9 * max(1.0, demand)
    taken: list[tuple[PdUnit, int]] = []
    while remaining > tol and len(table):
        fit = table.copies_that_fit(avail)
        ok = np.flatnonzero(fit > 0)
        if not len(ok):
            break  # availability is spent: the model stays short
        top = int(ok[0])
        if table.rps[top] >= remaining - tol:
            covering = ok[table.rps[ok] >= remaining - tol]
            pick = int(covering[np.argmin(table.usd[covering])])  # first cheapest: best value
            copies = 1
        else:
            pick = top
            copies = int(min(remaining // table.rps[top], fit[top]))
        r = table.region[pick]
        avail[table.p_g[pick], r] -= table.p_n[pick] * copies
        avail[table.d_g[pick], r] -= table.d_n[pick] * copies
        unit = table.unit(pick)
        for g, n in unit.nodes().items():
            left[(g, unit.region)] -= n * copies
        taken.append((unit, copies))
        remaining -= copies * unit.rps
    return taken


def cauchy(
    scenario: Scenario,
    prefill: Mapping[str, Sequence[Template]],
    decode: Mapping[str, Sequence[Template]],
    *,
    name: str = "cauchy",
) -> BaselineResult:
    """Greedy PD units for every model, in priority order, within availability."""
    demands = {d.model: d for d in scenario.demands()}
    left: dict[tuple[str, str], int] = dict(scenario.availability)
    columns: dict[str, TemplateColumn] = {}
    instances: dict[TemplateRegion, int] = {}
    used: list[str] = []
    for m in sorted(scenario.models, key=lambda m: -m.priority):
        pre = columns_of(scenario, prefill.get(m.name, ()), prefix=name)
        dec = columns_of(scenario, decode.get(m.name, ()), prefix=name)
        columns.update({c.id: c for c in pre + dec})
        demand = demands[m.name]
        if demand.requests_per_s <= 0:
            continue
        for unit, copies in greedy_units(UnitTable(demand, pre, dec, scenario.regions), left):
            for col, n in ((unit.prefill, unit.n_prefill), (unit.decode, unit.n_decode)):
                key = (col.id, unit.region)
                instances[key] = instances.get(key, 0) + n * copies
            used.append(f"{m.name}: {copies} x ({unit.n_prefill} x "
                        f"{unit.prefill.id.split(':', 3)[-1]} prefill + {unit.n_decode} x "
                        f"{unit.decode.id.split(':', 3)[-1]} decode) in {unit.region}")
    problem = scenario_problem(scenario, list(columns.values()))
    notes = (
        "PD units of homogeneous prefill and decode configurations, ratio a:b up to "
        f"{MAX_PD_RATIO}:{MAX_PD_RATIO}, ranked by tokens per dollar and added greedily "
        "(the last step takes the cheapest unit covering the rest); models in priority order",
        "KV transfer between prefill and decode is not costed",
    )
    plan = heuristic_plan(problem, instances, notes=notes)
    halves = (t for side in (prefill, decode) for tpls in side.values() for t in tpls)
    return result_of(name, plan, notes + (("units: " + "; ".join(used)) if used
                                          else "no unit could be placed",),
                     instances=deployment_of(scenario, plan, halves, prefix=name))
