"""Files of an adaptation run: a CSV with one row per period and a PNG plot over time."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from coral.errors import CoralError
from coral.planning.adapt import AdaptResult


class ReportError(CoralError, ValueError):
    """A report cannot be written (e.g. the plotting library is missing)."""


CSV_FIELDS = (
    "period", "name", "start_s", "duration_s", "status", "cost_usd_per_hour",
    "startup_penalty_usd", "period_cost_usd", "demand_rps", "served_rps", "served_fraction",
    "instances", "started", "stopped", "gap", "solve_s", "short_models",
)


def write_csv(result: AdaptResult, path: str | Path) -> Path:
    """One row per period; per-model served shares follow as `served_fraction:MODEL`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    models = list(result.records[0].served_fraction_by_model) if result.records else []
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([*CSV_FIELDS, *(f"served_fraction:{m}" for m in models)])
        for r in result.records:
            writer.writerow([
                r.index, r.name, f"{r.start_s:g}", f"{r.duration_s:g}", r.status,
                f"{r.cost_usd_per_hour:.4f}", f"{r.startup_penalty_usd:.4f}",
                f"{r.period_cost_usd:.4f}", f"{r.demand_rps:.4f}", f"{r.served_rps:.4f}",
                f"{r.served_fraction:.6f}", r.instances, r.started, r.stopped,
                f"{r.gap:.6g}" if math.isfinite(r.gap) else "inf", f"{r.solve_s:.4f}",
                ";".join(r.short_models),
                *(f"{r.served_fraction_by_model.get(m, 1.0):.6f}" for m in models),
            ])
    return path


def write_plot(result: AdaptResult, path: str | Path) -> Path:
    """A PNG over the timeline's hours: $/hour (top), served share of demand (middle), and
    instances started and stopped at each period's start (bottom). Periods whose demand was
    not met in full are shaded."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError(
            "the adaptation plot needs matplotlib; install it with `pip install matplotlib`"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recs = result.records
    starts = [r.start_s / 3600.0 for r in recs]
    widths = [r.duration_s / 3600.0 for r in recs]
    edges = starts + [starts[-1] + widths[-1]] if recs else []

    def step(ax: Any, values: list[float], **style: Any) -> None:
        ax.step(edges, values + values[-1:], where="post", **style)

    fig, (ax_cost, ax_served, ax_churn) = plt.subplots(
        3, 1, sharex=True, figsize=(9, 7), gridspec_kw={"height_ratios": [3, 2, 2]})
    try:
        short = [(x, w) for r, x, w in zip(recs, starts, widths) if r.short_models]
        for ax in (ax_cost, ax_served, ax_churn):
            for i, (x, w) in enumerate(short):
                ax.axvspan(x, x + w, color="tab:red", alpha=0.12, linewidth=0,
                           label="demand not met" if i == 0 and ax is ax_served else None)
            ax.grid(alpha=0.3)
        step(ax_cost, [r.cost_usd_per_hour for r in recs], color="tab:blue")
        ax_cost.set_ylabel("cost ($/hour)")
        ax_cost.set_ylim(bottom=0)
        step(ax_served, [r.served_fraction for r in recs], color="tab:green",
             label="served share (all models)")
        ax_served.set_ylabel("served share")
        ax_served.set_ylim(0, 1.05)
        ax_served.legend(loc="lower left", fontsize=8)
        ax_churn.bar(starts, [r.started for r in recs], width=[w * 0.8 for w in widths],
                     align="edge", color="tab:orange", label="started")
        ax_churn.bar(starts, [-r.stopped for r in recs], width=[w * 0.8 for w in widths],
                     align="edge", color="tab:gray", label="stopped")
        ax_churn.axhline(0, color="black", linewidth=0.6)
        ax_churn.set_ylabel("instances")
        ax_churn.set_xlabel("time (hours)")
        ax_churn.legend(loc="upper right", fontsize=8)
        title = f"{result.timeline} on {result.scenario}"
        if result.nmax != result.scenario_nmax:
            title += f" (templates at n_max {result.nmax} of {result.scenario_nmax})"
        ax_cost.set_title(title)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def write_outputs(result: AdaptResult, out_dir: str | Path) -> AdaptResult:
    """`OUT_DIR/adapt.csv` and `OUT_DIR/adapt.png`; the result with their paths."""
    out = Path(out_dir)
    csv_path = write_csv(result, out / "adapt.csv")
    png_path = write_plot(result, out / "adapt.png")
    return replace(result, csv_path=csv_path, png_path=png_path)
