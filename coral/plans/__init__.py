"""The plan file: the one contract between the planner and every reader of a plan.

- `file`: the typed plan (`PlanFile`, its rows `PlanRow`, the spot and robust
  promises) and its one reader and writer (`read_plan`, `write_plan`).
- `check`: the check of a plan's content every reader runs before it believes a row.
- `errors`: `PlanFileError`.

The package sits just above `templates` (it holds each model's `SloSpec`) and below the
allocator that writes plans and the simulator, runtime and CLI that read them; reading a plan
loads neither the template builder nor the solvers.
"""
