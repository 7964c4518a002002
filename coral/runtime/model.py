"""A Llama-style decoder in torch, split into pipeline stages, with a KV cache per request.

Weights come from a `WeightSource`: random ones drawn from a generator seeded by (model seed,
layer index), or a real checkpoint (a GGUF file, read tensor by tensor). Either way a stage
builds exactly its own layers from the same source, so any split holds bit-for-bit the weights
of the whole model. Each request's tokens are processed with its own cache, one request at a
time within a batch: exact and deterministic (the same arithmetic whatever the split or the
batch), at the price of not fusing requests into one matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np
import torch
from torch import nn

from coral.runtime.config import ModelConfig
from coral.runtime.messages import TokenResult, WorkItem

#: Seed offsets of the non-layer weights, far from any layer index.
_EMBED_SEED = 1_000_003
_HEAD_SEED = 2_000_003

#: Names of one decoder layer's tensors (linear weights are (out_features, in_features)).
LAYER_TENSORS = ("attn_norm", "q_proj", "k_proj", "v_proj", "o_proj", "mlp_norm", "gate_proj",
                 "up_proj", "down_proj")


class WeightSource(Protocol):
    """Where a stage's tensors come from; every tensor is float32 on the CPU."""

    def layer(self, index: int) -> dict[str, torch.Tensor]:
        """The tensors of decoder layer `index`, keyed by `LAYER_TENSORS`."""

    def embedding(self) -> torch.Tensor:
        """(vocab_size, hidden_size) input embedding."""

    def final_norm(self) -> torch.Tensor:
        """(hidden_size,) weight of the norm before the LM head."""

    def lm_head(self) -> torch.Tensor:
        """(vocab_size, hidden_size) output projection."""


def _generator(config: ModelConfig, offset: int) -> torch.Generator:
    return torch.Generator().manual_seed(config.seed * 10_000_019 + offset)


class RandomWeights:
    """Random weights: each layer's depend only on (seed, layer index)."""

    def __init__(self, config: ModelConfig):
        self.config = config

    def layer(self, index: int) -> dict[str, torch.Tensor]:
        c = self.config
        gen = _generator(c, index)
        h, d = c.hidden_size, c.head_dim

        def linear(in_features: int, out_features: int) -> torch.Tensor:
            return torch.randn(out_features, in_features, generator=gen) / math.sqrt(in_features)

        return {
            "attn_norm": torch.ones(h),
            "q_proj": linear(h, c.num_heads * d),
            "k_proj": linear(h, c.num_kv_heads * d),
            "v_proj": linear(h, c.num_kv_heads * d),
            "o_proj": linear(c.num_heads * d, h),
            "mlp_norm": torch.ones(h),
            "gate_proj": linear(h, c.ffn_size),
            "up_proj": linear(h, c.ffn_size),
            "down_proj": linear(c.ffn_size, h),
        }

    def embedding(self) -> torch.Tensor:
        c = self.config
        return torch.randn(c.vocab_size, c.hidden_size, generator=_generator(c, _EMBED_SEED))

    def final_norm(self) -> torch.Tensor:
        return torch.ones(self.config.hidden_size)

    def lm_head(self) -> torch.Tensor:
        c = self.config
        if c.tied_embeddings:
            return self.embedding()
        return (torch.randn(c.vocab_size, c.hidden_size, generator=_generator(c, _HEAD_SEED))
                / math.sqrt(c.hidden_size))


def weight_source(config: ModelConfig) -> WeightSource:
    """The config's checkpoint (`config.weights`), or random weights when it names none."""
    if config.weights is None:
        return RandomWeights(config)
    from coral.runtime.checkpoint import GgufWeights

    return GgufWeights(config)


class _Linear(nn.Module):
    """y = x W^T with a given weight (no bias, no initialisation of its own)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate (tokens, heads, head_dim) by each token's position (half-split convention)."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions.to(torch.float32)[:, None] * freqs[None, :]  # (T, half)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


@dataclass
class LayerCache:
    """Keys and values of one request in one layer, (tokens, kv_heads, head_dim)."""

    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[0]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = k if self.keys is None else torch.cat([self.keys, k])
        self.values = v if self.values is None else torch.cat([self.values, v])
        return self.keys, self.values


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, tensors: dict[str, torch.Tensor]):
        super().__init__()
        c = config
        expected = {
            "attn_norm": (c.hidden_size,), "mlp_norm": (c.hidden_size,),
            "q_proj": (c.num_heads * c.head_dim, c.hidden_size),
            "k_proj": (c.num_kv_heads * c.head_dim, c.hidden_size),
            "v_proj": (c.num_kv_heads * c.head_dim, c.hidden_size),
            "o_proj": (c.hidden_size, c.num_heads * c.head_dim),
            "gate_proj": (c.ffn_size, c.hidden_size), "up_proj": (c.ffn_size, c.hidden_size),
            "down_proj": (c.hidden_size, c.ffn_size),
        }
        for name, shape in expected.items():
            if tuple(tensors[name].shape) != shape:
                raise ValueError(f"{c.name}: tensor {name} has shape "
                                 f"{tuple(tensors[name].shape)}, expected {shape}")
        self.config = config
        self.attn_norm = RMSNorm(tensors["attn_norm"], c.norm_eps)
        self.q_proj = _Linear(tensors["q_proj"])
        self.k_proj = _Linear(tensors["k_proj"])
        self.v_proj = _Linear(tensors["v_proj"])
        self.o_proj = _Linear(tensors["o_proj"])
        self.mlp_norm = RMSNorm(tensors["mlp_norm"], c.norm_eps)
        self.gate_proj = _Linear(tensors["gate_proj"])
        self.up_proj = _Linear(tensors["up_proj"])
        self.down_proj = _Linear(tensors["down_proj"])

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        c = self.config
        t = x.shape[0]
        y = self.attn_norm(x)
        q = apply_rope(self.q_proj(y).view(t, c.num_heads, c.head_dim), positions, c.rope_theta)
        k = apply_rope(self.k_proj(y).view(t, c.num_kv_heads, c.head_dim), positions,
                       c.rope_theta)
        v = self.v_proj(y).view(t, c.num_kv_heads, c.head_dim)
        keys, values = cache.append(k, v)  # (S, kv_heads, head_dim)
        group = c.num_heads // c.num_kv_heads
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # (heads, S, d)
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = q.transpose(0, 1) @ keys.transpose(1, 2) / math.sqrt(c.head_dim)  # (H, T, S)
        key_pos = torch.arange(keys.shape[1], device=x.device)
        mask = key_pos[None, :] > positions[:, None]  # causal: no key after the query
        scores = scores.masked_fill(mask[None], float("-inf"))
        attn = (scores.softmax(-1) @ values).transpose(0, 1).reshape(t, c.num_heads * c.head_dim)
        x = x + self.o_proj(attn)
        y = self.mlp_norm(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(y)) * self.up_proj(y))


@dataclass
class RequestCache:
    layers: list[LayerCache] = field(default_factory=list)

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0


class Stage:
    """Layers [first_layer, end_layer) of a model; embeddings on the first stage, final norm,
    LM head and sampling on the last; a KV cache per request id."""

    def __init__(self, config: ModelConfig, first_layer: int, end_layer: int,
                 device: str = "cpu"):
        """`device` is a torch device ("cpu", "cuda:0"); weights are drawn or read on the CPU
        (so they are the same everywhere) and then moved."""
        if not 0 <= first_layer < end_layer <= config.num_layers:
            raise ValueError(f"layer range [{first_layer}, {end_layer}) is not within "
                             f"[0, {config.num_layers}) of {config.name}")
        self.config = config
        self.first_layer, self.end_layer = first_layer, end_layer
        self.is_first, self.is_last = first_layer == 0, end_layer == config.num_layers
        source = weight_source(config)
        self.layers = nn.ModuleList(DecoderLayer(config, source.layer(i))
                                    for i in range(first_layer, end_layer))
        self.embed = source.embedding() if self.is_first else None
        if self.is_last:
            self.norm = RMSNorm(source.final_norm(), config.norm_eps)
            self.lm_head = (self.embed if config.tied_embeddings and self.embed is not None
                            else source.lm_head())
        self.device = torch.device(device)
        self.layers.to(self.device)
        if self.embed is not None:
            self.embed = self.embed.to(self.device)
        if self.is_last:
            self.norm.to(self.device)
            self.lm_head = self.lm_head.to(self.device)
        self.caches: dict[str, RequestCache] = {}

    def release(self, request_id: str) -> None:
        self.caches.pop(request_id, None)

    @torch.inference_mode()
    def forward(self, items: Sequence[WorkItem]) -> list[WorkItem] | list[TokenResult]:
        """Run each item through the stage: activations out, or sampled tokens on the last."""
        out: list = []
        for item in items:
            if item.release:
                self.release(item.request_id)
                if not self.is_last:
                    out.append(item)
                continue
            out.append(self._forward_one(item))
        return out

    def _forward_one(self, item: WorkItem) -> WorkItem | TokenResult:
        cache = self.caches.setdefault(
            item.request_id, RequestCache([LayerCache() for _ in self.layers]))
        if cache.length != item.start_pos:
            raise ValueError(f"request {item.request_id}: chunk starts at {item.start_pos} but "
                             f"the stage's cache holds {cache.length} tokens")
        n = len(item.token_ids)
        if item.start_pos + n > self.config.max_seq_len:
            raise ValueError(f"request {item.request_id} reaches {item.start_pos + n} tokens, "
                             f"more than max_seq_len ({self.config.max_seq_len})")
        if self.is_first:
            x = self.embed[torch.tensor(item.token_ids, dtype=torch.long, device=self.device)]
        else:
            assert item.hidden is not None, "a later stage needs activations"
            x = torch.from_numpy(item.hidden).to(self.device)
        positions = torch.arange(item.start_pos, item.start_pos + n, device=self.device)
        for layer, layer_cache in zip(self.layers, cache.layers):
            x = layer(x, positions, layer_cache)
        if not self.is_last:
            return WorkItem(item.request_id, item.start_pos, item.token_ids, item.sampling,
                            item.step, hidden=x.cpu().numpy().astype(np.float32, copy=False))
        logits = self.norm(x[-1]) @ self.lm_head.T
        return TokenResult(item.request_id, item.step, sample(logits, item))


def sample(logits: torch.Tensor, item: WorkItem) -> int:
    """Greedy at temperature 0, else a draw seeded by (request seed, step): reproducible."""
    temperature = item.sampling.temperature
    if temperature <= 0:
        return int(torch.argmax(logits))
    gen = torch.Generator().manual_seed(item.sampling.seed * 1_000_003 + item.step)
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)  # CPU generator
    return int(torch.multinomial(probs, 1, generator=gen))
