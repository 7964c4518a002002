"""The sections of `coral evaluate` (see `coral.evaluation.evaluate` for what each measures)."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from coral.evaluation.common import (
    Section,
    md_table,
    pct,
    num,
    overall,
    pyplot,
    bar_plot,
    EvalContext,
    scaled,
    run_in_child,
    simulate_plan,
    slo_held,
)


def section_cost(ctx: EvalContext, head: dict[str, Any]) -> Section:
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
            sc = scaled(base, demand=scale)
            ctx.say(f"[cost] {name} demand x{scale:g}: planning")
            res = ctx.plan(sc, tpl)
            modes.append(f"x{scale:g} {res.mode}")
            demand = dict(res.plan.demand_rps)
            coral_served = overall(dict(res.served_fraction), demand)
            entries = [("coral", res.cost_per_hour, coral_served, res.plan.proof)]
            entries += [(b, float(r.cost_per_hour), overall(dict(r.served_fraction), demand),
                         r.solved) for b, r in res.baselines.items()]
            for planner, cost, served, solved in entries:
                ratio = cost / res.cost_per_hour if res.cost_per_hour > 0 else float("nan")
                rows.append([f"x{scale:g}", planner, num(cost), num(ratio),
                             pct(served), solved])
                costs.setdefault(planner, []).append(cost)
            labels.append(f"x{scale:g}")
            if scale == 1.0 and name == cfg.scenarios[0]:
                head["coral_cost"] = res.cost_per_hour
                head["coral_served"] = coral_served
                head["baselines_cost"] = {b: (float(r.cost_per_hour),
                                              overall(dict(r.served_fraction), demand))
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
        sec.body += md_table(["demand", "planner", "$/hour", "x Coral's cost", "served",
                            "solved"], rows)
        sec.body.append(f"Coral's serving mode per demand scale: {', '.join(modes)}.")
        sec.body.append("")
        fig = bar_plot(cfg.out / f"cost_{base.name}.png", labels, costs, "$/hour",
                        f"Cost to meet demand, {base.name}")
        sec.figures.append(fig)
        sec.body.append(f"![cost {base.name}]({fig.name})")
        sec.body.append("")
    sims = head.get("sims") or {}
    s = sims.get("coral")
    if s and "error" not in s:
        rows = [["all", s["requests"], s["completed"], pct(s["slo_attainment"]),
                 num(s["goodput_tokens_per_s"], ",.0f"), num(s["throughput_tokens_per_s"], ",.0f"),
                 num(s["throughput_rps"], ",.1f")]]
        for m, v in s.get("models", {}).items():
            rows.append([m, v.get("requests", "-"), "-", pct(v.get("slo_attainment")), "-",
                         "-", "-"])
        sec.body.append(f"Simulation of Coral's plan for `{head['scenario']}` at 1x "
                        f"({cfg.sim_seconds:g} s simulated, {s['wall_s']:.1f} s wall):")
        sec.body.append("")
        sec.body += md_table(["model", "requests", "completed", "SLO attainment",
                            "goodput tok/s", "throughput tok/s", "completed req/s"], rows)
        sec.body.append("Rates divide by the time of the last completion, so requests still in "
                        "flight at the end of the arrivals lower them slightly.")
        sec.body.append("")
    if sims:
        rows = []
        for planner, v in sims.items():
            if "error" in v:
                rows.append([planner, num(v["cost_per_hour"]), "-", "-", "-",
                             f"not simulated: {v['error']}"])
                continue
            short = [m for m, mv in (v.get("models") or {}).items() if not mv.get("slo_met")]
            rows.append([planner, num(v["cost_per_hour"]), pct(v["slo_attainment"]),
                         num(v["goodput_tokens_per_s"], ",.0f"),
                         "yes" if slo_held(v) else "no",
                         ("misses: " + ", ".join(short)) if short else ""])
        sec.body.append(f"Every planner's deployment for `{head['scenario']}` at 1x, simulated "
                        f"the same way ({cfg.sim_seconds:g} s of Poisson arrivals at the full "
                        "demand of every model, same seed):")
        sec.body.append("")
        sec.body += md_table(["planner", "$/hour", "SLO attainment", "goodput tok/s",
                            "every model's SLO held", "notes"], rows)
        sec.body.append("")
    return sec


def _simulate_planners(ctx: EvalContext, scenario: Any, res: Any, name: str) -> dict[str, Any]:
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


def section_goodput(ctx: EvalContext, head: dict[str, Any]) -> Section:
    cfg = ctx.cfg
    sec = Section("2. Goodput under GPU availability levels")
    sec.body.append(
        f"Ran: `plan_scenario` on `{ctx.scenario(cfg.goodput_scenario).name}` at availability "
        f"{', '.join(cfg.levels)} (scenario demand, n_max {cfg.nmax}; Coral in serving mode "
        f"`{cfg.coral_mode}`). Served req/s is "
        "min(demand, capacity meeting the SLO) per model, summed, from each plan; goodput tok/s "
        "is served req/s times each model's mean output tokens; the ratio is Coral's served "
        "req/s over the baseline's.")
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
        out_tokens = {d.model: d.output_tokens for d in sc.demands()}
        fractions = {"coral": dict(res.plan.served_fraction),
                     **{b: dict(r.served_fraction) for b, r in res.baselines.items()}}
        entries = [(b, sum(f * demand.get(m, 0.0) for m, f in fr.items()))
                   for b, fr in fractions.items()]
        coral = entries[0][1]
        for planner, served in entries:
            ratio = coral / served if served > 0 else float("inf")
            fr = fractions[planner]
            tokens = sum(f * demand.get(m, 0.0) * out_tokens.get(m, 0.0) for m, f in fr.items())
            rows.append([level, planner, num(served, ",.1f"), num(tokens, ",.0f"),
                         num(sum(demand.values()), ",.1f"), f"{min(fr.values(), default=1.0):.1%}",
                         "inf" if ratio == float("inf") else num(ratio)])
            series.setdefault(planner, []).append(served)
        head.setdefault("goodput", {})[level] = dict(entries)
    sec.body += md_table(["availability", "planner", "served req/s", "goodput tok/s",
                          "demand req/s", "smallest served share", "Coral / planner"], rows)
    fig = bar_plot(cfg.out / "goodput.png", list(cfg.levels), series, "served req/s",
                    f"Served demand under availability, {ctx.scenario(cfg.goodput_scenario).name}")
    sec.figures.append(fig)
    sec.body += [f"![goodput]({fig.name})", ""]
    return sec


def section_solve(ctx: EvalContext, head: dict[str, Any]) -> Section:
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
        sc = scaled(base, demand=float(k), availability=float(k))
        ctx.say(f"[solve] {cfg.solve_scenario} x{k}: solving")
        t0 = time.perf_counter()
        res = ctx.plan(sc, tpl, baselines=False)
        wall = time.perf_counter() - t0
        nodes = sum(sc.availability.values())
        rows.append([f"x{k}", f"{nodes:,}", res.columns, res.plan.total_instances,
                     num(res.solve_seconds), num(wall), res.status,
                     "-" if not math.isfinite(res.gap) else pct(res.gap),
                     pct(overall(dict(res.served_fraction), dict(res.plan.demand_rps)))])
        xs.append(nodes)
        ys.append(res.solve_seconds)
    head["solve_max_s"] = max(ys) if ys else None
    sec.body += md_table(["scale", "nodes available", "template columns", "instances",
                        "solve s", "plan wall s", "status", "gap", "served"], rows)
    plt = pyplot()
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
        from coral.templates.builder.parallel import default_perf_factory
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
    return run_in_child(_helix_worker, (model, nodes), timeout_s)


def section_helix(ctx: EvalContext, head: dict[str, Any]) -> Section:
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
        ["Helix-like (no SLO), total", num(out["no_slo"]), "-", num(cost)],
        ["Helix-like, meeting the SLO", num(out["under_slo"]), pct(out["share"]), num(cost)],
        ["Coral (SLO-bound placement)", num(out["coral"]),
         "100.0%" if out["coral"] > 0 else "-", num(cost)],
    ]
    for r, v in zip(rows, (out["no_slo"], out["under_slo"], out["coral"])):
        r.append(num(cost / v, ",.3f") if v > 0 else "-")
    sec.body += md_table(["placement", "req/s", "share meeting SLO", "$/hour",
                        "$/hour per req/s"], rows)
    if out["coral"] <= 0:
        sec.body.append("Coral finds no placement on this cluster that meets the SLO (0 req/s).")
        sec.body.append("")
    sec.body.append("Approximate: Helix is modelled with Coral's placement solver and a loose "
                    "SLO (not Helix's own MILP), and SLO compliance is judged on mean-shaped "
                    "iterations without queueing.")
    sec.body.append("")
    fig = bar_plot(cfg.out / "helix.png", ["no SLO (all)", "no SLO, meets SLO", "Coral"],
                    {"req/s": [out["no_slo"], out["under_slo"], out["coral"]]}, "req/s",
                    f"{cfg.helix_model} on {used}")
    sec.figures.append(fig)
    sec.body += [f"![helix]({fig.name})", ""]
    head["helix"] = out
    return sec


def section_adapt(ctx: EvalContext, head: dict[str, Any]) -> Section:
    from coral.planning.adapt import run_timeline
    from coral.planning.adapt_report import write_outputs
    from coral.planning.timeline import load_timeline

    cfg = ctx.cfg
    sec = Section("5. Adaptation over a timeline")
    tl = load_timeline(cfg.timeline, catalog=ctx.catalog)
    n_all = len(tl.periods)
    if cfg.timeline_periods is not None and cfg.timeline_periods < n_all:
        tl = replace(tl, spec=tl.spec.model_copy(
            update={"periods": list(tl.spec.periods[:cfg.timeline_periods])}))
    tpl = ctx.templates(tl.scenario)
    ctx.say(f"[adapt] timeline {tl.name}: {len(tl.periods)} periods")
    res = run_timeline(tl, catalog=ctx.catalog, options=ctx.options(), perf=ctx.perf,
                       templates=tpl)
    res = write_outputs(res, cfg.out / "adapt")
    sec.body.append(
        f"Ran: `run_timeline` on timeline `{tl.name}` over `{res.scenario}` "
        f"({len(tl.periods)} of {n_all} periods), re-planning each period against the previous "
        f"deployment with the start-up penalty; templates n_max {res.nmax}.")
    sec.body.append("")
    rows = [[r.name, num(r.demand_rps, ",.1f"), pct(r.served_fraction),
             num(r.cost_usd_per_hour), num(r.startup_penalty_usd), r.instances, r.started,
             r.stopped, num(r.solve_s), r.status] for r in res.records]
    sec.body += md_table(["period", "demand req/s", "served", "$/hour", "start-up $",
                        "instances", "started", "stopped", "solve s", "status"], rows)
    sec.body.append(f"Total ${res.total_cost_usd:,.2f}; {pct(res.served_fraction)} of requests "
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


def section_deploy(ctx: EvalContext, head: dict[str, Any]) -> Section:
    """What planning only shapes vLLM runs costs, and how much of Coral's plan vLLM could not
    run (`coral plan --engine vllm` against `--engine coral`)."""
    from coral.templates.space.engines import engine_violations

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
            rows.append([name, engine, num(r.cost_per_hour), num(ratio),
                         pct(overall(dict(r.served_fraction), demand)), r.plan.proof,
                         sum(i.count for i in r.instances)])
        rows.append([name, "coral, rows vLLM cannot run", num(sum(
            i.usd_per_hour * i.count for i in bad)), "-", "-", "-", sum(i.count for i in bad)])
        head.setdefault("deploy", {})[name] = (coral.cost_per_hour, vllm.cost_per_hour,
                                               vllm.plan.meets_demand)
    sec.body += md_table(["scenario", "engine", "$/hour", "vs coral", "served", "solved",
                        "instances"], rows)
    sec.body.append("Approximate: costs from list prices and the performance model; a "
                    "time-limited plan may be up to its gap dearer than its engine's optimum.")
    sec.body.append("")
    return sec


RUNNERS = {"cost": section_cost, "goodput": section_goodput, "solve": section_solve,
            "helix": section_helix, "adapt": section_adapt, "deploy": section_deploy}
