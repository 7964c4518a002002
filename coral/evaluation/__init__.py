"""Evaluation: `coral evaluate`'s experiments and report, above planning (it plans scenarios,
runs the baselines and simulates the plans) and below the CLI.

- `evaluate`: runs the selected sections and writes the markdown report with its headline.
- `sections`: one function per section (cost, goodput, solve time, Helix, adaptation, vLLM).
- `paper` (`coral evaluate --paper`): the paper's evaluation as the paper runs it, its
  cases (`paper_runs`), studies (`paper_studies`), figures (`paper_claims`) and tables
  (`paper_sections`).
- `common`: the settings (`EvalConfig`), the shared context (plans and simulations cached
  across sections), tables and plots.
"""
