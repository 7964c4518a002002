"""Templates as allocator columns: each kept template priced in the scenario's regions, with a
stable id `model|mode|combo`, so that a deployment planned now can be handed back as
`current` to a later plan."""

from __future__ import annotations

from typing import Mapping, Sequence

from coral.allocator.problem import TemplateColumn
from coral.allocator.scenario.load import Scenario
from coral.templates.builder.build import Template
from coral.templates.space.enumerate import combo_key, node_counts

#: Separator of the parts of a column id (`model|mode|combo`).
ID_SEP = "|"


def column_id(template: Template) -> str:
    """Stable column id of a template: `model|mode|combo` (e.g. `llama-3.1-8b|aggregated|1x-l4*2`).
    The same combination always gets the same id, so a deployment can be carried from one
    plan to the next."""
    return ID_SEP.join((template.model, template.mode, combo_key(template.combo)))


def columns_from_templates(
    scenario: Scenario, templates: Mapping[str, Sequence[Template]]
) -> list[TemplateColumn]:
    """Every usable template as a column priced in the scenario's regions, sorted by id.

    A column's capacity is the template's planned capacity (`Scenario.planned_capacity`:
    throughput times the utilisation at which TTFT still holds), not its full throughput.
    Left out: templates with no planned capacity, of models or modes the scenario does not
    serve, that are not one pipeline (not one instance a reader can deploy), or whose node
    types no scenario region prices together. Of two templates with the same id (same model,
    mode and combination: e.g. Coral's and the vLLM-shaped one) the one of higher planned
    capacity is kept; `columns_and_templates` says which.
    """
    return columns_and_templates(scenario, templates)[0]


def columns_and_templates(
    scenario: Scenario, templates: Mapping[str, Sequence[Template]]
) -> tuple[list[TemplateColumn], dict[str, Template]]:
    """`columns_from_templates`, and the template behind each column (by column id): what
    an instance of that column deploys."""
    served = {m.name for m in scenario.models}
    modes = set(scenario.template_modes)
    best: dict[str, tuple[TemplateColumn, Template]] = {}
    for model, tpls in templates.items():
        if model not in served:
            continue
        for t in tpls:
            if (t.model != model or t.mode not in modes or not t.feasible or t.throughput <= 0
                    or not t.is_pipeline):
                continue
            capacity = scenario.planned_capacity(t)
            if not capacity > 0:
                continue
            col = scenario.column(column_id(t), t.model, t.mode, node_counts(t.combo), capacity)
            if not col.price_usd_per_hour:
                continue
            if col.id not in best or col.capacity > best[col.id][0].capacity:
                best[col.id] = (col, t)
    ids = sorted(best)
    return [best[k][0] for k in ids], {k: best[k][1] for k in ids}
