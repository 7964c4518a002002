"""The paper's scarcity rule on any baseline: short of demand, scale every model's demand down
uniformly until the baseline's own planning meets it (`coral.allocator.scarcity.uniform_scale`).

`scale_down(run, scenario)` runs the baseline at the full demand; when its plan falls short,
it bisects the factor `f` over re-runs of the same baseline on the scenario with every
model's req/s times `f` (`scaled_scenario`), to `SCALE_TOL`. The result is the plan at the
largest `f` met, judged against the full demand: every model served `f` of its demand, its
$/hour, and its goodput in generated tokens/s (`f` times the demand's output tokens/s).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from coral.allocator.scenario.load import Scenario
from coral.allocator.scarcity.uniform_scale import SCALE_TOL, goodput_tokens_per_s, largest_scale
from coral.baselines.common import BaselineResult


def scaled_scenario(scenario: Scenario, factor: float) -> Scenario:
    """`scenario` with every model's demand times `factor` (nothing else changed)."""
    if not (math.isfinite(factor) and factor >= 0):
        raise ValueError(f"demand factor must be a finite number >= 0, got {factor!r}")
    models = [m.model_copy(update={"demand_rps": m.demand_rps * factor})
              for m in scenario.spec.models]
    return replace(scenario, spec=scenario.spec.model_copy(update={"models": models}))


def with_goodput(result: BaselineResult, scenario: Scenario) -> BaselineResult:
    """`result` (at the full demand) with its goodput in tokens/s filled in."""
    return replace(result, goodput_tokens_per_s=goodput_tokens_per_s(
        dict(result.served_fraction), scenario.demands()))


def scale_down(run: Callable[[Scenario], BaselineResult], scenario: Scenario, *,
               tol: float = SCALE_TOL) -> BaselineResult:
    """`run(scenario)`, or under scarcity `run` at the largest uniform demand factor it
    meets (to `tol`), reported against the full demand. A baseline that meets no demand at
    any factor keeps its full-demand result, with factor 0."""

    def attempt(f: float) -> tuple[bool, BaselineResult]:
        res = run(scenario if f == 1.0 else scaled_scenario(scenario, f))
        return res.meets_demand, res

    # the smallest served share at full demand is a factor the plan itself covers (for the
    # allocation ILP it is met; for a greedy it is a good first guess)
    first = run(scenario)
    if first.meets_demand:
        return with_goodput(first, scenario)
    hint = min(first.served_fraction.values(), default=0.0)
    seen = {1.0: (False, first)}
    found = largest_scale(lambda f: seen.pop(f) if f in seen else attempt(f), tol=tol,
                          hint=hint if hint > 0 else None)
    if found.factor <= 0:
        return replace(with_goodput(first, scenario), demand_scale=0.0, notes=first.notes + (
            "meets no uniform share of the demand: reported at the full demand",))
    res = found.result
    served = {m: found.factor * f for m, f in res.served_fraction.items()}
    return replace(
        res, served_fraction=served, demand_scale=found.factor,
        goodput_tokens_per_s=goodput_tokens_per_s(served, scenario.demands()),
        notes=res.notes + (
            f"scarcity rule: short of demand at full rate, so every model's rate is scaled "
            f"down uniformly to {found.factor:.4f} (largest factor met, bisected to {tol:g}; "
            f"{found.upper:.4f} falls short; {found.runs} runs of the planner); at the full "
            "demand it served " + ", ".join(f"{m} {f:.1%}" for m, f in
                                            first.served_fraction.items() if f < 1.0 - 1e-6),),
    )
