"""Running the gateway's app (`coral.runtime.gateway.create_app`) under uvicorn: in a
background thread (`ServerThread`: tests, benchmarks) or in this thread until a signal
(`run_gateway`: `coral serve`), with the HTTP limits the app was built with."""

from __future__ import annotations

import threading
import time

from fastapi import FastAPI

from coral.runtime.http_guard import GatewayLimits, uvicorn_options

DEFAULT_HOST = "127.0.0.1"
#: How long a stopping server lets requests in flight finish before it closes them.
GRACEFUL_SHUTDOWN_S = 30.0


class ServerThread:
    """Run a uvicorn server for `app` in a background thread (tests, benchmarks, `coral serve`
    when the caller keeps the main thread)."""

    def __init__(self, app: FastAPI, host: str = DEFAULT_HOST, port: int = 0,
                 log_level: str = "warning"):
        import uvicorn

        if port == 0:
            from coral.runtime.worker import free_tcp_port
            port = free_tcp_port(host)
        self.host, self.port = host, port
        limits = getattr(app.state, "limits", None) or GatewayLimits()
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port,
                                                    log_level=log_level, lifespan="off",
                                                    **uvicorn_options(limits)))
        self.thread = threading.Thread(target=self.server.run, name="coral-gateway",
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> "ServerThread":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 10.0) -> None:
        self.thread.start()
        deadline = time.time() + timeout_s
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"gateway did not start on {self.url}")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


def run_gateway(app: FastAPI, *, host: str = DEFAULT_HOST, port: int = 8000,
                log_level: str = "warning", graceful_s: float = GRACEFUL_SHUTDOWN_S) -> None:
    """Serve `app` in this thread until SIGINT or SIGTERM: then stop accepting connections,
    let the requests in flight finish (at most `graceful_s`) and return, so that the caller
    stops its workers. Uvicorn raises the signal again once it has stopped; run this inside
    `coral.runtime.lifecycle.stop_on_signals()` so that it unwinds instead of killing the
    process before the caller's cleanup."""
    import uvicorn

    limits = getattr(app.state, "limits", None) or GatewayLimits()
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                  timeout_graceful_shutdown=graceful_s,
                                  **uvicorn_options(limits))).run()
