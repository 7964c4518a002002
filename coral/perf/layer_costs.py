"""Per-GPU FLOPs and bytes of one transformer layer under tensor parallelism: the
coefficients the roofline (`coral.perf.model`) and its calibration turn into seconds."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from coral.catalog.schema import ModelArch

#: Rows (tokens) of the output tile a dense matmul kernel computes at a time: cuBLAS/CUTLASS
#: bf16 GEMMs on Ampere and Hopper tile the token dimension by 128 (64 for skinny problems),
#: so a matmul of T tokens does the tensor-core work of T rounded up to whole tiles. The
#: measured operator times step at these multiples (Vidur's A100/H100/A40 profiles: +35 to
#: +55 % from 256 to 264 tokens).
GEMM_ROW_TILE = 128
#: Row tile of skinny matmuls (at most this many tokens).
GEMM_SMALL_ROW_TILE = 64


@dataclass(frozen=True)
class Matmul:
    """Per-GPU cost of one matmul: FLOPs and bytes = weight_bytes + bytes_per_token * T."""

    flops_per_token: float
    weight_bytes: float
    bytes_per_token: float


@dataclass(frozen=True)
class LayerCoefficients:
    """Per-GPU cost coefficients of one layer of `model` under TP over `tp` GPUs."""

    tp: int
    qkv: Matmul
    o: Matmul
    up: Matmul  # dense gate+up; for MoE the active-expert part with no weights (see below)
    down: Matmul
    norm_bytes_per_token: float  # both RMSNorms, read + write
    rope_bytes_per_token: float
    act_bytes_per_token: float
    add_bytes_per_token: float
    kv_write_bytes_per_token: float
    q_dim_per_gpu: float
    kv_dim_per_gpu: float
    dtype_bytes: int
    # MoE (zero / None for dense models)
    moe_experts: int = 0
    moe_top_k: int = 0
    expert_up_bytes: float = 0.0  # one routed expert's gate+up weights, per GPU
    expert_down_bytes: float = 0.0  # one routed expert's down weights, per GPU
    fixed_up_bytes: float = 0.0  # router + shared experts' gate+up weights, per GPU
    fixed_down_bytes: float = 0.0  # shared experts' down weights, per GPU
    # sliding-window attention (0 / 0 when every layer attends over the whole context)
    sliding_share: float = 0.0  # fraction of the model's layers that slide
    window: int = 0  # tokens a sliding layer attends to

    @property
    def profiled_elementwise_kernels(self) -> tuple[float, float, float, float, float]:
        """Bytes per token of each element-wise kernel Vidur profiles: the two norms, rope,
        the MLP activation and the residual add (each kernel pays its own fixed time)."""
        half = 0.5 * self.norm_bytes_per_token
        return (half, half, self.rope_bytes_per_token, self.act_bytes_per_token,
                self.add_bytes_per_token)


def layer_coefficients(model: ModelArch, tp: int,
                       expert_weight_bits: float | None = None) -> LayerCoefficients:
    """Per-GPU FLOPs/bytes coefficients of one layer of `model` sharded over `tp` GPUs.

    Heads are split over the GPUs; KV heads are replicated when tp exceeds their number.
    Inputs of the column-parallel matmuls and outputs of the row-parallel ones are full-size
    on every GPU; norms and the residual add run replicated. Routed experts' weights take
    `expert_weight_bits` bits each (None: `dtype_bytes`; `coral.perf.precision` says which
    a GPU type holds). A layer stands for the model's mix of full and sliding-window layers
    (`sliding_share`), exact for a range of whole repeats of the attention pattern.
    """
    dt = float(model.dtype_bytes)
    edt = dt if expert_weight_bits is None else expert_weight_bits / 8.0
    share = model.sliding_layer_share
    window = (model.sliding_window or 0) if share else 0
    h = float(model.hidden_size)
    c = float(tp)
    qg = model.num_heads * model.head_dim / c
    kvg = float(math.ceil(model.num_kv_heads / tp) * model.head_dim)
    nu = 2.0 if model.gated_mlp else 1.0  # matrices in the up projection

    qkv = Matmul(2.0 * h * (qg + 2 * kvg), h * (qg + 2 * kvg) * dt, (h + qg + 2 * kvg) * dt)
    o = Matmul(2.0 * qg * h, qg * h * dt, (qg + h) * dt)
    norms = 2 * (2 * h * dt)
    rope = 2 * (qg + kvg) * dt
    add = 3 * h * dt
    kv_write = 2 * (2 * kvg) * dt
    if model.moe is None:
        f = model.ffn_size / c
        up = Matmul(2.0 * h * nu * f, h * nu * f * dt, (h + nu * f) * dt)
        down = Matmul(2.0 * f * h, f * h * dt, (f + h) * dt)
        act = (nu + 1) * f * dt
        return LayerCoefficients(
            tp=tp, qkv=qkv, o=o, up=up, down=down,
            norm_bytes_per_token=norms, rope_bytes_per_token=rope, act_bytes_per_token=act,
            add_bytes_per_token=add, kv_write_bytes_per_token=kv_write,
            q_dim_per_gpu=qg, kv_dim_per_gpu=kvg, dtype_bytes=model.dtype_bytes,
            sliding_share=share, window=window,
        )
    m = model.moe
    k, e = m.experts_per_token, m.num_experts
    fe = m.expert_ffn_size / c
    fs = m.shared_experts * m.shared_expert_ffn_size / c
    # up: routed experts (k per token) + shared experts + the replicated router
    up = Matmul(
        2.0 * h * nu * (k * fe + fs) + 2.0 * h * e,
        0.0,  # expert weights depend on the tokens: added per call (expert_*_bytes)
        (h * (k + (1 if fs else 0)) + nu * (k * fe + fs) + e) * dt,
    )
    down = Matmul(
        2.0 * (k * fe + fs) * h,
        0.0,
        ((k * fe + fs) + h * (k + (1 if fs else 0))) * dt,
    )
    act = (nu + 1) * (k * fe + fs) * dt
    return LayerCoefficients(
        tp=tp, qkv=qkv, o=o, up=up, down=down,
        norm_bytes_per_token=norms, rope_bytes_per_token=rope, act_bytes_per_token=act,
        add_bytes_per_token=add, kv_write_bytes_per_token=kv_write,
        q_dim_per_gpu=qg, kv_dim_per_gpu=kvg, dtype_bytes=model.dtype_bytes,
        moe_experts=e, moe_top_k=k,
        expert_up_bytes=nu * h * fe * edt,
        expert_down_bytes=h * fe * edt,
        fixed_up_bytes=(nu * h * fs + h * e) * dt,
        fixed_down_bytes=h * fs * dt,
        sliding_share=share, window=window,
    )


def tile_padded_tokens(tokens: int) -> int:
    """Tokens a dense matmul's kernel computes for `tokens` rows: whole row tiles."""
    tile = GEMM_SMALL_ROW_TILE if tokens <= GEMM_SMALL_ROW_TILE else GEMM_ROW_TILE
    return -(-tokens // tile) * tile


def tile_padded_tokens_array(tokens: np.ndarray) -> np.ndarray:
    """`tile_padded_tokens` of every entry (calibration's design matrix)."""
    tile = np.where(tokens <= GEMM_SMALL_ROW_TILE, GEMM_SMALL_ROW_TILE, GEMM_ROW_TILE)
    return np.ceil(tokens / tile) * tile


def expected_distinct_experts(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected number of distinct experts `tokens` tokens route to (uniform routing)."""
    if tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
