"""The transformer decoder layer the profiler times, built from a catalog `ModelArch` with
random weights (no download, no `transformers`): RMSNorm, fused QKV projection with
grouped-query attention, rotary embeddings, causal attention through
`torch.nn.functional.scaled_dot_product_attention`, output projection, RMSNorm and a gated
SiLU MLP (GELU MLP when the model's MLP is not gated); a mixture-of-experts model gets a
softmax router, top-k routed experts and its shared experts as one always-on MLP. Its
parameter count equals `ModelArch.params_per_layer`. `coral.perf.profiler` times it."""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from coral.catalog.schema import ModelArch

ROPE_THETA = 10000.0


def _param(shape: Sequence[int], fan_in: int, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    """Random weight, scaled so activations stay O(1) through the layer."""
    w = torch.empty(*shape, device=device, dtype=dtype).normal_(0.0, fan_in ** -0.5)
    return nn.Parameter(w, requires_grad=False)


_HAS_RMS_NORM = hasattr(F, "rms_norm")  # torch >= 2.4


class RMSNorm(nn.Module):
    def __init__(self, size: int, device: torch.device, dtype: torch.dtype, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype),
                                   requires_grad=False)
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
                 dtype: torch.dtype):
        super().__init__()
        self.gated = gated
        self.w_in = _param(((2 if gated else 1) * ffn, hidden), hidden, device, dtype)
        self.w_out = _param((hidden, ffn), ffn, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x, self.w_in)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return F.linear(h, self.w_out)


class MoE(nn.Module):
    """Softmax top-k router, routed experts as one grouped GEMM, shared experts always on.

    Tokens are sorted by expert and every expert's slice is multiplied in one grouped matmul
    (`torch.nn.functional.grouped_mm`), as serving engines' fused MoE kernels do: no host
    sync, so a step can be captured as a CUDA graph. Where grouped matmul is unavailable
    the experts run one by one (a host sync and two matmuls per touched expert)."""

    def __init__(self, arch: ModelArch, device: torch.device, dtype: torch.dtype):
        super().__init__()
        moe = arch.moe
        assert moe is not None
        h, f, e = arch.hidden_size, moe.expert_ffn_size, moe.num_experts
        self.top_k = moe.experts_per_token
        self.gated = arch.gated_mlp
        self.router = _param((e, h), h, device, dtype)
        # Stored [expert, out, in] like nn.Linear; an expert is `x @ w[e].T`.
        self.w_in = _param((e, (2 if self.gated else 1) * f, h), h, device, dtype)
        self.w_out = _param((e, h, f), f, device, dtype)
        self.shared = (
            MLP(h, moe.shared_experts * moe.shared_expert_ffn_size, arch.gated_mlp, device, dtype)
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


def rope_tables(positions: torch.Tensor, head_dim: int, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape [len(positions), head_dim] for rotary embeddings."""
    half = head_dim // 2
    inv = ROPE_THETA ** (-torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    ang = positions.float()[:, None] * inv[None, :]
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


class DecoderLayer(nn.Module):
    """One Llama-style decoder layer (dense or MoE) working on flattened tokens [T, hidden]."""

    def __init__(self, arch: ModelArch, device: torch.device, dtype: torch.dtype):
        super().__init__()
        if arch.head_dim % 2:
            raise ValueError(f"model {arch.name}: head_dim {arch.head_dim} must be even for RoPE")
        self.num_heads = arch.num_heads
        self.num_kv_heads = arch.num_kv_heads
        self.head_dim = arch.head_dim
        h = arch.hidden_size
        self.input_norm = RMSNorm(h, device, dtype)
        self.w_qkv = _param((arch.q_dim + 2 * arch.kv_dim, h), h, device, dtype)
        self.w_o = _param((h, arch.q_dim), arch.q_dim, device, dtype)
        self.post_norm = RMSNorm(h, device, dtype)
        self.mlp: nn.Module = (
            MoE(arch, device, dtype) if arch.moe is not None
            else MLP(h, arch.ffn_size, arch.gated_mlp, device, dtype)
        )

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = x.shape[0]
        qkv = F.linear(self.input_norm(x), self.w_qkv)
        q_dim = self.num_heads * self.head_dim
        kv_dim = self.num_kv_heads * self.head_dim
        # Rotate the query and key heads together: one pass instead of two.
        qk = _rope(qkv[:, :q_dim + kv_dim].view(t, self.num_heads + self.num_kv_heads,
                                                 self.head_dim), cos[:, None, :], sin[:, None, :])
        v = qkv[:, q_dim + kv_dim:].view(t, self.num_kv_heads, self.head_dim)
        return qk[:, :self.num_heads], qk[:, self.num_heads:], v

    def _finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + F.linear(attn, self.w_o)
        return x + self.mlp(self.post_norm(x))

    def prefill(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One sequence of T = x.shape[0] tokens, causal; cos/sin: [T, head_dim]."""
        t = x.shape[0]
        q, k, v = self._qkv(x, cos, sin)
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
        o = o.squeeze(0).transpose(0, 1).reshape(t, -1)
        return self._finish(x, o)

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


def build_layers(arch: ModelArch, num_layers: int = 1, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.ModuleList:
    """`num_layers` decoder layers of `arch` with random weights, ready for inference."""
    if num_layers < 1:
        raise ValueError(f"layers must be >= 1, got {num_layers}")
    torch.manual_seed(seed)
    dev = torch.device(device)
    with torch.no_grad():
        layers = nn.ModuleList(DecoderLayer(arch, dev, dtype) for _ in range(num_layers))
    return layers.eval()


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
