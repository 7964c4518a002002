"""A Llama-style decoder in torch, split into pipeline stages, with a KV cache per request.

Weights are random, drawn from a generator seeded by (model seed, layer index), so any stage holds
bit-for-bit the layers the whole model holds. Each request's tokens are processed with its own
cache, one request at a time within a batch: exact and deterministic (the same arithmetic whatever
the split or the batch), at the price of not fusing requests into one matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import nn

from coral.runtime.config import ModelConfig
from coral.runtime.messages import TokenResult, WorkItem

#: Seed offsets of the non-layer weights, far from any layer index.
_EMBED_SEED = 1_000_003
_HEAD_SEED = 2_000_003


def _generator(config: ModelConfig, offset: int) -> torch.Generator:
    return torch.Generator().manual_seed(config.seed * 10_000_019 + offset)


def _linear(gen: torch.Generator, in_features: int, out_features: int) -> nn.Linear:
    layer = nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_features, in_features, generator=gen)
                           / math.sqrt(in_features))
    return layer


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
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
    def __init__(self, config: ModelConfig, index: int):
        super().__init__()
        gen = _generator(config, index)
        h, d = config.hidden_size, config.head_dim
        self.config = config
        self.attn_norm = RMSNorm(h, config.norm_eps)
        self.q_proj = _linear(gen, h, config.num_heads * d)
        self.k_proj = _linear(gen, h, config.num_kv_heads * d)
        self.v_proj = _linear(gen, h, config.num_kv_heads * d)
        self.o_proj = _linear(gen, config.num_heads * d, h)
        self.mlp_norm = RMSNorm(h, config.norm_eps)
        self.gate_proj = _linear(gen, h, config.ffn_size)
        self.up_proj = _linear(gen, h, config.ffn_size)
        self.down_proj = _linear(gen, config.ffn_size, h)

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
        """`device` is a torch device ("cpu", "cuda:0"); weights are drawn on the CPU (so they
        are the same everywhere) and then moved."""
        if not 0 <= first_layer < end_layer <= config.num_layers:
            raise ValueError(f"layer range [{first_layer}, {end_layer}) is not within "
                             f"[0, {config.num_layers}) of {config.name}")
        self.config = config
        self.first_layer, self.end_layer = first_layer, end_layer
        self.is_first, self.is_last = first_layer == 0, end_layer == config.num_layers
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(first_layer, end_layer))
        embed_gen = _generator(config, _EMBED_SEED)
        needs_embed = self.is_first or (self.is_last and config.tied_embeddings)
        self.embed = (torch.randn(config.vocab_size, config.hidden_size, generator=embed_gen)
                      if needs_embed else None)
        if self.is_last:
            self.norm = RMSNorm(config.hidden_size, config.norm_eps)
            self.lm_head = (self.embed if config.tied_embeddings else
                            torch.randn(config.vocab_size, config.hidden_size,
                                        generator=_generator(config, _HEAD_SEED))
                            / math.sqrt(config.hidden_size))
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
