"""`coral evaluate --paper`: the paper's evaluation run as the paper runs it, written as
`paper.md` with its plots: one table per claim of the paper's "Results", each row the
paper's figure, ours measured in the same run and ours / paper.

The cases (`paper_runs.run_case`): `paper-core` and `paper-extended` at the default, scarce,
large-heavy and small-heavy levels, 30 simulated minutes re-planned every 6-minute epoch;
then Helix's cluster, the library's sensitivity to N_max and rho (`paper_studies`), and the
simulator's recorded error. `--quick` runs the core setup only, at shorter epochs, with a
smaller Helix and sensitivity study, for CI.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from coral.allocator.problem import DEFAULT_TIME_LIMIT_S
from coral.evaluation.common import EvalContext, md_table
from coral.evaluation.paper_runs import PAPER_BASELINES, CaseRun, run_case

log = logging.getLogger(__name__)

LEVELS = ("default", "scarce", "large-heavy", "small-heavy")


@dataclass
class PaperConfig:
    """What `coral evaluate --paper` runs; `preset(quick)` gives the two runs."""

    out: Path = Path("out/evaluate-paper")
    quick: bool = True
    scenarios: tuple[str, ...] = ("paper-core",)
    levels: tuple[str, ...] = LEVELS
    epochs: int = 2
    epoch_s: float = 120.0
    # templates: None builds at each scenario's own n_max; a number caps it
    nmax: int | None = None
    helix: bool = True
    helix_nmax: int | None = 8
    helix_timeout_s: float = 20.0
    sens_nmax: tuple[int, ...] = (1, 2, 3)
    sens_rho: tuple[float, ...] = (4.0, 8.0, 12.0, 16.0)
    sens_budget_s: float = 60.0
    templates_dir: Path = Path("out/templates")
    workers: int = 2
    time_limit_s: float = DEFAULT_TIME_LIMIT_S

    @classmethod
    def preset(cls, quick: bool, out: Path) -> "PaperConfig":
        """The quick preset (the defaults), or the full one; the CLI sets its flags on it
        with `dataclasses.replace`."""
        if quick:
            return cls(out=out)
        return cls(out=out, quick=False, scenarios=("paper-core", "paper-extended"), epochs=5,
                   epoch_s=360.0, helix_nmax=None, helix_timeout_s=300.0,
                   sens_nmax=(1, 2, 3, 4, 5, 6, 7, 8), sens_budget_s=600.0)


class PaperContext(EvalContext):
    """`EvalContext` whose libraries are built at each scenario's own n_max (capped by the
    config's, when it has one)."""

    def templates(self, scenario: Any, engine: str = "coral", nmax: int | None = None) -> Any:
        from coral.planning.libraries import build_regions, templates_for_scenario

        n = int(scenario.spec.n_max)
        cap = nmax if nmax is not None else self.cfg.nmax
        n = min(n, cap) if cap is not None else n
        # the libraries depend on the SLOs, node types and regions, not on the level's demand
        # or counts: one load per scenario (an extended library takes minutes to load)
        key = (scenario.name, build_regions(scenario), scenario.mode, f"{engine}/{n}")
        if key not in self._templates:
            options = self.options(engine, nmax=n)
            self._templates[key] = templates_for_scenario(
                scenario, self.catalog, self.perf, options=options.build,
                out_root=options.out_root, nmax=options.nmax)
        return self._templates[key]


@dataclass
class PaperRun:
    config: PaperConfig
    cases: dict[tuple[str, str], CaseRun] = field(default_factory=dict)
    helix: Any = None
    sensitivity: Any = None
    timings: list[tuple[str, float]] = field(default_factory=list)
    report: Path | None = None
    seconds: float = 0.0


def run_paper(cfg: PaperConfig, say: Callable[[str], None] = lambda _m: None) -> PaperRun:
    """Every case and study of the config, then `paper.md` under `cfg.out`."""
    from coral.evaluation.paper_studies import helix_study, sensitivity_study

    t0 = time.perf_counter()
    cfg.out.mkdir(parents=True, exist_ok=True)
    ctx = PaperContext(cfg, say)  # type: ignore[arg-type]
    run = PaperRun(cfg)
    for scen in cfg.scenarios:
        for level in cfg.levels:
            t = time.perf_counter()
            ctx.templates(ctx.scenario(scen, level).in_mode("auto"))
            lib = time.perf_counter() - t
            if lib > 1.0:
                run.timings.append((f"`{scen}` template libraries", lib))
            # Helix's placement beside the default level only: it is no paper baseline there,
            # and shows what a no-SLO placement serves under the paper's SLOs
            names = PAPER_BASELINES + (("helix",) if level == "default" else ())
            case = run_case(ctx, scen, level, epochs=cfg.epochs, epoch_s=cfg.epoch_s,
                            baselines=names, say=say)
            run.cases[(scen, level)] = case
            run.timings.append((f"`{scen}` {level}", case.seconds))
    if cfg.helix:
        t = time.perf_counter()
        run.helix = helix_study(_Capped(ctx, cfg.helix_nmax), sim_s=cfg.epochs * cfg.epoch_s,
                                helix_timeout_s=cfg.helix_timeout_s, say=say)
        run.timings.append(("Helix's cluster", time.perf_counter() - t))
    if cfg.sens_nmax:
        t = time.perf_counter()
        run.sensitivity = sensitivity_study(ctx, cfg.sens_nmax, cfg.sens_rho,
                                            budget_s=cfg.sens_budget_s, say=say)
        run.timings.append(("sensitivity", time.perf_counter() - t))
    run.seconds = time.perf_counter() - t0
    run.report = write_paper(run)
    return run


class _Capped:
    """A context whose `templates` builds at most `nmax` nodes (None: the scenario's)."""

    def __init__(self, ctx: PaperContext, nmax: int | None) -> None:
        self._ctx, self._nmax = ctx, nmax

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def templates(self, scenario: Any, engine: str = "coral") -> Any:
        return self._ctx.templates(scenario, engine, nmax=self._nmax)


def write_paper(run: PaperRun) -> Path:
    """`paper.md` and its plots from a finished run."""
    from coral.evaluation import paper_sections as ps

    cfg = run.config
    cases = run.cases
    default = {s: c for (s, lv), c in cases.items() if lv == "default"}
    claims = [*ps.claim_default(cases), *ps.claim_scarce(cases, default),
              *ps.claim_imbalance(cases), ps.claim_helix(run.helix, cfg.out),
              ps.claim_sensitivity(run.sensitivity, cfg.out), ps.claim_simulator(),
              ps.claim_init(cases), ps.slo_claim(cases)]
    lines = [
        "# Coral against the paper's evaluation", "",
        f"`coral evaluate --paper{' --quick' if cfg.quick else ''}`: ran in "
        f"{run.seconds:.0f} s with {cfg.workers} template worker(s). Every case runs "
        f"{cfg.epochs} epochs of {cfg.epoch_s:g} s ({cfg.epochs * cfg.epoch_s / 60:g} "
        "simulated minutes), Coral re-planned each epoch against its running deployment with "
        "the initialization penalty K = start-up / epoch, every method's plan simulated in "
        "every epoch (Poisson arrivals at the scenario's mean demand, fixed request shapes). "
        "Cost = nodes' $/hour + start-up cost amortised over 60 minutes; goodput = simulated "
        "generated tokens/s meeting the SLO. Cost ratios are baseline / Coral, goodput ratios "
        "Coral / baseline; ours / paper above 1 means ours beats the paper's figure "
        "(solve times: above 1 is slower). Figures come from the performance model, the "
        "price catalog and the simulator, not GPUs.", ""]
    if cases:
        fig = ps.cost_plot(cases, cfg.out / "paper_cost.png")
        lines += [f"![cost ratios]({fig.name})", ""]
    for c in claims:
        lines += c.lines()
    lines += ["## Where the time went", ""]
    lines += md_table(["part", "seconds"], [[p, f"{s:.0f}"] for p, s in run.timings])
    path = cfg.out / "paper.md"
    path.write_text("\n".join(lines) + "\n")
    return path
