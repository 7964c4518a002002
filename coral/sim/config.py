"""Simulator settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from coral.errors import InputError
from coral.perf.step import DEFAULT_MAX_BATCHED_TOKENS

#: Contexts are rounded up to 1/CONTEXT_BUCKETS of their power of two (about 3 % at 32).
DEFAULT_CONTEXT_BUCKETS = 32


@dataclass(frozen=True)
class SimConfig:
    """Simulator settings (all have defaults)."""

    mode: Literal["fast", "naive"] = "fast"
    """fast: identical decode steps as one event; naive: one event per step (for checking)."""
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    """Tokens one scheduler step may process (decode tokens + prompt chunks). Prefill
    instances (PD) take their template's prompt-token chunk per step instead."""
    context_buckets: int = DEFAULT_CONTEXT_BUCKETS
    """Context rounding: up to 1/N of its power of two; 0 keeps exact contexts (no jumps)."""
    horizon_s: float | None = None
    """Stop at this simulated time; requests still in flight are reported unfinished."""
    net_latency_s: float | None = None
    """Per-hop activation latency, s (None: the planner's NET_LATENCY_S)."""
    workers: int = 1
    """Processes to simulate in. Models share no instance and no request, so each extra
    worker (a forked process; where the OS cannot fork, 1 is used) simulates a share of the
    models. The results do not depend on it."""

    def __post_init__(self) -> None:
        if self.mode not in ("fast", "naive"):
            raise InputError(f"mode must be 'fast' or 'naive', got {self.mode!r}")
        if self.max_batched_tokens < 1:
            raise InputError(f"max_batched_tokens must be >= 1, got {self.max_batched_tokens}")
        if self.context_buckets < 0:
            raise InputError(f"context_buckets must be >= 0, got {self.context_buckets}")
        if self.workers < 1:
            raise InputError(f"workers must be >= 1, got {self.workers}")
