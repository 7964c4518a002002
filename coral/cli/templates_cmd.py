"""`coral templates ...`: build, solve and inspect serving-template libraries."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from coral.cli.common import (
    CatalogFiles,
    JsonFlag,
    UserError,
    console,
    err_console,
    native_stdout_to_stderr,
    open_catalog,
    print_json,
    user_errors,
)
from coral.cli.plan_cmd import EngineChoice

app = typer.Typer(
    help="Serving templates: the best placement of a model on each node combination.",
    no_args_is_help=True,
)

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Model name (catalog).")]
TpotOpt = Annotated[
    Optional[float],
    typer.Option("--tpot", help="TPOT target, seconds per output token (default: the model's)."),
]
TtftOpt = Annotated[
    Optional[float],
    typer.Option("--ttft", help="TTFT target, seconds to the first token (default: the model's)."),
]
InputOpt = Annotated[
    Optional[int],
    typer.Option("--input-tokens", help="Mean prompt length, tokens (default: 1024)."),
]
OutputOpt = Annotated[
    Optional[int],
    typer.Option("--output-tokens", help="Mean output length, tokens (default: 256)."),
]
TopologyOpt = Annotated[
    Optional[str],
    typer.Option("--topology", help="flow (pipelines of data-parallel stages), chain (plain pipeline) or dag (any DAG of layer ranges; slow MILP) (default: flow; chain with --engine vllm, which runs nothing else)."),
]
EngineOpt = Annotated[EngineChoice, typer.Option(
    "--engine", help="Serving engine the templates must be deployable on: coral, or vllm "
    "(one node per stage, one GPU count per pipeline, one batch on every node).",
    case_sensitive=False)]
TimeLimitOpt = Annotated[
    float, typer.Option("--time-limit", help="Time limit of one placement solve, seconds.")
]
BatchesOpt = Annotated[
    Optional[str],
    typer.Option("--batches", help="Decode batch sizes, comma-separated (default: 1,2,...,256)."),
]


def _split(text: str | None) -> list[str] | None:
    if text is None:
        return None
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise UserError(f"bad list {text!r}: empty entry between commas")
    return items


def _modes(mode: str) -> list[str]:
    if mode == "pd":
        return ["prefill", "decode"]
    if mode in ("aggregated", "prefill", "decode"):
        return [mode]
    raise UserError(f"unknown mode {mode!r}; choose aggregated, pd, prefill or decode")


def _batches(text: str | None) -> tuple[int, ...]:
    from coral.templates.space.operating_points import DEFAULT_BATCHES

    if text is None:
        return DEFAULT_BATCHES
    try:
        values = tuple(int(x) for x in _split(text) or ())
    except ValueError:
        raise UserError(f"bad --batches {text!r}: expected positive integers, e.g. 1,4,16") from None
    if not values or min(values) < 1:
        raise UserError(f"bad --batches {text!r}: expected positive integers, e.g. 1,4,16")
    return values


def _topology(engine: EngineChoice, topology: str | None) -> str:
    from coral.templates.space.engines import engine_topology
    from coral.templates.space.operating_points import check_topology

    return check_topology(engine_topology(EngineChoice(engine).value, topology))


def _slo(cat: Any, model: str, *, tpot_s: float | None, ttft_s: float | None,
         input_tokens: int | None, output_tokens: int | None) -> Any:
    """The model's default SLO with the flags given overriding it."""
    from coral.templates.slo import resolve_slo

    return resolve_slo(cat.model(model), tpot_s=tpot_s, ttft_s=ttft_s,
                       input_tokens=input_tokens, output_tokens=output_tokens)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f}"


def _price(tpl: Any) -> float | None:
    return tpl.min_usd_per_hour()


def _template_payload(tpl: Any) -> dict[str, Any]:
    d = tpl.to_dict()
    d["min_usd_per_hour"] = _price(tpl)
    return d


def _print_template(tpl: Any) -> None:
    from coral.templates.template import THROUGHPUT_UNITS

    unit = THROUGHPUT_UNITS[tpl.mode]
    note = next((n for n in tpl.notes if n.startswith("vllm:")), None)
    title = f"{tpl.model} on {', '.join(tpl.combo)} ({tpl.mode}, {tpl.topology}" + (
        f"; {note})" if note else ")")
    table = Table(title=title, title_justify="left")
    for col in ("#", "node type", "layers [a, b)", "batch", "TP", f"capacity ({unit})",
                "step (ms)", "prefill (ms)", "memory (GB)"):
        table.add_column(col, justify="left" if col in ("node type", "layers [a, b)") else "right")
    for i, n in enumerate(tpl.nodes):
        used = n.layers > 0
        table.add_row(
            str(i), n.node_type,
            f"[{n.first_layer}, {n.first_layer + n.layers})" if used else "unused",
            str(n.batch) if used else "-", str(n.tp_degree),
            f"{n.capacity:.3f}" if used else "-",
            _ms(n.step_s) if used else "-", _ms(n.prefill_s) if used else "-",
            f"{n.mem_bytes / 1e9:.1f}" if used else "-",
        )
    console.print(table)
    flows = [e for e in tpl.edges if e[2] > 1e-9]
    if flows:
        def name(i: int) -> str:
            return {-1: "source", -2: "sink"}.get(i, f"#{i}")
        console.print("flows: " + ", ".join(f"{name(u)}→{name(v)} {f:.3f}" for u, v, f in flows),
                      highlight=False)
    lines = [
        f"throughput: {tpl.throughput:.3f} {unit} = {tpl.throughput_rps:.3f} req/s, "
        f"{tpl.throughput_tokens_per_s:.1f} "
        f"{'prompt' if tpl.mode == 'prefill' else 'output'} tokens/s",
        f"predicted TTFT: {_s(tpl.ttft_s)} s (target {tpl.slo.ttft_s:g} s); "
        f"predicted TPOT: {_ms(tpl.tpot_s)} ms (target {tpl.slo.tpot_s * 1e3:g} ms)",
        f"status: {tpl.status.value}, gap {tpl.gap * 100:.2f}%, solve time {tpl.solve_s:.3f} s "
        f"({tpl.method})",
    ]
    price = _price(tpl)
    if price is not None:
        lines.append(f"$/hour: {price:.2f} (cheapest of {len(tpl.usd_per_hour)} regions)")
    for line in lines:
        console.print(line, highlight=False)


@app.command("solve")
def solve(
    model: ModelOpt,
    combo: Annotated[str, typer.Option(
        "--combo", help="Node types, comma-separated; NAME*COUNT repeats one "
        "(e.g. 1x-l4,1x-l4,4x-a100-40gb or 1x-l4*2,4x-a100-40gb).")],
    tpot: TpotOpt = None,
    ttft: TtftOpt = None,
    input_tokens: InputOpt = None,
    output_tokens: OutputOpt = None,
    mode: Annotated[str, typer.Option(
        "--mode", help="aggregated, prefill, decode, or pd (both halves).")] = "aggregated",
    topology: TopologyOpt = None,
    engine: EngineOpt = EngineChoice.coral,
    time_limit: TimeLimitOpt = 60.0,
    method: Annotated[str, typer.Option("--method", help="Placement solver method.")] = "auto",
    batches: BatchesOpt = None,
    catalog: CatalogFiles = None,
    json: JsonFlag = False,
) -> None:
    """Solve one node combination and print its placement."""
    from coral.templates.builder.solve import build_template, explain_infeasible
    from coral.templates.space.engines import deployable_combo
    from coral.templates.space.enumerate import parse_combo
    from coral.templates.space.operating_points import OperatingPointTables
    from coral.templates.builder.parallel import default_perf_factory

    with user_errors():
        cat = open_catalog(catalog)
        arch = cat.model(model)
        slo = _slo(cat, model, tpot_s=tpot, ttft_s=ttft, input_tokens=input_tokens,
                   output_tokens=output_tokens)
        names = parse_combo(combo)
        for n in names:
            cat.node_type(n)
        modes = _modes(mode)
        topology = _topology(engine, topology)
        eng = EngineChoice(engine).value
        if not deployable_combo(eng, cat, names):
            gpus = sorted({cat.node_type(n).gpu_count for n in names})
            raise UserError(f"engine {eng} runs one GPU count per pipeline (tensor parallel = "
                            f"GPUs per node); {', '.join(sorted(names))} mix {gpus} GPUs per "
                            "node")
        if time_limit <= 0:
            raise UserError(f"--time-limit must be > 0 s, got {time_limit:g}")
        perf = default_perf_factory(cat)
        tables = OperatingPointTables(perf, cat, batches=_batches(batches))
        results = []
        for m in modes:
            with native_stdout_to_stderr(json):
                tpl = build_template(arch, names, slo, m, topology, perf, cat, tables=tables,  # type: ignore[arg-type]
                    time_limit_s=time_limit, method=method, engine=eng)
            if not tpl.feasible:
                why = explain_infeasible(arch, names, slo, m, tables)  # type: ignore[arg-type]
                raise UserError(
                    f"no {m} placement of {model} on {', '.join(tpl.combo)} meets "
                    f"{slo.describe()}: {why}"
                )
            results.append(tpl)
    if json:
        payload = [_template_payload(t) for t in results]
        print_json(payload[0] if len(payload) == 1 else payload)
        return
    console.print(f"SLO: {slo.describe()}", highlight=False)
    for tpl in results:
        _print_template(tpl)


@app.command("build")
def build(
    model: ModelOpt,
    tpot: TpotOpt = None,
    ttft: TtftOpt = None,
    input_tokens: InputOpt = None,
    output_tokens: OutputOpt = None,
    nmax: Annotated[int, typer.Option("--nmax", help="Most nodes in one combination.")] = 6,
    rho: Annotated[float, typer.Option(
        "--rho", help="Largest total GPU memory of a combination, x the weight bytes.")] = 12.0,
    mode: Annotated[str, typer.Option(
        "--mode", help="aggregated, or pd (a prefill and a decode library).")] = "aggregated",
    topology: TopologyOpt = None,
    engine: EngineOpt = EngineChoice.coral,
    nodes: Annotated[Optional[str], typer.Option(
        "--nodes", help="Only these node types, comma-separated (default: all).")] = None,
    regions: Annotated[Optional[str], typer.Option(
        "--regions", help="Only node types priced in these regions, comma-separated.")] = None,
    out: Annotated[Path, typer.Option(
        "--out", help="Root directory; a library goes to OUT/MODEL/MODE (OUT/MODEL/MODE-vllm "
        "with --engine vllm).")] = Path("out/templates"),
    workers: Annotated[Optional[int], typer.Option(
        "--workers", help="Local worker processes (default: one per CPU).")] = None,
    ray: Annotated[Optional[str], typer.Option(
        "--ray", help="Solve on a Ray cluster at this address (e.g. auto, ray://host:10001).")] = None,
    time_limit: TimeLimitOpt = 60.0,
    method: Annotated[str, typer.Option("--method", help="Placement solver method.")] = "auto",
    batches: BatchesOpt = None,
    progress: Annotated[Optional[bool], typer.Option(
        "--progress/--no-progress", help="Progress bar on stderr (default: when a terminal).")] = None,
    catalog: CatalogFiles = None,
    json: JsonFlag = False,
) -> None:
    """Build (or resume) the template library of a model: enumerate, solve, prune."""
    from coral.templates.builder.build import build_library
    from coral.templates.builder.build_options import BuildOptions
    from coral.templates.builder.store import default_library_dir

    reports = []
    with user_errors():
        cat = open_catalog(catalog)
        arch = cat.model(model)
        slo = _slo(cat, model, tpot_s=tpot, ttft_s=ttft, input_tokens=input_tokens,
                   output_tokens=output_tokens)
        if mode not in ("aggregated", "pd", "prefill", "decode"):
            raise UserError(f"unknown mode {mode!r}; choose aggregated or pd")
        topology = _topology(engine, topology)
        eng = EngineChoice(engine).value
        if nmax < 1:
            raise UserError(f"--nmax must be >= 1, got {nmax}")
        if rho <= 0:
            raise UserError(f"--rho must be > 0, got {rho:g}")
        if workers is not None and workers < 1:
            raise UserError(f"--workers must be >= 1, got {workers}")
        if time_limit <= 0:
            raise UserError(f"--time-limit must be > 0 s, got {time_limit:g}")
        node_list = _split(nodes)
        region_list = _split(regions)
        for n in node_list or ():
            cat.node_type(n)
        for r in region_list or ():
            cat.region(r)
        show_progress = sys.stderr.isatty() if progress is None else progress
        options = BuildOptions(engine=eng, topology=topology,  # type: ignore[arg-type]
                               batches=_batches(batches), workers=workers, ray_address=ray,
                               time_limit_s=time_limit, method=method)

        def say(msg: str) -> None:
            err_console.print(f"[dim]{msg}[/]", highlight=False, soft_wrap=True)

        for m in _modes(mode):
            with native_stdout_to_stderr(json):
                _, report = build_library(
                    arch, cat, slo=slo, mode=m, nmax=nmax, rho=rho,  # type: ignore[arg-type]
                    node_types=node_list, regions=region_list, options=options,
                    out=default_library_dir(out, arch.name, m, eng),
                    progress=show_progress, on_message=say,
                )
            reports.append(report)
    if json:
        payload = [r.summary() for r in reports]
        print_json(payload[0] if len(payload) == 1 else payload)
        return
    for r in reports:
        _print_report(r.summary())


def _print_report(s: dict[str, Any]) -> None:
    table = Table(title=f"Template library {s['model']} ({s['mode']}) at {s['path']}",
                  title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    o = s["outcomes"]
    rows = [
        ("combinations enumerated", s["combos_enumerated"]),
        ("pruned: memory below weights + KV reserve", s["combos_pruned_memory_low"]),
        ("pruned: memory above rho x weights", s["combos_pruned_memory_high"]),
        ("pruned: no region prices every node", s["combos_pruned_no_region"]),
        *((("pruned: not deployable on the engine (GPU counts differ)",
            s["combos_pruned_engine"]),) if "combos_pruned_engine" in s else ()),
        ("candidates", s["combos_candidates"]),
        ("skipped by the throughput bound", o["bound"]),
        ("solved now / reused from disk", f"{s['solved_now']} / {s['reused']}"),
        ("infeasible / zero throughput", f"{o['infeasible']} / {o['zero']}"),
        ("dominated by a sub-multiset", o["dominated"]),
        ("kept templates", o["kept"]),
        ("solved to optimality",
         "-" if s["optimal_share"] is None else f"{s['optimal_share'] * 100:.1f}%"),
        ("solve time median / p99 (s)",
         "-" if s["solve_s_median"] is None
         else f"{s['solve_s_median']:.3f} / {s['solve_s_p99']:.3f}"),
        ("wall time (s)", f"{s['wall_s']:.1f}"),
    ]
    for k, v in rows:
        table.add_row(k, str(v))
    console.print(table)
    if s["excluded_node_types"]:
        console.print("excluded node types: " + "; ".join(
            f"{k} ({v})" for k, v in sorted(s["excluded_node_types"].items())), highlight=False)


@app.command("show")
def show(
    directory: Annotated[Path, typer.Argument(
        help="A library directory, or a root holding several (e.g. out/templates).")],
    top: Annotated[int, typer.Option("--top", help="Templates to list per library.")] = 20,
    sort: Annotated[str, typer.Option(
        "--sort", help="per-dollar (throughput per $/hour), throughput, or cost.")] = "per-dollar",
    json: JsonFlag = False,
) -> None:
    """Show a template library: inputs, counts and its best templates."""
    from coral.templates.builder.store import TemplateLibrary, find_libraries

    with user_errors():
        if top < 0:
            raise UserError(f"--top must be >= 0, got {top}")
        keys = {
            "per-dollar": lambda t: -(t.throughput / (_price(t) or float("inf"))),
            "throughput": lambda t: -t.throughput,
            "cost": lambda t: (_price(t) if _price(t) is not None else float("inf")),
        }
        if sort not in keys:
            raise UserError(f"unknown --sort {sort!r}; choose {', '.join(keys)}")
        paths = find_libraries(directory)
        if not paths:
            raise UserError(f"{directory}: no template library found (no manifest.json)")
        libs = [TemplateLibrary.open(p) for p in paths]
        payload = []
        for lib in libs:
            tpls = sorted(lib.templates(), key=keys[sort])
            payload.append({
                "path": str(lib.path),
                "digest": lib.digest,
                "complete": lib.complete,
                "inputs": lib.inputs,
                "counts": lib.counts(),
                "report": lib.manifest.get("report"),
                "templates": tpls,
            })
    if json:
        for p in payload:
            p["templates"] = [_template_payload(t) for t in p["templates"][:top]]
        print_json(payload[0] if len(payload) == 1 else payload)
        return
    for p in payload:
        inputs = p["inputs"]
        slo = inputs["slo"]
        console.print(
            f"[bold]{p['path']}[/]: {inputs['model']} {inputs['mode']} {inputs['topology']}, "
            f"engine {inputs.get('engine', 'coral')}, "
            f"TPOT {slo['tpot_s'] * 1e3:g} ms, TTFT {slo['ttft_s']:g} s, "
            f"{slo['input_tokens']} in / {slo['output_tokens']} out tokens, nmax "
            f"{inputs['nmax']}, rho {inputs['rho']:g}"
            f"{'' if p['complete'] else ' [yellow](incomplete)[/]'}",
            highlight=False,
        )
        console.print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(p["counts"].items())),
                      highlight=False)
        tpls = p["templates"][:top]
        if not tpls:
            console.print("no kept templates")
            continue
        unit = tpls[0].unit
        table = Table(title_justify="left")
        for col in ("nodes", f"throughput ({unit})", "req/s", "TTFT (s)", "TPOT (ms)",
                    "min $/hour", f"{unit} per $/hour", "status (gap)"):
            table.add_column(col, justify="left" if col == "nodes" else "right")
        for t in tpls:
            price = _price(t)
            table.add_row(
                ", ".join(t.combo), f"{t.throughput:.3f}", f"{t.throughput_rps:.3f}",
                _s(t.ttft_s), _ms(t.tpot_s), "-" if price is None else f"{price:.2f}",
                "-" if not price else f"{t.throughput / price:.3f}",
                t.status.value + (f" ({t.gap * 100:.1f}%)" if t.gap > 0 else ""),
            )
        console.print(table)
