"""The OpenAI API's side of the gateway: request bodies as the client sends them, and errors in
OpenAI's JSON shape (`{"error": {"message", "type", "param", "code"}}`), a backend's failure
among them (always 503 with `Retry-After`: the client may resend)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from coral.runtime.backends import BackendError, ModelUnavailableError, RetriableBackendError

MAX_STOP_SEQUENCES = 4
#: Error code of a request whose instance was lost after its stream began (safe to resend).
RETRIABLE_CODE = "instance_lost"
#: Error code of a request whose model has no ready instance (HTTP 503, safe to resend).
UNAVAILABLE_CODE = "model_unavailable"
#: Retry-After of a request cut by a lost instance: the model's other instances, or its
#: replacement, usually take it at once.
LOST_RETRY_AFTER_S = 1


# ---------------------------------------------------------------- request bodies
class RequestBody(BaseModel):
    # Unknown OpenAI fields (top_p, user, logit_bias, ...) are accepted and ignored.
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    stop: str | list[str] | None = None
    stream: bool = False
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1, description="Only one choice per request.")

    def stop_list(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ApiError(400, f"'stop' has {len(stops)} sequences; at most "
                           f"{MAX_STOP_SEQUENCES} are allowed", param="stop")
        return [s for s in stops if s]


class CompletionRequest(RequestBody):
    prompt: str | list[str]


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatRequest(RequestBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


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
    """The client's view of a backend failure: always retriable (503), never its fault."""
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


def validation_error(exc: RequestValidationError) -> ApiError:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return ApiError(400, "The request body is not valid JSON.", code="invalid_json")
    what = f"'{param}'" if param else "the request body"
    return ApiError(400, f"Invalid value for {what}: {first.get('msg')}.", param=param,
                    code="invalid_value" if param else None)
