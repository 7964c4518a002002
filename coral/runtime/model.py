"""A Llama-style decoder in torch, split into pipeline stages, with a KV cache per request.

Its layers are `coral.perf.torch_layers.DecoderLayer`, the layer `coral profile` times.

Weights come from a `WeightSource`: random ones drawn from a generator seeded by (model seed,
layer index), or a real checkpoint (a GGUF file, read tensor by tensor). Either way a stage
builds exactly its own layers from the same source, so any split holds bit-for-bit the weights
of the whole model. A step's decode tokens (one per running request) go through each layer's
matmuls together, as one batch, the way the step model (`coral.perf.step`) and the profiler
time a decode batch; each request's attention reads its own cache. Prompt chunks run request
by request (a prompt's tokens already make a matmul of many rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np
import torch
from torch import nn

import torch.nn.functional as F

from coral.perf.torch_layers import (
    LAYER_TENSORS,  # noqa: F401 - the names a WeightSource keys its tensors by
    DecoderLayer,
    DecoderShape,
    LayerCache,
    RMSNorm,
    rope_tables,
)
from coral.runtime.config import ModelConfig
from coral.runtime.messages import TokenResult, WorkItem

#: Seed offsets of the non-layer weights, far from any layer index.
_EMBED_SEED = 1_000_003
_HEAD_SEED = 2_000_003


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


def decoder_shape(config: ModelConfig) -> DecoderShape:
    return DecoderShape(config.hidden_size, config.num_heads, config.num_kv_heads,
                        config.head_dim, config.ffn_size, gated_mlp=True,
                        norm_eps=config.norm_eps, rope_theta=config.rope_theta)


def decoder_layer(config: ModelConfig, tensors: dict[str, torch.Tensor]) -> DecoderLayer:
    """Decoder layer of `config` holding `tensors` (keyed by `LAYER_TENSORS`)."""
    try:
        return DecoderLayer(decoder_shape(config), "cpu", torch.float32, tensors=tensors)
    except ValueError as exc:
        raise ValueError(f"{config.name}: {exc}") from None


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
        self.layers = nn.ModuleList(decoder_layer(config, source.layer(i))
                                    for i in range(first_layer, end_layer))
        self.embed = source.embedding() if self.is_first else None
        if self.is_last:
            self.norm = RMSNorm(config.hidden_size, torch.device("cpu"), torch.float32,
                                config.norm_eps, source.final_norm())
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
        """Run each item through the stage: activations out, or sampled tokens on the last.
        Decode items (one token of a request whose cache holds its earlier tokens) run as
        one batch; outputs keep the items' order."""
        out: list = [None] * len(items)
        decode: list[int] = []
        for n, item in enumerate(items):
            if item.release:
                self.release(item.request_id)
                if not self.is_last:
                    out[n] = item
            elif item.step > 0 and len(item.token_ids) == 1:
                decode.append(n)
            else:
                out[n] = self._forward_one(item)
        if decode:
            for n, res in zip(decode, self._decode([items[n] for n in decode])):
                out[n] = res
        return [o for o in out if o is not None]

    def _decode(self, items: Sequence[WorkItem]) -> list[WorkItem] | list[TokenResult]:
        """One new token of each item's request, the requests' rows batched in every matmul."""
        caches = []
        for item in items:
            cache = self.caches.get(item.request_id)
            length = 0 if cache is None else cache.length
            if cache is None or length != item.start_pos:
                raise ValueError(f"request {item.request_id}: chunk starts at {item.start_pos} "
                                 f"but the stage's cache holds {length} tokens")
            if item.start_pos + 1 > self.config.max_seq_len:
                raise ValueError(f"request {item.request_id} reaches {item.start_pos + 1} "
                                 f"tokens, more than max_seq_len ({self.config.max_seq_len})")
            caches.append(cache)
        if self.is_first:
            x = self.embed[torch.tensor([i.token_ids[0] for i in items], dtype=torch.long,
                                        device=self.device)]
        else:
            assert all(i.hidden is not None for i in items), "a later stage needs activations"
            x = torch.from_numpy(np.concatenate([i.hidden for i in items])).to(self.device)
        positions = torch.tensor([i.start_pos for i in items], device=self.device)
        for li, layer in enumerate(self.layers):
            x = decode_rows(layer, x, positions, [c.layers[li] for c in caches])
        if not self.is_last:
            hidden = x.cpu().numpy().astype(np.float32, copy=False)
            return [WorkItem(i.request_id, i.start_pos, i.token_ids, i.sampling, i.step,
                             hidden=hidden[j:j + 1]) for j, i in enumerate(items)]
        logits = self.norm(x) @ self.lm_head.T
        return [TokenResult(i.request_id, i.step, sample(logits[j], i))
                for j, i in enumerate(items)]

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
        if item.step < 0:  # a prompt chunk before the last: its KV is cached, nothing to sample
            return TokenResult(item.request_id, item.step, -1)
        logits = self.norm(x[-1]) @ self.lm_head.T
        return TokenResult(item.request_id, item.step, sample(logits, item))


def decode_rows(layer: DecoderLayer, x: torch.Tensor, positions: torch.Tensor,
                caches: Sequence[LayerCache]) -> torch.Tensor:
    """One decode token per request through `layer`: x is [B, hidden], row j the token at
    `positions[j]` of the request whose cache is `caches[j]` (its keys and values are
    appended). Projections and MLP take all B rows at once; attention runs per request, over
    its own cache (contexts differ in length)."""
    cos, sin = rope_tables(positions, layer.head_dim, x.dtype, layer.rope_theta)
    q, k, v = layer._qkv(x, cos, sin)  # [B, H, d], [B, KV, d], [B, KV, d]
    kv_heads, d = layer.num_kv_heads, layer.head_dim
    g = layer.num_heads // kv_heads
    attn = []
    for j, cache in enumerate(caches):
        keys, values = cache.append(k[j][:, None], v[j][:, None])  # [KV, S, d]
        # the G query heads that share a KV head act as G queries of that head
        attn.append(F.scaled_dot_product_attention(q[j].view(kv_heads, g, d), keys, values)
                    .reshape(-1))
    return layer._finish(x, torch.stack(attn))


def sample(logits: torch.Tensor, item: WorkItem) -> int:
    """Greedy at temperature 0, else a draw seeded by (request seed, step): reproducible."""
    temperature = item.sampling.temperature
    if temperature <= 0:
        return int(torch.argmax(logits))
    gen = torch.Generator().manual_seed(item.sampling.seed * 1_000_003 + item.step)
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)  # CPU generator
    return int(torch.multinomial(probs, 1, generator=gen))
