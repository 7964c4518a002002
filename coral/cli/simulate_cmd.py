"""`coral simulate`: replay a workload on a planned deployment and report SLOs, goodput, $."""

from __future__ import annotations

import csv
import json as jsonlib
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape
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
from coral.perf.slowdown import PhaseSlowdown, Slowdown, slowdown_json

#: Node limit of the templates when a scenario is planned here (quick; see `coral demo`).
SIMULATE_NMAX = 2
DEFAULT_DURATION_S = 300.0


def _load_deployment(ref: str, *, cat: Any, nmax: int, templates_dir: Path, level: str | None,
                     quiet_stdout: bool, show: bool) -> tuple[str, list, dict, dict, Any]:
    """(name, instances, slos per model, demand req/s per model, plan file) of a plan JSON
    or a scenario (planned here; its plan then names the scenario as given, for a re-plan)."""
    from dataclasses import replace

    from coral.plans.errors import PlanFileError
    from coral.plans.file import read_plan
    from coral.allocator.scenario.load import scenario_slo
    from coral.planning.options import PlanOptions
    from coral.planning.plan import plan_scenario
    from coral.allocator.scenario.load import load_scenario
    from coral.sim.deployment import instances_from_plan
    from coral.templates.builder.build_options import BuildOptions
    from coral.templates.builder.parallel import default_perf_factory

    path = Path(ref)
    if path.suffix == ".json":
        try:
            plan = read_plan(path, cat)
        except PlanFileError as exc:
            raise UserError(str(exc)) from None
        slos = plan.slos
        if slos is None:  # a plan file written before plans carried their SLOs
            scenario = load_scenario(plan.scenario, level=plan.level, catalog=cat)
            slos = {m.name: scenario_slo(scenario, m.name) for m in scenario.models}
        return (path.stem, instances_from_plan(plan, slos), dict(slos),
                dict(plan.demand_rps or {}), plan)
    scenario = load_scenario(ref, level=level, catalog=cat)
    perf = default_perf_factory(cat)
    options = PlanOptions(build=BuildOptions(workers=os.cpu_count() or 1),
                          out_root=templates_dir, nmax=nmax)
    with native_stdout_to_stderr(quiet_stdout):
        if show:
            with err_console.status(f"planning {scenario.name} (templates n_max {nmax})..."):
                result = plan_scenario(scenario, catalog=cat, options=options, perf=perf,
                                       baselines=False)
        else:
            result = plan_scenario(scenario, catalog=cat, options=options, perf=perf,
                                   baselines=False)
    plan = replace(result.plan_file(), scenario=ref)
    return (scenario.name, instances_from_plan(plan, plan.slos), dict(plan.slos),
            dict(result.plan.demand_rps), plan)


def _workload(models: dict[str, float], slos: dict, *, trace: Path | None, rate: float | None,
              duration: float | None, seed: int, lengths: str,
              trace_ends: dict[str, float] | None = None) -> list:
    """The requests to simulate. With a trace and a duration, `trace_ends` gets each model
    whose rescaled trace ends before the duration, and when (a trace is replayed once)."""
    from coral.sim.workload import merge, read_trace, synthetic, trace_requests, trace_span_s

    total = sum(models.values())
    if total <= 0:
        raise UserError("the plan serves no demand; give --rate")
    scale = 1.0 if rate is None else rate / total
    parts = []
    rows = read_trace(trace) if trace is not None else None  # once, for every model
    for k, (model, demand) in enumerate(sorted(models.items())):
        r = demand * scale
        if r <= 0:
            continue
        if trace is not None:
            parts.append(trace_requests(trace, model, rate_rps=r, duration_s=duration,
                                        rows=rows))
            span = trace_span_s(trace, rate_rps=r, rows=rows)
            if trace_ends is not None and duration is not None and span < duration:
                trace_ends[model] = span
        else:
            slo = slos[model]
            parts.append(synthetic(model, rate_rps=r, duration_s=duration or DEFAULT_DURATION_S,
                                   seed=seed + 1000 * k, prompt_tokens=slo.input_tokens,
                                   output_tokens=slo.output_tokens,
                                   length_dist=lengths))  # type: ignore[arg-type]
    return merge(*parts)


#: Processes `coral simulate` uses unless told (one per model group; results are the same).
MAX_DEFAULT_WORKERS = 4


def _write(out: Path, result: Any, summary: dict) -> None:
    from coral.sim.metrics import REQUEST_COLUMNS, request_rows

    out.mkdir(parents=True, exist_ok=True)
    with (out / "requests.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(REQUEST_COLUMNS)
        w.writerows(request_rows(result))
    (out / "summary.json").write_text(jsonlib.dumps(summary, indent=2, default=_json_default)
                                      + "\n")


def _json_default(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else str(x)


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f}"


def print_summary(name: str, s: dict) -> None:
    console.print(f"[bold]Simulated {escape(name)}[/]: {s['requests']} requests over "
                  f"{s['span_s']:.0f} s, {s['completed']} completed, ${s['cost_per_hour']:,.2f}"
                  f"/hour; goodput {s['goodput_tokens_per_s']:,.0f} tokens/s of "
                  f"{s['throughput_tokens_per_s']:,.0f}"
                  + (f" ({s['goodput_rps']:,.2f} req/s within the SLO)"
                     if s.get("goodput_rps") is not None else "")
                  + "; SLO attainment "
                  + f"{s['slo_attainment'] * 100:.1f}%", highlight=False)
    t = Table(title="Per model (latency at the SLO percentile)", title_justify="left")
    for col in ("model", "requests", "p", "TTFT ms", "target", "TPOT ms", "target", "SLO met",
                "attainment"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for m, v in s["models"].items():
        t.add_row(escape(m), str(v["requests"]), f"{v['percentile']:g}",
                  _ms(v["ttft_s_at_percentile"]), _ms(v["ttft_target_s"]),
                  _ms(v["tpot_s_at_percentile"]), _ms(v["tpot_target_s"]),
                  "yes" if v["slo_met"] else "[red]no[/]", f"{v['slo_attainment'] * 100:.1f}%")
    console.print(t)
    by_role = s.get("mean_utilisation_by_role") or {}
    if s.get("kv_transfers"):
        roles = ", ".join(f"{r} {u * 100:.0f}%" for r, u in by_role.items())
        console.print(f"PD: {s['kv_transfers']} KV-cache hand-overs, transfer p50/p90/p99 "
                      f"{_ms(s.get('kv_transfer_s_p50'))}/{_ms(s.get('kv_transfer_s_p90'))}/"
                      f"{_ms(s.get('kv_transfer_s_p99'))} ms (queueing at the NIC included); "
                      f"mean node utilisation by role: {roles}", highlight=False)


def _preemptions(sim: Any, plan: Any, slos: dict, *, cat: Any, perf: Any,
                 templates_dir: Path, seed: int, horizon_s: float, quiet: bool,
                 scenario: str | None) -> Any:
    """A `PreemptionRun` on `sim`, re-planning as the adaptation loop does."""
    from coral.sim.preemption import PreemptionConfig, PreemptionError, PreemptionRun, check_rates
    from coral.planning.options import PlanOptions
    from coral.planning.preemption_replan import AllocatorReplanner

    try:
        rates = check_rates(cat)
        replanner = AllocatorReplanner(plan, catalog=cat, perf=perf,
                                       options=PlanOptions(out_root=templates_dir),
                                       scenario=scenario)
        run = PreemptionRun(sim, plan.instances, slos, rates, replanner,
                            PreemptionConfig(seed=seed, startup_s=replanner.startup_s),
                            on_event=None if quiet else
                            (lambda text: err_console.print(f"preemption: {text}",
                                                            highlight=False)))
        run.install(horizon_s, extra_pools=replanner.pools())
    except PreemptionError as exc:
        raise UserError(str(exc)) from None
    return run


def print_preemptions(p: dict) -> None:
    console.print(
        f"Preemptions over {p['horizon_s']:,.0f} s ({p['spot_instances']} spot instances in "
        f"the plan, seed {p['seed']}): {p['events']} events reclaimed "
        f"{p['instances_reclaimed']} instances; {p['replans']} re-plans started "
        f"{p['replacements_started']} and stopped {p['instances_stopped']}; requests "
        f"rerouted {p['requests_rerouted']}, retried {p['requests_retried']}, failed "
        f"{p['requests_failed']}, rejected {p['requests_rejected']}; cost "
        f"${p['cost_usd']:,.2f} (${p['cost_per_hour']:,.2f}/hour with the replacements, "
        f"planned ${p['planned_cost_per_hour']:,.2f}/hour)", highlight=False)


def simulate_plan_summary(plan: Path, cat: Any, *, factors: dict[str, Slowdown] | None,
                          duration: float, seed: int = 0) -> dict:
    """`coral simulate PLAN --slowdown ...`'s summary, with no files written and no progress
    bar: for commands that judge a plan by simulating it (`coral perf calibrate --plan`)."""
    from coral.sim.event_loop import SimConfig, Simulator
    from coral.sim.metrics import summarize
    from coral.templates.builder.parallel import default_perf_factory

    _, instances, slos, demand, _ = _load_deployment(
        str(plan), cat=cat, nmax=SIMULATE_NMAX, templates_dir=Path("out/templates"),
        level=None, quiet_stdout=True, show=False)
    reqs = _workload(demand, slos, trace=None, rate=None, duration=duration, seed=seed,
                     lengths="fixed")
    perf = default_perf_factory(cat)
    if factors:
        from coral.perf.slowdown import SlowedPerf

        perf = SlowedPerf(perf, cat, factors)
    cfg = SimConfig(workers=min(os.cpu_count() or 1, MAX_DEFAULT_WORKERS))
    result = Simulator(instances, perf=perf, catalog=cat, config=cfg).run(reqs)
    return _clean(summarize(result, slos))


def simulate(
    plan_or_scenario: Annotated[str, typer.Argument(
        help="A plan JSON from `coral plan --out`, or a scenario (core, advanced, or a YAML "
        "file) to plan first.")],
    trace: Annotated[Optional[Path], typer.Option(
        "--trace", help="Trace CSV (Azure or processed form); lengths and arrival pattern "
        "replayed per model, rescaled to the model's demand (or to --rate).")] = None,
    rate: Annotated[Optional[float], typer.Option(
        "--rate", help="Total requests/s, split over models like the plan's demand "
        "(default: the plan's demand).")] = None,
    duration: Annotated[Optional[float], typer.Option(
        "--duration", help=f"Seconds of arrivals (default {DEFAULT_DURATION_S:g}; with "
        "--trace, the whole trace).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of generated arrivals and lengths.")] = 0,
    lengths: Annotated[str, typer.Option(
        "--lengths", help="Generated lengths: fixed (the SLO's mean shape) or lognormal.")] = "fixed",
    mode: Annotated[str, typer.Option(
        "--mode", help="fast (closed-form decode runs) or naive (one event per step).")] = "fast",
    max_batched_tokens: Annotated[int, typer.Option(
        "--max-batched-tokens", help="Token budget of one scheduler step.")] = 2048,
    nmax: Annotated[int, typer.Option(
        "--nmax", help="Template node limit when planning a scenario here.")] = SIMULATE_NMAX,
    level: Annotated[Optional[str], typer.Option(
        "--level", "-l", help="Availability level of the scenario.")] = None,
    templates_dir: Annotated[Path, typer.Option(
        "--templates-dir", help="Root of the template libraries.")] = Path("out/templates"),
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="Folder for requests.csv and summary.json (default out/simulate/NAME).")]
    = None,
    progress: Annotated[Optional[bool], typer.Option(
        "--progress/--no-progress", help="Progress bar on stderr (default: when a terminal).")]
    = None,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", help="Processes; models are split over them and the results do not "
        f"depend on it (default: the CPU count, at most {MAX_DEFAULT_WORKERS}).")] = None,
    preemptions: Annotated[bool, typer.Option(
        "--preemptions", help="Preempt the plan's spot instances at the catalog's rates "
        "(per pool, an event reclaims the pool's spot nodes), fail over their requests and "
        "re-plan after each event; reports requests retried/failed, preemptions and the cost "
        "with the replacements. Runs in one process.")] = False,
    preemption_seed: Annotated[int, typer.Option(
        "--preemption-seed", help="Seed of the preemption events.")] = 0,
    replan_scenario: Annotated[Optional[str], typer.Option(
        "--replan-scenario", help="With --preemptions: the scenario file the plan was made "
        "from, for its re-plans (a plan file names its scenario only).")] = None,
    slowdown: Annotated[Optional[str], typer.Option(
        "--slowdown", help="Run the plan with some GPU types slower than the perf model says: "
        "GPU=FACTOR,... (e.g. l4=1.3,t4=1.3: every iteration on an L4 or T4 node takes 1.3x "
        "the modelled time), or per phase GPU:prefill=F,GPU:decode=F (a mixed iteration "
        "takes the two weighted by each part's time).")] = None,
    catalog: CatalogFiles = None,
    json: JsonFlag = False,
) -> None:
    """Simulate a planned deployment under a workload: TTFT/TPOT percentiles, SLO attainment,
    goodput, utilisation and $/hour. Writes one CSV row per request and a summary JSON."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from coral.sim.event_loop import SimConfig, Simulator
    from coral.sim.metrics import summarize
    from coral.sim.workload import WorkloadError
    from coral.templates.builder.parallel import default_perf_factory

    show = sys.stderr.isatty() if progress is None else progress
    with user_errors():
        if rate is not None and not rate > 0:
            raise UserError(f"--rate must be > 0 requests/s, got {rate:g}")
        if duration is not None and not duration > 0:
            raise UserError(f"--duration must be > 0 s, got {duration:g}")
        if lengths not in ("fixed", "lognormal"):
            raise UserError(f"--lengths must be 'fixed' or 'lognormal', got {lengths!r}")
        cat = open_catalog(catalog)
        factors = None
        if slowdown is not None:
            from coral.perf.slowdown import parse_slowdown

            factors = parse_slowdown(slowdown, cat.gpus)
        name, instances, slos, demand, plan = _load_deployment(
            plan_or_scenario, cat=cat, nmax=nmax, templates_dir=templates_dir, level=level,
            quiet_stdout=json, show=show)
        if workers is not None and workers < 1:
            raise UserError(f"--workers must be >= 1, got {workers}")
        # Models the deployment has no instance of are simulated too: their requests are
        # rejected and count against the SLO, rather than vanishing from the figures.
        unserved = sorted(m for m, d in demand.items()
                          if d > 0 and not any(i.model == m for i in instances))
        trace_ends: dict[str, float] = {}
        try:
            reqs = _workload(demand, slos, trace=trace, rate=rate, duration=duration,
                             seed=seed, lengths=lengths, trace_ends=trace_ends)
        except WorkloadError as exc:
            raise UserError(str(exc)) from None
        cfg = SimConfig(mode=mode, max_batched_tokens=max_batched_tokens,  # type: ignore[arg-type]
                        workers=1 if preemptions else
                        workers or min(os.cpu_count() or 1, MAX_DEFAULT_WORKERS))
        perf = default_perf_factory(cat)
        if factors:
            from coral.perf.slowdown import SlowedPerf

            perf = SlowedPerf(perf, cat, factors)
        sim = Simulator(instances, perf=perf, catalog=cat, config=cfg)
        horizon = reqs[-1].arrival_s if reqs else 0.0
        pre = None
        if preemptions:
            pre = _preemptions(sim, plan, slos, cat=cat, perf=perf,
                               templates_dir=templates_dir, seed=preemption_seed,
                               horizon_s=duration or horizon, quiet=json,
                               scenario=replan_scenario)
        if show:
            with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                          TimeElapsedColumn(), console=err_console, transient=True) as bar:
                task = bar.add_task("sim", total=max(horizon, 1e-9))
                result = sim.run(reqs, progress=lambda t: bar.update(task, completed=t))
        else:
            result = sim.run(reqs)
        summary = _clean(summarize(result, slos))
        if pre is not None:
            report = _clean(pre.report(result))
            summary["preemptions"] = report
            # what was held over the horizon, replacements included, not the plan's sum
            summary["cost_per_hour"] = report["cost_per_hour"]
        summary["source"] = plan_or_scenario
        summary["mode"] = mode
        summary["seed"] = seed
        summary["models_without_instances"] = unserved
        summary["slowdown"] = {g: slowdown_json(f) for g, f in (factors or {}).items()}
        # models whose replayed trace ends before --duration: second of its last arrival
        summary["trace_ends_s"] = dict(sorted(trace_ends.items()))
        folder = out if out is not None else Path("out/simulate") / name
        _write(folder, result, summary)
    if json:
        print_json(summary)
        return
    print_summary(name, summary)
    if summary.get("preemptions"):
        print_preemptions(summary["preemptions"])
    if factors:
        console.print("slowdown: " + ", ".join(f"{g} {PhaseSlowdown.of(f).text()}"
                                               for g, f in factors.items())
                      + " (the iterations on a node of that GPU type)", highlight=False)
    if trace_ends:
        console.print(
            f"[yellow]the trace ends before --duration ({duration:g} s)[/] for "
            + ", ".join(f"{escape(m)} (at {t:,.0f} s)" for m, t in sorted(trace_ends.items()))
            + ": rescaled to each model's demand, it is replayed once, so those models get no "
            "requests after it; figures cover what arrived", highlight=False)
    if unserved:
        console.print(f"[yellow]no instance serves {', '.join(map(escape, unserved))}[/]: its "
                      "requests were rejected and count as missing the SLO", highlight=False)
    console.print(f"written {escape(str(folder / 'requests.csv'))} and "
                  f"{escape(str(folder / 'summary.json'))}", highlight=False)
