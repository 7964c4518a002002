"""A plan's instances as the runtime deploys them (the built-in tiny one is `coral.runtime.tiny`).

A plan (`coral plan --out plan.json`, or `PlanResult.to_dict()`) lists, per region and
template, how many instances to run, their node types and each node's layer range. Here every
row becomes a `DeployableInstance`: its nodes in layer order, grouped into pipeline stages
(nodes on the same range are the data-parallel nodes of one stage).

How an instance then runs depends on the engine and provisioner:

- torch workers on this machine (`approximate_specs`): the model's real layer count and the
  plan's exact layer split and node mix, but a reduced width and random weights, because
  8B-70B models do not run on a CPU. Every such instance says so in `notes`.
- vLLM (`coral.runtime.vllm`), on cloud nodes through SkyPilot (`coral.runtime.skypilot`).

A row that cannot be read, or that the chosen engine cannot run, becomes a `Refusal` (the
row's name and the reason) instead of failing the whole plan, so that the command line can
list every refused row and deploy the rest when asked to (`--skip-unservable`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from coral.errors import CoralError
from coral.plans.file import PlanFile, PlanRow
from coral.routing import serving_slots
from coral.runtime.config import ModelConfig, PipelineSpec, StageSpec
from coral.runtime.instance import RuntimeInstanceSpec

if TYPE_CHECKING:
    from coral.catalog import Catalog

#: Width of the reduced models that stand in for catalog models on this machine.
APPROX_HIDDEN_SIZE = 64
APPROX_HEAD_DIM = 16
APPROX_MAX_SEQ_LEN = 512


class RuntimeDeploymentError(CoralError, ValueError):
    """A plan (or one of its instances) cannot be deployed as asked."""


@dataclass(frozen=True)
class PlannedNode:
    """One node of an instance and the layers it holds."""

    node_type: str
    first_layer: int
    layers: int
    tp_degree: int = 1
    """GPUs of the node that split each layer (tensor parallel)."""
    batch: int = 1
    """Most sequences per iteration (the template's choice); the data-parallel share."""

    @property
    def end_layer(self) -> int:
        return self.first_layer + self.layers


@dataclass(frozen=True)
class DeployableInstance:
    """`count` identical instances of one template in one region, as the runtime deploys them:
    a plan's row (`coral.plans.file.PlanRow`) with its nodes in layer order."""

    name: str
    """Unique in the plan: `region/template_id`."""
    model: str
    """Catalog model name (also the served model name)."""
    region: str
    count: int
    nodes: tuple[PlannedNode, ...]
    """Nodes holding layers, in layer order."""
    capacity_rps: float = 1.0
    """Requests/s one instance serves (the router weight)."""
    usd_per_hour: float = 0.0
    mode: str = "aggregated"

    def stages(self) -> tuple[tuple[PlannedNode, ...], ...]:
        """Nodes grouped by layer range, in layer order (the nodes come from a
        `PipelineShape`, whose ranges tile [0, L))."""
        return tuple(tuple(group) for _, group in itertools.groupby(
            self.nodes, key=lambda n: (n.first_layer, n.end_layer)))

    @property
    def num_layers(self) -> int:
        return max(n.end_layer for n in self.nodes)

    @property
    def slots(self) -> int:
        """Requests one instance serves at once (`coral.routing.serving_slots`, as the
        simulator reads them): stages x the smallest stage's batch (its nodes' batches
        summed) for an aggregated or decode row; a prefill row's batch counts prompt tokens
        and the prompt length is the plan's SLO, not the row's, so 0 (all in flight queued)."""
        stages = self.stages()
        return serving_slots(self.mode, len(stages) * min(sum(n.batch for n in s) for s in stages))

    @property
    def is_chain(self) -> bool:
        """One node per stage (what vLLM's pipeline parallelism runs)."""
        return all(len(s) == 1 for s in self.stages())

    def describe(self) -> str:
        """`1x-a10g [0,20) -> 1x-t4 [20,32)`; data-parallel nodes joined by `+`."""
        return " -> ".join("+".join(n.node_type for n in s) + f" [{s[0].first_layer},"
                           f"{s[0].end_layer})" for s in self.stages())

    def pipeline(self, model: ModelConfig) -> PipelineSpec:
        """The stages as a runtime pipeline of `model` (which must have the same layers)."""
        if model.num_layers != self.num_layers:
            raise RuntimeDeploymentError(f"instance {self.name}: its nodes cover {self.num_layers} "
                                  f"layers but {model.name} has {model.num_layers}")
        return PipelineSpec(model, tuple(
            StageSpec(s[0].first_layer, s[0].end_layer, tuple(float(n.batch) for n in s),
                      node_type=s[0].node_type)
            for s in self.stages()))


def read_plan(path: str | Path, catalog: Catalog | None = None) -> PlanFile:
    """A plan file written by `coral plan --out`, its bad rows kept aside (`rejected`) for
    `read_instances` to list; a problem of the plan as a whole raises
    `RuntimeDeploymentError`."""
    from coral.plans.errors import PlanFileError
    from coral.plans.file import read_plan as read_plan_file

    try:
        return read_plan_file(path, catalog, skip_bad_rows=True)
    except PlanFileError as exc:
        raise RuntimeDeploymentError(str(exc)) from None


#: Modes of a prefill/decode-disaggregated row (the others are `aggregated`).
PD_MODES = ("prefill", "decode")


@dataclass(frozen=True)
class Refusal:
    """A plan row that is not deployed, and why."""

    instance: str
    """The row's name (`region/template_id`, or `instances[K]` when the row has none)."""
    reason: str
    blocks: bool = True
    """Whether it refuses the plan unless the caller asks to skip unservable rows; False
    for rows an engine leaves out by design (the torch engine's prefill/decode rows)."""
    invalid: bool = False
    """Whether the row is not a valid plan row (`coral.plans.check`), which no
    engine runs, rather than one this engine cannot run."""

    def to_dict(self) -> dict[str, str]:
        return {"instance": self.instance, "reason": self.reason}


@dataclass(frozen=True)
class DeployableRows:
    """A plan's rows that run (`count` >= 1): the readable ones as instances, the others
    refused with the parser's reason."""

    instances: tuple[DeployableInstance, ...]
    refused: tuple[Refusal, ...]

    @property
    def total(self) -> int:
        return len(self.instances) + len(self.refused)


def read_instances(plan: PlanFile | Mapping[str, Any], catalog: Catalog | None = None,
                   source: str = "the plan") -> DeployableRows:
    """Every row of a plan that runs (`count` >= 1), nodes in layer order. A `PlanFile`
    has been checked when read; a plan's JSON object is read here (the plan check of
    `coral.plans.check`, with `catalog` when given; `source` names the file in its
    messages).

    A row the check refuses is refused with every problem found rather than failing the
    plan: which rows a deployment may leave out is the caller's choice. Raises
    `RuntimeDeploymentError` when the plan as a whole is wrong (no list of rows, SLOs,
    more instances than any deployment runs), or it has no row that runs.
    """
    if isinstance(plan, Mapping):
        from coral.plans.errors import PlanFileError

        try:
            plan = PlanFile.from_payload(plan, catalog, source, skip_bad_rows=True)
        except PlanFileError as exc:
            raise RuntimeDeploymentError(str(exc)) from None
    refused = [Refusal(r.name, f"{source}: {'; '.join(map(str, r.problems))}", invalid=True)
               for r in plan.rejected]
    out = [_instance_of(row) for row in plan.instances if row.count >= 1]
    if not out and not refused:
        raise RuntimeDeploymentError("the plan runs no instance")
    return DeployableRows(tuple(out), tuple(refused))


def _instance_of(row: PlanRow) -> DeployableInstance:
    assert row.shape is not None  # a row read from a plan file has its stages
    nodes = tuple(PlannedNode(st.node_type, st.first_layer, st.layers, st.tp_degree, st.batch)
                  for st in row.shape.stages for _ in range(st.count))
    return DeployableInstance(
        name=row.name, model=row.model, region=row.region, count=row.count, nodes=nodes,
        capacity_rps=row.capacity_rps or 1.0, usd_per_hour=row.usd_per_hour, mode=row.mode)


def planned_instances(plan: PlanFile | Mapping[str, Any]) -> tuple[DeployableInstance, ...]:
    """Every row of a plan's 'instances' list, nodes in layer order; a plan with a row that
    cannot be read is refused, naming every such row."""
    rows = read_instances(plan)
    if rows.refused:
        raise RuntimeDeploymentError("; ".join(r.reason for r in rows.refused))
    return rows.instances


# ---------------------------------------------------------------- torch workers, locally
@dataclass(frozen=True)
class ApproximateDeployment:
    """Runtime instances standing in for a plan's on this machine."""

    specs: tuple  # of coral.runtime.controller.InstanceSpec
    notes: tuple[str, ...]
    refused: tuple[Refusal, ...] = ()
    """Rows the torch engine cannot run here, with the reason."""
    left_out: tuple[str, ...] = ()
    """Servable rows not started because of `max_instances`."""

    @property
    def servable(self) -> int:
        return len(self.specs) + len(self.left_out)


def approximate_model(arch, *, hidden_size: int = APPROX_HIDDEN_SIZE,
                      max_seq_len: int = APPROX_MAX_SEQ_LEN, seed: int = 0) -> ModelConfig:
    """A catalog model's real layer count and vocabulary at a reduced width, random weights.

    Attention keeps its shape class (grouped-query when the model's is), with heads of
    `APPROX_HEAD_DIM`; MoE layers become dense.
    """
    if hidden_size % APPROX_HEAD_DIM:
        raise RuntimeDeploymentError(f"approximate width {hidden_size} must be a multiple of "
                              f"{APPROX_HEAD_DIM}")
    heads = hidden_size // APPROX_HEAD_DIM
    group = arch.num_heads // arch.num_kv_heads
    kv_heads = max(1, heads // group)
    while heads % kv_heads:
        kv_heads -= 1
    return ModelConfig(name=arch.name, num_layers=arch.num_layers, hidden_size=hidden_size,
                       ffn_size=hidden_size * 2, num_heads=heads, num_kv_heads=kv_heads,
                       head_dim=APPROX_HEAD_DIM, vocab_size=max(arch.vocab_size, 260),
                       max_seq_len=max_seq_len, tied_embeddings=arch.tied_embeddings, seed=seed)


def approximate_specs(instances: Sequence[DeployableInstance], catalog, *,
                      hidden_size: int = APPROX_HIDDEN_SIZE,
                      max_instances: int | None = None) -> ApproximateDeployment:
    """One local instance per plan row (a row's `count` becomes its weight), each at the
    model's real depth and the plan's layer split, reduced width, random weights.

    Rows it cannot run (prefill/decode rows, a model missing from the catalog, nodes that
    do not cover the model's layers) are refused with the reason. `max_instances` keeps that
    many of the servable rows, every model's largest-capacity rows first.
    """
    refused: list[Refusal] = []
    models: dict[str, ModelConfig] = {}
    notes: list[str] = []
    servable: list[tuple[DeployableInstance, Any]] = []
    for inst in instances:
        if inst.mode != "aggregated":
            refused.append(Refusal(inst.name, (
                f"a {inst.mode} instance of {inst.model}; the torch engine serves aggregated "
                "instances only (prefill/decode pairs need a KV transfer between instances, "
                "which it does not have)" if inst.mode in PD_MODES
                else f"an instance of {inst.model} with an unknown mode '{inst.mode}'"),
                blocks=inst.mode not in PD_MODES))
            continue
        arch = catalog.models.get(inst.model)
        if arch is None:
            refused.append(Refusal(inst.name, (
                f"instance {inst.name}: model '{inst.model}' is not in the catalog; to fix: "
                "pass the catalog the plan was made with (--catalog FILE)")))
            continue
        model = models.get(inst.model) or approximate_model(arch, hidden_size=hidden_size)
        try:
            pipeline = inst.pipeline(model)
        except RuntimeDeploymentError as exc:
            refused.append(Refusal(inst.name, str(exc)))
            continue
        if inst.model not in models:
            models[inst.model] = model
            notes.append(
                f"approximate: {inst.model} runs its real {arch.num_layers} layers and "
                f"{arch.vocab_size}-token vocabulary but at width {model.hidden_size} instead "
                f"of {arch.hidden_size}, with random weights: the plan's topology (layer "
                "split, node mix, routing weights) is real, the text is noise")
        servable.append((inst, pipeline))
    rows = [i for i, _ in servable]
    if max_instances is not None and len(rows) > max_instances:
        by_model: dict[str, list[DeployableInstance]] = {}
        for i in sorted(rows, key=lambda i: -i.capacity_rps * i.count):
            by_model.setdefault(i.model, []).append(i)
        kept: list[DeployableInstance] = []
        while len(kept) < max_instances:  # round robin over models
            for queue in by_model.values():
                if queue and len(kept) < max_instances:
                    kept.append(queue.pop(0))
        notes.append(f"running {len(kept)} of the plan's {len(rows)} servable instance rows "
                     f"(--max-instances {max_instances})")
        rows = [i for i in rows if i in kept]
    running = {i.name for i in rows}
    specs = []
    for inst, pipeline in servable:
        if inst.name not in running:
            continue
        specs.append(RuntimeInstanceSpec(inst.name, pipeline, inst.capacity_rps * inst.count,
                                         slots=inst.slots * inst.count))
        if inst.count > 1:
            notes.append(f"{inst.name}: the plan's {inst.count} copies run as one local "
                         f"instance with {inst.count}x its weight")
    left_out = tuple(i.name for i, _ in servable if i.name not in running)
    return ApproximateDeployment(tuple(specs), tuple(notes), tuple(refused), left_out)
