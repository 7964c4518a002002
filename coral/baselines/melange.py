"""Melange-like: the cheapest mix of single-node replicas.

Melange picks, per request-size bucket, how many instances of each GPU type to rent with an
ILP, every instance a whole model replica on one GPU configuration. Here: only templates on
exactly one node (any node type, any GPU count inside it), allocated by Coral's allocation
ILP, so the mix across node types and regions is optimal for that restriction.

Approximation: our scenarios describe each model's requests by one mean shape (input and
output tokens), so there is one bucket per model; Melange's per-size buckets and its
SLO-aware profiling are replaced by the template builder's operating points under the same
SLO as Coral's.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.scenario.load import Scenario
from coral.baselines.common import (
    BaselineResult,
    columns_of,
    deployment_of,
    result_of,
    scenario_problem,
)
from coral.templates.builder.build import Template

NOTE_BUCKETS = ("one request-size bucket per model: the scenario gives one mean request shape "
                "per model, where Melange buckets requests by size")


def single_node_templates(templates: Sequence[Template]) -> list[Template]:
    """The templates on exactly one node."""
    return [t for t in templates if len(t.combo) == 1]


def melange(
    scenario: Scenario,
    candidates: Mapping[str, Sequence[Template]],
    *,
    time_limit_s: float,
    mip_gap: float,
    name: str = "melange",
) -> BaselineResult:
    """The allocation ILP over every model's single-node templates in `candidates`."""
    columns = [c for tpls in candidates.values()
               for c in columns_of(scenario, single_node_templates(tpls), prefix=name)]
    plan = solve_allocation(scenario_problem(scenario, columns, time_limit_s=time_limit_s,
                                             mip_gap=mip_gap))
    notes = [f"{len(columns)} single-node templates, one allocation ILP over all models",
             NOTE_BUCKETS]
    served_by = {c.model for c in columns}
    unplaceable = [m.name for m in scenario.models if m.demand_rps > 0 and m.name not in served_by]
    if unplaceable:
        notes.append("no single node holds " + ", ".join(unplaceable) + " under its SLO: not "
                     "served")
    singles = (t for tpls in candidates.values() for t in single_node_templates(tpls))
    return result_of(name, plan, notes,
                     instances=deployment_of(scenario, plan, singles, prefix=name))
