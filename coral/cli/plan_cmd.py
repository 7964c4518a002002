"""`coral plan`, `coral demo` and `coral adapt`: plan a scenario, show it, replay a timeline."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Iterator, Optional

import typer
from rich.markup import escape
from rich.table import Table

from coral.allocator.problem import (
    DEFAULT_MIP_GAP,
    DEFAULT_SCARCITY,
    DEFAULT_TIME_LIMIT_S,
    SCARCITY_OBJECTIVES,
)
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
from coral.cli.plan_view import pct, print_plan

if TYPE_CHECKING:  # the planner loads when a command runs, not when the CLI starts
    from coral.planning.options import PlanOptions

#: Node limit of `coral demo`'s templates. The `core` scenario asks for 6, which takes far
#: longer than a demo should; 3 is the largest whose whole demo (templates from scratch,
#: allocation, baselines) stays well under three minutes on a 2-core machine (timings in
#: benchmarks/results/refactoring.md, "Figures moved here from the code's comments").
DEMO_NMAX = 3
DEMO_SCENARIO = "core"
#: The demo plans every serving mode and keeps the best plan.
DEMO_MODE = "auto"
#: `coral plan`'s default serving mode: every mode planned and the best plan kept, whatever
#: mode the scenario file names (its `mode` is what other commands plan a scenario in).
PLAN_MODE = "auto"
#: Serving modes `--mode` takes (`coral.allocator.scenario.load.ScenarioMode`).
MODES = ("aggregated", "pd", "mixed", "auto")

LevelOpt = Annotated[Optional[str], typer.Option(
    "--level", "-l", help="Availability level of the scenario (default: the scenario's).")]
NmaxOpt = Annotated[Optional[int], typer.Option(
    "--nmax", help="Build templates with at most this many nodes (quicker, maybe dearer) "
    "(default: the scenario's n_max).")]
WorkersOpt = Annotated[Optional[int], typer.Option(
    "--workers", help="Local processes that build templates (default: one per CPU).")]
TemplatesDirOpt = Annotated[Path, typer.Option(
    "--templates-dir", help="Root of the template libraries (reused when inputs match).")]
TimeLimitOpt = Annotated[float, typer.Option(
    "--time-limit", help="Time limit of one allocation solve, seconds (mode auto solves "
    "each of its three modes within it).")]
GapOpt = Annotated[float, typer.Option(
    "--gap", help="Stop a solve once its plan is proven within this relative gap of the best "
    "(0.005: 0.5%; larger is faster, smaller is slower and may end at the time limit).")]
ProgressOpt = Annotated[Optional[bool], typer.Option(
    "--progress/--no-progress", help="Progress bars on stderr (default: when a terminal).")]
ScarcityOpt = Annotated[str, typer.Option(
    "--scarcity", help="What the plan maximises when the demand cannot be met: fair (the "
    "default: raise the smallest served fraction over models, then the priority-weighted "
    "generated tokens/s, then the lowest cost at that) or goodput (the most priority-weighted "
    "req/s, then cost: may leave the model whose requests take the most GPUs at zero).")]
BaselinesOpt = Annotated[bool, typer.Option(
    "--baselines/--no-baselines", help="Run the baselines on the same templates to compare.")]


class EngineChoice(str, Enum):
    """`--engine`: the serving engines of `coral.templates.space.engines.ENGINES` (typer refuses any
    other value and lists these; defined here so that the CLI starts without importing the
    template solvers)."""

    coral = "coral"
    vllm = "vllm"


EngineOpt = Annotated[EngineChoice, typer.Option(
    "--engine", help="Serving engine the plan must be deployable on: coral (any pipeline of "
    "stages of identical nodes) or vllm (one node per stage, one GPU count per pipeline, one "
    "batch on every node; its own template libraries).", case_sensitive=False)]

DEFAULT_TEMPLATES_DIR = Path("out/templates")
#: Where `coral demo` writes its plan (the README's main job; simulated and deployed from it).
DEMO_PLAN_FILE = Path("out/demo/plan.json")


def _say(msg: str) -> None:
    err_console.print(f"[dim]{escape(msg)}[/]", highlight=False, soft_wrap=True)


def _check_common(nmax: int | None, workers: int | None, time_limit: float,
                  gap: float = DEFAULT_MIP_GAP) -> None:
    if nmax is not None and nmax < 1:
        raise UserError(f"--nmax must be >= 1, got {nmax}")
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
    if not time_limit > 0:
        raise UserError(f"--time-limit must be > 0 s, got {time_limit:g}")
    if not 0.0 <= gap < 1.0:
        raise UserError(f"--gap must be a fraction in [0, 1) (0.005 is 0.5%), got {gap:g}")


@contextmanager
def _busy(message: str, enabled: bool) -> Iterator[None]:
    """A spinner on stderr while something without its own progress bar runs."""
    if enabled:
        with err_console.status(message):
            yield
    else:
        yield


def parse_robust(text: str | float) -> str | float:
    """`--robust`'s value: "auto", or R as a checked float."""
    from coral.allocator.robust.planner import RobustError, check_robust_r

    if isinstance(text, str) and text.strip().lower() == "auto":
        return "auto"
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise RobustError(f"--robust must be a number in (0, 10] (0.2: any one GPU type 20 % "
                          f"slower than modelled) or 'auto', got {text!r}") from None
    return check_robust_r(value)


def _plan_options(*, nmax: int | None, workers: int | None, templates_dir: Path,
                  time_limit: float, gap: float = DEFAULT_MIP_GAP, engine: str = "coral",
                  robust: str | None = None, spot: bool = False,
                  risk_target: float = 0.99, risk_window: float = 3600.0,
                  scarcity: str = DEFAULT_SCARCITY) -> PlanOptions:
    """The `PlanOptions` of `coral plan`'s (and `coral demo`'s) flags, checked."""
    from coral.planning.options import PlanOptions
    from coral.templates.builder.build_options import BuildOptions

    _check_common(nmax, workers, time_limit, gap)
    if scarcity not in SCARCITY_OBJECTIVES:
        raise UserError(f"--scarcity must be one of {', '.join(SCARCITY_OBJECTIVES)}, got "
                        f"{scarcity!r}")
    spot_options = None
    if spot:
        from coral.allocator.spot.planner import SpotOptions

        spot_options = SpotOptions(risk_target=risk_target, window_s=risk_window)
    return PlanOptions(
        build=BuildOptions(engine=engine, workers=workers or os.cpu_count() or 1),
        out_root=templates_dir, nmax=nmax, time_limit_s=time_limit, mip_gap=gap,
        scarcity=scarcity,  # type: ignore[arg-type]
        robust=parse_robust(robust) if robust is not None else None,  # before any build
        spot=spot_options)


def _plan(scenario_ref: str, options: PlanOptions, *, level: str | None, progress: bool | None,
          baselines: bool, catalog: list[Path] | None, quiet_stdout: bool,
          mode: str | None = None) -> Any:
    """Plan a scenario as `options` say, with progress on stderr."""
    from coral.planning.libraries import templates_for_scenario
    from coral.planning.plan import plan_scenario
    from coral.allocator.scenario.load import load_scenario
    from coral.templates.builder.parallel import default_perf_factory

    cat = open_catalog(catalog)
    scenario = load_scenario(scenario_ref, level=level, catalog=cat)
    if mode is not None:
        if mode not in MODES:
            raise UserError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
        scenario = scenario.in_mode(mode)  # type: ignore[arg-type]
    show = sys.stderr.isatty() if progress is None else progress
    perf = default_perf_factory(cat)
    with native_stdout_to_stderr(quiet_stdout):
        templates = templates_for_scenario(
            scenario, cat, perf, options=options.build, out_root=options.out_root,
            nmax=options.nmax, progress=show, on_message=_say,
        )
        from coral.allocator.kernels.jit import warm_up

        with _busy("loading the allocator's compiled kernels...", show):
            warm_up(on_message=_say)  # once per install it compiles them: said on stderr
        what = "allocating" + (" and running the baselines" if baselines else "")
        with _busy(f"{what}...", show):
            return plan_scenario(scenario, catalog=cat, options=options, perf=perf,
                                 templates=templates, baselines=baselines)


def _write_plan(result: Any, path: Path) -> None:
    from coral.plans.file import write_plan

    write_plan(result.plan_file(), path)


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------


def plan(
    scenario: Annotated[str, typer.Argument(
        help="Built-in scenario (core, advanced) or a scenario YAML file.")],
    level: LevelOpt = None,
    nmax: NmaxOpt = None,
    workers: WorkersOpt = None,
    templates_dir: TemplatesDirOpt = DEFAULT_TEMPLATES_DIR,
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="Also write the plan as JSON to this file.")] = None,
    time_limit: TimeLimitOpt = DEFAULT_TIME_LIMIT_S,
    gap: GapOpt = DEFAULT_MIP_GAP,
    scarcity: ScarcityOpt = DEFAULT_SCARCITY,
    baselines: BaselinesOpt = True,
    progress: ProgressOpt = None,
    mode: Annotated[str, typer.Option(
        "--mode", help="Serving mode: aggregated, pd (prefill/decode disaggregated), mixed "
        "(each model may run both side by side) or auto (plan each, keep the best: never "
        "dearer than any of them), the default.")] = PLAN_MODE,
    engine: EngineOpt = EngineChoice.coral,
    robust: Annotated[Optional[str], typer.Option(
        "--robust", help="Plan so that every model's demand stays covered if any one GPU type "
        "is 1 + R times slower than modelled (e.g. 0.2), or 'auto': each GPU type as much "
        "slower as the perf model's measured error on it (own profile or borrowed; "
        "coral/perf/data/uncertainty.yaml); shows the nominal plan's cost beside it.")] = None,
    spot: Annotated[bool, typer.Option(
        "--spot", help="Mix spot and on-demand instances of the mode's templates: every model's "
        "demand stays covered with probability >= --risk-target over --risk-window, pools "
        "(node type x region) preempted at the catalog's rates; --risk-target 0 gives the "
        "naive spot plan (no risk model).")] = False,
    risk_target: Annotated[float, typer.Option(
        "--risk-target", help="With --spot: probability each model's demand stays covered "
        "over the window.")] = 0.99,
    risk_window: Annotated[float, typer.Option(
        "--risk-window", help="With --spot: the window, s.")] = 3600.0,
    catalog: CatalogFiles = None,
    json: JsonFlag = False,
) -> None:
    """Plan a scenario at the lowest $/hour, beside the baselines.

    Prints what to rent in each region and how each model is split over it (node mix and
    layer placement of every template), the headroom per model, and every baseline's cost
    and served demand on the same templates, prices and availability. By default it plans
    every serving mode at the scenario's n_max and keeps the best plan; only baselines that
    serve all demand are compared on cost.
    """
    with user_errors():
        options = _plan_options(nmax=nmax, workers=workers, templates_dir=templates_dir,
                                time_limit=time_limit, gap=gap,
                                engine=EngineChoice(engine).value, robust=robust, spot=spot,
                                risk_target=risk_target, risk_window=risk_window,
                                scarcity=scarcity)
        result = _plan(scenario, options, level=level, progress=progress, baselines=baselines,
                       catalog=catalog, quiet_stdout=json, mode=mode)
        payload = result.to_dict()
        if out is not None:
            _write_plan(result, out)
    if json:
        print_json(payload)
        return
    print_plan(result)
    if out is not None:
        console.print(f"plan written to {escape(str(out))}", highlight=False)


def demo(
    nmax: Annotated[int, typer.Option(
        "--nmax", help=f"Template node limit (the scenario asks for 6; the demo uses "
        f"{DEMO_NMAX} to finish in minutes).")] = DEMO_NMAX,
    workers: WorkersOpt = None,
    templates_dir: TemplatesDirOpt = DEFAULT_TEMPLATES_DIR,
    time_limit: TimeLimitOpt = DEFAULT_TIME_LIMIT_S,
    gap: GapOpt = DEFAULT_MIP_GAP,
    progress: ProgressOpt = None,
    mode: Annotated[str, typer.Option(
        "--mode", help="Serving mode: aggregated, pd, mixed or auto (plan each, keep the "
        "best)."
    )] = DEMO_MODE,
    engine: EngineOpt = EngineChoice.coral,
    out: Annotated[Path, typer.Option(
        "--out", help="Where the demo's plan is written, for `coral simulate` and "
        "`coral serve`.")] = DEMO_PLAN_FILE,
    json: JsonFlag = False,
) -> None:
    """Plan the core scenario end to end and show Coral against the baselines.

    Builds the templates, solves the allocation and runs the baselines. Templates are built
    with a reduced n_max (3 by default, against the scenario's 6) so that the whole demo
    takes about a minute on 2 cores. Libraries are kept under --templates-dir, so a second
    run reuses them.
    """
    with user_errors():
        from coral.allocator.scenario.load import load_scenario

        scenario = load_scenario(DEMO_SCENARIO)
        if not json:
            full = scenario.spec.n_max
            how = (f"Templates are built with n_max = {nmax} instead of the scenario's {full} "
                   f"so that the demo finishes in minutes; `coral plan {scenario.name}` plans "
                   "with the full n_max." if nmax != full else
                   f"Templates are built with the scenario's n_max = {full}.")
            console.print(f"[bold]Coral demo[/]: scenario '{escape(scenario.name)}' "
                          f"({escape(scenario.spec.description)}). {escape(how)}",
                          highlight=False)
        options = _plan_options(nmax=nmax, workers=workers, templates_dir=templates_dir,
                                time_limit=time_limit, gap=gap,
                                engine=EngineChoice(engine).value)
        result = _plan(DEMO_SCENARIO, options, level=None, progress=progress, baselines=True,
                       catalog=None, quiet_stdout=json, mode=mode)
        payload = result.to_dict()
        _write_plan(result, out)
    if json:
        print_json(payload)
        return
    print_plan(result)
    console.print(f"plan written to {escape(str(out))}; simulate it with `coral simulate "
                  f"{escape(str(out))}`, deploy it with `coral serve {escape(str(out))} "
                  "--dry-run` (torch workers here) or `--engine vllm --provisioner skypilot`",
                  highlight=False)


def adapt(
    timeline: Annotated[str, typer.Argument(
        help="Timeline YAML file, or a built-in timeline name (day).")],
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="Folder for adapt.csv and adapt.png (default: out/adapt/NAME).")] = None,
    nmax: NmaxOpt = None,
    workers: WorkersOpt = None,
    templates_dir: TemplatesDirOpt = DEFAULT_TEMPLATES_DIR,
    time_limit: TimeLimitOpt = DEFAULT_TIME_LIMIT_S,
    progress: ProgressOpt = None,
    catalog: CatalogFiles = None,
    json: JsonFlag = False,
) -> None:
    """Replay a timeline, re-planning every period with the start-up penalty.

    The timeline changes demand, availability and prices period by period; the result is a
    CSV and a PNG plot of cost and served demand over time.
    """
    from coral.planning.adapt import run_timeline
    from coral.planning.adapt_report import write_outputs
    from coral.planning.timeline import load_timeline

    with user_errors():
        options = _plan_options(nmax=nmax, workers=workers, templates_dir=templates_dir,
                                time_limit=time_limit)
        cat = open_catalog(catalog)
        tl = load_timeline(timeline, catalog=cat)
        show = sys.stderr.isatty() if progress is None else progress
        folder = out if out is not None else Path("out/adapt") / tl.name
        with native_stdout_to_stderr(json):
            def said(r: Any) -> None:
                if show:
                    _say(f"period {r.name}: ${r.cost_usd_per_hour:,.2f}/hour, "
                         f"{pct(r.served_fraction)} served, {r.started} started, "
                         f"{r.stopped} stopped ({r.status}, {r.solve_s:.1f} s)")

            result = run_timeline(tl, catalog=cat, options=options, progress=show,
                                  on_message=_say, on_period=said)
            result = write_outputs(result, folder)
    if json:
        print_json(result.to_dict())
        return
    table = Table(title=f"Timeline {tl.name} on {result.scenario}", title_justify="left",
                  box=None, padding=(0, 1), pad_edge=False, header_style="bold")
    table.add_column("period", min_width=max(len(r.name) for r in result.records))
    for col in ("req/s", "served", "$/hour", "start-up $", "running", "started", "stopped"):
        table.add_column(col, justify="right", min_width=min(len(col), 8))
    table.add_column("status", min_width=10)
    for r in result.records:
        table.add_row(escape(r.name), f"{r.demand_rps:.1f}", pct(r.served_fraction),
                      f"{r.cost_usd_per_hour:,.2f}", f"{r.startup_penalty_usd:,.2f}",
                      str(r.instances), str(r.started), str(r.stopped), r.status)
    console.print(table)
    for r in result.records:
        if r.short_models:
            console.print(f"period {escape(r.name)}: demand not met for "
                          f"{escape(', '.join(r.short_models))}", highlight=False)
    console.print(
        f"total ${result.total_cost_usd:,.2f} over {len(result.records)} periods; "
        f"{pct(result.served_fraction)} of requests served; {result.total_started} instances "
        f"started, {result.total_stopped} stopped", highlight=False)
    for note in result.notes:
        console.print(f"[dim]note: {escape(note)}[/]", highlight=False, soft_wrap=True)
    console.print(f"wrote {escape(str(result.csv_path))} and {escape(str(result.png_path))}",
                  highlight=False)
