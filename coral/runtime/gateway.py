"""OpenAI-compatible HTTP gateway: translates HTTP requests into backend calls, nothing more.

Endpoints: `/v1/models`, `/v1/completions`, `/v1/chat/completions` (both also streamed as
server-sent events), `/health`, `/metrics` (Prometheus text). Errors use OpenAI's JSON shape,
`{"error": {"message", "type", "param", "code"}}`, and never take the server down.

Failures are told apart for the client: a request the server cannot serve *now* (its model has
no ready instance, or lost it) gets HTTP 503 with `Retry-After`, which OpenAI clients retry;
4xx is only for requests that are wrong. A streamed request starts its response only once the
first text is there, so that it too gets a 503 rather than a stream that ends at once; a stream
cut after text was sent ends with an error event (`data: {"error": ...}`), which the `openai`
client raises, never with a silent truncation.

`create_app` builds the app; `coral.runtime.gateway_server` runs it (`ServerThread`,
`run_gateway`).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Mapping

from fastapi import FastAPI, Request
from jinja2 import TemplateError
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from coral.runtime.http_guard import GatewayLimits, GuardMiddleware
from coral.runtime.backends import (
    Backend,
    BackendError,
    ModelUnavailableError,
    RetriableBackendError,
)
from coral.runtime.messages import SamplingParams
from coral.runtime.metrics import GatewayMetrics
from coral.runtime.openai_api import (
    RETRIABLE_CODE,
    ApiError,
    ChatRequest,
    CompletionRequest,
    RequestBody,
    backend_error,
    model_health,
    validation_error,
)
from coral.runtime.tokenizer import ByteTokenizer, Tokenizer, fewest_tokens

if TYPE_CHECKING:
    from coral.templates.slo import SloSpec

log = logging.getLogger(__name__)

#: OpenAI's default for /v1/completions.
DEFAULT_COMPLETION_MAX_TOKENS = 16
#: Chat requests without max_tokens get at most this many (OpenAI: up to the context).
DEFAULT_CHAT_MAX_TOKENS = 256
#: Non-streamed requests whose instance was lost mid-generation are run again this many times.
MAX_REQUEST_RETRIES = 2
#: Retry-After of a request refused because its model's queue is full: requests of the tiny
#: models here take about a second, so a place is usually free by then.
QUEUE_FULL_RETRY_AFTER_S = 1


# ---------------------------------------------------------------- generation
@dataclass
class _Outcome:
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


def create_app(models: Mapping[str, Backend], *, api_key: str | None = None,
               tokenizer: Tokenizer | Mapping[str, Tokenizer] | None = None,
               metrics: GatewayMetrics | None = None,
               preempt: Callable[[str, float], Any] | None = None,
               limits: GatewayLimits | None = None,
               slos: Mapping[str, SloSpec] | None = None) -> FastAPI:
    """The gateway over `models` (served name -> backend).

    `tokenizer`: one for every model, or one per served name (models not in the mapping use
    the byte tokenizer). `api_key`, when set, is required on every path but /health and
    /metrics (the OpenAPI schema and /admin/* included) as `Authorization: Bearer <api_key>`;
    bind the gateway to loopback or a private network. `preempt` (a controller's `notice`)
    serves `POST /admin/preempt {"instance": NAME, "notice_s": S}`: a preemption notice for an
    instance, as a cloud's would be delivered. `limits`: body size, timeouts, allowed Host
    names and the admission limit per model (`coral.runtime.http_guard`); the servers below
    apply its HTTP-level ones. `slos`: each model's SLO, from the plan file
    (`PlanFile.slos`); `/metrics` and `/health` then report each model's SLO attainment
    against its TTFT and TPOT bounds.
    """
    limits = limits or GatewayLimits()
    default_tok: Tokenizer = ByteTokenizer()
    per_model: Mapping[str, Tokenizer] = {}
    if isinstance(tokenizer, Mapping):
        per_model = tokenizer
    elif tokenizer is not None:
        default_tok = tokenizer

    def tok_of(model: str) -> Tokenizer:
        return per_model.get(model, default_tok)

    stats = metrics or GatewayMetrics(slos)
    created = int(time.time())
    app = FastAPI(title="coral gateway", docs_url=None, redoc_url=None)
    app.state.metrics = stats
    app.state.limits = limits
    app.add_middleware(GuardMiddleware, limits=limits, api_key=api_key)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return ApiError(exc.status_code, str(exc.detail), code=code).response()

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in the gateway")
        return ApiError(500, f"Internal error: {type(exc).__name__}", type="server_error"
                        ).response()

    if preempt is not None:
        @app.post("/admin/preempt", include_in_schema=False)
        async def admin_preempt(body: dict[str, Any]) -> dict[str, Any]:
            name, notice_s = body.get("instance"), body.get("notice_s", 0.0)
            if not isinstance(name, str) or not isinstance(notice_s, (int, float)) \
                    or not notice_s >= 0:
                raise ApiError(400, "expected {\"instance\": NAME, \"notice_s\": S >= 0}")
            try:
                record = preempt(name, float(notice_s))
            except KeyError as exc:
                raise ApiError(404, str(exc).strip("'\""), code="instance_not_found") from None
            return {"instance": name, "notice_s": float(notice_s),
                    "in_flight": getattr(record, "in_flight", None)}

    admitted: dict[str, int] = {}  # model -> requests admitted (event loop only)

    def admit(model: str, endpoint: str) -> Callable[[], None]:
        """Admit a request of `model`, or refuse it (429) past the model's queue depth;
        returns the function that frees its place (once, however often it is called)."""
        held = admitted.get(model, 0)
        if limits.max_queue is not None and held >= limits.max_queue:
            stats.count_request(model, endpoint, "throttled")
            raise ApiError(429, f"Model '{model}' has {held} requests in progress, as many as "
                           f"this gateway admits (--max-queue {limits.max_queue}). Please "
                           f"retry after {QUEUE_FULL_RETRY_AFTER_S} s.", type="rate_limit_error",
                           code="queue_full", retry_after_s=QUEUE_FULL_RETRY_AFTER_S)
        admitted[model] = held + 1
        freed = False

        def release() -> None:
            nonlocal freed
            if not freed:
                freed = True
                admitted[model] -= 1
        return release

    def backend_of(name: str) -> Backend:
        if name not in models:
            close = difflib.get_close_matches(name, list(models), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ApiError(404, f"The model '{name}' does not exist. Available models: "
                           f"{', '.join(sorted(models))}.{hint}", param="model",
                           code="model_not_found")
        return models[name]

    def context_error(body: RequestBody, context: int, prompt_tokens: int, max_tokens: int,
                      *, at_least: bool = False) -> ApiError:
        prompt = f"at least {prompt_tokens}" if at_least else str(prompt_tokens)
        total = f"at least {prompt_tokens + max_tokens}" if at_least else str(
            prompt_tokens + max_tokens)
        return ApiError(400, f"This model's maximum context length is {context} tokens. "
                        f"However, you requested {total} tokens ({prompt} in the prompt, "
                        f"{max_tokens} for the completion). Please reduce the prompt or "
                        "max_tokens.", param="messages" if isinstance(body, ChatRequest)
                        else "prompt", code="context_length_exceeded")

    async def prepare(body: RequestBody, prompt: str, default_max: int | None
                      ) -> tuple[Backend, list[int], int, SamplingParams, list[str]]:
        """Check the request against the model's context, cheaply first (a bound on its
        tokens from its length), then tokenize it in a worker thread: a long prompt neither
        reaches the tokenizer nor holds up the event loop."""
        backend = backend_of(body.model)
        stops = body.stop_list()
        tok = tok_of(body.model)
        max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens
        context = backend.max_context_tokens
        fewest = fewest_tokens(tok, prompt)
        if fewest + (max_tokens or 1) > context:
            raise context_error(body, context, fewest, max_tokens or 1, at_least=True)
        ids = await asyncio.to_thread(tok.encode, prompt)
        if not ids:
            raise ApiError(400, "The prompt is empty once tokenized; send some text.",
                           param="messages" if isinstance(body, ChatRequest) else "prompt",
                           code="invalid_value")
        if max_tokens is None:
            max_tokens = max(1, min(default_max or DEFAULT_CHAT_MAX_TOKENS, context - len(ids)))
        if len(ids) + max_tokens > context:
            raise context_error(body, context, len(ids), max_tokens)
        seed = body.seed if body.seed is not None else secrets.randbits(31)
        sampling = SamplingParams(body.temperature, seed, body.top_p)
        return backend, ids, max_tokens, sampling, stops

    async def run(body: RequestBody, endpoint: str, backend: Backend, ids: list[int], max_tokens: int,
                  sampling: SamplingParams, stops: list[str], outcome: _Outcome
                  ) -> AsyncIterator[str]:
        """Yield text deltas; fills `outcome`; applies stop sequences."""
        tok = tok_of(body.model)
        hold = max((len(s) for s in stops), default=1) - 1
        generated: list[int] = []
        emitted = 0
        t0 = time.perf_counter()
        first_s = last_s = None
        outcome.text, outcome.finish_reason = "", None  # a rerun starts afresh
        outcome.prompt_tokens = len(ids)
        status = "error"
        try:
            async with contextlib.aclosing(backend.generate(ids, max_tokens, sampling)) as it:
                async for token in it:
                    last_s = time.perf_counter()
                    first_s = first_s or last_s
                    generated.append(token)
                    text = tok.decode(generated)
                    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
                    if cut >= 0:
                        yield text[emitted:cut]
                        outcome.text, outcome.finish_reason = text[:cut], "stop"
                        break
                    safe = len(text) - hold - (1 if text.endswith("\ufffd") else 0)
                    if safe > emitted:
                        yield text[emitted:safe]
                        emitted = safe
                else:
                    text = tok.decode(generated)
                    yield text[emitted:]
                    outcome.text = text
                    outcome.finish_reason = "length" if len(generated) >= max_tokens else "stop"
            status = "ok"
        except BackendError as exc:
            status = ("unavailable" if isinstance(exc, ModelUnavailableError) else
                      "retriable" if isinstance(exc, RetriableBackendError) else "error")
            raise backend_error(exc, body.model) from exc
        finally:
            outcome.completion_tokens = len(generated)
            stats.count_request(body.model, endpoint, status)
            tpot = ((last_s - first_s) / (len(generated) - 1)
                    if first_s is not None and len(generated) > 1 else None)
            stats.observe_request(body.model, len(ids), len(generated),
                                  None if first_s is None else first_s - t0, tpot)

    async def collect(body: RequestBody, endpoint: str, args: tuple) -> _Outcome:
        """Run a non-streamed request to the end; rerun it from the prompt when its instance was
        lost mid-generation (nothing was sent to the client yet)."""
        for attempt in range(MAX_REQUEST_RETRIES + 1):
            outcome = _Outcome()
            try:
                async for _ in run(body, endpoint, *args, outcome):
                    pass
                return outcome
            except ApiError as exc:
                if exc.code != RETRIABLE_CODE or attempt == MAX_REQUEST_RETRIES:
                    raise
                stats.count_rerun(body.model)
                log.warning("rerunning a %s request after: %s", endpoint, exc.message)
        raise AssertionError("unreachable")

    async def started(body: RequestBody, endpoint: str, args: tuple, outcome: _Outcome
                      ) -> AsyncIterator[str]:
        """A streamed request's text deltas, run up to its first text before the response
        starts: a request that cannot be served gets an HTTP error (503 and Retry-After) the
        client can act on, and one whose instance was lost before any text reached the client
        is rerun from its prompt, as a non-streamed one is."""
        for attempt in range(MAX_REQUEST_RETRIES + 1):
            deltas = run(body, endpoint, *args, outcome)
            try:
                first = await anext(deltas)
                break
            except StopAsyncIteration:
                first = None
                break
            except ApiError as exc:
                if exc.code != RETRIABLE_CODE or attempt == MAX_REQUEST_RETRIES:
                    raise
                stats.count_rerun(body.model)
                log.warning("rerunning a streamed %s request after: %s", endpoint, exc.message)

        async def rest() -> AsyncIterator[str]:
            if first is None:
                return
            yield first
            async with contextlib.aclosing(deltas):
                async for delta in deltas:
                    yield delta
        return rest()

    def usage(o: _Outcome) -> dict[str, int]:
        return {"prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens,
                "total_tokens": o.prompt_tokens + o.completion_tokens}

    def sse(gen: AsyncIterator[dict], release: Callable[[], None]) -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            try:
                async for chunk in gen:
                    yield f"data: {json.dumps(chunk)}\n\n"
            except ApiError as exc:
                yield f"data: {json.dumps(exc.body())}\n\n"
            except Exception as exc:  # keep the stream well-formed
                log.exception("stream failed")
                error = ApiError(500, f"Internal error: {type(exc).__name__}", type="server_error")
                yield f"data: {json.dumps(error.body())}\n\n"
            finally:
                release()
            yield "data: [DONE]\n\n"
        # the background task frees the place too when the client left before the stream ran
        return StreamingResponse(events(), media_type="text/event-stream",
                                 background=BackgroundTask(release))

    async def counted_prepare(body: RequestBody, endpoint: str, prompt: str,
                              default_max: int | None):
        try:
            return await prepare(body, prompt, default_max)
        except ApiError:
            stats.count_request(body.model if body.model in models else "unknown", endpoint,
                                "rejected")
            raise

    # ------------------------------------------------------------ routes
    @app.get("/health")
    async def health() -> JSONResponse:
        """`ok` when every model is ready, `degraded` when some instance is down, and
        `unavailable` (HTTP 503, for load balancers) when no model can answer."""
        per_model = {name: model_health(models[name]) for name in sorted(models)}
        for name, share in stats.slo_attainment().items():
            if name in per_model:
                per_model[name] = {**per_model[name], "slo_attainment": share}
        states = [m["status"] for m in per_model.values()]
        if all(s == "ready" for s in states):
            status = "ok"
        elif all(s == "unavailable" for s in states):
            status = "unavailable"
        else:
            status = "degraded"
        return JSONResponse({"status": status, "models": per_model},
                            status_code=503 if status == "unavailable" else 200)

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        runtime = {name: b.runtime_stats() for name, b in list(models.items())
                   if callable(getattr(b, "runtime_stats", None))}
        steps = [row for b in list(models.values())
                 if callable(getattr(b, "step_stats", None)) for row in b.step_stats()]
        return PlainTextResponse(stats.render(runtime, steps),
                                 media_type="text/plain; version=0.0.4")

    def model_card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created, "owned_by": "coral"}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(m) for m in sorted(models)]}

    @app.get("/v1/models/{name}")
    async def get_model(name: str) -> dict[str, Any]:
        backend_of(name)
        return model_card(name)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if len(prompts) != 1:
            raise ApiError(400, f"'prompt' holds {len(prompts)} prompts; send one per request",
                           param="prompt")
        backend_of(body.model)
        release = admit(body.model, "completions")
        try:
            args = await counted_prepare(body, "completions", prompts[0],
                                         DEFAULT_COMPLETION_MAX_TOKENS)
            rid, now, outcome = f"cmpl-{secrets.token_hex(12)}", int(time.time()), _Outcome()

            def chunk(text: str, finish: str | None) -> dict[str, Any]:
                return {"id": rid, "object": "text_completion", "created": now,
                        "model": body.model, "choices": [{"text": text, "index": 0,
                                                          "logprobs": None,
                                                          "finish_reason": finish}]}

            if body.stream:
                deltas = await started(body, "completions", args, outcome)

                async def stream() -> AsyncIterator[dict]:
                    async for delta in deltas:
                        if delta:
                            yield chunk(delta, None)
                    yield chunk("", outcome.finish_reason)
                response = sse(stream(), release)
                release = _kept  # the stream frees the place when it ends
                return response
            outcome = await collect(body, "completions", args)
            return {**chunk(outcome.text, outcome.finish_reason), "usage": usage(outcome)}
        finally:
            release()

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest):
        backend_of(body.model)
        release = admit(body.model, "chat")
        try:
            try:
                prompt = await asyncio.to_thread(tok_of(body.model).apply_chat_template,
                                                 [(m.role, m.text()) for m in body.messages])
            except (ValueError, TemplateError) as exc:  # no template, or messages it refuses
                raise ApiError(400, f"The messages cannot be rendered with the model's chat "
                               f"template: {exc}", param="messages") from None
            args = await counted_prepare(body, "chat", prompt, None)
            rid, now = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
            outcome = _Outcome()

            def chunk(delta: dict[str, str], finish: str | None) -> dict[str, Any]:
                return {"id": rid, "object": "chat.completion.chunk", "created": now,
                        "model": body.model,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

            if body.stream:
                deltas = await started(body, "chat", args, outcome)

                async def stream() -> AsyncIterator[dict]:
                    yield chunk({"role": "assistant", "content": ""}, None)
                    async for delta in deltas:
                        if delta:
                            yield chunk({"content": delta}, None)
                    yield chunk({}, outcome.finish_reason)
                response = sse(stream(), release)
                release = _kept  # the stream frees the place when it ends
                return response
            outcome = await collect(body, "chat", args)
            return {"id": rid, "object": "chat.completion", "created": now,
                    "model": body.model,
                    "choices": [{"index": 0, "message": {"role": "assistant",
                                                         "content": outcome.text},
                                 "finish_reason": outcome.finish_reason}],
                    "usage": usage(outcome)}
        finally:
            release()

    return app


def _kept() -> None:
    """A request's place that a stream now holds (it frees it itself)."""
