"""A robust allocation problem (`coral plan --robust R`, `planner.py`): the allocation problem
and each column's capacity in every scenario (one GPU type slow), and what a plan serves in
each scenario.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from coral.allocator.problem import DEMAND_REL_TOL, AllocationProblem, TemplateRegion
from coral.errors import CoralError

#: Largest `R` `--robust` takes: a GPU type 11x slower than modelled is no model error.
MAX_ROBUST_R = 10.0


class RobustError(CoralError, ValueError):
    """A `--robust` request that cannot be planned (the message says why and what to do)."""


def check_robust_r(r: float) -> float:
    """`R` of `--robust R` as a float, or `RobustError`."""
    if not (isinstance(r, (int, float)) and math.isfinite(r) and 0.0 < r <= MAX_ROBUST_R):
        raise RobustError(f"--robust must be a number in (0, {MAX_ROBUST_R:g}] (0.2: any one "
                          f"GPU type 20 % slower than modelled), got {r!r}")
    return float(r)


@dataclass(frozen=True)
class RobustProblem:
    """An allocation problem and its scenarios: scenario name (a GPU type) -> column id ->
    that column's capacity in the scenario (its unit; columns not listed keep their nominal
    capacity)."""

    problem: AllocationProblem
    scenario_capacity: Mapping[str, Mapping[str, float]]

    def __post_init__(self) -> None:
        ids = {t.id for t in self.problem.templates}
        for name, caps in self.scenario_capacity.items():
            for cid, cap in caps.items():
                if cid not in ids:
                    raise ValueError(f"scenario {name!r}: no column {cid!r} in the problem")
                if not (math.isfinite(cap) and cap >= 0):
                    raise ValueError(f"scenario {name!r}: capacity of {cid!r} must be a finite "
                                     f"number >= 0, got {cap!r}")

    @property
    def scenarios(self) -> tuple[str, ...]:
        return tuple(sorted(self.scenario_capacity))

    def capacity_matrix(self) -> np.ndarray:
        """(scenarios, templates): each column's capacity in each scenario, in problem order."""
        nominal = np.array([t.capacity for t in self.problem.templates], dtype=float)
        out = np.tile(nominal, (len(self.scenarios), 1))
        pos = {t.id: i for i, t in enumerate(self.problem.templates)}
        for k, name in enumerate(self.scenarios):
            for cid, cap in self.scenario_capacity[name].items():
                out[k, pos[cid]] = cap
        return out


def capacity_rps_under(problem: AllocationProblem, capacity: Mapping[str, float],
                       instances: Mapping[TemplateRegion, int]) -> dict[str, float]:
    """Requests/s each model serves with `instances` when column `id` has `capacity[id]`
    (its nominal capacity where absent): aggregated capacity plus, per region, the PD halves
    paired (`problem.model_capacity_rps` with other capacities)."""
    by_id = {t.id: t for t in problem.templates}
    agg: dict[str, float] = {}
    pd: dict[tuple[str, str, str], float] = {}
    for (tid, region), n in instances.items():
        t = by_id[tid]
        cap = n * capacity.get(tid, t.capacity)
        if t.mode == "aggregated":
            agg[t.model] = agg.get(t.model, 0.0) + cap
        else:
            pd[(t.model, t.mode, region)] = pd.get((t.model, t.mode, region), 0.0) + cap
    out = {}
    for d in problem.demands:
        total = agg.get(d.model, 0.0)
        for region in problem.regions:
            total += min(pd.get((d.model, "prefill", region), 0.0) / d.input_tokens,
                         pd.get((d.model, "decode", region), 0.0) / d.output_tokens)
        out[d.model] = total
    return out


def scenario_capacity_rps(rp: RobustProblem, instances: Mapping[TemplateRegion, int]
                          ) -> dict[str, dict[str, float]]:
    """Scenario -> model -> requests/s the plan `instances` serves in that scenario."""
    return {name: capacity_rps_under(rp.problem, rp.scenario_capacity[name], instances)
            for name in rp.scenarios}


def robust_shortfall(rp: RobustProblem, instances: Mapping[TemplateRegion, int]
                     ) -> dict[tuple[str, str], float]:
    """(scenario, model) -> requests/s short of demand in that scenario (only those short
    beyond the solver's tolerance)."""
    out = {}
    for name, caps in scenario_capacity_rps(rp, instances).items():
        for d in rp.problem.demands:
            short = d.requests_per_s - caps[d.model]
            if short > DEMAND_REL_TOL * max(1.0, d.requests_per_s):
                out[(name, d.model)] = short
    return out
