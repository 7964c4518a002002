"""Serving templates: the best SLO-feasible placement of a model on each node combination.

- `slo`: the latency targets and workload mix a template is built for (`SloSpec`).
- `operating_points`: what one node can do at each (layers, batch) — the solver's input.
  `grid`: the modes, topologies, batches and prefill chunks a library is built over;
  `stage_bytes`: what a stage holds or hands on beyond its layers.
- `enumerate`: the node combinations worth solving.
- `placement` / `verify`: the exact placement solver and its independent checker.
- `template`: what a solved template is (`Template`); `solve`: one combination
  (`build_template`); `build`: a whole library (`build_library`), built as a
  `build_options.BuildOptions` says.
- `store`: the on-disk, resumable library; `parallel`: process-pool and Ray backends.

The names below load their module on first use, so that reading `coral.templates.slo` (every
plan file's SLOs) does not import the template builder and its solvers.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "BuildOptions": "build_options",
    "BuildReport": "build",
    "build_library": "build",
    "build_template": "solve",
    "Template": "template",
    "TemplateNode": "template",
    "Enumeration": "enumerate",
    "enumerate_combinations": "enumerate",
    "parse_combo": "enumerate",
    "LibraryInputs": "store",
    "TemplateLibrary": "store",
    "OperatingPointTables": "operating_points",
    "SloSpec": "slo",
    "Workload": "slo",
    "default_slo": "slo",
    "resolve_slo": "slo",
    "Mode": "types",
    "NodePlacement": "types",
    "NodeSpec": "types",
    "OperatingPoint": "types",
    "Placement": "types",
    "PlacementProblem": "types",
    "SolveStatus": "types",
    "Topology": "types",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
