"""Online allocation: how many instances of each serving template to run in each region.

- `problem`: the allocation problem and plan as plain numbers (`AllocationProblem`,
  `TemplateColumn`, `ModelDemand`, `AllocationPlan`).
- `ilp`: the HiGHS ILP (`solve_allocation`), its presolve and `InfeasiblePlanError`.
- `bruteforce`: the exhaustive oracle for tiny problems (`solve_bruteforce`).
- `scenario`: scenario files (models, demand, regions, availability levels) -> problems.
- `planning`: scenario -> template libraries -> allocation -> a decoded `PlanResult`, with the
  baselines (`plan_scenario`).
- `adapt` / `adapt_report`: replay a timeline, re-planning every period; CSV and plot.
"""

from coral.allocator.bruteforce import solve_bruteforce
from coral.allocator.ilp import (
    InfeasiblePlanError,
    PresolveReport,
    dominated_templates,
    presolve_columns,
    solve_allocation,
)
from coral.allocator.problem import (
    AllocationPlan,
    AllocationProblem,
    ModelDemand,
    PlanStatus,
    TemplateColumn,
    make_plan,
    model_capacity_rps,
    priced_column,
)

__all__ = [
    "AllocationPlan",
    "AllocationProblem",
    "InfeasiblePlanError",
    "ModelDemand",
    "PlanStatus",
    "PresolveReport",
    "TemplateColumn",
    "dominated_templates",
    "make_plan",
    "model_capacity_rps",
    "presolve_columns",
    "priced_column",
    "solve_allocation",
    "solve_bruteforce",
]
