"""Built-in deployments: the tiny random-weight model behind the gateway."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from coral.runtime.config import ModelConfig, PipelineSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TinyDeployment:
    """A tiny Llama-style model with random weights, split into pipeline stages."""

    num_stages: int = 3
    """Pipeline stages, one worker process each."""
    num_layers: int = 6
    """Decoder layers of the tiny model."""
    seed: int = 0
    """Seed of the random weights."""
    in_process: bool = False
    """Run the stages in the gateway's process instead of ZeroMQ worker processes."""

    def spec(self) -> PipelineSpec:
        return PipelineSpec.even(ModelConfig(num_layers=self.num_layers, seed=self.seed),
                                 self.num_stages)


def start_tiny(deployment: TinyDeployment):
    """Start the executor and engine; returns (engine, backend). Call `engine.stop()` after."""
    import torch

    from coral.runtime.backends import EngineBackend
    from coral.runtime.engine import Engine
    from coral.runtime.pipeline import LocalPipeline

    torch.set_num_threads(1)  # tiny matmuls: threads only add contention
    spec = deployment.spec()
    if deployment.in_process:
        executor = LocalPipeline(spec)
    else:
        from coral.runtime.worker import ZmqPipeline

        executor = ZmqPipeline(spec)
        log.info("workers %s up", ", ".join(executor.node_ids))
    engine = Engine(executor, max_seq_len=spec.model.max_seq_len)
    engine.start()
    return engine, EngineBackend(engine)


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
