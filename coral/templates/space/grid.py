"""The grid a template library is built over, and the checks of what a caller asks for: the
serving modes, the placement topologies, the decode batch sizes a node may run at and the
prefill chunk sizes of a workload.

Its own module because these are choices, not formulas: the CLI, the library builder and the
solver read and check them without the operating points' tables (`operating_points.py`,
which re-exports them for its callers).
"""

from __future__ import annotations

from typing import Iterable

from coral.errors import InputError
from coral.templates.slo import SloSpec
from coral.templates.types import Mode, Topology

#: Decode batch sizes a node may run at.
DEFAULT_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)

#: Prefill chunk sizes, in multiples of the mean prompt (PD prefill templates).
PREFILL_CHUNK_MULTIPLES: tuple[int, ...] = (1, 2, 4, 8, 16)
#: Largest prefill chunk, tokens (vLLM's long-prompt chunk sizes are of this order).
MAX_PREFILL_CHUNK_TOKENS = 16384

MODES: tuple[str, ...] = ("aggregated", "prefill", "decode")
TOPOLOGIES: tuple[str, ...] = ("flow", "chain", "dag")


def check_mode(mode: str) -> Mode:
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    return mode  # type: ignore[return-value]


def check_topology(topology: str) -> Topology:
    if topology not in TOPOLOGIES:
        raise InputError(f"unknown topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")
    return topology  # type: ignore[return-value]


def check_batches(batches: Iterable[int]) -> tuple[int, ...]:
    out = tuple(sorted({int(b) for b in batches}))
    if not out or out[0] < 1:
        raise InputError(f"batch sizes must be positive integers, got {list(batches)}")
    return out


def prefill_chunks(slo: SloSpec) -> tuple[int, ...]:
    """Prefill chunk sizes (tokens) for the workload: multiples of the mean prompt."""
    cap = max(slo.input_tokens, MAX_PREFILL_CHUNK_TOKENS)
    return tuple(m * slo.input_tokens for m in PREFILL_CHUNK_MULTIPLES if m * slo.input_tokens <= cap)
