"""The gateway's edge: bounds on what one HTTP client may make the server hold or wait for,
checked before any request reaches a route.

- `GuardMiddleware` (ASGI): the Host header against an allow-list (a page on another site
  that rebinds its DNS name to 127.0.0.1 sends its own name, so a localhost gateway refuses
  it); the API key on every path but /health and /metrics (the OpenAPI schema and the admin
  routes included), with the bearer scheme matched case-insensitively as RFC 9110 asks; the
  body read whole before the route runs, at most `max_body_bytes` (413) within
  `body_timeout_s` (408).
- `guarded_protocol`: uvicorn's h11 protocol with a deadline for each request's head (a
  client that trickles its headers is answered 408 and disconnected) and 431 for a head
  over `max_header_bytes`; error answers let the client finish sending before the
  connection closes, so that it reads the status instead of a reset.

Admission (429 past a model's queue depth) is the gateway's (`coral.runtime.gateway`): it
needs the model's name from the body.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Largest request body by default: a long context's prompt is well under it.
MAX_BODY_BYTES = 2 * 1024 * 1024
#: Longest time to read a request's body once its head arrived.
BODY_TIMEOUT_S = 30.0
#: Longest time from a connection's start (or its previous response) to a complete head.
HEADER_TIMEOUT_S = 10.0
#: Largest request head (request line and headers).
MAX_HEADER_BYTES = 32 * 1024
#: How long an error answer keeps reading (and dropping) what the client still sends.
LINGER_S = 1.0
#: Paths open without the API key (probes and scrapers; bind to a private network).
OPEN_PATHS = ("/health", "/metrics")
#: Names a loopback-bound gateway answers to.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class GatewayLimits:
    """What one request or client may cost the gateway (see the module)."""

    max_body_bytes: int = MAX_BODY_BYTES
    body_timeout_s: float = BODY_TIMEOUT_S
    header_timeout_s: float = HEADER_TIMEOUT_S
    max_header_bytes: int = MAX_HEADER_BYTES
    max_queue: int | None = None
    """Requests of one model admitted at once (running or waiting for the model); more are
    answered 429 with Retry-After. None: no limit."""
    allowed_hosts: tuple[str, ...] | None = None
    """Host header names accepted (without port; "*" any). None: any."""
    linger_s: float = field(default=LINGER_S, repr=False)

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_header_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be at least 1")
        for name in ("body_timeout_s", "header_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be positive")
        if self.max_queue is not None and self.max_queue < 1:
            raise ValueError(f"max_queue ({self.max_queue}) must be at least 1 (or None: "
                             "no limit)")


def default_allowed_hosts(bind_host: str, extra: Iterable[str] = ()) -> tuple[str, ...] | None:
    """Host names a gateway bound to `bind_host` answers to: the bound address, plus the
    localhost names when it is loopback; None (any) for a wildcard bind without `extra`
    (its names are not known here: pass them as `extra`)."""
    names = [h.strip().lower() for h in extra if h.strip()]
    host = bind_host.strip("[]").lower()
    if host in ("0.0.0.0", "::", ""):
        return tuple(names) or None
    names.append(host)
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        names.extend(LOOPBACK_NAMES)
    return tuple(dict.fromkeys(names))


def host_name(header: str) -> str:
    """The name of a Host header, without port or brackets, lower case."""
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8000
        return header[1:].partition("]")[0]
    if header.count(":") == 1:
        header = header.partition(":")[0]
    return header.rstrip(".")


def bearer_token(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header (scheme in any case)."""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _error_body(message: str, *, type: str = "invalid_request_error",
                code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type, "param": None,
                                 "code": code}}).encode()


async def _answer(send: Send, status: int, message: str, *, code: str | None = None,
                  headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    body = _error_body(message, code=code)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


class _BodyTooLarge(Exception):
    pass


class GuardMiddleware:
    """Host check, API key and a bounded body read in front of `app` (see the module)."""

    def __init__(self, app: Asgi, limits: GatewayLimits, api_key: str | None = None):
        self.app, self.limits, self.api_key = app, limits, api_key
        self._allowed = (None if limits.allowed_hosts is None or "*" in limits.allowed_hosts
                         else frozenset(host_name(h) for h in limits.allowed_hosts))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if self._allowed is not None and host_name(headers.get("host", "")) not in self._allowed:
            await _answer(send, 400, "Invalid Host header: this gateway answers to "
                          f"{', '.join(sorted(self._allowed))} (to allow another name, start "
                          "it with --allowed-host NAME).", code="invalid_host")
            return
        if self.api_key is not None and scope["path"] not in OPEN_PATHS:
            token = bearer_token(headers.get("authorization", ""))
            if token is None or not secrets.compare_digest(token.encode(),
                                                           self.api_key.encode()):
                await _answer(send, 401, "Incorrect API key provided.",
                              code="invalid_api_key",
                              headers=[(b"www-authenticate", b"Bearer")])
                return
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE") and \
                "content-length" not in headers and "transfer-encoding" not in headers:
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            if headers.get("expect", "").lower() != "100-continue":
                await self._drain(receive)  # so that the client reads the answer
            await _answer(send, 413, f"The request body ({int(declared)} bytes) is larger "
                          f"than this gateway's limit of {limit} bytes.",
                          code="request_too_large", headers=[(b"connection", b"close")])
            return
        try:
            body = await asyncio.wait_for(self._read(receive, limit),
                                          self.limits.body_timeout_s)
        except _BodyTooLarge:
            await self._drain(receive)
            await _answer(send, 413, f"The request body is larger than this gateway's limit "
                          f"of {limit} bytes.", code="request_too_large",
                          headers=[(b"connection", b"close")])
            return
        except asyncio.TimeoutError:
            await _answer(send, 408, "The request body did not arrive within "
                          f"{self.limits.body_timeout_s:g} s.", code="request_timeout",
                          headers=[(b"connection", b"close")])
            return
        if body is None:  # the client left
            return
        await self.app(scope, _replay(body, receive), send)

    async def _drain(self, receive: Receive) -> None:
        """Read and drop the rest of a refused body, for at most the linger time: a client
        that is still sending when the connection closes sees a reset, not the answer."""
        async def drop() -> None:
            while True:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return

        try:
            await asyncio.wait_for(drop(), self.limits.linger_s)
        except asyncio.TimeoutError:
            pass

    @staticmethod
    async def _read(receive: Receive, limit: int) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body read already, then what the client sends next (its
    disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# ---------------------------------------------------------------- the HTTP protocol
_REASONS = {400: "Bad Request", 408: "Request Timeout",
            431: "Request Header Fields Too Large"}


def guarded_protocol(limits: GatewayLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with `limits`' head deadline and 431 (see the module); pass it
    as uvicorn's `http` with `h11_max_incomplete_event_size=limits.max_header_bytes`."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._dropping = False
            self._head_timer: asyncio.TimerHandle | None = None
            super().connection_made(transport)
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(limits.header_timeout_s, self._head_late)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            waiting = self.conn.their_state is h11.IDLE and (
                self.cycle is None or self.cycle.response_complete)
            if waiting and not self.transport.is_closing():
                self._refuse(408, "The request's head did not arrive within "
                             f"{limits.header_timeout_s:g} s.", "request_timeout", linger=False)

        def data_received(self, data: bytes) -> None:
            if self._dropping:  # an error was answered: read to the end of what comes
                return
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._cancel_head_timer()  # the head is complete

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm_head_timer()

        def send_400_response(self, msg: str) -> None:
            if len(self.conn.trailing_data[0]) > limits.max_header_bytes:
                self._refuse(431, f"The request head is larger than this gateway's limit of "
                             f"{limits.max_header_bytes} bytes.", "headers_too_large")
            else:
                self._refuse(400, msg, None)

        def _refuse(self, status: int, message: str, code: str | None, *,
                    linger: bool = True) -> None:
            self._cancel_head_timer()
            body = _error_body(message, code=code)
            head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                    "content-type: application/json\r\nconnection: close\r\n"
                    f"content-length: {len(body)}\r\n\r\n").encode()
            self.transport.write(head + body)
            self._dropping = True
            if linger:  # let the client finish sending, so that it reads the answer
                self.loop.call_later(limits.linger_s, self.transport.close)
            else:
                self.transport.close()

    return GuardedH11Protocol


def uvicorn_options(limits: GatewayLimits) -> dict[str, Any]:
    """uvicorn.Config arguments that apply `limits` to the HTTP server."""
    return {"http": guarded_protocol(limits),
            "h11_max_incomplete_event_size": limits.max_header_bytes}
