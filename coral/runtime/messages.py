"""Messages between the engine and the stages (in-process or over ZeroMQ).

Plain dataclasses; over ZeroMQ they travel pickled, so workers must only listen on loopback or a
trusted private network (the default binds are 127.0.0.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax)
    seed: int = 0  # seeds the per-request sampler; token i uses seed + i
    top_p: float = 1.0  # nucleus sampling: draw from the smallest set holding this mass


#: `WorkItem.step` of a prompt chunk that is not the prompt's last (nothing to sample).
PROMPT_CHUNK_STEP = -1


@dataclass
class WorkItem:
    """One request's chunk of tokens for one engine step, as it crosses the pipeline."""

    request_id: str
    start_pos: int  # position of the chunk's first token in the sequence
    token_ids: tuple[int, ...]  # the chunk's tokens (prefill: the prompt; decode: one token)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    step: int = 0  # index of the token this chunk produces (0 for the prefill)
    # a prompt chunk before the prompt's last has step PROMPT_CHUNK_STEP: it fills the KV
    # caches and produces no token (its result comes back unsampled)
    hidden: np.ndarray | None = None  # (len(token_ids), hidden_size) float32 between stages
    release: bool = False  # free the request's KV caches along its route; no token comes back


@dataclass(frozen=True)
class TokenResult:
    """A sampled token, sent by the last stage back to the engine."""

    request_id: str
    step: int  # which generated token this is (0 = first)
    token_id: int
    error: str | None = None
    """Set when the request's step failed (no token): the request ends with this error."""
    retry: bool = False
    """With `error`: the failure was its micro-batch's, not the request's own (it may run
    again); else the request's own computation failed and would fail again."""


@dataclass(frozen=True)
class Batch:
    """Work items sent together to one node."""

    items: tuple[WorkItem, ...]
    batch_id: int  # the micro-batch's number, echoed in the results


@dataclass(frozen=True)
class Results:
    """Tokens of one batch, sent by a last-stage node to the engine."""

    tokens: tuple[TokenResult, ...]
    batch_id: int
    node_id: str


@dataclass(frozen=True)
class StepFailed:
    """A node's step raised: the items it held fail (the worker itself goes on)."""

    batch_id: int
    node_id: str
    error: str
    items: tuple[tuple[str, int], ...]  # (request id, step) of each failed item


@dataclass(frozen=True)
class Heartbeat:
    node_id: str
    stage: int
    sent_at_s: float  # time.monotonic() is per process; wall clock here (time.time())
    cached_requests: int  # requests whose KV cache the node holds


@dataclass(frozen=True)
class StageTiming:
    """One worker's time for one step of its stage, with the step's shape (for /metrics)."""

    node_id: str
    stage: int
    prefill_tokens: int
    decode_batch: int
    context_tokens: int  # decode sequences' context, tokens, summed
    seconds: float


@dataclass(frozen=True)
class Wake:
    """Sent by the engine to its own driver socket: new work arrived while it waits for
    results, so it should schedule now rather than at its next result."""


@dataclass(frozen=True)
class Shutdown:
    """Ask a worker to exit."""
