"""What the simulator runs: template instances as pipelines of stages, with router weights.

An `InstanceSpec` is one running copy of a template: its stages in layer order, each stage the
nodes that hold the same layer range (data parallel), each node with its layers, batch and the
share of the stage's traffic it takes. It is built from the one instance shape
(`coral.perf.pipeline.PipelineShape`) of a `Template`, of a `PlanResult` row, or of a row of
the JSON that `coral plan --out` writes (its `stages`, each instance's capacity and price, and
the scenario name, which gives the SLO): the identical nodes of a stage share it evenly.
Hand-made specs (`stages_from_nodes`) may give nodes of one stage other shares.

Roles: an instance is `aggregated` (prompts and decoding, the default) or one half of a
prefill/decode-disaggregated (PD) deployment: `prefill` (runs prompts only; its nodes' batch
counts prompt tokens per iteration, as in the template) or `decode` (decodes requests whose KV
cache it receives from a prefill instance of the same model in the same `region`; see
`coral.sim.pd`). Every role's `weight` is its planned capacity in requests/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence

from coral.errors import CoralError
from coral.perf.pipeline import ShapeError
from coral.perf.step import Stage, StageNode, stages_from_shape
from coral.plans.file import PlanFile, PlanRow
from coral.templates.slo import SloSpec


Role = Literal["aggregated", "prefill", "decode"]
ROLES: tuple[str, ...] = ("aggregated", "prefill", "decode")


class DeploymentError(CoralError, ValueError):
    """A deployment cannot be simulated as given."""


@dataclass(frozen=True)
class InstanceSpec:
    """One template instance the router can send requests to."""

    name: str  # unique in the deployment, e.g. "region/template_id#k"
    model: str
    stages: tuple[Stage, ...]  # in layer order
    weight: float  # router weight: planned capacity, requests/s
    usd_per_hour: float
    slo: SloSpec | None = None
    role: Role = "aggregated"
    region: str = ""  # PD: a prefill instance hands its requests to decode instances here

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise DeploymentError(f"instance {self.name}: role must be one of "
                                  f"{', '.join(ROLES)}, got {self.role!r}")

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(n.node_type for s in self.stages for n in s.nodes)


def stages_from_nodes(nodes: Sequence[tuple[str, int, int, int, float]]) -> tuple[Stage, ...]:
    """Group (node_type, first_layer, layers, batch, weight) into stages by layer range.

    Nodes holding no layers are dropped. The ranges must tile [0, L) without gaps.
    """
    groups: dict[tuple[int, int], list[tuple[str, int, int, int, float]]] = {}
    for n in nodes:
        if n[2] > 0:
            groups.setdefault((n[1], n[2]), []).append(n)
    if not groups:
        raise DeploymentError("the instance has no node holding layers")
    stages = []
    expect = 0
    for (first, layers), members in sorted(groups.items()):
        if first != expect:
            raise DeploymentError(
                f"layer ranges do not form a pipeline: a stage starts at layer {first}, "
                f"expected {expect} (ranges: {sorted(groups)})")
        expect = first + layers
        total = sum(m[4] for m in members)
        stages.append(Stage(tuple(
            StageNode(m[0], m[1], m[2], int(m[3]),
                      (m[4] / total) if total > 0 else 1.0 / len(members))
            for m in members)))
    return tuple(stages)


def instance_from_template(template: Any, *, name: str | None = None, weight: float | None = None,
                           usd_per_hour: float | None = None, region: str = "") -> InstanceSpec:
    """An instance of `template` in the template's mode (its role), its stages the
    template's shape; weight its throughput in requests/s unless given."""
    if template.mode not in ROLES:
        raise DeploymentError(f"template {template.combo} is in unknown mode {template.mode!r}")
    try:
        stages = stages_from_shape(template.shape)
    except ShapeError as exc:
        raise DeploymentError(f"template {template.model} on {'+'.join(template.combo)}: "
                              f"{exc}") from None
    price = usd_per_hour
    if price is None:
        price = template.min_usd_per_hour() or 0.0
    role = "" if template.mode == "aggregated" else f"|{template.mode}"
    return InstanceSpec(
        name=name or f"{template.model}|{'+'.join(template.combo)}{role}",
        model=template.model, stages=stages,
        weight=float(template.throughput_rps if weight is None else weight),
        usd_per_hour=float(price), slo=template.slo, role=template.mode, region=region)


def instances_from_rows(rows: Iterable[PlanRow],
                        slos: Mapping[str, SloSpec]) -> list[InstanceSpec]:
    """Every instance of the plan rows `rows`, named `region/template_id#k`."""
    out = []
    for row in rows:
        role = row.mode
        if role not in ROLES:
            raise DeploymentError(
                f"instance {row.template_id!r} is in unknown mode {role!r}; expected "
                + ", ".join(ROLES))
        if row.shape is None:
            raise DeploymentError(f"instance {row.template_id!r} has no stages")
        stages = stages_from_shape(row.shape)
        slo = slos.get(row.model)
        for k in range(row.count):
            out.append(InstanceSpec(
                name=f"{row.name}#{k}", model=row.model, stages=stages,
                weight=_capacity_rps(row, role, slo), usd_per_hour=row.usd_per_hour, slo=slo,
                role=role, region=row.region))
    return out


def _capacity_rps(row: PlanRow, role: str, slo: SloSpec | None) -> float:
    """A row's planned requests/s. A plan decoded without its templates writes 0 for PD rows
    (their `capacity` is in tokens/s); that is converted with the SLO's request shape."""
    if row.capacity_rps > 0 or role == "aggregated" or slo is None:
        return row.capacity_rps
    per_request = slo.input_tokens if role == "prefill" else slo.output_tokens
    return row.capacity / per_request


def instances_from_plan(result: Any, slos: Mapping[str, SloSpec]) -> list[InstanceSpec]:
    """Every instance of a plan: a `PlanFile`, a `PlanResult`, or a plan file's JSON object
    (read into a `PlanFile` here, after the plan check)."""
    if isinstance(result, Mapping):
        from coral.plans.errors import PlanFileError

        try:  # a reader with a catalog checks its names first (`read_plan`)
            result = PlanFile.from_payload(result)
        except PlanFileError as exc:
            raise DeploymentError(str(exc)) from None
    return instances_from_rows(result.instances, slos)
