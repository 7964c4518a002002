"""`coral perf ...`: predict iteration times and report the calibration."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from coral.catalog import Catalog
from coral.perf.vidur_profiles import short_model_name
from coral.cli.common import (
    CatalogFiles,
    JsonFlag,
    UserError,
    console,
    open_catalog,
    print_json,
    user_errors,
)

app = typer.Typer(help="Performance model: predict iteration times, show the calibration.",
                  no_args_is_help=True)


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:.4g}"


@app.command()
def predict(
    model: Annotated[str, typer.Option("--model", "-m", help="Model name (catalog).")],
    node: Annotated[str, typer.Option("--node", "-n", help="Node type name (catalog).")],
    layers: Annotated[
        int | None,
        typer.Option("--layers", "-k",
                     help="Consecutive layers on the node (default: all of the model's layers)."),
    ] = None,
    prefill_tokens: Annotated[
        int,
        typer.Option("--prefill-tokens", "-p", help="Prompt tokens in the iteration (one chunk)."),
    ] = 0,
    decode_batch: Annotated[
        int, typer.Option("--decode-batch", "-b", help="Decoding sequences in the iteration.")
    ] = 0,
    context: Annotated[
        int | None,
        typer.Option("--context", "-c", help="Total context tokens of the decoding sequences."),
    ] = None,
    first_stage: Annotated[
        bool, typer.Option("--first-stage", help="Include the embedding lookup.")
    ] = False,
    last_stage: Annotated[
        bool, typer.Option("--last-stage", help="Include the final norm and LM head.")
    ] = False,
    profile: Annotated[
        list[Path] | None,
        typer.Option("--profile", help="Measured profile table (`coral profile`); repeatable. "
                     "Used instead of the formula for its model and node type."),
    ] = None,
    catalog: CatalogFiles = None,
    json: JsonFlag = False,
) -> None:
    """Predict the time of one iteration of some layers of a model on a node type."""
    from coral.perf.model import MEMORY_RESERVE_FRACTION, PerfModel

    with user_errors():
        cat = open_catalog(catalog)
        arch = cat.model(model)
        node_t = cat.node_type(node)
        tables = []
        if profile:
            from coral.perf.profile_table import ProfileTable

            tables = [ProfileTable.load(p) for p in profile]
        if prefill_tokens < 0 or decode_batch < 0:
            raise UserError("--prefill-tokens and --decode-batch must be >= 0")
        if prefill_tokens == 0 and decode_batch == 0:
            raise UserError(
                "nothing to predict: give --prefill-tokens and/or --decode-batch with --context"
            )
        if context is not None and not decode_batch:
            raise UserError("--context is the total context of the decoding sequences: give "
                            "--decode-batch too")
        if decode_batch and context is None:
            raise UserError("--decode-batch needs --context (total context tokens of the batch)")
        context_tokens = context or 0
        if context_tokens < decode_batch:
            raise UserError(
                f"--context ({context_tokens}) must be at least --decode-batch ({decode_batch}):"
                " each decoding sequence has at least one token of context"
            )
        k = arch.num_layers if layers is None else layers
        if not 1 <= k <= arch.num_layers:
            raise UserError(f"--layers must be between 1 and {arch.num_layers} "
                            f"(the layers of {arch.name}), got {k}")
        pm = PerfModel(cat, tables=tables)
        stage = {"first_stage": first_stage, "last_stage": last_stage}
        node_mem = cat.node_memory_bytes(node_t)
        if not pm.fits(arch, node_t, k, **stage):
            weights = pm.stage_weight_bytes(arch, k, **stage, node=node_t)
            most = pm.max_layers(arch, node_t, **stage)
            raise UserError(
                f"{k} layers of {arch.name} do not fit on {node_t.name}: weights "
                f"{weights / 1e9:.1f} GB, node memory {node_mem / 1e9:.1f} GB "
                f"({(1 - MEMORY_RESERVE_FRACTION) * node_mem / 1e9:.1f} GB usable after the "
                f"{MEMORY_RESERVE_FRACTION:.0%} reserve); at most {most} layers fit"
            )
        kv_needed = context_tokens + prefill_tokens
        kv_max = pm.max_kv_tokens(arch, node_t, k, **stage)
        if kv_needed > kv_max:
            raise UserError(
                f"the KV cache of {kv_needed} tokens (context + prefill) does not fit next to "
                f"{k} layers of {arch.name} on {node_t.name}: at most {kv_max} tokens fit"
            )
        bd = pm.breakdown(arch, node_t, k, prefill_tokens, decode_batch, context_tokens, **stage)
    payload = {
        "model": arch.name,
        "node": node_t.name,
        "layers": k,
        "prefill_tokens": prefill_tokens,
        "decode_batch": decode_batch,
        "context_tokens": context_tokens,
        "first_stage": first_stage,
        "last_stage": last_stage,
        "seconds": bd.total_s,
        "breakdown": {
            "compute_s": bd.compute_s,
            "memory_s": bd.memory_s,
            "comm_s": bd.comm_s,
            "overhead_s": bd.overhead_s,
            "total_s": bd.total_s,
        },
        "max_kv_tokens": kv_max,
        "source": bd.source,
        "efficiencies_from": bd.efficiencies_from,
    }
    if json:
        print_json(payload)
        return
    table = Table(
        title=f"{arch.name} on {node_t.name}: {k} layers, P={prefill_tokens} prefill tokens, "
        f"B={decode_batch} decoding (context {context_tokens} tokens)",
        title_justify="left",
    )
    table.add_column("part")
    table.add_column("time (ms)", justify="right")
    table.add_column("share (%)", justify="right")
    for label, value in (
        ("compute-bound operators", bd.compute_s),
        ("memory-bound operators", bd.memory_s),
        ("TP communication", bd.comm_s),
        ("fixed overheads (kernels, iteration)", bd.overhead_s),
    ):
        table.add_row(label, _fmt_s(value), f"{100 * value / bd.total_s:.1f}")
    table.add_row("[bold]total[/]", f"[bold]{_fmt_s(bd.total_s)}[/]", "100.0")
    console.print(table)
    console.print(f"source: {bd.source}; efficiencies: {bd.efficiencies_from}", highlight=False)
    console.print(f"KV cache room next to these layers: {kv_max} tokens", highlight=False)


def calibration_payload(cat: Catalog, cal, written: Path | None) -> dict:
    """JSON-able report of a calibration against every GPU type in the catalog."""
    from coral.perf.model import ROOFLINE_P

    from coral.perf.sustained import (
        compute_fraction, compute_ratio, elementwise_rate, memory_fraction, scale_borrowed)

    table = cal.table()
    rate = elementwise_rate(table, cat)
    gpus = []
    for gpu in cat.gpus.values():
        eff = table.for_gpu(gpu)
        factor = None
        if eff.borrowed_from:  # as the perf model uses it: scaled to sustained throughput
            donor = cat.gpu(eff.borrowed_from)
            factor = compute_ratio(gpu, donor, cat)
            eff = scale_borrowed(eff, gpu, donor, cat, rate)
        fit = cal.fits.get(gpu.name)
        gpus.append({
            "gpu": gpu.name,
            "architecture": gpu.architecture,
            "eta_compute": eff.eta_compute,
            "eta_memory": eff.eta_memory,
            "eta_elementwise": eff.eta_elementwise,
            "kernel_overhead_s": eff.kernel_overhead_s,
            "points": fit.points if fit else 0,
            "median_rel_error": fit.median_rel_error if fit else None,
            "max_rel_error": fit.max_rel_error if fit else None,
            "fitted": fit is not None,
            "fitted_on": eff.fitted_on,
            "borrowed_from": eff.borrowed_from,
            "sustained_compute_fraction": compute_fraction(gpu, cat),
            # the factor on the donor's matmul efficiency the perf model applies (a public
            # benchmark's like-for-like ratio where both list it, else the fractions' ratio)
            "borrowed_compute_factor": factor,
            "sustained_memory_fraction": memory_fraction(gpu, cat),
        })
    held = [
        {
            "name": h.name,
            "gpu": h.gpu,
            "models": list(h.models),
            "efficiencies_from": h.efficiencies_from,
            "figures": h.figures,
            "points": h.points,
            "median_rel_error": h.median_rel_error,
            "max_rel_error": h.max_rel_error,
        }
        for h in cal.held_out
    ]
    return {
        "gpus": gpus,
        "held_out": held,
        "roofline_p": ROOFLINE_P,
        "written": str(written) if written else None,
    }


@app.command()
def calibrate(
    write: Annotated[
        bool,
        typer.Option("--write", help="Write the fitted figures to the package's "
                     "efficiencies.yaml (what the perf model loads by default)."),
    ] = False,
    from_metrics: Annotated[
        Path | None,
        typer.Option("--from-metrics", help="A runtime's /metrics text: fit each node type's "
                     "efficiencies to its workers' measured step times instead."),
    ] = None,
    node_type: Annotated[
        str | None,
        typer.Option("--node-type", help="With --from-metrics: the node type every worker "
                     "ran on (default: the metrics' node_type label)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="With --from-metrics: the catalog model the workers "
                     "served (default: the metrics' model label)."),
    ] = None,
    plan: Annotated[
        Path | None,
        typer.Option("--plan", help="With --from-metrics: a plan file to simulate as modelled "
                     "and at the measured speeds, to see whether it still meets its SLOs."),
    ] = None,
    duration: Annotated[
        float,
        typer.Option("--duration", help="With --plan: seconds of arrivals per simulation."),
    ] = 120.0,
    catalog: CatalogFiles = None,
    json: JsonFlag = False,
) -> None:
    """Fit per-GPU efficiencies to the measured profiles and report the errors."""
    from coral.cli.perf_metrics import calibrate_from_metrics
    from coral.perf.calibration import calibrate as run_calibration
    from coral.perf.calibration import write_efficiencies

    if from_metrics is not None:
        with user_errors():
            if write:
                raise UserError("--write writes the profile calibration; with --from-metrics "
                                "the fitted figures are reported only")
            calibrate_from_metrics(from_metrics, open_catalog(catalog), node_type, model, json,
                                   plan, duration)
        return
    with user_errors():
        if plan is not None:
            raise UserError("--plan needs --from-metrics: it simulates a plan at the speeds "
                            "the metrics measured")

    with user_errors():
        cat = open_catalog(catalog)
        cal = run_calibration(cat)
        written = write_efficiencies(cal) if write else None
    payload = calibration_payload(cat, cal, written)
    if json:
        print_json(payload)
        return
    fits = Table(title="Roofline efficiencies per GPU type", title_justify="left",
                 box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("GPU", "η\ncomp.", "η\nmem.", "η\nelem.", "kern.\n(µs)", "points",
                "med.\nerr %", "max\nerr %", "figures\nfrom"):
        left = col.startswith(("GPU", "figures"))
        fits.add_column(col, justify="left" if left else "right", no_wrap=True)
    for row in payload["gpus"]:
        fitted = row["fitted"]
        fits.add_row(
            row["gpu"],
            f"{row['eta_compute']:.3f}",
            f"{row['eta_memory']:.3f}",
            f"{row['eta_elementwise']:.3f}",
            f"{row['kernel_overhead_s'] * 1e6:.2f}",
            str(row["points"]) if fitted else "-",
            f"{100 * row['median_rel_error']:.1f}" if fitted else "-",
            f"{100 * row['max_rel_error']:.1f}" if fitted else "-",
            "own fit" if fitted else row["borrowed_from"],
        )
    console.print(fits)
    console.print("[dim]η compute: achieved fraction of peak bf16 FLOP/s in matmuls; η memory / "
                  "η elem.: achieved fraction of peak memory bandwidth in weight-streaming "
                  "matmuls / element-wise kernels; kernel: fixed GPU time per kernel. Errors: "
                  "|predicted/measured - 1| of one layer's profiled operators (Vidur). GPU types "
                  "without an own fit borrow by architecture (ampere, ada, volta, turing -> "
                  "ampere; hopper, blackwell -> hopper), scaled by the two types' sustained "
                  "throughput (coral.perf.sustained; `--json` gives each type's fractions).[/]")
    held = Table(title="Held out (not used in the fit)", title_justify="left",
                 box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("data", "points", "med.\nerr %", "max\nerr %", "figures"):
        held.add_column(col, justify="left" if col in ("data", "figures") else "right")
    for h in payload["held_out"]:
        models = ", ".join(short_model_name(m) for m in h["models"])
        held.add_row(f"{h['name']}: {models}", str(h["points"]),
                     f"{100 * h['median_rel_error']:.1f}", f"{100 * h['max_rel_error']:.1f}",
                     h["figures"])
    console.print(held)
    console.print(f"[dim]Smoothed roofline exponent p = {payload['roofline_p']} (fixed).[/]")
    if written:
        console.print(f"wrote {written}", highlight=False)


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}"


def _validation_rows(results, label: str) -> list[dict]:
    rows = []
    for v in results:
        pre, dec, both = v.summary("prefill"), v.summary("decode"), v.summary()
        rows.append({
            "model": v.model, "gpu": v.gpu, "figures": label, "points": both.points,
            "prefill_median_error": pre.median_signed, "decode_median_error": dec.median_signed,
            "median_abs_error": both.median_abs, "max_abs_error": both.max_abs,
        })
    return rows


@app.command()
def validate(
    paths: Annotated[list[Path] | None, typer.Argument(
        help="Profile tables (CSV) or directories of them (default: the measured tables "
             "shipped with Coral).")] = None,
    gpu: Annotated[str | None, typer.Option(
        "--gpu", help="Catalog GPU type the tables were measured on (default: from each "
                      "table's node type or device name).")] = None,
    fit: Annotated[bool, typer.Option(
        "--fit", help="Also fit the GPU type's own figures to the dense models' tables and "
                      "predict each table from a fit on the other tables only.")] = False,
    catalog: CatalogFiles = None,
    json: JsonFlag = False,
) -> None:
    """Compare the perf model's per-layer times with measured profile tables."""
    from coral.perf.validation import (
        PACKAGED_PROFILES,
        compare,
        fit_tables,
        leave_one_model_out,
        load_tables,
    )

    with user_errors():
        cat = open_catalog(catalog)
        tables = load_tables(paths or [PACKAGED_PROFILES])
        rows = _validation_rows(compare(tables, cat, gpu=gpu), "committed")
        fit_payload = None
        if fit:
            dense = [t for t in tables if cat.model(t.model).moe is None]
            if len(dense) < 2:
                raise UserError("--fit needs tables of at least two dense models (MoE layers "
                                "are reported, not fitted: see the note below the table)")
            own = fit_tables(dense, cat, gpu)
            e = own.efficiencies
            rows += _validation_rows(compare(tables, cat, e, gpu), "own fit")
            loo = {v.model: v for v in leave_one_model_out(dense, cat, gpu)}
            rows += _validation_rows(loo.values(), "others' fit")
            fit_payload = {
                "gpu": e.gpu, "eta_compute": e.eta_compute, "eta_memory": e.eta_memory,
                "eta_elementwise": e.eta_elementwise, "kernel_overhead_s": e.kernel_overhead_s,
                "fitted_on": list(own.models), "points": own.summary.points,
                "median_abs_error": own.summary.median_abs, "max_abs_error": own.summary.max_abs,
            }
    if json:
        print_json({"tables": len(tables), "rows": rows, "fit": fit_payload})
        return
    gpus = sorted({r["gpu"] for r in rows})
    out = Table(title=f"Perf model vs measured layer times on {', '.join(gpus)}: "
                      "predicted/measured - 1, %", title_justify="left", box=box.SIMPLE_HEAD,
                pad_edge=False)
    for col in ("model", "figures", "n", "prefill\nmed.", "decode\nmed.", "|err|\nmed.",
                "|err|\nmax"):
        left = col in ("model", "figures")
        out.add_column(col, justify="left" if left else "right", no_wrap=True)
    for r in rows:
        out.add_row(r["model"] if len(gpus) == 1 else f"{r['model']} ({r['gpu']})",
                    r["figures"], str(r["points"]),
                    _pct(r["prefill_median_error"]), _pct(r["decode_median_error"]),
                    f"{100 * r['median_abs_error']:.1f}", f"{100 * r['max_abs_error']:.1f}")
    console.print(out)
    if fit_payload:
        f = fit_payload
        console.print(
            f"Own fit on {len(f['fitted_on'])} dense models ({f['points']} points): "
            f"η compute {f['eta_compute']:.3f}, η memory {f['eta_memory']:.3f}, η elem. "
            f"{f['eta_elementwise']:.3f}, kernel {f['kernel_overhead_s'] * 1e6:.2f} µs; "
            f"median |err| {100 * f['median_abs_error']:.1f} %.", highlight=False)
    console.print("[dim]Negative: the model predicts faster than measured. 'committed': the "
                  "figures plans use (own fit or borrowed by architecture). The measured layer "
                  "is plain torch (fused RMSNorm, other element-wise ops unfused; MoE as torch's "
                  "grouped matmul, decode attention unsplit): the prediction adds the "
                  "kernels it launches beyond a serving engine's layer and the SMs its decode "
                  "attention leaves idle (coral.perf.validation). MoE tables fix "
                  "the grouped-GEMM figures (benchmarks/perf_holdout.py) and are not fitted "
                  "by --fit.[/]")
