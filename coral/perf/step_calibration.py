"""Closed-loop calibration: a node type's efficiencies from the step times a runtime measured.

The runtime's /metrics carry, per worker, sums of its measured step times by step kind and
size (`coral.runtime.step_times`). Each such group's mean step is predicted by the perf model
on the node type the worker runs (its layers, first/last-stage extras and per-iteration
overhead included); the worker's scale is measured / predicted over all its steps (time-
weighted), and a node type's is pooled over its workers. The efficiencies that reproduce a
scale s are the node type's current ones with every rate divided by s (eta_compute,
eta_memory, eta_elementwise) and the per-kernel time times s: a uniform slowdown, the one
thing step times of a running pipeline pin down without a profile of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

from coral.errors import CoralError
from coral.perf.efficiencies import Efficiencies
from coral.perf.model import PerfModel


class StepCalibrationError(CoralError, ValueError):
    """Step metrics that cannot be calibrated as given (the message says why)."""


@dataclass(frozen=True)
class NodeScale:
    """One worker (or a node type's workers pooled): measured against predicted seconds."""

    name: str
    node_type: str
    steps: float
    measured_s: float
    predicted_s: float

    @property
    def scale(self) -> float:
        return self.measured_s / self.predicted_s


def _predicted(perf: PerfModel, model: str, node_type: str, row: Any) -> float:
    p, b, c = row.mean_shape()
    layers = min(row.layers, perf.catalog.model(model).num_layers)
    return row.steps * perf.iteration_seconds(
        model, node_type, layers, p, b, c, first_stage=row.stage == 0,
        last_stage=row.stage == row.stages - 1)


def node_scales(rows: Iterable[Any], perf: PerfModel, *, node_type: str | None = None,
                model: str | None = None) -> list[NodeScale]:
    """Per worker: its steps' measured and predicted seconds (`rows`: `StepRow`s).

    `node_type`/`model` override the rows' labels (a runtime that does not know them, e.g. the
    CPU workers of `coral serve --tiny`, leaves them empty)."""
    by_node: dict[str, list[float]] = {}
    types: dict[str, str] = {}
    for row in rows:
        nt = node_type or row.node_type
        m = model or row.model
        if not nt:
            raise StepCalibrationError(
                f"worker {row.node}: the metrics name no node type; give --node-type")
        if m not in perf.catalog.models:
            raise StepCalibrationError(
                f"model {m!r} of worker {row.node} is not in the catalog; add it with "
                "--catalog FILE or name one with --model")
        if nt not in perf.catalog.node_types:
            raise StepCalibrationError(f"node type {nt!r} is not in the catalog")
        acc = by_node.setdefault(row.node, [0.0, 0.0, 0.0])
        acc[0] += row.steps
        acc[1] += row.seconds
        acc[2] += _predicted(perf, m, nt, row)
        types[row.node] = nt
    if not by_node:
        raise StepCalibrationError("the metrics hold no coral_stage_step_* samples")
    return [NodeScale(n, types[n], *v) for n, v in sorted(by_node.items())]


def pooled(scales: Sequence[NodeScale]) -> list[NodeScale]:
    """Per node type: its workers' scales pooled (time-weighted)."""
    out: dict[str, list[float]] = {}
    for s in scales:
        acc = out.setdefault(s.node_type, [0.0, 0.0, 0.0])
        acc[0] += s.steps
        acc[1] += s.measured_s
        acc[2] += s.predicted_s
    return [NodeScale(nt, nt, *v) for nt, v in sorted(out.items())]


def scaled_efficiencies(eff: Efficiencies, scale: float, source: str) -> Efficiencies:
    """`eff` slowed down uniformly by `scale` (rates capped at 1: a scale below 1 beyond what
    the figures allow is reported, not applied in full)."""
    return replace(
        eff,
        eta_compute=min(1.0, eff.eta_compute / scale),
        eta_memory=min(1.0, eff.eta_memory / scale),
        eta_elementwise=min(1.0, eff.eta_elementwise / scale),
        kernel_overhead_s=eff.kernel_overhead_s * scale,
        fitted_on=f"{eff.fitted_on}; x{scale:.3f} from measured step times ({source})",
        borrowed_from=None,
    )
