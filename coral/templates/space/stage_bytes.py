"""Bytes a pipeline stage holds or hands on beyond its layers: the LM head on the last stage,
the input embedding on the stage with layer 0, the activations crossing a stage boundary.

Its own module because the operating points (`operating_points.py`, which re-exports these)
and the template solver (`library/solve.py`) both charge them, from the model's shape alone.
"""

from __future__ import annotations

from coral.catalog.schema import ModelArch
from coral.templates.slo import SloSpec
from coral.templates.types import Mode


def lm_head_bytes(arch: ModelArch) -> float:
    """Final norm plus LM head, bytes (held by the last stage)."""
    return float((arch.vocab_size * arch.hidden_size + arch.hidden_size) * arch.dtype_bytes)


def input_embedding_bytes(arch: ModelArch) -> float:
    """Input embedding matrix, bytes (held by the stage with layer 0)."""
    return float(arch.vocab_size * arch.hidden_size * arch.dtype_bytes)


def edge_bytes_per_unit(arch: ModelArch, slo: SloSpec, mode: Mode) -> float:
    """Bytes crossing a stage boundary per unit of flow (request in aggregated, else token)."""
    hb = float(arch.activation_bytes_per_token)
    if mode == "aggregated":
        return (slo.input_tokens + slo.output_tokens) * hb
    return hb
