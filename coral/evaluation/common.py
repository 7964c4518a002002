"""What every section of `coral evaluate` shares: its settings and results, the shared
catalog, perf model and template libraries, markdown tables and plots, and simulating a
plan."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from coral.allocator.problem import DEFAULT_TIME_LIMIT_S

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
    time_limit_s: float = DEFAULT_TIME_LIMIT_S

    @classmethod
    def preset(cls, quick: bool, out: Path) -> "EvalConfig":
        """The quick preset (the defaults), or the full one; the CLI sets its flags on it
        with `dataclasses.replace`."""
        if quick:
            return cls(out=out, quick=True)
        return cls(out=out, quick=False, nmax=3, scenarios=("core", "advanced"),
                   demand_scales=(0.5, 1.0, 2.0), sim_seconds=1800.0,
                   cluster_scales=(1, 4, 16), helix_timeout_s=300.0, timeline_periods=None)


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


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out + [""]


def pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 100:.1f}%"


def num(x: float | None, fmt: str = ",.2f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def overall(served: dict[str, float], demand: dict[str, float]) -> float:
    asked = sum(demand.values())
    return 1.0 if asked <= 0 else sum(served.get(m, 0.0) * d for m, d in demand.items()) / asked


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bar_plot(path: Path, labels: Sequence[str], series: dict[str, Sequence[float]],
              ylabel: str, title: str) -> Path:
    plt = pyplot()
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


class EvalContext:
    """Catalog, perf model and template libraries shared by the sections."""

    def __init__(self, cfg: EvalConfig, say: Callable[[str], None]) -> None:
        from coral.catalog import load_catalog
        from coral.templates.builder.parallel import default_perf_factory

        self.cfg = cfg
        self.say = say
        self.catalog = load_catalog(())
        self.perf = default_perf_factory(self.catalog)
        self._templates: dict[tuple[str, str | None, str, str], Any] = {}

    def scenario(self, name: str, level: str | None = None) -> Any:
        from coral.allocator.scenario.load import load_scenario

        return load_scenario(name, level=level, catalog=self.catalog)

    def options(self, engine: str = "coral", nmax: int | None = None) -> Any:
        """The `PlanOptions` of this evaluation's config (`nmax`: the config's unless given)."""
        from coral.planning.options import PlanOptions
        from coral.templates.builder.build_options import BuildOptions

        return PlanOptions(build=BuildOptions(engine=engine, workers=self.cfg.workers),
                           out_root=self.cfg.templates_dir,
                           nmax=self.cfg.nmax if nmax is None else nmax,
                           time_limit_s=self.cfg.time_limit_s)

    def templates(self, scenario: Any, engine: str = "coral") -> Any:
        from coral.planning.libraries import templates_for_scenario

        key = (scenario.name, scenario.level, scenario.mode, engine)
        if key not in self._templates:
            options = self.options(engine)
            self._templates[key] = templates_for_scenario(
                scenario, self.catalog, self.perf, options=options.build,
                out_root=options.out_root, nmax=options.nmax)
        return self._templates[key]

    def plan(self, scenario: Any, templates: Any, baselines: bool = True,
             engine: str = "coral") -> Any:
        from coral.planning.plan import plan_scenario

        return plan_scenario(scenario, catalog=self.catalog, options=self.options(engine),
                             perf=self.perf, templates=templates, baselines=baselines)


def scaled(scenario: Any, demand: float = 1.0, availability: float = 1.0) -> Any:
    from coral.planning.timeline import Period, apply_period

    return apply_period(scenario, Period(duration_s=1.0, demand_scale=demand,
                                         availability_scale=availability))


def simulate_plan(ctx: EvalContext, scenario: Any, result: Any, seconds: float,
                  seed: int = 0) -> dict[str, Any]:
    """Simulate a deployment under Poisson arrivals at the scenario's demand (every model's,
    also one the deployment does not serve: its requests then count as missing the SLO).

    `result` is Coral's `PlanResult` or a baseline's `BaselineResult` (their `instances`
    hold each template's placement)."""
    from coral.allocator.scenario.load import scenario_slo
    from coral.sim import Simulator, SimConfig, instances_from_plan, summarize, synthetic
    from coral.sim.workload import merge

    slos = {m.name: scenario_slo(scenario, m.name) for m in scenario.models}
    instances = instances_from_plan(result, slos)
    demand = {m: d for m, d in result.plan.demand_rps.items() if d > 0}
    parts = [synthetic(m, rate_rps=d, duration_s=seconds, seed=seed + 1000 * k,
                       prompt_tokens=slos[m].input_tokens, output_tokens=slos[m].output_tokens)
             for k, (m, d) in enumerate(sorted(demand.items()))]
    reqs = merge(*parts)
    sim = Simulator(instances, perf=ctx.perf, catalog=ctx.catalog, config=SimConfig())
    return summarize(sim.run(reqs), slos)


def slo_held(summary: dict[str, Any]) -> bool:
    """Every model's SLO met at its percentile in the simulation."""
    models = summary.get("models") or {}
    return bool(models) and all(v.get("slo_met") for v in models.values())


def run_in_child(target: Callable[..., None], args: tuple[Any, ...], timeout_s: float) -> Any:
    """`target(*args, queue)` in a child process; what it puts on the queue, or None when it
    has put nothing after `timeout_s` (the child is then terminated): a placement over tens of
    nodes may take minutes, and a report should not wait for it."""
    import multiprocessing as mp

    mctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = mctx.Queue()
    p = mctx.Process(target=target, args=(*args, q), daemon=True)
    p.start()
    try:
        return q.get(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - queue.Empty: timed out
        return None
    finally:
        if p.is_alive():
            p.terminate()
        p.join(5)

