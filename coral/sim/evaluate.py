"""`coral evaluate`: run Coral's experiments and write a markdown report with PNG plots.

Sections (each can be selected on its own):

1. cost: cost to meet demand at several demand scales, Coral against every baseline, and a
   simulation of Coral's plan at 1x (SLO attainment, goodput).
2. goodput: served req/s under the scenario's availability levels, Coral against baselines.
3. solve: allocation solve time as the cluster (availability and demand) grows.
4. helix: Helix's cluster for one model, no-SLO placement against Coral's SLO placement.
5. adapt: a timeline replayed period by period (cost and served demand over time).

Everything is computed from the project's performance model and price catalog, not measured
on GPUs; the report says which numbers are approximate.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

#: The paper's headline figures the report sets beside the measured ones.
PAPER_COST_RATIO = 2.79  # cheaper than homogeneous replicas
PAPER_GOODPUT_RATIO = 2.39  # more goodput when GPUs are scarce
SECTIONS = ("cost", "goodput", "solve", "helix", "adapt", "deploy")
HELIX_CLUSTER = (("1x-a100-40gb", 4), ("1x-l4", 8), ("1x-t4", 12))
HELIX_MODEL = "llama-2-70b"


@dataclass
class EvalConfig:
    """What `evaluate` runs; `quick()` and `full()` give the two presets."""

    out: Path = Path("out/evaluate")
    quick: bool = True
    nmax: int = 2
    scenarios: tuple[str, ...] = ("core",)
    demand_scales: tuple[float, ...] = (1.0,)
    # Long enough for an overloaded instance's queue to show in TTFT (a short run from an
    # empty system hides it).
    sim_seconds: float = 600.0
    # Serving mode Coral plans the cost and goodput sections in: `auto` plans aggregated, PD
    # and mixed and keeps the best (the other sections keep each scenario's own mode).
    coral_mode: str = "auto"
    goodput_scenario: str = "core"
    levels: tuple[str, ...] = ("abundant", "limited", "scarce")
    solve_scenario: str = "core"
    cluster_scales: tuple[int, ...] = (1, 4)
    helix_model: str = HELIX_MODEL
    helix_cluster: tuple[tuple[str, int], ...] = HELIX_CLUSTER
    helix_timeout_s: float = 90.0
    timeline: str = "day"
    timeline_periods: int | None = 4
    sections: tuple[str, ...] = SECTIONS
    templates_dir: Path = Path("out/templates")
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    time_limit_s: float = 10.0

    @classmethod
    def preset(cls, quick: bool, out: Path, **kw: Any) -> "EvalConfig":
        if quick:
            return cls(out=out, quick=True, **kw)
        base = dict(quick=False, nmax=3, scenarios=("core", "advanced"),
                    demand_scales=(0.5, 1.0, 2.0), sim_seconds=1800.0,
                    cluster_scales=(1, 4, 16), helix_timeout_s=300.0, timeline_periods=None)
        base.update(kw)
        return cls(out=out, **base)


@dataclass
class Section:
    title: str
    body: list[str] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)


@dataclass
class Evaluation:
    config: EvalConfig
    sections: list[Section]
    headline: list[tuple[str, str, str]]  # (claim, paper, measured)
    report: Path
    seconds: float


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out + [""]


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 100:.1f}%"


def _num(x: float | None, fmt: str = ",.2f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def _overall(served: dict[str, float], demand: dict[str, float]) -> float:
    asked = sum(demand.values())
    return 1.0 if asked <= 0 else sum(served.get(m, 0.0) * d for m, d in demand.items()) / asked


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bar_plot(path: Path, labels: Sequence[str], series: dict[str, Sequence[float]],
              ylabel: str, title: str) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(labels) * max(1, len(series))), 4))
    width = 0.8 / max(1, len(series))
    for k, (name, vals) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, [v if math.isfinite(v) else 0.0 for v in vals], width, label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


class _Ctx:
    """Catalog, perf model and template libraries shared by the sections."""

    def __init__(self, cfg: EvalConfig, say: Callable[[str], None]) -> None:
        from coral.catalog import load_catalog
        from coral.templates.parallel import default_perf_factory

        self.cfg = cfg
        self.say = say
        self.catalog = load_catalog(())
        self.perf = default_perf_factory(self.catalog)
        self._templates: dict[tuple[str, str | None, str, str], Any] = {}

    def scenario(self, name: str, level: str | None = None) -> Any:
        from coral.allocator.scenario import load_scenario

        return load_scenario(name, level=level, catalog=self.catalog)

    def templates(self, scenario: Any, engine: str = "coral") -> Any:
        from coral.allocator.planning import templates_for_scenario

        key = (scenario.name, scenario.level, scenario.mode, engine)
        if key not in self._templates:
            self._templates[key] = templates_for_scenario(
                scenario, self.catalog, self.perf, out_root=self.cfg.templates_dir,
                workers=self.cfg.workers, nmax=self.cfg.nmax, engine=engine)
        return self._templates[key]

    def plan(self, scenario: Any, templates: Any, baselines: bool = True,
             engine: str = "coral") -> Any:
        from coral.allocator.planning import plan_scenario

        return plan_scenario(scenario, catalog=self.catalog, perf=self.perf,
                             templates=templates, nmax=self.cfg.nmax,
                             time_limit_s=self.cfg.time_limit_s, baselines=baselines,
                             engine=engine)


def _scaled(scenario: Any, demand: float = 1.0, availability: float = 1.0) -> Any:
    from coral.allocator.adapt import Period, apply_period

    return apply_period(scenario, Period(duration_s=1.0, demand_scale=demand,
                                         availability_scale=availability))


def simulate_plan(ctx: _Ctx, scenario: Any, result: Any, seconds: float,
                  seed: int = 0) -> dict[str, Any]:
    """Simulate a deployment under Poisson arrivals at the scenario's demand (every model's,
    also one the deployment does not serve: its requests then count as missing the SLO).

    `result` is Coral's `PlanResult` or a baseline's `BaselineResult` (their `instances`
    hold each template's placement)."""
    from coral.allocator.planning import scenario_slo
    from coral.sim import Simulator, SimConfig, instances_from_plan, summarize, synthetic
    from coral.sim.workload import merge

    slos = {m.name: scenario_slo(scenario, m.name) for m in scenario.models}
    instances = instances_from_plan({"instances": [i.to_dict() for i in result.instances]}, slos)
    demand = {m: d for m, d in result.plan.demand_rps.items() if d > 0}
    parts = [synthetic(m, rate_rps=d, duration_s=seconds, seed=seed + 1000 * k,
                       prompt_tokens=slos[m].input_tokens, output_tokens=slos[m].output_tokens)
             for k, (m, d) in enumerate(sorted(demand.items()))]
    reqs = merge(*parts)
    sim = Simulator(instances, perf=ctx.perf, catalog=ctx.catalog, config=SimConfig())
    return summarize(sim.run(reqs), slos)


def _slo_held(summary: dict[str, Any]) -> bool:
    """Every model's SLO met at its percentile in the simulation."""
    models = summary.get("models") or {}
    return bool(models) and all(v.get("slo_met") for v in models.values())


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


def section_cost(ctx: _Ctx, head: dict[str, Any]) -> Section:
    cfg = ctx.cfg
    sec = Section("1. Cost to meet demand")
    sec.body.append(
        f"Ran: `plan_scenario` on {', '.join(f'`{s}`' for s in cfg.scenarios)} (each at its "
        f"default availability level) at demand x{', x'.join(f'{s:g}' for s in cfg.demand_scales)}"
        f", templates with n_max {cfg.nmax}, allocation time limit {cfg.time_limit_s:g} s; every "
        "baseline on the same templates, prices and availability. Coral's plan at 1x is then "
        f"simulated for {cfg.sim_seconds:g} s of Poisson arrivals at the scenario's demand "
        "(fixed request shapes from the SLOs). Coral plans in serving mode "
        f"`{cfg.coral_mode}`" + (" (aggregated, prefill/decode-disaggregated and mixed, the "
                                 "best kept)" if cfg.coral_mode == "auto" else "") + ".")
    sec.body.append("")
    sec.body.append("Approximate: costs come from catalog list prices and capacities from the "
                    "performance model (not measured GPUs); the simulation is the project's "
                    "event simulator, short, and starts from an empty system. `solved`: how "
                    "each plan was reached, with its proven gap (a plan stopped by the time "
                    "limit may cost up to its gap less at the optimum of its planner's own "
                    "restriction); a heuristic baseline proves nothing.")
    sec.body.append("")
    for name in cfg.scenarios:
        base = ctx.scenario(name).in_mode(cfg.coral_mode)
        tpl = ctx.templates(base)
        rows, labels, costs, modes = [], [], {}, []
        for scale in cfg.demand_scales:
            sc = _scaled(base, demand=scale)
            ctx.say(f"[cost] {name} demand x{scale:g}: planning")
            res = ctx.plan(sc, tpl)
            modes.append(f"x{scale:g} {res.mode}")
            demand = dict(res.plan.demand_rps)
            coral_served = _overall(dict(res.served_fraction), demand)
            entries = [("coral", res.cost_per_hour, coral_served, res.plan.proof)]
            entries += [(b, float(r.cost_per_hour), _overall(dict(r.served_fraction), demand),
                         r.solved) for b, r in res.baselines.items()]
            for planner, cost, served, solved in entries:
                ratio = cost / res.cost_per_hour if res.cost_per_hour > 0 else float("nan")
                rows.append([f"x{scale:g}", planner, _num(cost), _num(ratio),
                             _pct(served), solved])
                costs.setdefault(planner, []).append(cost)
            labels.append(f"x{scale:g}")
            if scale == 1.0 and name == cfg.scenarios[0]:
                head["coral_cost"] = res.cost_per_hour
                head["coral_served"] = coral_served
                head["baselines_cost"] = {b: (float(r.cost_per_hour),
                                              _overall(dict(r.served_fraction), demand))
                                          for b, r in res.baselines.items()}
                head["scenario"] = base.name
                if cfg.sim_seconds > 0:
                    head["sims"] = _simulate_planners(ctx, sc, res, name)
                    if "error" not in head["sims"]["coral"]:
                        head["sim"] = head["sims"]["coral"]
        sec.body.append(f"**Scenario `{base.name}`** (n_max {cfg.nmax}; the scenario asks for "
                        f"{base.spec.n_max}), demand at 1x "
                        f"{sum(m.demand_rps for m in base.spec.models):g} req/s:")
        sec.body.append("")
        sec.body += _table(["demand", "planner", "$/hour", "x Coral's cost", "served",
                            "solved"], rows)
        sec.body.append(f"Coral's serving mode per demand scale: {', '.join(modes)}.")
        sec.body.append("")
        fig = _bar_plot(cfg.out / f"cost_{base.name}.png", labels, costs, "$/hour",
                        f"Cost to meet demand, {base.name}")
        sec.figures.append(fig)
        sec.body.append(f"![cost {base.name}]({fig.name})")
        sec.body.append("")
    sims = head.get("sims") or {}
    s = sims.get("coral")
    if s and "error" not in s:
        rows = [["all", s["requests"], s["completed"], _pct(s["slo_attainment"]),
                 _num(s["goodput_tokens_per_s"], ",.0f"), _num(s["throughput_tokens_per_s"], ",.0f"),
                 _num(s["throughput_rps"], ",.1f")]]
        for m, v in s.get("models", {}).items():
            rows.append([m, v.get("requests", "-"), "-", _pct(v.get("slo_attainment")), "-",
                         "-", "-"])
        sec.body.append(f"Simulation of Coral's plan for `{head['scenario']}` at 1x "
                        f"({cfg.sim_seconds:g} s simulated, {s['wall_s']:.1f} s wall):")
        sec.body.append("")
        sec.body += _table(["model", "requests", "completed", "SLO attainment",
                            "goodput tok/s", "throughput tok/s", "completed req/s"], rows)
        sec.body.append("Rates divide by the time of the last completion, so requests still in "
                        "flight at the end of the arrivals lower them slightly.")
        sec.body.append("")
    if sims:
        rows = []
        for planner, v in sims.items():
            if "error" in v:
                rows.append([planner, _num(v["cost_per_hour"]), "-", "-", "-",
                             f"not simulated: {v['error']}"])
                continue
            short = [m for m, mv in (v.get("models") or {}).items() if not mv.get("slo_met")]
            rows.append([planner, _num(v["cost_per_hour"]), _pct(v["slo_attainment"]),
                         _num(v["goodput_tokens_per_s"], ",.0f"),
                         "yes" if _slo_held(v) else "no",
                         ("misses: " + ", ".join(short)) if short else ""])
        sec.body.append(f"Every planner's deployment for `{head['scenario']}` at 1x, simulated "
                        f"the same way ({cfg.sim_seconds:g} s of Poisson arrivals at the full "
                        "demand of every model, same seed):")
        sec.body.append("")
        sec.body += _table(["planner", "$/hour", "SLO attainment", "goodput tok/s",
                            "every model's SLO held", "notes"], rows)
        sec.body.append("")
    return sec


def _simulate_planners(ctx: _Ctx, scenario: Any, res: Any, name: str) -> dict[str, Any]:
    """Coral's plan and every baseline's deployment that can be decoded, simulated alike."""
    from coral.sim.deployment import DeploymentError

    out: dict[str, Any] = {}
    planners = [("coral", res)] + [(b, r) for b, r in res.baselines.items()]
    for planner, result in planners:
        if not getattr(result, "instances", ()):
            out[planner] = {"error": "no placement to simulate (plan without templates)",
                            "cost_per_hour": float(result.cost_per_hour)}
            continue
        ctx.say(f"[cost] {name}: simulating {planner}'s plan for {ctx.cfg.sim_seconds:g} s")
        t0 = time.perf_counter()
        try:
            s = simulate_plan(ctx, scenario, result, ctx.cfg.sim_seconds)
        except DeploymentError as exc:
            out[planner] = {"error": str(exc), "cost_per_hour": float(result.cost_per_hour)}
            continue
        s["wall_s"] = time.perf_counter() - t0
        s["cost_per_hour"] = float(result.cost_per_hour)
        out[planner] = s
    return out


def section_goodput(ctx: _Ctx, head: dict[str, Any]) -> Section:
    cfg = ctx.cfg
    sec = Section("2. Goodput under GPU availability levels")
    sec.body.append(
        f"Ran: `plan_scenario` on `{ctx.scenario(cfg.goodput_scenario).name}` at availability "
        f"{', '.join(cfg.levels)} (scenario demand, n_max {cfg.nmax}; Coral in serving mode "
        f"`{cfg.coral_mode}`). Served req/s is "
        "min(demand, capacity meeting the SLO) per model, summed, from each plan; the ratio is "
        "Coral's served req/s over the baseline's.")
    sec.body.append("")
    sec.body.append("Approximate: served req/s is the planner's capacity model (per-template "
                    "throughput at the SLO), not a simulation.")
    sec.body.append("")
    rows, series = [], {}
    for level in cfg.levels:
        sc = ctx.scenario(cfg.goodput_scenario, level=level).in_mode(cfg.coral_mode)
        ctx.say(f"[goodput] {cfg.goodput_scenario} {level}: planning")
        res = ctx.plan(sc, ctx.templates(sc))
        demand = dict(res.plan.demand_rps)
        coral = sum(res.plan.served_rps.values())
        entries = [("coral", coral)] + [
            (b, sum(f * demand.get(m, 0.0) for m, f in dict(r.served_fraction).items()))
            for b, r in res.baselines.items()]
        for planner, served in entries:
            ratio = coral / served if served > 0 else float("inf")
            rows.append([level, planner, _num(served, ",.1f"), _num(sum(demand.values()), ",.1f"),
                         "inf" if ratio == float("inf") else _num(ratio)])
            series.setdefault(planner, []).append(served)
        head.setdefault("goodput", {})[level] = dict(entries)
    sec.body += _table(["availability", "planner", "served req/s", "demand req/s",
                        "Coral / planner"], rows)
    fig = _bar_plot(cfg.out / "goodput.png", list(cfg.levels), series, "served req/s",
                    f"Served demand under availability, {ctx.scenario(cfg.goodput_scenario).name}")
    sec.figures.append(fig)
    sec.body += [f"![goodput]({fig.name})", ""]
    return sec


def section_solve(ctx: _Ctx, head: dict[str, Any]) -> Section:
    cfg = ctx.cfg
    sec = Section("3. Online solve time vs cluster size")
    base = ctx.scenario(cfg.solve_scenario)
    sec.body.append(
        f"Ran: the allocation of `{base.name}` (default level) with every region's "
        f"node counts and every model's demand multiplied by x{', x'.join(map(str, cfg.cluster_scales))}"
        f", reusing one template library (n_max {cfg.nmax}), baselines off, time limit "
        f"{cfg.time_limit_s:g} s. Solve time is the allocator's own (template building "
        "excluded).")
    sec.body.append("")
    sec.body.append("Approximate: wall-clock times on this machine; a solve stopped by the "
                    "time limit reports its proven gap.")
    sec.body.append("")
    tpl = ctx.templates(base)
    rows, xs, ys = [], [], []
    for k in cfg.cluster_scales:
        sc = _scaled(base, demand=float(k), availability=float(k))
        ctx.say(f"[solve] {cfg.solve_scenario} x{k}: solving")
        t0 = time.perf_counter()
        res = ctx.plan(sc, tpl, baselines=False)
        wall = time.perf_counter() - t0
        nodes = sum(sc.availability.values())
        rows.append([f"x{k}", f"{nodes:,}", res.columns, res.plan.total_instances,
                     _num(res.solve_seconds), _num(wall), res.status,
                     "-" if not math.isfinite(res.gap) else _pct(res.gap),
                     _pct(_overall(dict(res.served_fraction), dict(res.plan.demand_rps)))])
        xs.append(nodes)
        ys.append(res.solve_seconds)
    head["solve_max_s"] = max(ys) if ys else None
    sec.body += _table(["scale", "nodes available", "template columns", "instances",
                        "solve s", "plan wall s", "status", "gap", "served"], rows)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, ys, marker="o")
    ax.set_xscale("log")
    ax.set_xlabel("nodes available (all regions)")
    ax.set_ylabel("allocation solve time, s")
    ax.set_title(f"Solve time vs cluster size, {base.name}")
    fig.tight_layout()
    path = cfg.out / "solve_time.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    sec.figures.append(path)
    sec.body += [f"![solve time]({path.name})", ""]
    return sec


def _helix_worker(model: str, nodes: list[str], q: Any) -> None:
    try:
        from coral.baselines.helix import helix_placement
        from coral.catalog import load_catalog
        from coral.templates.parallel import default_perf_factory
        from coral.templates.slo import default_slo

        cat = load_catalog(())
        slo = default_slo(cat.model(model))
        t0 = time.perf_counter()
        h = helix_placement(model, nodes, slo=slo, catalog=cat,
                            perf=default_perf_factory(cat))
        q.put({"ok": True, "seconds": time.perf_counter() - t0,
               "no_slo": h.throughput_no_slo_rps, "under_slo": h.served_under_slo_rps,
               "share": h.slo_share, "coral": h.throughput_slo_rps,
               "slo": f"TPOT {slo.tpot_s:g} s, TTFT {slo.ttft_s:g} s, p{slo.percentile * 100:g}, "
                      f"{slo.input_tokens:g}/{slo.output_tokens:g} tokens"})
    except Exception as exc:  # noqa: BLE001 - reported in the section
        q.put({"ok": False, "error": f"{type(exc).__name__}: {exc}"})


def _run_helix(model: str, nodes: list[str], timeout_s: float) -> dict[str, Any] | None:
    """`helix_placement` in a child process, killed after `timeout_s` (None then)."""
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_helix_worker, args=(model, nodes, q), daemon=True)
    p.start()
    try:
        return q.get(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - queue.Empty: timed out
        return None
    finally:
        if p.is_alive():
            p.terminate()
        p.join(5)


def section_helix(ctx: _Ctx, head: dict[str, Any]) -> Section:
    cfg = ctx.cfg
    sec = Section("4. Helix's heterogeneous cluster")

    def price(node: str) -> float:
        return min(p.usd_per_hour for p in ctx.catalog.node_type(node).prices)

    cluster = list(cfg.helix_cluster)
    tried: list[str] = []
    out = None
    while True:
        nodes = [n for n, k in cluster for _ in range(k)]
        desc = ", ".join(f"{k}x {n}" for n, k in cluster)
        ctx.say(f"[helix] {cfg.helix_model} on {desc}")
        out = _run_helix(cfg.helix_model, nodes, cfg.helix_timeout_s)
        if out is not None and out.get("ok"):
            break
        why = (f"timed out after {cfg.helix_timeout_s:g} s" if out is None
               else f"failed: {out['error']}")
        tried.append(f"{desc} ({len(nodes)} nodes): {why}")
        half = [(n, k // 2) for n, k in cluster if k // 2 > 0]
        if out is not None or half == cluster or sum(k for _, k in half) < 2:
            out = None
            break
        cluster = half
    full = ", ".join(f"{k}x {n}" for n, k in cfg.helix_cluster)
    sec.body.append(
        f"Ran: `helix_placement` for `{cfg.helix_model}` on Helix's cluster ({full}) with the "
        "model's default SLO: the best placement without a latency bound (Helix-like, max "
        "throughput), how much of its flow meets the SLO, and Coral's SLO-bound placement on "
        f"the same nodes. Each try is limited to {cfg.helix_timeout_s:g} s and the cluster is "
        "halved per node type when a try runs out of time.")
    sec.body.append("")
    for t in tried:
        sec.body.append(f"- **Not completed**: {t}.")
    if tried:
        sec.body.append("")
    if out is None:
        sec.body.append("No cluster size finished within the time limit; no numbers.")
        sec.body.append("")
        return sec
    used = ", ".join(f"{k}x {n}" for n, k in cluster)
    if cluster != list(cfg.helix_cluster):
        sec.body.append(f"**Scaled-down cluster used: {used}** (the full cluster did not "
                        "finish in time).")
        sec.body.append("")
    cost = sum(price(n) * k for n, k in cluster)
    sec.body.append(f"Cluster {used}, cheapest list price per node type: ${cost:,.2f}/hour; SLO "
                    f"{out['slo']}; solved in {out['seconds']:.1f} s.")
    sec.body.append("")
    rows = [
        ["Helix-like (no SLO), total", _num(out["no_slo"]), "-", _num(cost)],
        ["Helix-like, meeting the SLO", _num(out["under_slo"]), _pct(out["share"]), _num(cost)],
        ["Coral (SLO-bound placement)", _num(out["coral"]),
         "100.0%" if out["coral"] > 0 else "-", _num(cost)],
    ]
    for r, v in zip(rows, (out["no_slo"], out["under_slo"], out["coral"])):
        r.append(_num(cost / v, ",.3f") if v > 0 else "-")
    sec.body += _table(["placement", "req/s", "share meeting SLO", "$/hour",
                        "$/hour per req/s"], rows)
    if out["coral"] <= 0:
        sec.body.append("Coral finds no placement on this cluster that meets the SLO (0 req/s).")
        sec.body.append("")
    sec.body.append("Approximate: Helix is modelled with Coral's placement solver and a loose "
                    "SLO (not Helix's own MILP), and SLO compliance is judged on mean-shaped "
                    "iterations without queueing.")
    sec.body.append("")
    fig = _bar_plot(cfg.out / "helix.png", ["no SLO (all)", "no SLO, meets SLO", "Coral"],
                    {"req/s": [out["no_slo"], out["under_slo"], out["coral"]]}, "req/s",
                    f"{cfg.helix_model} on {used}")
    sec.figures.append(fig)
    sec.body += [f"![helix]({fig.name})", ""]
    head["helix"] = out
    return sec


def section_adapt(ctx: _Ctx, head: dict[str, Any]) -> Section:
    from coral.allocator.adapt import load_timeline, run_timeline
    from coral.allocator.adapt_report import write_outputs

    cfg = ctx.cfg
    sec = Section("5. Adaptation over a timeline")
    tl = load_timeline(cfg.timeline, catalog=ctx.catalog)
    n_all = len(tl.periods)
    if cfg.timeline_periods is not None and cfg.timeline_periods < n_all:
        tl = replace(tl, spec=tl.spec.model_copy(
            update={"periods": list(tl.spec.periods[:cfg.timeline_periods])}))
    tpl = ctx.templates(tl.scenario)
    ctx.say(f"[adapt] timeline {tl.name}: {len(tl.periods)} periods")
    res = run_timeline(tl, catalog=ctx.catalog, perf=ctx.perf, templates=tpl,
                       time_limit_s=cfg.time_limit_s)
    res = write_outputs(res, cfg.out / "adapt")
    sec.body.append(
        f"Ran: `run_timeline` on timeline `{tl.name}` over `{res.scenario}` "
        f"({len(tl.periods)} of {n_all} periods), re-planning each period against the previous "
        f"deployment with the start-up penalty; templates n_max {res.nmax}.")
    sec.body.append("")
    rows = [[r.name, _num(r.demand_rps, ",.1f"), _pct(r.served_fraction),
             _num(r.cost_usd_per_hour), _num(r.startup_penalty_usd), r.instances, r.started,
             r.stopped, _num(r.solve_s), r.status] for r in res.records]
    sec.body += _table(["period", "demand req/s", "served", "$/hour", "start-up $",
                        "instances", "started", "stopped", "solve s", "status"], rows)
    sec.body.append(f"Total ${res.total_cost_usd:,.2f}; {_pct(res.served_fraction)} of requests "
                    f"served. Data: `adapt/adapt.csv`.")
    sec.body.append("")
    sec.body.append("Approximate: per-period plans from the capacity model; the start-up "
                    "penalty is the scenario's rho x start-up time, not measured.")
    sec.body.append("")
    if res.png_path:
        rel = res.png_path.relative_to(cfg.out)
        sec.figures.append(res.png_path)
        sec.body += [f"![adapt]({rel.as_posix()})", ""]
    head["adapt_solve_max_s"] = max((r.solve_s for r in res.records), default=None)
    return sec


def section_deploy(ctx: _Ctx, head: dict[str, Any]) -> Section:
    """What planning only shapes vLLM runs costs, and how much of Coral's plan vLLM could not
    run (`coral plan --engine vllm` against `--engine coral`)."""
    from coral.templates.engine import engine_violations

    cfg = ctx.cfg
    sec = Section("6. Cost of deployability on vLLM")
    sec.body.append(
        f"Ran: `plan_scenario` on {', '.join(f'`{s}`' for s in cfg.scenarios)} (default level, "
        f"mode `{cfg.coral_mode}`, templates n_max {cfg.nmax}, time limit "
        f"{cfg.time_limit_s:g} s) with `--engine coral` and `--engine vllm` (one node per "
        "stage, one GPU count and one batch per pipeline, single-node decode instances); "
        "then every instance row of Coral's plan checked against vLLM's rules.")
    sec.body.append("")
    rows = []
    for name in cfg.scenarios:
        base = ctx.scenario(name).in_mode(cfg.coral_mode)
        res = {}
        for engine in ("coral", "vllm"):
            ctx.say(f"[deploy] {name} --engine {engine}: planning")
            res[engine] = ctx.plan(base, ctx.templates(base, engine), baselines=False,
                                   engine=engine)
        coral, vllm = res["coral"], res["vllm"]
        bad = [i for i in coral.instances if i.shape is not None
               and engine_violations("vllm", i, ctx.catalog)]
        for engine, r in res.items():
            demand = dict(r.plan.demand_rps)
            ratio = (r.cost_per_hour / coral.cost_per_hour if coral.cost_per_hour > 0
                     else float("nan"))
            rows.append([name, engine, _num(r.cost_per_hour), _num(ratio),
                         _pct(_overall(dict(r.served_fraction), demand)), r.plan.proof,
                         sum(i.count for i in r.instances)])
        rows.append([name, "coral, rows vLLM cannot run", _num(sum(
            i.usd_per_hour * i.count for i in bad)), "-", "-", "-", sum(i.count for i in bad)])
        head.setdefault("deploy", {})[name] = (coral.cost_per_hour, vllm.cost_per_hour,
                                               vllm.plan.meets_demand)
    sec.body += _table(["scenario", "engine", "$/hour", "vs coral", "served", "solved",
                        "instances"], rows)
    sec.body.append("Approximate: costs from list prices and the performance model; a "
                    "time-limited plan may be up to its gap dearer than its engine's optimum.")
    sec.body.append("")
    return sec


_RUNNERS = {"cost": section_cost, "goodput": section_goodput, "solve": section_solve,
            "helix": section_helix, "adapt": section_adapt, "deploy": section_deploy}


# ---------------------------------------------------------------------------------------------
# Headline and report
# ---------------------------------------------------------------------------------------------


def _headline(head: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    coral = head.get("coral_cost")
    bl = head.get("baselines_cost", {})
    if coral and coral > 0:
        homo = bl.get("homo")
        if homo:
            rows.append(("Cost vs homogeneous replicas", f"{PAPER_COST_RATIO}x cheaper",
                         f"{homo[0] / coral:.2f}x cheaper (homo ${homo[0]:,.0f}/h serving "
                         f"{_pct(homo[1])}; Coral ${coral:,.0f}/h serving "
                         f"{_pct(head.get('coral_served'))}; `{head.get('scenario')}` 1x)"))
        full = {b: c for b, (c, f) in bl.items() if f >= 1 - 1e-6 and c > 0}
        if full:
            b = min(full, key=full.__getitem__)
            rows.append(("Cost vs best baseline meeting all demand", "-",
                         f"{full[b] / coral:.2f}x cheaper than {b}"))
    scarce = head.get("goodput", {}).get("scarce")
    if scarce:
        c = scarce.get("coral", 0.0)
        others = {b: v for b, v in scarce.items() if b != "coral"}
        parts = []
        if others.get("homo", 0) > 0:
            parts.append(f"{c / others['homo']:.2f}x vs homo")
        if others:
            best = max(others, key=others.__getitem__)
            if others[best] > 0:
                parts.append(f"{c / others[best]:.2f}x vs best baseline ({best})")
        rows.append(("Goodput when GPUs are scarce", f"{PAPER_GOODPUT_RATIO}x more",
                     "; ".join(parts) + f" (Coral {c:,.1f} req/s)" if parts else "-"))
    solve = [v for v in (head.get("solve_max_s"), head.get("adapt_solve_max_s")) if v]
    if solve:
        rows.append(("Re-plan time", "seconds", f"at most {max(solve):.1f} s per allocation "
                     "solve (sections 3 and 5)"))
    sim = head.get("sim")
    if sim:
        rows.append(("SLO attainment of Coral's plan (simulated)", "-",
                     f"{_pct(sim['slo_attainment'])}, goodput "
                     f"{_num(sim['goodput_tokens_per_s'], ',.0f')} tok/s"))
    sims = head.get("sims") or {}
    if sim and _slo_held(sim):
        coral = sim["cost_per_hour"]
        held = {b: v["cost_per_hour"] for b, v in sims.items()
                if b != "coral" and "error" not in v and _slo_held(v)}
        if held:
            b = min(held, key=held.__getitem__)
            rows.append(("Cost vs cheapest baseline holding every SLO in simulation", "-",
                         f"{held[b] / coral:.2f}x cheaper than {b}"))
        elif sims:
            rows.append(("Cost vs cheapest baseline holding every SLO in simulation", "-",
                         "no baseline's plan held every model's SLO in simulation"))
    for name, (coral, vllm, met) in head.get("deploy", {}).items():
        if coral > 0:
            rows.append((f"Cost of deployability on vLLM (`{name}`)", "-",
                         f"{vllm / coral:.2f}x Coral's cost"
                         + ("" if met else ", and short of demand")))
    return rows


def write_report(cfg: EvalConfig, sections: list[Section],
                 headline: list[tuple[str, str, str]], seconds: float) -> Path:
    lines = ["# Coral evaluation", "",
             f"Mode: {'quick' if cfg.quick else 'full'}; templates n_max {cfg.nmax}; "
             f"{cfg.workers} worker(s); ran in {seconds:.0f} s. All figures come from the "
             "performance model, the price catalog and the event simulator, not from GPUs; "
             "they are approximate, and n_max below the scenarios' own limit can only make "
             "Coral's plans dearer.", "",
             "## Headline", ""]
    if headline:
        lines += _table(["claim", "paper", "measured here"], headline)
    else:
        lines += ["(no headline figures: the sections they come from were not run)", ""]
    for s in sections:
        lines += [f"## {s.title}", ""] + s.body
    path = cfg.out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def evaluate(cfg: EvalConfig, say: Callable[[str], None] = lambda _m: None) -> Evaluation:
    """Run the selected sections and write `cfg.out/report.md`."""
    unknown = [s for s in cfg.sections if s not in _RUNNERS]
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(SECTIONS)}")
    t0 = time.perf_counter()
    cfg.out.mkdir(parents=True, exist_ok=True)
    ctx = _Ctx(cfg, say)
    head: dict[str, Any] = {}
    sections: list[Section] = []
    for name in SECTIONS:
        if name not in cfg.sections:
            continue
        t1 = time.perf_counter()
        try:
            sec = _RUNNERS[name](ctx, head)
        except Exception as exc:  # noqa: BLE001 - one failed section leaves the report
            sec = Section(f"{name} (failed)", [f"Section failed: `{type(exc).__name__}: {exc}`",
                                               ""])
        sec.body.append(f"_Section time: {time.perf_counter() - t1:.0f} s._")
        sec.body.append("")
        sections.append(sec)
        say(f"[{name}] done in {time.perf_counter() - t1:.0f} s")
    headline = _headline(head)
    seconds = time.perf_counter() - t0
    report = write_report(cfg, sections, headline, seconds)
    return Evaluation(cfg, sections, headline, report, seconds)
