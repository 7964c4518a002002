"""Planning: the layer that runs Coral's allocator on a scenario, beside the baselines.

It sits above the allocator, the simulator and the baselines (it uses all three) and below
the evaluation and the CLI:

- `libraries`: a scenario's template libraries, built or reused from disk
  (`templates_for_scenario`, `ScenarioTemplates`, `library_dir`).
- `columns`: templates as allocator columns with stable ids (`columns_from_templates`).
- `options`: how a scenario is planned (`PlanOptions`, holding the templates'
  `BuildOptions`), passed whole.
- `plan`: one plan in each serving mode the scenario allows, the best kept
  (`plan_scenario`); `planners`: plain, spot or robust solving behind one `Planner`
  protocol; `result`: the decoded plan (`PlanResult`).
- `baseline_runs`: the baselines run beside Coral's plan, and their plans as its starts.
- `timeline` / `adapt` / `adapt_report`: a timeline of demand, availability and prices,
  re-planned period by period; its CSV and plot.
- `preemption_replan`: the re-plan after a simulated spot preemption.

Import from the modules: this package re-exports nothing, so that importing one part does not
load the others (the CLI's start-up stays short).
"""
