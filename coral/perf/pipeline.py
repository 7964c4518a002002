"""The one instance shape every stage of Coral reads and writes.

A template deploys **one pipeline**; a pipeline is a sequence of stages in layer order; a stage
is `count` identical nodes (same node type, same operating point) holding the same contiguous
layer range, sharing its traffic (data parallel inside the stage). Replicas of a pipeline are
separate instances, counted by the allocator. Templates produce this shape, plan files store
it (`stages`), the simulator runs it and the runtime and the engine emitters deploy it: a shape
that one reader would refuse is refused here, where it is built, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence


class ShapeError(ValueError):
    """Nodes or a plan row that do not form one pipeline of stages."""


@dataclass(frozen=True)
class StageShape:
    """`count` identical nodes on layers [first_layer, first_layer + layers)."""

    node_type: str
    count: int
    first_layer: int
    layers: int
    batch: int  # most sequences (prefill: prompt tokens) one node runs per iteration
    tp_degree: int  # GPUs of a node that split each layer (tensor parallel)

    @property
    def end_layer(self) -> int:
        return self.first_layer + self.layers

    def to_dict(self) -> dict[str, Any]:
        return {"node_type": self.node_type, "count": self.count,
                "first_layer": self.first_layer, "layers": self.layers, "batch": self.batch,
                "tp_degree": self.tp_degree}


@dataclass(frozen=True)
class PipelineShape:
    """Stages in layer order, tiling [0, num_layers) without gaps or overlaps."""

    stages: tuple[StageShape, ...]

    def __post_init__(self) -> None:
        if not self.stages:
            raise ShapeError("a pipeline needs at least one stage")
        expect = 0
        for s in self.stages:
            if s.count < 1 or s.layers < 1 or s.batch < 1 or s.tp_degree < 1:
                raise ShapeError(f"stage {s.node_type} [{s.first_layer}, {s.end_layer}): count, "
                                 f"layers, batch and tp_degree must be >= 1 (got {s.count}, "
                                 f"{s.layers}, {s.batch}, {s.tp_degree})")
            if s.first_layer != expect:
                ranges = [(x.first_layer, x.end_layer) for x in self.stages]
                raise ShapeError(f"layer ranges {ranges} do not form one pipeline: a stage "
                                 f"starts at layer {s.first_layer}, expected {expect}")
            expect = s.end_layer

    @property
    def num_layers(self) -> int:
        return self.stages[-1].end_layer

    @property
    def num_nodes(self) -> int:
        return sum(s.count for s in self.stages)

    @property
    def is_chain(self) -> bool:
        """One node per stage (what vLLM's pipeline parallelism runs)."""
        return all(s.count == 1 for s in self.stages)

    def node_types(self) -> tuple[str, ...]:
        """Every node's type, stage by stage."""
        return tuple(s.node_type for s in self.stages for _ in range(s.count))

    def describe(self) -> str:
        """`1x-l4 x2 [0,16) → 1x-a10g [16,32)`."""
        return " → ".join(f"{s.node_type}{f' x{s.count}' if s.count > 1 else ''} "
                          f"[{s.first_layer},{s.end_layer})" for s in self.stages)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.stages]

    @classmethod
    def from_nodes(cls, nodes: Iterable[tuple[str, int, int, int, int]]) -> "PipelineShape":
        """Per-node (node_type, first_layer, layers, batch, tp_degree) as one pipeline.

        Nodes holding no layers are idle and left out. Nodes on the same layer range form a
        stage and must be identical (same node type and batch); the ranges must tile the
        layers from 0 (several pipelines side by side are not one instance).
        """
        groups: dict[tuple[int, int], list[tuple[str, int, int, int, int]]] = {}
        for n in nodes:
            if int(n[2]) > 0:
                groups.setdefault((int(n[1]), int(n[2])), []).append(n)
        if not groups:
            raise ShapeError("no node holds any layer")
        stages = []
        for (first, layers), members in sorted(groups.items()):
            kinds = {(m[0], int(m[3]), int(m[4])) for m in members}
            if len(kinds) > 1:
                raise ShapeError(
                    f"layers [{first}, {first + layers}) are held by different nodes or "
                    f"operating points {sorted(kinds)}; a stage is identical nodes")
            node_type, batch, tp = kinds.pop()
            stages.append(StageShape(node_type, len(members), first, layers, batch, tp))
        return cls(tuple(stages))

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "PipelineShape":
        """The shape of a plan row (`coral plan --out`): its `stages`, or the per-node
        `placement` of plan files written before stages were."""
        if "stages" in row:
            stages = row["stages"]
            if not isinstance(stages, list):
                raise ShapeError("'stages' must be a list")
            out = []
            for k, s in enumerate(stages):
                try:
                    out.append(StageShape(str(s["node_type"]), int(s["count"]),
                                          int(s["first_layer"]), int(s["layers"]),
                                          int(s["batch"]), int(s.get("tp_degree", 1))))
                except (KeyError, TypeError, ValueError) as exc:
                    raise ShapeError(f"stages[{k}] is malformed ({type(exc).__name__}: "
                                     f"{exc})") from None
            return cls(tuple(out))
        placement = row.get("placement")
        if not isinstance(placement, list) or not placement:
            raise ShapeError("the row has no 'stages'; re-plan with a current `coral plan`")
        try:
            nodes = [(str(p["node_type"]), int(p["first_layer"]), int(p["layers"]),
                      max(1, int(p.get("batch", 1))), int(p.get("tp_degree", 1)))
                     for p in placement]
        except (KeyError, TypeError, ValueError) as exc:
            raise ShapeError(f"'placement' is malformed ({type(exc).__name__}: {exc})") from None
        return cls.from_nodes(nodes)


def shape_of(nodes: Sequence[Any]) -> PipelineShape:
    """The shape of a template's nodes (objects with node_type, first_layer, layers, batch,
    tp_degree)."""
    return PipelineShape.from_nodes(
        (n.node_type, n.first_layer, n.layers, n.batch, n.tp_degree) for n in nodes)
