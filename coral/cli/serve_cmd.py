"""`coral serve`: run pipeline workers and the OpenAI-compatible gateway on this machine."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from coral.cli.common import UserError, console, user_errors


def serve(
    tiny: Annotated[bool, typer.Option(
        "--tiny", help="Serve a tiny random-weight model (model name 'tiny-random') split over "
        "pipeline worker processes; output is noise, for trying the API.")] = False,
    stages: Annotated[int, typer.Option(
        "--stages", min=1, max=6, help="Pipeline stages (one worker process each).")] = 3,
    in_process: Annotated[bool, typer.Option(
        "--in-process", help="Run the stages inside the gateway process (no workers).")] = False,
    host: Annotated[str, typer.Option(
        "--host", help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 8000,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", envvar="CORAL_API_KEY",
        help="Require 'Authorization: Bearer KEY' on /v1/* (also $CORAL_API_KEY).")] = None,
) -> None:
    """Serve models over an OpenAI-compatible API (/v1/completions, /v1/chat/completions)."""
    with user_errors():
        if not tiny:
            raise UserError("only the built-in tiny deployment can be served so far; "
                            "to fix: pass --tiny")
        try:
            import uvicorn

            from coral.runtime.deploy import TinyDeployment, start_tiny
            from coral.runtime.gateway import create_app
        except ImportError as exc:
            raise UserError(f"serving needs the runtime extra ({exc.name} is missing); "
                            "to fix: pip install 'coral-serving[runtime]'") from None
        deployment = TinyDeployment(num_stages=stages, in_process=in_process)
    console.print(f"starting {'in-process stages' if in_process else f'{stages} workers'} ...")
    engine, backend = start_tiny(deployment)
    try:
        app = create_app({"tiny-random": backend}, api_key=api_key)
        console.print(f"gateway on http://{host}:{port}/v1 (model 'tiny-random')")
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        engine.stop()
