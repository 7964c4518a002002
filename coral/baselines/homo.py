"""Homo: every replica is `k` copies of one node type (homogeneous replicas).

This is how most serving systems are deployed (SkyServe, SageServe): pick a GPU configuration
per model and replicate it; replicas of one model may differ. Two variants, on the same
templates, prices and availability as Coral:

- `homo` (`homo_greedy`, the paper's Homo): greedy, per model, by goodput per USD; see its
  docstring for exactly what it does;
- `homo-joint` (`homo_joint`): one allocation ILP over all models with only homogeneous
  templates, so the models share availability optimally and a model may mix several
  homogeneous configurations at their cheapest combination. It is never dearer than `homo`
  when both meet demand (the greedy plan is one of its feasible plans), so it is the
  stronger baseline.

An earlier `homo-independent` variant (each model replicating the one configuration whose
remaining availability met its whole demand) is folded into `homo`: both rank configurations
the same way (lowest $/hour per req/s is highest goodput per USD, goodput being served req/s
times the model's output tokens); they differed only when the best configuration ran out,
where `homo-independent` skipped to a configuration that could hold the whole demand alone and
`homo` takes what the best one holds and moves on to the next best, as the paper says.

Homogeneous templates come from the planner's templates where it has them; the others (a
library prunes, e.g., `2 x 1x-l4` when two single-node replicas do as well) are solved here
with `build_template` for `k = 1..n_max`, within the same enumeration limits as Coral's
library (`n_max`, `rho`, memory floor), so Homo has no node set Coral could not have used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.problem import DEMAND_REL_TOL, TemplateColumn, TemplateRegion
from coral.allocator.scenario.load import Scenario, scenario_slo
from coral.baselines.common import (
    BaselineResult,
    TemplateBuilder,
    columns_of,
    deployment_of,
    heuristic_plan,
    result_of,
    scenario_problem,
)
from coral.templates.builder.build import Template
from coral.templates.types import Mode


def is_homogeneous(combo: Sequence[str]) -> bool:
    """All nodes of one type (one node counts)."""
    return len(set(combo)) == 1


def homogeneous_templates(
    model: str,
    given: Sequence[Template],
    builder: TemplateBuilder,
    scenario: Scenario,
    *,
    mode: Mode = "aggregated",
    n_max: int | None = None,
    node_types: Sequence[str] | None = None,
) -> list[Template]:
    """Feasible homogeneous templates of `model` in `mode`: the planner's, plus the missing
    `k x g` ones (`g` in the scenario's node types, `k <= n_max`) solved now."""
    slo = scenario_slo(scenario, model)
    builder.seed(given)
    combos = builder.homogeneous_combos(
        model, slo, mode,
        node_types=tuple(node_types) if node_types is not None else scenario.node_types,
        n_max=n_max if n_max is not None else scenario.spec.n_max,
        rho=scenario.spec.rho,
    )
    have = {t.combo: t for t in given if t.mode == mode and is_homogeneous(t.combo)}
    out = []
    for combo in sorted(set(combos) | set(have), key=lambda c: (c[0], len(c))):
        t = have.get(combo) or builder.get(model, combo, slo, mode)
        if t.feasible:
            out.append(t)
    return out


def homo_joint(
    scenario: Scenario,
    homogeneous: Mapping[str, Sequence[Template]],
    *,
    time_limit_s: float,
    mip_gap: float,
    name: str = "homo-joint",
    notes: Sequence[str] = (),
) -> BaselineResult:
    """The allocation ILP over all models' homogeneous templates at once."""
    columns = [c for tpls in homogeneous.values() for c in columns_of(scenario, tpls, prefix=name)]
    plan = solve_allocation(scenario_problem(scenario, columns, time_limit_s=time_limit_s,
                                             mip_gap=mip_gap))
    return result_of(name, plan, tuple(notes) + (
        f"{len(columns)} homogeneous templates (k x one node type), one allocation ILP over "
        "all models",
    ), instances=_deployment(scenario, plan, homogeneous, name))


def _deployment(scenario: Scenario, plan, homogeneous: Mapping[str, Sequence[Template]],
                prefix: str) -> tuple:
    return deployment_of(scenario, plan, (t for tpls in homogeneous.values() for t in tpls),
                         prefix=prefix)


@dataclass(frozen=True)
class HomoStrategy:
    """One homogeneous strategy of a model: replicas of one template column in one region."""

    column: TemplateColumn
    region: str
    usd_per_hour: float  # one replica
    goodput_per_usd: float  # output tokens/s served per $/hour of one replica

    @property
    def label(self) -> str:
        return f"{self.column.id.split(':', 3)[-1]} in {self.region}"


def homo_strategies(columns: Sequence[TemplateColumn], output_tokens: float
                    ) -> list[HomoStrategy]:
    """Every (column, region) a column is priced in, best goodput per USD first; ties:
    cheaper replica first, then column id and region (deterministic)."""
    out = [HomoStrategy(col, region, usd, col.capacity * output_tokens / usd)
           for col in columns for region, usd in col.price_usd_per_hour.items() if usd > 0]
    return sorted(out, key=lambda s: (-s.goodput_per_usd, s.usd_per_hour, s.column.id,
                                      s.region))


def _fit(col: TemplateColumn, region: str, left: Mapping[tuple[str, str], int]) -> int:
    """Replicas of `col` the nodes left in `region` allow."""
    return min(left.get((g, region), 0) // n for g, n in col.node_counts.items())


def greedy_replicas(strategies: Sequence[HomoStrategy], demand_rps: float,
                    left: dict[tuple[str, str], int]) -> list[tuple[HomoStrategy, int]]:
    """Replicas of the best strategy until `demand_rps` is met, then of the next best while
    availability has run out, and so on; takes their nodes from `left`."""
    remaining = demand_rps
    tol = DEMAND_REL_TOL * max(1.0, demand_rps)
    taken: list[tuple[HomoStrategy, int]] = []
    for s in strategies:
        if remaining <= tol:
            break
        take = min(math.ceil(remaining / s.column.capacity - 1e-9), _fit(s.column, s.region,
                                                                         left))
        if take <= 0:
            continue
        for g, n in s.column.node_counts.items():
            left[(g, s.region)] -= n * take
        taken.append((s, take))
        remaining -= take * s.column.capacity
    return taken


def homo_greedy(
    scenario: Scenario,
    homogeneous: Mapping[str, Sequence[Template]],
    *,
    name: str = "homo",
    notes: Sequence[str] = (),
) -> BaselineResult:
    """The paper's Homo: per model, greedy by goodput per USD over homogeneous strategies.

    A strategy is one homogeneous template (`k` copies of one node type, `k <= n_max`) in one
    region, valued at its goodput per USD: its planned req/s times the model's output tokens
    per request, per $/hour of one replica in that region. For each model, in priority order
    (file order on ties), the greedy walks its strategies best first and rents
    `ceil(remaining demand / replica req/s)` replicas of each, or as many as the nodes left in
    that region allow, until the model's demand is met; a model whose strategies all run out
    stays short. Models take nodes first come, first served, as independent deployments
    would. Nothing is re-optimised afterwards: the last replica of a strategy may overshoot
    the demand, and a cheaper mix of two configurations (what `homo-joint` finds) is not
    looked for.
    """
    demands = {d.model: d for d in scenario.demands()}
    order = sorted(scenario.models, key=lambda m: -m.priority)  # stable: file order on ties
    left: dict[tuple[str, str], int] = dict(scenario.availability)
    instances: dict[TemplateRegion, int] = {}
    columns: list[TemplateColumn] = []
    chosen: list[str] = []
    for m in order:
        demand = demands[m.name]
        cols = columns_of(scenario, homogeneous.get(m.name, ()), prefix=name)
        columns.extend(cols)
        if demand.requests_per_s <= 0 or not cols:
            continue
        taken = greedy_replicas(homo_strategies(cols, demand.output_tokens),
                                demand.requests_per_s, left)
        for s, n in taken:
            key = (s.column.id, s.region)
            instances[key] = instances.get(key, 0) + n
        chosen.append(f"{m.name}: " + (", ".join(f"{n} x {s.label}" for s, n in taken)
                                       or "nothing fits"))
    problem = scenario_problem(scenario, columns)
    plan = heuristic_plan(problem, instances, notes=notes)
    return result_of(name, plan, tuple(notes) + (
        "the paper's Homo: per model (priority order, first come first served), homogeneous "
        "strategies (k x one node type in one region) best goodput per USD first, each "
        "replicated until the demand is met or its region's nodes run out",
        "chosen: " + "; ".join(chosen) if chosen else "no model chose a configuration",
    ), instances=_deployment(scenario, plan, homogeneous, name))
