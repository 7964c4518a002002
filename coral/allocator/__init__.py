"""Online allocation: how many instances of each serving template to run in each region.

- `problem`: the allocation problem and plan as plain numbers (`AllocationProblem`,
  `TemplateColumn`, `ModelDemand`, `AllocationPlan`) and the solver's defaults
  (`DEFAULT_MIP_GAP`, `DEFAULT_TIME_LIMIT_S`).
- `ilp`: the allocation ILP's solve (`solve_allocation`) and `InfeasiblePlanError`; its
  parts: `presolve` (columns kept, dominance), `formulation` (variables and rows),
  `highs_runs` (HiGHS runs, the LP relaxation), `scarcity` (the goodput phases), `starts`
  (plans given beforehand).
- `plan_decode`: an allocation decoded into plan-file rows (the file is `coral.plans`).
- `bruteforce`: the exhaustive oracle for tiny problems (`solve_bruteforce`).
- `scenario`: scenario files (models, demand, regions, availability levels) -> problems.

Planning a scenario end to end (template libraries, the allocation in each mode, the
baselines beside it, re-plans over a timeline) is `coral.planning`, the layer above.

The names below load their module on first use, so that reading `coral.allocator.problem`
(the CLI's defaults) does not import HiGHS and the compiled kernels.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "solve_bruteforce": "bruteforce",
    "InfeasiblePlanError": "ilp",
    "PresolveReport": "presolve",
    "dominated_templates": "presolve",
    "presolve_columns": "presolve",
    "solve_allocation": "ilp",
    "AllocationPlan": "problem",
    "AllocationProblem": "problem",
    "ModelDemand": "problem",
    "PlanStatus": "problem",
    "TemplateColumn": "problem",
    "make_plan": "problem",
    "model_capacity_rps": "problem",
    "priced_column": "problem",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
