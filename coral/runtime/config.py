"""Runtime model and deployment configuration (plain data, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from coral.catalog.schema import ModelArch

#: Byte-level tokenizer: ids 0-255 are bytes, then the special tokens below.
BOS_TOKEN_ID = 256
EOS_TOKEN_ID = 257
TINY_VOCAB_SIZE = 260


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder (RMSNorm, RoPE, GQA attention, SwiGLU MLP): its shape, and where
    its weights come from (random, or a checkpoint file)."""

    name: str = "tiny-random"
    """Model name served by the gateway."""
    num_layers: int = 6
    """Decoder layers."""
    hidden_size: int = 64
    """Residual stream width."""
    ffn_size: int = 128
    """SwiGLU intermediate size."""
    num_heads: int = 4
    """Query heads."""
    num_kv_heads: int = 2
    """Key/value heads (GQA); must divide `num_heads`."""
    head_dim: int = 16
    """Width of one attention head."""
    vocab_size: int = TINY_VOCAB_SIZE
    """Vocabulary size (the byte tokenizer needs at least 258)."""
    max_seq_len: int = 512
    """Longest sequence (prompt + generated tokens) one request may reach."""
    rope_theta: float = 10000.0
    """RoPE base."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    tied_embeddings: bool = False
    """LM head shares the input embedding matrix."""
    seed: int = 0
    """Seed of the random weights; each layer's weights depend only on (seed, layer index), so a
    stage built alone holds exactly the weights of the same layers in the whole model."""
    weights: str | None = None
    """GGUF checkpoint holding the real weights (None: random weights from `seed`). Each stage
    reads only its own layers from it."""
    eos_token_ids: tuple[int, ...] = (EOS_TOKEN_ID,)
    """Tokens that end a generation (when the request stops on end of sequence)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "ffn_size", "num_heads", "num_kv_heads",
                     "head_dim", "vocab_size", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be at least 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads "
                             f"({self.num_heads}); to fix: pick a divisor")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        if any(not 0 <= t < self.vocab_size for t in self.eos_token_ids):
            raise ValueError(f"eos_token_ids {self.eos_token_ids} must be token ids below "
                             f"vocab_size ({self.vocab_size})")

    @classmethod
    def from_arch(cls, arch: ModelArch, *, num_layers: int | None = None,
                  max_seq_len: int = 2048, seed: int = 0) -> "ModelConfig":
        """The decoder shape of a catalog model (MoE layers are built dense, with `ffn_size`).

        `num_layers` truncates the model, e.g. for a quick test of a large architecture.
        """
        return cls(
            name=arch.name, num_layers=num_layers or arch.num_layers,
            hidden_size=arch.hidden_size, ffn_size=arch.ffn_size, num_heads=arch.num_heads,
            num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
            vocab_size=max(arch.vocab_size, TINY_VOCAB_SIZE), max_seq_len=max_seq_len,
            tied_embeddings=arch.tied_embeddings, seed=seed,
        )


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage: the layer range [first_layer, end_layer) and its data-parallel nodes."""

    first_layer: int
    end_layer: int
    node_weights: tuple[float, ...] = (1.0,)
    """Routing weight of each data-parallel node of the stage (share of new requests)."""
    node_type: str = ""
    """The catalog node type a plan runs this stage on ("" when none: a local run); the
    measured step times carry it, so that calibration knows what they measured."""

    def __post_init__(self) -> None:
        if not 0 <= self.first_layer < self.end_layer:
            raise ValueError(f"stage layer range [{self.first_layer}, {self.end_layer}) is empty")
        if not self.node_weights or any(w <= 0 for w in self.node_weights):
            raise ValueError(f"node_weights {self.node_weights} must be positive, one per node")


@dataclass(frozen=True)
class PipelineSpec:
    """A model split into contiguous stages covering all its layers."""

    model: ModelConfig
    stages: tuple[StageSpec, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a pipeline needs at least one stage")
        expected = 0
        for i, stage in enumerate(self.stages):
            if stage.first_layer != expected:
                raise ValueError(f"stage {i} starts at layer {stage.first_layer}, expected "
                                 f"{expected}: stages must be contiguous")
            expected = stage.end_layer
        if expected != self.model.num_layers:
            raise ValueError(f"stages end at layer {expected} but {self.model.name} has "
                             f"{self.model.num_layers} layers")

    @classmethod
    def even(cls, model: ModelConfig, num_stages: int,
             nodes_per_stage: tuple[int, ...] | None = None) -> "PipelineSpec":
        """Split `model` into `num_stages` stages of (nearly) equal layer counts."""
        if not 1 <= num_stages <= model.num_layers:
            raise ValueError(f"num_stages ({num_stages}) must be in [1, {model.num_layers}]")
        nodes = nodes_per_stage or (1,) * num_stages
        bounds = [round(i * model.num_layers / num_stages) for i in range(num_stages + 1)]
        return cls(model, tuple(
            StageSpec(bounds[i], bounds[i + 1], (1.0,) * nodes[i]) for i in range(num_stages)))
