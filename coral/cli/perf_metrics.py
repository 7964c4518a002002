"""`coral perf calibrate --from-metrics`: a node type's efficiencies fitted to the step times a
runtime's workers measured, and (`--plan`) what those speeds do to a plan."""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.table import Table

from coral.catalog import Catalog
from coral.cli.common import UserError, console, print_json


def calibrate_from_metrics(path: Path, cat: Catalog, node_type: str | None,
                            model: str | None, json: bool, plan: Path | None = None,
                            duration: float = 120.0) -> None:
    """`calibrate --from-metrics`: node types' efficiencies from a runtime's step times."""
    from coral.perf.model import PerfModel
    from coral.perf.step_calibration import node_scales, pooled, scaled_efficiencies
    from coral.runtime.step_times import parse_step_metrics

    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror or exc}") from None
    try:
        rows = parse_step_metrics(text)
    except ValueError as exc:
        raise UserError(f"{path}: not Prometheus text ({exc})") from None
    perf = PerfModel(cat)
    workers = node_scales(rows, perf, node_type=node_type, model=model)
    types = pooled(workers)
    payload = {
        "metrics": str(path),
        "workers": [{"node": w.name, "node_type": w.node_type, "steps": w.steps,
                     "measured_s": w.measured_s, "predicted_s": w.predicted_s,
                     "scale": w.scale} for w in workers],
        "node_types": [],
    }
    for t in types:
        gpu = cat.gpu_of(t.node_type)
        now = perf.efficiencies_for(gpu)
        fit = scaled_efficiencies(now, t.scale, path.name)
        payload["node_types"].append({
            "node_type": t.node_type, "gpu": gpu.name, "steps": t.steps, "scale": t.scale,
            "eta_compute": fit.eta_compute, "eta_memory": fit.eta_memory,
            "eta_elementwise": fit.eta_elementwise, "kernel_overhead_s": fit.kernel_overhead_s,
            "was": {"eta_compute": now.eta_compute, "eta_memory": now.eta_memory,
                    "eta_elementwise": now.eta_elementwise,
                    "kernel_overhead_s": now.kernel_overhead_s},
        })
    if plan is not None:
        payload["plan"] = _plan_at_measured_speeds(plan, cat, workers, duration)
    if json:
        print_json(payload)
        return
    table = Table(title="Measured step times against the perf model, per worker",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("worker", "node type", "steps", "measured s", "predicted s", "scale"):
        table.add_column(col, justify="left" if col in ("worker", "node type") else "right")
    for w in payload["workers"]:
        table.add_row(w["node"], w["node_type"], f"{w['steps']:.0f}", f"{w['measured_s']:.4g}",
                      f"{w['predicted_s']:.4g}", f"{w['scale']:.3f}")
    console.print(table)
    for t in payload["node_types"]:
        console.print(
            f"{t['node_type']} ({t['gpu']}): x{t['scale']:.3f} the modelled time; η compute "
            f"{t['eta_compute']:.3f} (was {t['was']['eta_compute']:.3f}), η memory "
            f"{t['eta_memory']:.3f} (was {t['was']['eta_memory']:.3f}), kernel "
            f"{t['kernel_overhead_s'] * 1e6:.2f} µs", highlight=False)
    if plan is not None:
        _print_plan_at_measured_speeds(payload["plan"])


def _plan_at_measured_speeds(plan: Path, cat: Catalog, workers: list, duration: float
                             ) -> dict:
    """What the measured speeds do to a plan: it is simulated as the perf model says and
    with every GPU type the metrics measured running at its measured scale (the workers'
    measured over predicted seconds, pooled per GPU type), as `coral simulate --slowdown`
    runs it. A GPU type the plan does not use changes nothing."""
    from coral.cli.simulate_cmd import simulate_plan_summary

    if not duration > 0:
        raise UserError(f"--duration must be > 0 s, got {duration:g}")
    if not plan.is_file():
        raise UserError(f"{plan}: no such plan file")
    measured: dict[str, list[float]] = {}
    for w in workers:
        acc = measured.setdefault(cat.gpu_of(w.node_type).name, [0.0, 0.0])
        acc[0] += w.measured_s
        acc[1] += w.predicted_s
    factors = {g: m / p for g, (m, p) in sorted(measured.items()) if p > 0}
    nominal = simulate_plan_summary(plan, cat, factors=None, duration=duration)
    slowed = simulate_plan_summary(plan, cat, factors=factors, duration=duration)
    models = {}
    for m, v in nominal["models"].items():
        w = slowed["models"][m]
        models[m] = {"slo_attainment_modelled": v["slo_attainment"],
                     "slo_met_modelled": v["slo_met"],
                     "slo_attainment_measured": w["slo_attainment"],
                     "slo_met_measured": w["slo_met"],
                     "ttft_s_measured": w["ttft_s_at_percentile"],
                     "tpot_s_measured": w["tpot_s_at_percentile"]}
    return {"plan": str(plan), "duration_s": duration, "gpu_factors": factors,
            "slo_attainment_modelled": nominal["slo_attainment"],
            "slo_attainment_measured": slowed["slo_attainment"],
            "models_missing": sorted(m for m, v in models.items() if not v["slo_met_measured"]),
            "models": models}


def _print_plan_at_measured_speeds(p: dict) -> None:
    factors = ", ".join(f"{g} x{f:.3f}" for g, f in p["gpu_factors"].items())
    table = Table(title=f"{p['plan']} simulated for {p['duration_s']:g} s, as modelled and at "
                  f"the measured speeds ({factors})", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("model", "attainment modelled", "attainment measured", "SLO met"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for m, v in p["models"].items():
        table.add_row(m, f"{v['slo_attainment_modelled'] * 100:.1f}%",
                      f"{v['slo_attainment_measured'] * 100:.1f}%",
                      "yes" if v["slo_met_measured"] else "[red]no[/]")
    console.print(table)
    if p["models_missing"]:
        console.print(f"[red]At the measured speeds the plan misses the SLO of "
                      f"{', '.join(p['models_missing'])}[/]: re-plan with margin for them "
                      "(`coral plan --robust R`, R at least the largest factor above 1 "
                      "minus 1) or re-profile the GPU types measured.", highlight=False)
    else:
        console.print("At the measured speeds the plan still meets every model's SLO.",
                      highlight=False)
