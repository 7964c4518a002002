"""The OpenAI API's side of the gateway: request bodies as the client sends them, and errors in
OpenAI's JSON shape (`{"error": {"message", "type", "param", "code"}}`), a backend's failure
among them (always 503 with `Retry-After`: the client may resend)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from coral.runtime.backends import (
    BackendError,
    ModelUnavailableError,
    PoisonRequestError,
    RequestFailedError,
    RetriableBackendError,
)

MAX_STOP_SEQUENCES = 4
#: Error code of a request whose instance was lost after its stream began (safe to resend).
RETRIABLE_CODE = "instance_lost"
#: Error code of a request whose model has no ready instance (HTTP 503, safe to resend).
UNAVAILABLE_CODE = "model_unavailable"
#: Retry-After of a request cut by a lost instance: the model's other instances, or its
#: replacement, usually take it at once.
LOST_RETRY_AFTER_S = 1
#: Seeds are 64-bit integers (what OpenAI's clients send and the sampler's generator takes).
SEED_MIN, SEED_MAX = -(2 ** 63), 2 ** 63 - 1
#: Upper bound of max_tokens before the context check (which is the real bound): keeps the
#: arithmetic on it small.
MAX_TOKENS_LIMIT = 2 ** 31 - 1


def _utf8(text: str) -> str:
    """Text that UTF-8 can carry: JSON's `\\ud800` escapes decode to lone surrogates, which no
    tokenizer can encode (a client error, not a server one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"holds a lone surrogate (U+{ord(text[exc.start]):04X}) at index "
                         f"{exc.start}, which is not valid Unicode text") from None
    return text


#: A string, strictly (no number or boolean coerced), valid as UTF-8.
Text = Annotated[str, AfterValidator(_utf8)]


# ---------------------------------------------------------------- request bodies
class RequestBody(BaseModel):
    """Fields as OpenAI documents them, typed strictly (`"max_tokens": "3"` and `"stream":
    "yes"` are refused, not coerced) and bounded by OpenAI's documented ranges. Unknown
    fields (user, logit_bias, ...) are accepted and ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: Text = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    stop: Text | list[Text] | None = Field(default=None)
    stream: bool = False
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    n: int = Field(default=1, ge=1, le=1, description="Only one choice per request.")
    user: Text | None = Field(default=None, max_length=1024)

    def stop_list(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ApiError(400, f"'stop' has {len(stops)} sequences; at most "
                           f"{MAX_STOP_SEQUENCES} are allowed", param="stop")
        return [s for s in stops if s]


class CompletionRequest(RequestBody):
    prompt: Text | list[Text]

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, prompt: str | list[str]) -> str | list[str]:
        # an empty prompt has nothing to continue (and some tokenizers give it no token)
        if prompt == "" or (isinstance(prompt, list) and "" in prompt):
            raise ValueError("the prompt is empty; send some text to continue")
        return prompt


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True)
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatRequest(RequestBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)


# ---------------------------------------------------------------- errors
class ApiError(Exception):
    """An error returned to the client in OpenAI's shape."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 retry_after_s: int | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status, message, type, param, code)
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        headers = ({"Retry-After": str(self.retry_after_s)}
                   if self.retry_after_s is not None else None)
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def backend_error(exc: BackendError, model: str) -> ApiError:
    """The client's view of a backend failure: retriable (503) when the server's state is to
    blame, final when the request itself cannot be run (so that clients do not resend it)."""
    if isinstance(exc, PoisonRequestError):
        return ApiError(422, f"{exc}. The request is not run again; to fix: change the "
                        "request (prompt or sampling parameters).", code="poison_request")
    if isinstance(exc, RequestFailedError):
        return ApiError(500, f"The request failed on model '{model}': {exc}",
                        type="server_error", code="request_failed")
    if isinstance(exc, ModelUnavailableError):
        return ApiError(503, f"{exc}. Please retry after {exc.retry_after_s} s.",
                        type="service_unavailable", code=UNAVAILABLE_CODE,
                        retry_after_s=exc.retry_after_s)
    if isinstance(exc, RetriableBackendError):
        return ApiError(503, f"The model instance serving this request was lost: {exc}. "
                        "Please retry the request.", type="server_error", code=RETRIABLE_CODE,
                        retry_after_s=LOST_RETRY_AFTER_S)
    return ApiError(503, f"The backend of model '{model}' failed: {exc}", type="server_error",
                    code="backend_unavailable", retry_after_s=LOST_RETRY_AFTER_S)


def model_health(backend: Any) -> dict[str, Any]:
    """A backend's own health (`ready`, `degraded`, `unavailable`), or `ready` for backends
    that are always there (echo, an engine in this process, a vLLM server)."""
    health = getattr(backend, "health", None)
    return health() if callable(health) else {"status": "ready"}


#: Names pydantic gives the members of a union in an error's location (not fields).
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "tuple"})


def _union_tag(part: object) -> bool:
    """Whether a part of an error's location names a union member (`str`,
    `list[function-after[...]]`) rather than a field or an index."""
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part or "(" in part)


def validation_error(exc: RequestValidationError) -> ApiError:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _union_tag(p)]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return ApiError(400, "The request body is not valid JSON.", code="invalid_json")
    what = f"'{param}'" if param else "the request body"
    return ApiError(400, f"Invalid value for {what}: {first.get('msg')}.", param=param,
                    code="invalid_value" if param else None)
