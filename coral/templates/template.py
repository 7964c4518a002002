"""A serving template: one model on one node multiset, and what it delivers.

`Template` is what every layer above reads (libraries on disk, the allocator's columns, the
baselines, the plan file); it lives apart from the solvers that make it so that the library
store and the solvers' process pools can read it without importing the solvers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from coral.catalog.loader import Catalog
from coral.catalog.schema import ModelArch
from coral.perf.pipeline import PipelineShape, ShapeError, shape_of
from coral.templates.space.enumerate import Combo
from coral.templates.slo import SloSpec
from coral.templates.types import (
    Mode,
    NodePlacement,
    Placement,
    SolveStatus,
    Topology,
    upper_bound_of,
)

THROUGHPUT_UNITS: Mapping[str, str] = {
    "aggregated": "req/s",
    "decode": "output tokens/s",
    "prefill": "prompt tokens/s",
}


@dataclass(frozen=True)
class TemplateNode:
    """One node of a template: its layer range [first_layer, first_layer + layers)."""

    node_type: str
    first_layer: int
    layers: int
    batch: int
    tp_degree: int
    capacity: float  # the mode's unit per second
    step_s: float
    prefill_s: float
    mem_bytes: float  # including the input embedding on the node holding layer 0


@dataclass(frozen=True)
class Template:
    """A solved serving template of one model on one node multiset."""

    model: str
    slo: SloSpec
    mode: Mode
    topology: Topology
    combo: tuple[str, ...]  # node-type names, sorted
    nodes: tuple[TemplateNode, ...]
    edges: tuple[tuple[int, int, float], ...]  # (from, to, flow); -1 source, -2 sink
    throughput: float  # in `unit`
    unit: str
    throughput_rps: float  # requests/s of the workload mix
    throughput_tokens_per_s: float  # output tokens/s (aggregated, decode), prompt tokens/s (prefill)
    ttft_s: float | None  # predicted: longest prefill path (None in decode mode)
    tpot_s: float | None  # predicted: longest step path (None in prefill mode)
    usd_per_hour: Mapping[str, float]  # region -> $/hour, regions pricing every node type
    status: SolveStatus
    gap: float
    solve_s: float
    method: str
    upper_bound: float  # proven bound on the combination's throughput
    notes: tuple[str, ...] = ()

    @property
    def num_nodes(self) -> int:
        return len(self.combo)

    @property
    def feasible(self) -> bool:
        return self.status is not SolveStatus.INFEASIBLE and self.throughput > 0

    def min_usd_per_hour(self) -> float | None:
        return min(self.usd_per_hour.values()) if self.usd_per_hour else None

    @property
    def shape(self) -> PipelineShape:
        """What one instance of this template deploys (`coral.perf.pipeline`); raises
        `ShapeError` for a placement that is not one pipeline (a `dag` template, or the best
        split into replicas that `coral templates solve` answers with)."""
        return shape_of(self.nodes)

    @property
    def is_pipeline(self) -> bool:
        """Whether the template is one pipeline of stages (deployable as one instance)."""
        try:
            self.shape
        except ShapeError:
            return False
        return True

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "slo": self.slo.model_dump(mode="json"),
            "mode": self.mode,
            "topology": self.topology,
            "combo": list(self.combo),
            "nodes": [vars(n).copy() for n in self.nodes],
            "edges": [list(e) for e in self.edges],
            "throughput": self.throughput,
            "unit": self.unit,
            "throughput_rps": self.throughput_rps,
            "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "usd_per_hour": dict(self.usd_per_hour),
            "status": self.status.value,
            "gap": self.gap,
            "solve_s": self.solve_s,
            "method": self.method,
            "upper_bound": _finite_or_none(self.upper_bound),
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Template":
        ub = d.get("upper_bound")
        return cls(
            model=d["model"],
            slo=SloSpec.parse(d["slo"]),
            mode=d["mode"],
            topology=d["topology"],
            combo=tuple(d["combo"]),
            nodes=tuple(TemplateNode(**n) for n in d["nodes"]),
            edges=tuple((int(u), int(v), float(f)) for u, v, f in d["edges"]),
            throughput=float(d["throughput"]),
            unit=d["unit"],
            throughput_rps=float(d["throughput_rps"]),
            throughput_tokens_per_s=float(d["throughput_tokens_per_s"]),
            ttft_s=d.get("ttft_s"),
            tpot_s=d.get("tpot_s"),
            usd_per_hour=dict(d.get("usd_per_hour", {})),
            status=SolveStatus(d["status"]),
            gap=float(d["gap"]),
            solve_s=float(d["solve_s"]),
            method=d.get("method", "ilp"),
            upper_bound=math.inf if ub is None else float(ub),
            notes=tuple(d.get("notes", ())),
        )


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def combo_prices(catalog: Catalog, combo: Sequence[str]) -> dict[str, float]:
    """$/hour of the whole combination in every region that prices all its node types."""
    prices: dict[str, float] | None = None
    for name in combo:
        node = catalog.node_type(name)
        here = {p.region: p.usd_per_hour for p in node.prices}
        if prices is None:
            prices = dict(here)
        else:
            prices = {r: prices[r] + here[r] for r in prices if r in here}
    return {r: round(v, 6) for r, v in sorted((prices or {}).items())}


def template_from_placement(
    arch: ModelArch,
    combo: Combo,
    slo: SloSpec,
    mode: Mode,
    topology: Topology,
    first_stage_extra_bytes: float,
    placement: Placement,
    catalog: Catalog,
    *,
    solve_s: float | None = None,
) -> Template:
    """`placement` as a template; the node holding layer 0 also holds the input embedding
    (`first_stage_extra_bytes`), which its memory figure counts."""
    nodes: list[TemplateNode] = []
    for i, np_ in enumerate(placement.nodes):
        assert isinstance(np_, NodePlacement)
        node_t = catalog.node_type(np_.node_type)
        extra = first_stage_extra_bytes if (np_.layers > 0 and np_.first_layer == 0) else 0.0
        nodes.append(
            TemplateNode(
                node_type=np_.node_type,
                first_layer=int(np_.first_layer),
                layers=int(np_.layers),
                batch=int(np_.batch),
                tp_degree=int(np_.tp_degree or node_t.gpu_count),
                capacity=float(np_.capacity),
                step_s=float(np_.step_s),
                prefill_s=float(np_.prefill_s),
                mem_bytes=float(np_.mem_bytes) + extra,
            )
        )
    thr = float(placement.throughput)
    I, O = slo.input_tokens, slo.output_tokens
    if mode == "aggregated":
        rps, tps = thr, thr * O
    elif mode == "decode":
        rps, tps = thr / O, thr
    else:
        rps, tps = thr / I, thr
    feasible = placement.status is not SolveStatus.INFEASIBLE and thr > 0
    return Template(
        model=arch.name,
        slo=slo,
        mode=mode,
        topology=topology,
        combo=combo,
        nodes=tuple(nodes),
        edges=tuple((int(u), int(v), float(f)) for u, v, f in placement.edges),
        throughput=thr,
        unit=THROUGHPUT_UNITS[mode],
        throughput_rps=rps,
        throughput_tokens_per_s=tps,
        ttft_s=placement.predicted_ttft_s if feasible and mode != "decode" else None,
        tpot_s=placement.predicted_tpot_s if feasible and mode != "prefill" else None,
        usd_per_hour=combo_prices(catalog, combo),
        status=placement.status,
        gap=float(placement.gap),
        solve_s=float(placement.solve_s if solve_s is None else solve_s),
        method=placement.method,
        upper_bound=upper_bound_of(thr, placement.status, float(placement.gap)),
        notes=tuple(placement.notes),
    )


def infeasible_template(
    arch: ModelArch,
    combo: Combo,
    slo: SloSpec,
    mode: Mode,
    topology: Topology,
    catalog: Catalog,
    note: str,
) -> Template:
    return Template(
        model=arch.name, slo=slo, mode=mode, topology=topology, combo=combo, nodes=(), edges=(),
        throughput=0.0, unit=THROUGHPUT_UNITS[mode], throughput_rps=0.0,
        throughput_tokens_per_s=0.0, ttft_s=None, tpot_s=None,
        usd_per_hour=combo_prices(catalog, combo), status=SolveStatus.INFEASIBLE, gap=0.0,
        solve_s=0.0, method="presolve", upper_bound=0.0, notes=(note,),
    )


