"""Measured per-stage step times: what each worker spent on each step, for /metrics.

A worker times its stage's forward pass of every step and reports it with the step's shape
(`coral.runtime.messages.StageTiming`): prompt tokens, decode sequences and their context.
The driver folds them into sums per (node, step kind, size bucket), the form Prometheus
counters take, and the gateway exposes them as `coral_stage_step_*_total` with the node's
stage and layer range as labels. `coral perf calibrate --from-metrics` reads them back
(`parse_step_metrics`) and fits a node type's efficiencies.

Sizes are bucketed by powers of two of the step's tokens (prompt tokens plus decode
sequences), so a bucket's mean shape stands for its steps: the perf model's time is nearly
linear within a factor of two.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence

#: Environment variable of the test hook that slows workers down: "NODE=FACTOR,..." makes
#: each listed worker sleep (FACTOR - 1) x its measured forward time after every step, so a
#: known slowdown can be injected and recovered from the metrics.
INJECT_SLOWDOWN_ENV = "CORAL_INJECT_SLOWDOWN"

#: Metric names and what each sums.
METRICS = (
    ("coral_stage_steps_total", "steps", "Steps a worker ran, by step kind and size."),
    ("coral_stage_step_seconds_total", "seconds", "Seconds a worker spent in its steps' forward."),
    ("coral_stage_step_prefill_tokens_total", "prefill_tokens", "Prompt tokens in the steps."),
    ("coral_stage_step_decode_sequences_total", "decode_batch", "Decode sequences in the steps."),
    ("coral_stage_step_context_tokens_total", "context_tokens",
     "Context tokens of the steps' decode sequences."),
)
LABELS = ("model", "node", "node_type", "stage", "stages", "first_layer", "layers", "kind",
          "bucket")


def injected_slowdown(node_id: str, env: Mapping[str, str] | None = None) -> float:
    """The slowdown factor the test hook gives `node_id` (1.0: none)."""
    text = (env if env is not None else os.environ).get(INJECT_SLOWDOWN_ENV, "")
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() == node_id and value.strip():
            return float(value)
    return 1.0


def step_kind(prefill_tokens: int, decode_batch: int) -> str:
    if prefill_tokens and decode_batch:
        return "mixed"
    return "prefill" if prefill_tokens else "decode"


def size_bucket(prefill_tokens: int, decode_batch: int) -> int:
    """Smallest power of two at least the step's tokens."""
    n = max(1, prefill_tokens + decode_batch)
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class StepRow:
    """Sums over the steps of one (node, kind, bucket)."""

    model: str
    node: str
    node_type: str
    stage: int
    stages: int
    first_layer: int
    layers: int
    kind: str
    bucket: int
    steps: float
    seconds: float
    prefill_tokens: float
    decode_batch: float
    context_tokens: float

    def mean_shape(self) -> tuple[int, int, int]:
        """(prefill tokens, decode batch, context tokens) of the bucket's mean step."""
        n = max(self.steps, 1.0)
        p = int(round(self.prefill_tokens / n))
        b = int(round(self.decode_batch / n))
        c = max(b, int(round(self.context_tokens / n)))
        if not p and not b:
            p = 1
        return p, b, c


class StepTimes:
    """Thread-safe sums of one pipeline's measured step times."""

    def __init__(self, model: str, stages: Sequence[tuple[int, int]],
                 node_type: str | Sequence[str] = ""):
        self.model = model
        self.stages = tuple(stages)  # (first layer, end layer) per stage
        # one node type for every stage, or one per stage
        self.node_types = ((node_type,) * len(self.stages) if isinstance(node_type, str)
                           else tuple(node_type))
        if len(self.node_types) != len(self.stages):
            raise ValueError(f"{len(self.node_types)} node types for {len(self.stages)} stages")
        self._lock = threading.Lock()
        self._sums: dict[tuple[str, int, str, int], list[float]] = {}

    def record(self, node_id: str, stage: int, prefill_tokens: int, decode_batch: int,
               context_tokens: int, seconds: float) -> None:
        key = (node_id, stage, step_kind(prefill_tokens, decode_batch),
               size_bucket(prefill_tokens, decode_batch))
        with self._lock:
            s = self._sums.setdefault(key, [0.0, 0.0, 0.0, 0.0, 0.0])
            s[0] += 1
            s[1] += seconds
            s[2] += prefill_tokens
            s[3] += decode_batch
            s[4] += context_tokens

    def rows(self) -> list[StepRow]:
        with self._lock:
            items = sorted(self._sums.items())
        out = []
        for (node, stage, kind, bucket), (n, sec, p, b, c) in items:
            first, end = self.stages[stage]
            out.append(StepRow(self.model, node, self.node_types[stage], stage, len(self.stages),
                               first, end - first, kind, bucket, n, sec, p, b, c))
        return out


def families(rows: Iterable[StepRow]) -> Iterator[object]:
    """Prometheus counter families of `rows`."""
    from prometheus_client.core import CounterMetricFamily

    rows = list(rows)
    for name, field, help_ in METRICS:
        family = CounterMetricFamily(name.removesuffix("_total"), help_, labels=list(LABELS))
        for r in rows:
            family.add_metric([str(getattr(r, label)) for label in LABELS], getattr(r, field))
        yield family


def parse_step_metrics(text: str) -> list[StepRow]:
    """The step rows of a /metrics text (other metrics are ignored)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {name.removesuffix("_total"): field for name, field, _ in METRICS}
    sums: dict[tuple[str, ...], dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        field = wanted.get(family.name)
        if field is None:
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            key = tuple(sample.labels.get(label, "") for label in LABELS)
            sums.setdefault(key, {})[field] = sample.value
    rows = []
    for key, v in sorted(sums.items()):
        lab = dict(zip(LABELS, key))
        rows.append(StepRow(
            lab["model"], lab["node"], lab["node_type"], int(lab["stage"]), int(lab["stages"]),
            int(lab["first_layer"]), int(lab["layers"]), lab["kind"], int(lab["bucket"]),
            v.get("steps", 0.0), v.get("seconds", 0.0), v.get("prefill_tokens", 0.0),
            v.get("decode_batch", 0.0), v.get("context_tokens", 0.0)))
    return [r for r in rows if r.steps > 0]
