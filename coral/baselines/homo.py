"""Homo: every replica is `k` copies of one node type (homogeneous replicas).

This is how most serving systems are deployed: pick a GPU configuration per model and
replicate it. Two variants, on the same templates, prices and availability as Coral:

- `homo`: one allocation ILP over all models with only homogeneous templates, so the models
  share availability optimally and a model may still mix several homogeneous configurations;
- `homo-independent`: each model on its own picks the single configuration with the lowest
  $/hour per req/s among those whose remaining availability can meet its demand (else the
  one that serves the most) and replicates it, cheapest region first; models go in priority
  order and take nodes first come, first served, as independent deployments would.

Homogeneous templates come from the planner's templates where it has them; the others (a
library prunes, e.g., `2 x 1x-l4` when two single-node replicas do as well) are solved here
with `build_template` for `k = 1..n_max`, within the same enumeration limits as Coral's
library (`n_max`, `rho`, memory floor), so Homo has no node set Coral could not have used.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from coral.allocator.ilp import solve_allocation
from coral.allocator.problem import TemplateColumn, TemplateRegion
from coral.allocator.scenario import Scenario
from coral.baselines.common import (
    BaselineResult,
    TemplateBuilder,
    columns_of,
    deployment_of,
    heuristic_plan,
    result_of,
    scenario_problem,
    scenario_slo,
)
from coral.templates.build import Template
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
    name: str = "homo",
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


def _fit(col: TemplateColumn, region: str, left: Mapping[tuple[str, str], int]) -> int:
    """Instances of `col` the nodes left in `region` allow."""
    return min(left.get((g, region), 0) // n for g, n in col.node_counts.items())


def homo_independent(
    scenario: Scenario,
    homogeneous: Mapping[str, Sequence[Template]],
    *,
    name: str = "homo-independent",
    notes: Sequence[str] = (),
) -> BaselineResult:
    """Each model replicates its single cheapest-per-req/s homogeneous configuration."""
    demands = {d.model: d for d in scenario.demands()}
    order = sorted(scenario.models, key=lambda m: -m.priority)  # stable: file order on ties
    left: dict[tuple[str, str], int] = dict(scenario.availability)
    instances: dict[TemplateRegion, int] = {}
    columns: list[TemplateColumn] = []
    chosen: list[str] = []
    for m in order:
        demand = demands[m.name].requests_per_s
        cols = columns_of(scenario, homogeneous.get(m.name, ()), prefix=name)
        columns.extend(cols)
        if demand <= 0 or not cols:
            continue
        best: tuple[tuple[int, float], TemplateColumn] | None = None
        for col in cols:
            servable = sum(_fit(col, r, left) for r in col.price_usd_per_hour) * col.capacity
            usd_per_rps = min(col.price_usd_per_hour.values()) / col.capacity
            # meets its demand first, then cheapest per req/s; when none meets it, most served
            rank = (0, usd_per_rps) if servable >= demand else (1, -servable)
            if best is None or rank < best[0]:
                best = (rank, col)
        assert best is not None
        col = best[1]
        need = math.ceil(demand / col.capacity - 1e-9)
        for region, _ in sorted(col.price_usd_per_hour.items(), key=lambda kv: (kv[1], kv[0])):
            take = min(need, _fit(col, region, left))
            if take <= 0:
                continue
            instances[(col.id, region)] = take
            for g, n in col.node_counts.items():
                left[(g, region)] -= n * take
            need -= take
            if need == 0:
                break
        chosen.append(f"{m.name}: {col.id.split(':', 3)[-1]}")
    problem = scenario_problem(scenario, columns)
    plan = heuristic_plan(problem, instances, notes=notes)
    return result_of(name, plan, tuple(notes) + (
        "each model alone: the single homogeneous configuration of lowest $/hour per req/s "
        "(cheapest region) whose remaining availability meets its demand, replicated, "
        "cheapest region first; models in priority order, first come first served",
        "chosen: " + "; ".join(chosen) if chosen else "no model chose a configuration",
    ), instances=_deployment(scenario, plan, homogeneous, name))
