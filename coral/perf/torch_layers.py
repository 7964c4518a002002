"""Coral's one transformer decoder layer: the layer the profiler times is the layer the
runtime serves with.

Llama-style: RMSNorm, fused QKV projection with grouped-query attention, rotary embeddings,
attention through `torch.nn.functional.scaled_dot_product_attention`, output projection,
RMSNorm and a gated SiLU MLP (GELU MLP when the model's MLP is not gated); a mixture-of-experts
model gets a softmax router, top-k routed experts and its shared experts as one always-on MLP.
Its parameter count equals `ModelArch.params_per_layer`.

Its weights are random (drawn on the device: no download, no `transformers`) or given as
tensors (`LAYER_TENSORS`, e.g. a checkpoint's). Three ways to run it, one arithmetic:

- `prefill`: one sequence from position 0 (the profiler's prefill point);
- `decode`: a batch of sequences, one new token each, over a preallocated dense KV cache
  (the profiler's decode point);
- `forward`: one request's chunk of tokens after what its `LayerCache` holds (the runtime's
  pipeline stages, `coral.runtime.model`).

So `coral profile` measures the layer `coral serve` runs, and a change to one is a change to
both. The layer sits in `coral.perf` because that is the lowest layer that needs it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from coral.catalog.schema import ModelArch, MoeConfig
from coral.errors import InputError

ROPE_THETA = 10000.0
NORM_EPS = 1e-5

#: Names of one dense decoder layer's tensors when they are given (linear weights are
#: (out_features, in_features), as `nn.Linear` stores them).
LAYER_TENSORS = ("attn_norm", "q_proj", "k_proj", "v_proj", "o_proj", "mlp_norm", "gate_proj",
                 "up_proj", "down_proj")


@dataclass(frozen=True)
class DecoderShape:
    """The shape of one decoder layer, whichever model description it comes from."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    gated_mlp: bool = True
    norm_eps: float = NORM_EPS
    rope_theta: float = ROPE_THETA
    moe: MoeConfig | None = None

    @classmethod
    def of_arch(cls, arch: ModelArch) -> "DecoderShape":
        """The layer of `arch`; refused for a model whose layers this one does not run, so
        that a profile never times another layer than the model's."""
        missing = [what for what, has in (
            ("sliding-window attention", arch.sliding_window is not None),
            ("attention sinks", arch.attention_sinks),
            (f"{arch.expert_weight_format} experts", arch.expert_weight_format is not None),
        ) if has]
        if missing:
            raise InputError(
                f"model {arch.name!r} has {', '.join(missing)}, which Coral's torch layer "
                "does not run: its profile would time another layer. To fix: predict it with "
                "the roofline (`coral perf predict`) or profile it with its serving engine")
        return cls(arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim,
                   arch.ffn_size, arch.gated_mlp, moe=arch.moe)

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape each of `LAYER_TENSORS` must have (a gated dense layer's)."""
        h, f = self.hidden_size, self.ffn_size
        return {"attn_norm": (h,), "mlp_norm": (h,), "q_proj": (self.q_dim, h),
                "k_proj": (self.kv_dim, h), "v_proj": (self.kv_dim, h),
                "o_proj": (h, self.q_dim), "gate_proj": (f, h), "up_proj": (f, h),
                "down_proj": (h, f)}


#: Below this many rows a CPU matmul `x @ w.T` runs as `(w @ x.T).T`: MKL's GEMM with a
#: short left operand (2-7 rows) runs at half the speed of the same product with a short right
#: one (torch 2.13 on a 2-vCPU AMD EPYC, one thread, float32, 3 rows by a 576 x 3072 weight:
#: 1.61 ms against 0.73 ms), so a decode batch of 2-7 would take longer than one sequence.
SKINNY_ROWS = 8


def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`x @ w.T` (`F.linear` without bias), a few rows on a CPU as `(w @ x.T).T`."""
    if x.device.type == "cpu" and x.dim() == 2 and 1 < x.shape[0] < SKINNY_ROWS:
        return (w @ x.T).T.contiguous()
    return F.linear(x, w)


def _param(shape: Sequence[int], fan_in: int, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    """Random weight, scaled so activations stay O(1) through the layer."""
    w = torch.empty(*shape, device=device, dtype=dtype).normal_(0.0, fan_in ** -0.5)
    return nn.Parameter(w, requires_grad=False)


_HAS_RMS_NORM = hasattr(F, "rms_norm")  # torch >= 2.4


def _given(weight: torch.Tensor, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(weight.to(device=device, dtype=dtype), requires_grad=False)


class RMSNorm(nn.Module):
    def __init__(self, size: int, device: torch.device, dtype: torch.dtype,
                 eps: float = NORM_EPS, weight: torch.Tensor | None = None):
        super().__init__()
        self.weight = (_given(weight, device, dtype) if weight is not None else
                       nn.Parameter(torch.ones(size, device=device, dtype=dtype),
                                    requires_grad=False))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _HAS_RMS_NORM:  # one fused kernel on CUDA, as serving engines use
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


class MLP(nn.Module):
    """Gated SiLU MLP (gate and up fused in one matrix) or a plain GELU MLP."""

    def __init__(self, hidden: int, ffn: int, gated: bool, device: torch.device,
                 dtype: torch.dtype, w_in: torch.Tensor | None = None,
                 w_out: torch.Tensor | None = None):
        super().__init__()
        self.gated = gated
        self.w_in = (_given(w_in, device, dtype) if w_in is not None else
                     _param(((2 if gated else 1) * ffn, hidden), hidden, device, dtype))
        self.w_out = (_given(w_out, device, dtype) if w_out is not None else
                      _param((hidden, ffn), ffn, device, dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = project(x, self.w_in)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return project(h, self.w_out)


class MoE(nn.Module):
    """Softmax top-k router, routed experts as one grouped GEMM, shared experts always on.

    Tokens are sorted by expert and every expert's slice is multiplied in one grouped matmul
    (`torch.nn.functional.grouped_mm`), as serving engines' fused MoE kernels do: no host
    sync, so a step can be captured as a CUDA graph. Where grouped matmul is unavailable
    the experts run one by one (a host sync and two matmuls per touched expert)."""

    def __init__(self, shape: DecoderShape, device: torch.device, dtype: torch.dtype):
        super().__init__()
        moe = shape.moe
        assert moe is not None
        h, f, e = shape.hidden_size, moe.expert_ffn_size, moe.num_experts
        self.top_k = moe.experts_per_token
        self.gated = shape.gated_mlp
        self.router = _param((e, h), h, device, dtype)
        # Stored [expert, out, in] like nn.Linear; an expert is `x @ w[e].T`.
        self.w_in = _param((e, (2 if self.gated else 1) * f, h), h, device, dtype)
        self.w_out = _param((e, h, f), f, device, dtype)
        self.shared = (
            MLP(h, moe.shared_experts * moe.shared_expert_ffn_size, shape.gated_mlp, device,
                dtype)
            if moe.shared_experts else None
        )
        self.grouped_mm = _grouped_mm_fn(device, dtype)
        self.expert_ids = torch.arange(e, device=device)

    def _act(self, h: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.gelu(h, approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_experts = self.router.shape[0]
        probs = torch.softmax(F.linear(x, self.router).float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)
        token_of = order // self.top_k
        weight_of = weights.flatten()[order]
        out = torch.zeros_like(x)
        grouped_mm = self.grouped_mm
        if grouped_mm is not None:
            # End of each expert's slice of the sorted assignments, without a host sync
            # (bincount would read its input's maximum back to the host).
            offs = torch.searchsorted(flat[order], self.expert_ids, right=True).to(torch.int32)
            h = grouped_mm(x.index_select(0, token_of), self.w_in.transpose(-2, -1), offs=offs)
            h = grouped_mm(self._act(h), self.w_out.transpose(-2, -1), offs=offs)
            out.index_add_(0, token_of, h * weight_of[:, None])
        else:
            start = 0
            for e, n in enumerate(torch.bincount(flat, minlength=num_experts).tolist()):
                if n == 0:
                    continue
                idx = token_of[start:start + n]
                h = self._act(x.index_select(0, idx) @ self.w_in[e].T)
                out.index_add_(0, idx, (h @ self.w_out[e].T) * weight_of[start:start + n, None])
                start += n
        if self.shared is not None:
            out = out + self.shared(x)
        return out


@functools.cache
def _grouped_mm_fn(device: torch.device, dtype: torch.dtype) -> Callable[..., torch.Tensor] | None:
    """torch's grouped matmul if it runs on this device and dtype (checked once), else None."""
    fn = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    if fn is None:
        return None
    try:
        a = torch.ones(16, 16, device=device, dtype=dtype)
        b = torch.ones(2, 16, 16, device=device, dtype=dtype)
        offs = torch.tensor([0, 16], device=device, dtype=torch.int32)
        out = fn(a, b.transpose(-2, -1), offs=offs)
        if not bool(torch.all(out == 16)):
            return None
    except Exception:  # noqa: BLE001 - unsupported device/dtype/kernel: use the loop
        return None
    return fn


@functools.cache
def _sdpa_supports_gqa() -> bool:
    q = torch.zeros(1, 2, 1, 4)
    kv = torch.zeros(1, 1, 1, 4)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rope_tables(positions: torch.Tensor, head_dim: int, dtype: torch.dtype,
                theta: float = ROPE_THETA) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape [len(positions), head_dim] for rotary embeddings (half-split
    convention: dimension i pairs with i + head_dim / 2)."""
    half = head_dim // 2
    inv = theta ** (-torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    ang = positions.float()[:, None] * inv[None, :]
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


class LayerCache:
    """One request's keys and values in one layer, [kv_heads, tokens, head_dim] each, grown
    chunk by chunk (the runtime's cache; the profiler's decode uses a dense batch cache)."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=1)
        self.values = v if self.values is None else torch.cat([self.values, v], dim=1)
        return self.keys, self.values


class DecoderLayer(nn.Module):
    """One Llama-style decoder layer (dense or MoE) working on flattened tokens [T, hidden].

    `tensors` (keyed by `LAYER_TENSORS`, a gated dense layer's) gives its weights; without
    them they are drawn at random on the device."""

    def __init__(self, shape: DecoderShape | ModelArch, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32,
                 tensors: Mapping[str, torch.Tensor] | None = None):
        super().__init__()
        if isinstance(shape, ModelArch):
            shape = DecoderShape.of_arch(shape)
        if shape.head_dim % 2:
            raise ValueError(f"head_dim {shape.head_dim} must be even for RoPE")
        device = torch.device(device)
        self.num_heads = shape.num_heads
        self.num_kv_heads = shape.num_kv_heads
        self.head_dim = shape.head_dim
        self.rope_theta = shape.rope_theta
        h = shape.hidden_size
        if tensors is None:
            self.input_norm = RMSNorm(h, device, dtype, shape.norm_eps)
            self.w_qkv = _param((shape.q_dim + 2 * shape.kv_dim, h), h, device, dtype)
            self.w_o = _param((h, shape.q_dim), shape.q_dim, device, dtype)
            self.post_norm = RMSNorm(h, device, dtype, shape.norm_eps)
            self.mlp: nn.Module = (
                MoE(shape, device, dtype) if shape.moe is not None
                else MLP(h, shape.ffn_size, shape.gated_mlp, device, dtype)
            )
            return
        if shape.moe is not None or not shape.gated_mlp:
            raise ValueError("given tensors build a gated dense layer only")
        for name, want in shape.tensor_shapes().items():
            got = tuple(tensors[name].shape)
            if got != want:
                raise ValueError(f"tensor {name} has shape {got}, expected {want}")
        self.input_norm = RMSNorm(h, device, dtype, shape.norm_eps, tensors["attn_norm"])
        self.w_qkv = _given(torch.cat([tensors["q_proj"], tensors["k_proj"],
                                       tensors["v_proj"]]), device, dtype)
        self.w_o = _given(tensors["o_proj"], device, dtype)
        self.post_norm = RMSNorm(h, device, dtype, shape.norm_eps, tensors["mlp_norm"])
        self.mlp = MLP(h, shape.ffn_size, True, device, dtype,
                       w_in=torch.cat([tensors["gate_proj"], tensors["up_proj"]]),
                       w_out=tensors["down_proj"])

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = x.shape[0]
        qkv = project(self.input_norm(x), self.w_qkv)
        q_dim = self.num_heads * self.head_dim
        kv_dim = self.num_kv_heads * self.head_dim
        # Rotate the query and key heads together: one pass instead of two.
        qk = _rope(qkv[:, :q_dim + kv_dim].view(t, self.num_heads + self.num_kv_heads,
                                                 self.head_dim), cos[:, None, :], sin[:, None, :])
        v = qkv[:, q_dim + kv_dim:].view(t, self.num_kv_heads, self.head_dim)
        return qk[:, :self.num_heads], qk[:, self.num_heads:], v

    def _finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + project(attn, self.w_o)
        return x + self.mlp(self.post_norm(x))

    def prefill(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One sequence of T = x.shape[0] tokens, causal; cos/sin: [T, head_dim]."""
        q, k, v = self._qkv(x, cos, sin)
        return self._finish(x, self._causal_attention(q, k, v))

    def _causal_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                          ) -> torch.Tensor:
        """Causal attention of one sequence's T tokens among themselves: q [T, H, d], k and v
        [T, KV, d] -> [T, H x d]. SDPA's own causal kernel, with no mask tensor built."""
        t = q.shape[0]
        q = q.transpose(0, 1).unsqueeze(0)  # [1, H, T, d]
        k = k.transpose(0, 1).unsqueeze(0)  # [1, KV, T, d]
        v = v.transpose(0, 1).unsqueeze(0)
        if self.num_kv_heads == self.num_heads:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif _sdpa_supports_gqa():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            g = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(g, dim=1)
            v = v.repeat_interleave(g, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.squeeze(0).transpose(0, 1).reshape(t, -1)

    def decode(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, pos: int) -> torch.Tensor:
        """B = x.shape[0] sequences, one new token each at position `pos`; caches are
        [B, KV, pos + 1, d]; cos/sin: [1, head_dim]."""
        b = x.shape[0]
        q, k, v = self._qkv(x, cos, sin)
        k_cache[:, :, pos] = k
        v_cache[:, :, pos] = v
        # Grouped-query decode without copying K/V: the G query heads that share a KV head
        # act as G queries of that head (no mask: every query sees the whole cache).
        g = self.num_heads // self.num_kv_heads
        qg = q.view(b, self.num_kv_heads, g, self.head_dim)
        o = F.scaled_dot_product_attention(qg, k_cache, v_cache)
        return self._finish(x, o.reshape(b, -1))


    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: LayerCache
                ) -> torch.Tensor:
        """One request's chunk: T = x.shape[0] tokens at `positions` (consecutive, right after
        the tokens `cache` holds), each attending causally to the cache and the chunk; the
        chunk's keys and values are appended to `cache`."""
        cos, sin = rope_tables(positions, self.head_dim, x.dtype, self.rope_theta)
        q, k, v = self._qkv(x, cos, sin)
        return self._finish(x, self.attend(q, k, v, positions, cache))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        """Attention of one request's chunk (q [T, H, d], k and v [T, KV, d], at `positions`,
        right after the tokens `cache` holds) over its cache and itself, causal; appends the
        chunk's keys and values to `cache`. Returns [T, H x d]."""
        t = q.shape[0]
        first_chunk = t > 1 and cache.length == 0
        keys, values = cache.append(k.transpose(0, 1), v.transpose(0, 1))  # [KV, S, d]
        if first_chunk:
            # A prompt's first chunk attends only to itself: the same causal kernel that
            # `prefill` runs (and `coral profile` times), so served prefills cost what the
            # profile says.
            return self._causal_attention(q, k, v)
        # The G query heads that share a KV head act as G x T queries of that head.
        g = self.num_heads // self.num_kv_heads
        qg = q.transpose(0, 1).reshape(self.num_kv_heads, g * t, self.head_dim)
        if t == 1:  # the newest token sees the whole cache
            o = F.scaled_dot_product_attention(qg, keys, values)
        else:
            key_pos = torch.arange(keys.shape[1], device=q.device)
            mask = (key_pos[None, :] <= positions[:, None]).repeat(g, 1)  # [G x T, S]
            o = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask)
        return o.view(self.num_heads, t, self.head_dim).transpose(0, 1).reshape(t, -1)


def build_layers(arch: ModelArch, num_layers: int = 1, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.ModuleList:
    """`num_layers` decoder layers of `arch` with random weights, ready for inference."""
    if num_layers < 1:
        raise ValueError(f"layers must be >= 1, got {num_layers}")
    torch.manual_seed(seed)
    dev = torch.device(device)
    shape = DecoderShape.of_arch(arch)
    with torch.no_grad():
        layers = nn.ModuleList(DecoderLayer(shape, dev, dtype) for _ in range(num_layers))
    return layers.eval()


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
