"""Evaluation: `coral evaluate`'s experiments and report, above planning (it plans scenarios,
runs the baselines and simulates the plans) and below the CLI.

- `evaluate`: runs the selected sections and writes the markdown report with its headline.
- `sections`: one function per section (cost, goodput, solve time, Helix, adaptation, vLLM).
- `common`: the settings (`EvalConfig`), the shared context (plans and simulations cached
  across sections), tables and plots.
"""
