"""Scenario files: their schema, their checks against the catalog, and the problems they give.

- `headroom`: planned capacity: the request rate a template instance takes while TTFT holds at the
  SLO.
- `load`: scenarios: which models to serve, how much, where, and how many nodes each region can
  give.
- `spec`: the scenario file: its schema and the checks that resolve it against the catalog.
"""
