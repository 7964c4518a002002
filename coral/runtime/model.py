"""A Llama-style decoder in torch, split into pipeline stages, with a KV cache per request.

Its layers are `coral.perf.torch_layers.DecoderLayer`, the layer `coral profile` times.

Weights come from a `WeightSource`: random ones drawn from a generator seeded by (model seed,
layer index), or a real checkpoint (a GGUF file, read tensor by tensor). Either way a stage
builds exactly its own layers from the same source, so any split holds bit-for-bit the weights
of the whole model. A step's tokens (its prompt chunks and one decode token per running
request) go through each layer's matmuls together, as one batch, the way a serving engine runs
a step and the step model (`coral.perf.step`) costs it; each request's attention reads its own
cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np
import torch
from torch import nn

from coral.perf.torch_layers import (
    LAYER_TENSORS,  # noqa: F401 - the names a WeightSource keys its tensors by
    DecoderLayer,
    DecoderShape,
    LayerCache,
    RMSNorm,
    project,
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
        """Run each item through the stage: activations out, or sampled tokens on the last
        (none for a prompt chunk before its last: `PROMPT_CHUNK_STEP`). Every item's tokens
        go through the projections and the MLP as one batch (prompt chunks and decode tokens
        fused, as a serving engine runs a step and the perf model costs it); attention runs
        per request, over its own cache. Outputs keep the items' order."""
        out: list = [None] * len(items)
        work: list[int] = []
        for n, item in enumerate(items):
            if item.release:
                self.release(item.request_id)
                if not self.is_last:
                    out[n] = item
            else:
                work.append(n)
        if work:
            for n, res in zip(work, self._run([items[n] for n in work])):
                out[n] = res
        return [o for o in out if o is not None]

    def _cache_for(self, item: WorkItem) -> RequestCache:
        """The request's KV cache, checked to end where the item's chunk starts (a prompt's
        first chunk starts one)."""
        cache = self.caches.get(item.request_id)
        length = 0 if cache is None else cache.length
        if length != item.start_pos:
            raise ValueError(f"request {item.request_id}: chunk starts at {item.start_pos} "
                             f"but the stage's cache holds {length} tokens")
        end = item.start_pos + len(item.token_ids)
        if end > self.config.max_seq_len:
            raise ValueError(f"request {item.request_id} reaches {end} tokens, more than "
                             f"max_seq_len ({self.config.max_seq_len})")
        if cache is None:
            cache = self.caches[item.request_id] = RequestCache(
                [LayerCache() for _ in self.layers])
        return cache

    def _run(self, items: Sequence[WorkItem]) -> list[WorkItem] | list[TokenResult]:
        """Every item's chunk (a prompt or a part of one, or one decode token), all rows
        batched in every matmul."""
        if len({i.request_id for i in items}) != len(items):
            raise ValueError("a step holds at most one chunk of each request")
        caches = [self._cache_for(i) for i in items]
        bounds = [0]
        for i in items:
            bounds.append(bounds[-1] + len(i.token_ids))
        if self.is_first:
            ids = [t for i in items for t in i.token_ids]
            x = self.embed[torch.tensor(ids, dtype=torch.long, device=self.device)]
        else:
            assert all(i.hidden is not None for i in items), "a later stage needs activations"
            x = torch.from_numpy(np.concatenate([i.hidden for i in items])).to(self.device)
        positions = torch.cat([torch.arange(i.start_pos, i.start_pos + len(i.token_ids))
                               for i in items]).to(self.device)
        first = self.layers[0]
        cos, sin = rope_tables(positions, first.head_dim, x.dtype, first.rope_theta)
        spans = list(zip(bounds, bounds[1:]))
        for li, layer in enumerate(self.layers):
            q, k, v = layer._qkv(x, cos, sin)
            attn = [layer.attend(q[a:b], k[a:b], v[a:b], positions[a:b], c.layers[li])
                    for (a, b), c in zip(spans, caches)]
            x = layer._finish(x, attn[0] if len(attn) == 1 else torch.cat(attn))
        if not self.is_last:
            hidden = x.cpu().numpy().astype(np.float32, copy=False)
            return [WorkItem(i.request_id, i.start_pos, i.token_ids, i.sampling, i.step,
                             hidden=hidden[a:b]) for i, (a, b) in zip(items, spans)]
        # one row of logits per item that samples: its chunk's last token
        rows = [(j, b - 1) for j, (i, (_, b)) in enumerate(zip(items, spans)) if i.step >= 0]
        out = [TokenResult(i.request_id, i.step, -1) for i in items]
        if rows:
            logits = project(self.norm(x[[r for _, r in rows]]), self.lm_head)
            for k, (j, _) in enumerate(rows):
                try:
                    token = sample(logits[k], items[j])
                except Exception as exc:  # noqa: BLE001 - that request fails, not the step
                    out[j] = TokenResult(items[j].request_id, items[j].step, -1,
                                         error=f"sampling failed: {type(exc).__name__}: {exc}")
                    continue
                out[j] = TokenResult(items[j].request_id, items[j].step, token)
        return out


#: Below this temperature a draw is greedy: dividing logits by it would overflow (inf/NaN
#: probabilities), and the distribution is the argmax's anyway.
MIN_TEMPERATURE = 1e-5
#: torch's generators take 64-bit seeds: (request seed, step) is folded into that range.
_SEED_SPACE = 2 ** 64


def sample(logits: torch.Tensor, item: WorkItem) -> int:
    """Greedy at temperature 0 (or one too small to divide by), else a draw seeded by
    (request seed, step): reproducible. Any 64-bit seed and any temperature in [0, 2] are
    safe: the scaling runs in float64 from the largest logit, so no probability is inf or
    NaN; `top_p` < 1 keeps the smallest set of tokens holding that much of the mass."""
    temperature = item.sampling.temperature
    if not temperature >= MIN_TEMPERATURE:  # NaN too
        return int(torch.argmax(logits))
    scores = logits.detach().to("cpu", torch.float64)  # CPU generator
    scaled = (scores - scores.max()) / temperature
    probs = torch.softmax(scaled, dim=-1)
    if not bool(torch.isfinite(probs).all()):
        raise ValueError(f"request {item.request_id}: logits hold non-finite values")
    top_p = item.sampling.top_p
    if top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        # keep a token while the mass before it is below top_p (the first is always kept)
        keep = (torch.cumsum(ordered, dim=-1) - ordered) < top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
    gen = torch.Generator().manual_seed((item.sampling.seed * 1_000_003 + item.step)
                                        % _SEED_SPACE)
    return int(torch.multinomial(probs, 1, generator=gen))
