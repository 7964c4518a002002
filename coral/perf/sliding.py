"""Sliding-window attention: what a layer that attends to the last `window` tokens costs and
keeps, for models that mix such layers with full ones (GPT-OSS alternates them).

A sliding layer pairs each prompt token with at most `window` keys, reads at most `window`
tokens of KV a decoding sequence and keeps at most `window` tokens of each sequence's KV
(vLLM frees the blocks that slide out). The perf model costs one layer as the model's mix,
`(1 - s) x full + s x sliding` with `s` its share of sliding layers: exact for a range of whole
repeats of the attention pattern, within half a layer's attention otherwise.
"""

from __future__ import annotations

from coral.perf.kernel_time import ROOFLINE_P
from coral.perf.layer_costs import LayerCoefficients

_INV_P = 1.0 / ROOFLINE_P

#: Sequences whose sliding windows a node's KV capacity holds aside (`window_capacity_tokens`):
#: the largest per-node batch of the template grid (`coral.templates.space.operating_points`).
#: A node holding more sequences keeps up to one window of the sliding layers more for each
#: past it.
WINDOW_SEQUENCES = 256


def sliding_prefill_pairs(tokens: int, window: int) -> int:
    """Query-key pairs of a causal prompt chunk of `tokens` tokens when each token attends to
    at most the last `window` (itself included): `T(T+1)/2` up to the window, then `window`
    a token."""
    if tokens <= window:
        return tokens * (tokens + 1) // 2
    return window * (window + 1) // 2 + (tokens - window) * window


def mixed_attention_seconds(coef: LayerCoefficients, p: int, b: int, ctx: int, flops: float,
                            bw: float, dtype_bytes: float) -> tuple[float, float]:
    """(compute, memory) seconds of one layer's attention, the full and sliding layers weighted
    by the sliding share, each part by the roofline (`coral.perf.model`). A sliding layer's
    decodes read `min(C, B x window)` of the batch's `C` context tokens: exact when every
    decoding sequence holds a full window (the batch's split is not known)."""
    qg, kvg, s, w = coef.q_dim_per_gpu, coef.kv_dim_per_gpu, coef.sliding_share, coef.window
    parts: list[tuple[float, float, float]] = []
    if p:
        io = p * (2.0 * qg + 2.0 * kvg) * dtype_bytes / bw
        parts += [(1.0 - s, 2.0 * p * (p + 1) * qg / flops, io),
                  (s, 4.0 * sliding_prefill_pairs(p, w) * qg / flops, io)]
    if b:
        ctx_s = min(ctx, b * w)
        for weight, c in ((1.0 - s, ctx), (s, ctx_s)):
            parts.append((weight, 4.0 * c * qg / flops,
                          (c * 2.0 * kvg + b * 2.0 * qg) * dtype_bytes / bw))
    comp = mem = 0.0
    for weight, tc, tm in parts:
        tg = weight * (tc**ROOFLINE_P + tm**ROOFLINE_P) ** _INV_P
        if tc >= tm:
            comp += tg
        else:
            mem += tg
    return comp, mem


def window_capacity_tokens(free_bytes: float, full_bytes_per_token: float,
                           window_bytes: float, window: int, sequences: int) -> int:
    """Tokens of context that fit in `free_bytes` of KV cache when a token takes
    `full_bytes_per_token` in the full layers and one sequence's full window `window_bytes` in
    the sliding ones, for up to `sequences` sequences.

    `C` tokens over `N` sequences take `full x C + sliding x min(C, N x window)` bytes
    (`sliding = window_bytes / window`, a token's bytes in the sliding layers); with `N` at
    `sequences` the largest `C` is `free / (full + sliding)` while that is under `N x window`,
    else `(free - N x window_bytes) / full`.
    """
    sliding = window_bytes / window
    reserve = sequences * window_bytes
    if free_bytes <= sequences * window * (full_bytes_per_token + sliding):
        return int(free_bytes // (full_bytes_per_token + sliding))
    return int((free_bytes - reserve) // full_bytes_per_token)
