"""How `coral plan`, `coral demo` and `coral simulate` show a plan: its instances, the
baselines beside it, its spot risk. Presentation only: every figure comes from the plan."""

from __future__ import annotations

import math
from typing import Any

from rich.markup import escape
from rich.table import Table

from coral.allocator.scarcity.uniform_scale import SCALE_TOL
from coral.cli.common import console
from coral.perf.slowdown import PhaseSlowdown, slowdown_from_json


def pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _stages(inst: Any) -> str:
    """`1x-l4 x2 [0,16) → 1x-a10g [16,32)`: the pipeline stages of one instance in layer
    order; the nodes of one stage hold the same layers (data parallel)."""
    return inst.shape.describe() if inst.shape is not None else "-"


def _overall_served(served_fraction: dict[str, float], demand: dict[str, float]) -> float:
    asked = sum(demand.values())
    if asked <= 0:
        return 1.0
    return sum(served_fraction.get(m, 0.0) * d for m, d in demand.items()) / asked


def print_plan(result: Any, *, title: str | None = None) -> None:
    """The plan as rich tables: instances per region, models, baselines, notes."""
    p = result.plan
    head = title or f"Plan for scenario {result.scenario}" + (
        f" (availability {result.level})" if result.level else "")
    console.print(f"[bold]{escape(head)}[/]", highlight=False)
    gap = "-" if result.gap == float("inf") else pct(result.gap)
    engine = getattr(result, "engine", "coral")
    console.print(
        f"{result.mode} serving on engine {engine}, status {result.status}, "
        f"${result.cost_per_hour:,.2f}/hour, "
        f"{p.total_instances} instances on {sum(p.nodes_used.values())} nodes, solved in "
        f"{result.solve_seconds:.2f} s (gap {gap}); {result.columns} template columns from "
        f"{result.templates} templates, n_max {result.nmax}", highlight=False)
    scarcity = getattr(result, "extras", {}).get("scarcity")
    if scarcity and scarcity.get("applied"):
        gaps = ", ".join(f"{k} {'no bound' if g is None else pct(g)}"
                         for k, g in scarcity.get("phase_gaps", {}).items())
        tokens = getattr(result, "extras", {}).get("goodput_tokens_per_s")
        console.print(
            f"demand cannot be met in full; scarcity objective {scarcity['description']}: "
            f"smallest served fraction {pct(scarcity['min_served_fraction'])}, "
            f"{pct(scarcity['tokens_served_share'])} of tokens/s served"
            + (f" ({tokens:,.0f} tok/s, {result.extras.get('goodput_rps', 0.0):,.1f} req/s)"
               if tokens is not None else "")
            + (f"; proven gaps by phase: {gaps}" if gaps else ""), highlight=False)
    robust = getattr(result, "extras", {}).get("robust")
    if robust:
        nominal = robust["nominal_cost_per_hour"]
        console.print(
            f"robust: every demand covered with any one of {len(robust['gpu_types'])} GPU types "
            + (f"{robust['factor']:g}x slower than modelled" if robust.get("factor") else
               "slower than modelled by its own uncertainty (" + ", ".join(
                   f"{g} {PhaseSlowdown.of(slowdown_from_json(f)).text()}"
                   for g, f in robust.get("factors", {}).items()) + ")")
            + "; the nominal plan "
            + (f"${nominal:,.2f}/hour (robustness {100 * robust['cost_of_robustness']:+.1f}%)"
               if nominal is not None else "does not meet demand"), highlight=False)
    spot = getattr(result, "extras", {}).get("spot")
    if spot:
        print_spot(spot)
    if result.reduced:
        console.print(f"[yellow]note:[/] templates built with n_max {result.nmax} (the scenario "
                      f"asks for {result.scenario_nmax}); larger combinations were not "
                      "considered.", highlight=False)

    # a model's aggregated instances are named as such where it also runs PD pairs (mixed)
    disaggregated = {i.model for i in result.instances if i.mode != "aggregated"}

    def label(i: Any) -> str:
        return i.model if i.mode == "aggregated" and i.model not in disaggregated \
            else f"{i.model} ({i.mode})"

    width = max((len(label(i)) for i in result.instances), default=5)
    for region, insts in result.by_region().items():
        table = Table(title=f"{region}: ${sum(i.usd_per_hour * i.count for i in insts):,.2f}"
                      "/hour", title_justify="left")
        table.add_column("model", min_width=width)
        table.add_column("count", justify="right")
        table.add_column("placement: nodes [layers) → next stage", ratio=1)
        for col in ("req/s each", "load", "$/hour each", "$/hour"):
            table.add_column(col, justify="right")
        for i in insts:
            table.add_row(escape(label(i) + (" (spot)" if i.market == "spot" else "")),
                          str(i.count), escape(_stages(i)),
                          f"{i.capacity_rps:.2f}", pct(i.utilisation), f"{i.usd_per_hour:.2f}",
                          f"{i.usd_per_hour * i.count:,.2f}")
        console.print(table)
    if result.instances:
        console.print("[dim]req/s each: the planned rate, run at 'load' of the template's full "
                      "throughput so that queueing leaves TTFT within the SLO at its percentile "
                      "(a queueing approximation; `coral simulate` checks it).[/]")

    models = Table(title="Models", title_justify="left")
    models.add_column("model", min_width=max(map(len, p.demand_rps), default=5))
    tokens = dict(getattr(result, "extras", {}).get("served_tokens_per_s", {}))
    for col in ("demand (req/s)", "capacity (req/s)", "served", "served tok/s",
                "headroom (req/s)"):
        models.add_column(col, justify="right")
    for m, demand in p.demand_rps.items():
        headroom = p.headroom_rps[m]
        style = "red" if m in p.short_models else ""
        models.add_row(escape(m), f"{demand:.1f}", f"{p.capacity_rps[m]:.1f}",
                       pct(p.served_fraction[m]),
                       f"{tokens[m]:,.0f}" if m in tokens else "-",
                       f"[{style}]{headroom:+.1f}[/]" if style else f"{headroom:+.1f}")
    console.print(models)
    print_comparison(result)
    for note in result.notes:
        console.print(f"[dim]note: {escape(note)}[/]", highlight=False, soft_wrap=True)


def print_comparison(result: Any) -> None:
    """Coral's plan beside every baseline: $/hour, ratio to Coral, share of demand served,
    goodput in generated tokens/s and, under scarcity, the uniform demand factor each meets
    (the paper's rule; Coral's own row at that rule is `coral (uniform)`)."""
    p = result.plan
    extras = getattr(result, "extras", {}) or {}
    table = Table(title="Coral against the baselines (same templates, prices, availability)",
                  title_justify="left")
    names = ["coral (uniform)", *result.baselines]
    table.add_column("planner", min_width=max(map(len, names)))
    for col in ("$/hour", "x Coral's cost", "served (all models)", "goodput tok/s",
                "demand x"):
        table.add_column(col, justify="right")
    table.add_column("solved")
    table.add_column("models short", ratio=1)

    def row(name: str, cost: float, served: dict[str, float], solved: str,
            bold: bool = False, goodput: float | None = None, scale: float = 1.0) -> None:
        short = [m for m, f in served.items() if f < 1.0 - 1e-6]
        # costs compare only between plans that serve all demand: a plan short of it is
        # cheaper by what it leaves unserved
        if name == "coral" or result.cost_per_hour <= 0 or not p.meets_demand:
            ratio = "-"
        elif short and 0 < scale < 1:
            ratio = f"{cost / result.cost_per_hour:.2f} at x{scale:.3g}"  # the scarcity rule
        elif short:
            ratio = "short"
        else:
            ratio = f"{cost / result.cost_per_hour:.2f}"
        good = "-" if goodput is None or not math.isfinite(goodput) else f"{goodput:,.0f}"
        cells = [escape(name), f"{cost:,.2f}", ratio,
                 pct(_overall_served(served, dict(p.demand_rps))), good, f"{scale:.4g}",
                 escape(solved),
                 f"every model, to x{scale:.3g}" if short and 0 < scale < 1
                 else escape(", ".join(short)) or "-"]
        table.add_row(*[f"[bold]{c}[/]" if bold else c for c in cells])

    row("coral", result.cost_per_hour, p.served_fraction, p.proof, bold=True,
        goodput=extras.get("goodput_tokens_per_s"))
    uniform = extras.get("uniform_scale")
    if uniform:
        row("coral (uniform)", float(uniform["cost_per_hour"]), dict(uniform["served_fraction"]),
            "scarcity rule", goodput=float(uniform["goodput_tokens_per_s"]),
            scale=float(uniform["factor"]))
    for name, b in result.baselines.items():
        row(name, float(b.cost_per_hour), dict(b.served_fraction), b.solved,
            goodput=getattr(b, "goodput_tokens_per_s", None),
            scale=float(getattr(b, "demand_scale", 1.0)))
    if not result.baselines:
        table.add_row("(no baselines)", "-", "-", "-", "-", "-", "-", "-")
    console.print(table)
    for line in comparison_lines(result):
        console.print(escape(line), highlight=False, soft_wrap=True)
    if result.baselines:
        console.print(f"[dim]demand x: the paper's scarcity rule, the largest uniform factor on "
                      f"every model's demand the planner meets (bisected to {SCALE_TOL:g}); goodput "
                      "tok/s = served req/s x output tokens per request.[/]")
        console.print("[dim]solved: a plan's proven gap bounds how much cheaper (under "
                      "scarcity: how much more goodput, then how much cheaper at it) the best "
                      "plan of that planner's own restriction could be; a heuristic has no "
                      "such bound.[/]")


def comparison_lines(result: Any) -> list[str]:
    """Who Coral is compared with, in words: on cost, the baselines that serve all demand
    (when Coral's plan does); under scarcity, on priority-weighted goodput; the baselines short
    of demand are named with what they leave unserved, not compared on cost."""
    p = result.plan
    full = {n: b for n, b in result.baselines.items() if _meets_demand(b)}
    short = {n: b for n, b in result.baselines.items() if not _meets_demand(b)}
    lines = []
    if p.meets_demand and full and result.cost_per_hour > 0:
        best = min(full, key=lambda n: float(full[n].cost_per_hour))
        cost = float(full[best].cost_per_hour)
        lines.append(f"Compared on cost (baselines serving all demand): the cheapest, {best}, "
                     f"costs ${cost:,.2f}/hour, {cost / result.cost_per_hour:.2f}x Coral's "
                     f"${result.cost_per_hour:,.2f}.")
    elif not p.meets_demand and result.baselines:
        mine = goodput_of(result, p.served_fraction)
        best = max(result.baselines,
                   key=lambda n: goodput_of(result, result.baselines[n].served_fraction))
        theirs = goodput_of(result, result.baselines[best].served_fraction)
        lines.append(f"Demand cannot be met: compared on priority-weighted goodput, Coral "
                     f"serves {mine:,.2f} req/s, the best baseline ({best}) {theirs:,.2f}.")
    if short and p.meets_demand:
        lines.append("Short of demand, so not compared on cost: " + "; ".join(
            f"{n} (serves " + ", ".join(f"{m} {f:.0%}" for m, f in b.served_fraction.items()
                                        if f < 1.0 - 1e-6) + ")"
            for n, b in short.items()) + ".")
    return lines


def _meets_demand(baseline: Any) -> bool:
    return bool(getattr(baseline, "meets_demand", all(
        f >= 1.0 - 1e-6 for f in dict(baseline.served_fraction).values())))


def goodput_of(result: Any, served_fraction: dict[str, float]) -> float:
    """Priority-weighted served req/s of served shares at the scenario's demand (what the
    allocator maximises under scarcity)."""
    priority = getattr(result, "priorities", {}) or {}
    return sum(priority.get(m, 1.0) * served_fraction.get(m, 0.0) * d
               for m, d in result.plan.demand_rps.items())


def print_spot(spot: dict[str, Any]) -> None:
    """The spot plan's share, expected cost and risk per model."""
    od = spot.get("on_demand_usd_per_hour")
    console.print(
        f"spot: {spot['spot_share']:.1%} of $/hour on spot; expected "
        f"${spot['expected_usd_per_hour']:,.2f}/hour with replacements"
        + (f" (on demand only: ${od:,.2f}/hour)" if od is not None else "")
        + f"; every model covered with probability >= {spot['risk_target']:g} over "
        f"{spot['window_s']:g} s", highlight=False)
    table = Table(title="Risk per model", title_justify="left")
    for col in ("model", "spot share", "P(short in window)"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for m, r in spot["per_model"].items():
        table.add_row(escape(m), pct(r["spot_share"]), f"{r['p_short']:.2e}")
    console.print(table)
