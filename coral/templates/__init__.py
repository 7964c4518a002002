"""Serving templates: the best SLO-feasible placement of a model on each node combination.

- `slo`: the latency targets and workload mix a template is built for (`SloSpec`).
- `operating_points`: what one node can do at each (layers, batch) — the solver's input.
- `enumerate`: the node combinations worth solving.
- `placement` / `verify`: the exact placement solver and its independent checker.
- `template`: what a solved template is (`Template`); `solve`: one combination
  (`build_template`); `build`: a whole library (`build_library`), built as a
  `build_options.BuildOptions` says.
- `store`: the on-disk, resumable library; `parallel`: process-pool and Ray backends.
"""

from coral.templates.build import BuildReport, build_library
from coral.templates.build_options import BuildOptions
from coral.templates.solve import build_template
from coral.templates.template import Template, TemplateNode
from coral.templates.enumerate import Enumeration, enumerate_combinations, parse_combo
from coral.templates.store import LibraryInputs, TemplateLibrary
from coral.templates.operating_points import OperatingPointTables
from coral.templates.slo import SloSpec, Workload, default_slo, resolve_slo
from coral.templates.types import (
    Mode,
    NodePlacement,
    NodeSpec,
    OperatingPoint,
    Placement,
    PlacementProblem,
    SolveStatus,
    Topology,
)

__all__ = [
    "BuildOptions",
    "BuildReport",
    "Enumeration",
    "LibraryInputs",
    "Mode",
    "NodePlacement",
    "NodeSpec",
    "OperatingPoint",
    "OperatingPointTables",
    "Placement",
    "PlacementProblem",
    "SloSpec",
    "SolveStatus",
    "Template",
    "TemplateLibrary",
    "TemplateNode",
    "Topology",
    "Workload",
    "build_library",
    "build_template",
    "default_slo",
    "enumerate_combinations",
    "parse_combo",
    "resolve_slo",
]
