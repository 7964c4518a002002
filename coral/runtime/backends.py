"""What the gateway calls: a model that turns prompt token ids into a stream of token ids."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Protocol

from coral.runtime.backend_errors import (  # noqa: F401 - re-exported: the backends' vocabulary
    BackendError,
    ModelUnavailableError,
    PoisonRequestError,
    RequestFailedError,
    RetriableBackendError,
)
from coral.runtime.messages import SamplingParams


class Backend(Protocol):
    max_context_tokens: int  # prompt + generated tokens

    def generate(self, prompt_ids: list[int], max_tokens: int,
                 sampling: SamplingParams) -> AsyncIterator[int]:
        """Yield generated token ids; closing the iterator early cancels the request."""


class EngineBackend:
    """Adapts a threaded `BatchingEngine` to asyncio."""

    def __init__(self, engine, *, stop_on_eos: bool = True):
        self.engine = engine
        self.max_context_tokens = engine.max_seq_len
        self.stop_on_eos = stop_on_eos

    async def generate(self, prompt_ids: list[int], max_tokens: int,
                       sampling: SamplingParams) -> AsyncIterator[int]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def on_token(token: int | None, finished: bool,
                     error: str | BaseException | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (token, finished, error))

        from coral.runtime.batching_engine import EngineStoppedError

        try:
            request_id = self.engine.submit(prompt_ids, max_tokens, on_token, sampling,
                                            self.stop_on_eos)
        except EngineStoppedError as exc:
            raise BackendError(str(exc)) from exc
        finished = False
        try:
            while not finished:
                token, finished, error = await queue.get()
                if isinstance(error, BackendError):
                    raise error
                if error is not None:
                    raise BackendError(str(error))
                if token is not None:
                    yield token
        finally:
            if not finished:
                self.engine.cancel(request_id)


class EchoBackend:
    """Returns the prompt's tokens (cycled) at once: measures the gateway, not a model."""

    def __init__(self, max_context_tokens: int = 4096):
        self.max_context_tokens = max_context_tokens

    async def generate(self, prompt_ids: list[int], max_tokens: int,
                       sampling: SamplingParams) -> AsyncIterator[int]:
        for i in range(max_tokens):
            yield prompt_ids[i % len(prompt_ids)]
