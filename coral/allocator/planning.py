"""Planning glue: scenario -> template libraries -> allocation ILP -> a decoded deployment.

This is the whole planner in three calls, each usable alone:

1. `templates_for_scenario`: one template library per (model, template mode) of the scenario,
   built with the scenario's SLO, node types, `n_max` and `rho`, and reused from disk when its
   inputs are unchanged (`coral.templates.store`). The libraries live under
   `OUT_ROOT/MODEL/MODE-nN-KEY` (`MODE-ENGINE-nN-KEY` for an engine other than Coral's own,
   e.g. `--engine vllm`, whose libraries hold only the shapes vLLM runs), where `KEY` hashes
   what the scenario chooses (SLO, request shape, `rho`, node types, regions, engine), so
   scenarios that ask for different libraries of the same model do not overwrite each
   other's.
2. `columns_from_templates`: every kept template as an allocator column priced in the
   scenario's regions (its price overrides included), with a stable id `model|mode|combo`,
   so that a deployment planned now can be handed back as `current` to a later plan.
3. `plan_scenario`: the allocation ILP over those columns (with the start-up penalty against a
   `current` deployment), decoded into a `PlanResult`: instances per region with each
   template's node mix and layer placement, $/hour, status, proven gap, solve time, served
   share and headroom per model, and the baselines run on the same templates.

Baselines come from `coral.baselines.run_baselines`; when that package is missing (or fails)
the plan is still returned, with `baselines` empty and a note saying why.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from coral.allocator.ilp import infeasibility_message, solve_allocation
# the plan file's names, which readers of plans also import from here
from coral.allocator.plan_file import (  # noqa: F401
    PlanFileError,
    PlannedInstances,
    baseline_summary,
    decode_instances,
    finite,
    plan_slos,
    read_plan_file,
)
from coral.allocator.robust import RobustPlanner
from coral.allocator.problem import (
    DEFAULT_MIP_GAP,
    DEFAULT_TIME_LIMIT_S,
    AllocationPlan,
    TemplateColumn,
    TemplateRegion,
)
from coral.allocator.scenario import AUTO_MODES, Scenario
from coral.catalog.loader import Catalog
from coral.sim.slowdown import SlowedPerf
from coral.templates.build import DEFAULT_TIME_LIMIT_S as DEFAULT_PLACEMENT_TIME_LIMIT_S
from coral.templates.build import BuildReport, Template, build_library, build_template
from coral.templates.engine import DEFAULT_ENGINE, check_engine, engine_topology, engine_violations
from coral.templates.homogeneous import cached_completions, homogeneous_combos
from coral.templates.operating_points import DEFAULT_BATCHES, PerfLike, shared_tables
from coral.templates.slo import SloSpec
from coral.templates.store import MANIFEST, TemplateLibrary

log = logging.getLogger(__name__)

#: Where template libraries go unless the caller says otherwise (as `coral templates build`).
DEFAULT_TEMPLATES_DIR = Path("out/templates")
#: Separator of the parts of a column id (`model|mode|combo`).
ID_SEP = "|"


# ---------------------------------------------------------------------------------------------
# Templates of a scenario
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScenarioTemplates(MappingABC):
    """Model -> its kept templates (every template mode of the scenario), plus how they were
    built. Reads like a `dict[str, tuple[Template, ...]]`.

    `nmax` is the node limit the libraries were built with; `scenario_nmax` the one the
    scenario asks for. When they differ (`reduced`), the templates are a quick approximation:
    larger combinations, which may be cheaper per request, were never considered.
    """

    by_model: Mapping[str, tuple[Template, ...]]
    nmax: int
    scenario_nmax: int
    reports: tuple[BuildReport, ...] = ()
    template_dirs: Mapping[str, str] = field(default_factory=dict)  # "model/mode" -> directory
    engine: str = DEFAULT_ENGINE  # the serving engine whose shapes the templates are limited to

    def __getitem__(self, model: str) -> tuple[Template, ...]:
        return self.by_model[model]

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_model)

    def __len__(self) -> int:
        return len(self.by_model)

    @property
    def reduced(self) -> bool:
        return self.nmax != self.scenario_nmax

    @property
    def total(self) -> int:
        return sum(len(t) for t in self.by_model.values())

    def notes(self) -> tuple[str, ...]:
        if not self.reduced:
            return ()
        return (f"templates built with n_max = {self.nmax} instead of the scenario's "
                f"{self.scenario_nmax} (quick run): combinations of more than {self.nmax} "
                "nodes were not considered, so costs may be higher than a full plan's",)


def scenario_slo(scenario: Scenario, model: str) -> SloSpec:
    """The SLO and request shape the scenario asks of `model`."""
    for m in scenario.models:
        if m.name == model:
            return SloSpec.make(**m.slo_values())
    raise KeyError(f"scenario {scenario.name!r} does not serve model {model!r}")


def _build_regions(scenario: Scenario) -> tuple[str, ...] | None:
    """Regions to restrict enumeration to. None when a price override may price a node type
    that the catalog does not price there: enumeration reads catalog prices, so restricting
    it would drop combinations the scenario can run."""
    if any(r.price_overrides for r in scenario.spec.regions):
        return None
    return scenario.regions


def library_dir(out_root: str | Path, scenario: Scenario, model: str, mode: str,
                nmax: int, engine: str = DEFAULT_ENGINE) -> Path:
    """Directory of the (model, mode) library this scenario asks for at `nmax` nodes, for
    `engine` (its libraries never share a directory with another engine's)."""
    engine = check_engine(engine)
    regions = _build_regions(scenario)
    key_doc: dict[str, Any] = {
        "slo": scenario_slo(scenario, model).model_dump(mode="json"),
        "rho": float(scenario.spec.rho),
        "node_types": sorted(scenario.node_types),
        "regions": sorted(regions) if regions is not None else None,
    }
    if engine != "coral":  # Coral's own keys stay as they were, so its libraries are reused
        key_doc["engine"] = engine
    key = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()[:10]
    name = f"{mode}-n{nmax}-{key}" if engine == "coral" else f"{mode}-{engine}-n{nmax}-{key}"
    return Path(out_root) / model / name


def _library_digest(out: Path | None) -> str:
    """The digest of the library built at `out` ("" when none was written)."""
    if out is None or not (Path(out) / MANIFEST).exists():
        return ""
    return TemplateLibrary.open(out).digest


def templates_for_scenario(
    scenario: Scenario,
    catalog: Catalog,
    perf: PerfLike,
    *,
    out_root: str | Path | None = DEFAULT_TEMPLATES_DIR,
    workers: int | None = 1,
    nmax: int | None = None,
    progress: bool = False,
    on_message: Callable[[str], None] | None = None,
    engine: str = DEFAULT_ENGINE,
    **build_options: Any,
) -> ScenarioTemplates:
    """Build (or reuse) one library per model and template mode of `scenario`.

    `nmax` overrides the scenario's `n_max` (quick runs); the result says so (`reduced`,
    `notes()`). With `out_root=None` nothing is written and everything is solved afresh.
    `build_options` go to `build_library` as they are (e.g. `batches`, `time_limit_s`).
    `engine` limits every template, the homogeneous completions included, to the shapes that
    engine runs (`coral.templates.engine`; `vllm` solves in topology `chain`). Coral's own
    templates need no vLLM-shaped ones beside them: both are searched under the one step
    model, and Coral's space holds every vLLM pipeline.
    """
    n = int(scenario.spec.n_max if nmax is None else nmax)
    if n < 1:
        raise ValueError(f"nmax must be >= 1, got {n}")
    engine = check_engine(engine)
    regions = _build_regions(scenario)
    build_options = dict(build_options)
    topology = engine_topology(engine, build_options.pop("topology", None))
    tables = shared_tables(perf, catalog, build_options.get("batches", DEFAULT_BATCHES))
    time_limit_s = build_options.get("time_limit_s", DEFAULT_PLACEMENT_TIME_LIMIT_S)
    by_model: dict[str, tuple[Template, ...]] = {}
    reports: list[BuildReport] = []
    dirs: dict[str, str] = {}
    for m in scenario.models:
        slo = scenario_slo(scenario, m.name)
        kept_all: list[Template] = []
        for mode in scenario.template_modes:
            out = None if out_root is None else library_dir(out_root, scenario, m.name,
                                                             mode, n, engine)
            kept, report = build_library(
                m.name, catalog, slo=slo, mode=mode, topology=topology, engine=engine,
                nmax=n, rho=scenario.spec.rho, node_types=scenario.node_types,
                regions=regions, out=out, workers=workers, perf=perf, progress=progress,
                on_message=on_message, **build_options,
            )
            kept_all.extend(kept)
            # the k x g combinations the library dropped by throughput: one instance
            # pools its queue, so it may plan above its parts (`coral.templates.homogeneous`)
            useful = [g for g in scenario.node_types if g not in report.excluded_node_types]
            combos = homogeneous_combos(m.name, catalog, slo, mode, node_types=useful,
                                        n_max=n, rho=scenario.spec.rho,
                                        memory_reserve=tables.memory_reserve)
            kept_all.extend(cached_completions(
                out, _library_digest(out), kept, combos,
                lambda c, mode=mode: build_template(
                    m.name, c, slo, mode, topology, perf, catalog, tables=tables,
                    time_limit_s=time_limit_s, solver=build_options.get("solver"),
                    floor=0.0, engine=engine)))
            reports.append(report)
            if out is not None:
                dirs[f"{m.name}/{mode}"] = str(out)
            log.info("%s %s %s: %d templates kept (n_max %d)", m.name, mode, engine,
                     len(kept), n)
        by_model[m.name] = tuple(kept_all)
    return ScenarioTemplates(by_model=by_model, nmax=n, scenario_nmax=int(scenario.spec.n_max),
                             reports=tuple(reports), template_dirs=dirs, engine=engine)


# ---------------------------------------------------------------------------------------------
# Columns
# ---------------------------------------------------------------------------------------------


def combo_key(combo: Sequence[str]) -> str:
    """`("1x-l4", "1x-l4", "1x-t4")` -> `"1x-l4*2+1x-t4"`."""
    counts = node_counts(combo)
    return "+".join(g if k == 1 else f"{g}*{k}" for g, k in counts.items())


def node_counts(combo: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in sorted(combo):
        out[g] = out.get(g, 0) + 1
    return out


def column_id(template: Template) -> str:
    """Stable column id of a template: `model|mode|combo` (e.g. `llama-3.1-8b|aggregated|1x-l4*2`).
    The same combination always gets the same id, so a deployment can be carried from one
    plan to the next."""
    return ID_SEP.join((template.model, template.mode, combo_key(template.combo)))


def columns_from_templates(
    scenario: Scenario, templates: Mapping[str, Sequence[Template]]
) -> list[TemplateColumn]:
    """Every usable template as a column priced in the scenario's regions, sorted by id.

    A column's capacity is the template's planned capacity (`Scenario.planned_capacity`:
    throughput times the utilisation at which TTFT still holds), not its full throughput.
    Left out: templates with no planned capacity, of models or modes the scenario does not
    serve, that are not one pipeline (not one instance a reader can deploy), or whose node
    types no scenario region prices together. Of two templates with the same id (same model,
    mode and combination: e.g. Coral's and the vLLM-shaped one) the one of higher planned
    capacity is kept; `columns_and_templates` says which.
    """
    return columns_and_templates(scenario, templates)[0]


def columns_and_templates(
    scenario: Scenario, templates: Mapping[str, Sequence[Template]]
) -> tuple[list[TemplateColumn], dict[str, Template]]:
    """`columns_from_templates`, and the template behind each column (by column id): what
    an instance of that column deploys."""
    served = {m.name for m in scenario.models}
    modes = set(scenario.template_modes)
    best: dict[str, tuple[TemplateColumn, Template]] = {}
    for model, tpls in templates.items():
        if model not in served:
            continue
        for t in tpls:
            if (t.model != model or t.mode not in modes or not t.feasible or t.throughput <= 0
                    or not t.is_pipeline):
                continue
            capacity = scenario.planned_capacity(t)
            if not capacity > 0:
                continue
            col = scenario.column(column_id(t), t.model, t.mode, node_counts(t.combo), capacity)
            if not col.price_usd_per_hour:
                continue
            if col.id not in best or col.capacity > best[col.id][0].capacity:
                best[col.id] = (col, t)
    ids = sorted(best)
    return [best[k][0] for k in ids], {k: best[k][1] for k in ids}


# ---------------------------------------------------------------------------------------------
# The decoded plan
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanResult:
    """A planned deployment of a scenario, decoded for people and files.

    `cost_per_hour` is $/hour of every node rented; `headroom_rps` per model is capacity
    beyond demand (negative: shortfall). `baselines` maps a baseline's name to its result
    (`coral.baselines.BaselineResult`: `cost_per_hour`, `served_fraction`, `notes`).
    """

    scenario: str
    level: str | None
    plan: AllocationPlan
    instances: tuple[PlannedInstances, ...]  # by region, then template id
    nmax: int  # node limit the templates were built with
    scenario_nmax: int
    templates: int  # templates kept over all libraries
    columns: int  # priced template columns handed to the allocator
    baselines: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # for people: quick-run templates, shortfall, baselines
    mode: str = "aggregated"  # serving mode of the plan (`auto` scenarios: the one chosen)
    engine: str = DEFAULT_ENGINE  # the engine every instance is deployable on
    #: model -> the SLO and request shape it was planned for; written to the plan file, so
    #: that the file alone is enough to simulate and deploy (a scenario given as a YAML file
    #: need not be at hand, or unchanged, when the plan is read)
    slos: Mapping[str, SloSpec] = field(default_factory=dict)
    #: model -> its priority (the weight of its req/s in goodput under scarcity)
    priorities: Mapping[str, float] = field(default_factory=dict)
    #: top-level entries of the plan file that a planning option adds (`robust`: R, the GPU
    #: types it covers, the nominal plan's cost beside this one)
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def cost_per_hour(self) -> float:
        return float(self.plan.cost_usd_per_hour)

    @property
    def solve_seconds(self) -> float:
        return float(self.plan.solve_s)

    @property
    def status(self) -> str:
        return self.plan.status.value

    @property
    def gap(self) -> float:
        return float(self.plan.gap)

    @property
    def served_fraction(self) -> dict[str, float]:
        return self.plan.served_fraction

    @property
    def headroom_rps(self) -> dict[str, float]:
        return self.plan.headroom_rps

    @property
    def shortfall_rps(self) -> dict[str, float]:
        return {m: s for m, s in self.plan.shortfall_rps.items() if m in self.plan.short_models}

    @property
    def reduced(self) -> bool:
        return self.nmax != self.scenario_nmax

    def by_region(self) -> dict[str, list[PlannedInstances]]:
        out: dict[str, list[PlannedInstances]] = {}
        for inst in self.instances:
            out.setdefault(inst.region, []).append(inst)
        return out

    def current(self) -> dict[TemplateRegion, int]:
        """This deployment as the `current` of a later plan."""
        return dict(self.plan.instances)

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        nodes: dict[str, dict[str, int]] = {}
        for (g, r), k in sorted(p.nodes_used.items()):
            nodes.setdefault(r, {})[g] = k
        return {
            "scenario": self.scenario,
            "level": self.level,
            "mode": self.mode,
            "engine": self.engine,
            "slos": {m: slo.model_dump(mode="json") for m, slo in sorted(self.slos.items())},
            "cost_per_hour": self.cost_per_hour,
            "solve_seconds": self.solve_seconds,
            "status": self.status,
            "gap": finite(self.gap),
            "goodput_gap": finite(p.goodput_gap),  # scarcity: phase 1's proven gap
            "solved": p.proof,
            "meets_demand": p.meets_demand,
            "served_fraction": dict(self.served_fraction),
            "demand_rps": dict(p.demand_rps),
            "capacity_rps": dict(p.capacity_rps),
            "served_rps": dict(p.served_rps),
            "headroom_rps": dict(self.headroom_rps),
            "shortfall_rps": self.shortfall_rps,
            "startup_penalty_usd": p.penalty_usd,
            "instances": [i.to_dict() for i in self.instances],
            "nodes_per_region": nodes,
            "started": [{"template_id": t, "region": r, "count": n}
                        for (t, r), n in sorted(p.started.items())],
            "stopped": [{"template_id": t, "region": r, "count": n}
                        for (t, r), n in sorted(p.stopped.items())],
            "nmax": self.nmax,
            "scenario_nmax": self.scenario_nmax,
            "nmax_reduced": self.reduced,
            "templates": self.templates,
            "columns": self.columns,
            "baselines": {name: baseline_summary(b) for name, b in self.baselines.items()},
            "notes": list(self.notes),
            "solver_notes": list(self.plan.notes),
            **self.extras,
        }


def plan_scenario(
    scenario: Scenario,
    *,
    catalog: Catalog,
    perf: PerfLike | None = None,
    templates: Mapping[str, Sequence[Template]] | None = None,
    out_root: str | Path | None = DEFAULT_TEMPLATES_DIR,
    workers: int | None = 1,
    nmax: int | None = None,
    progress: bool = False,
    current: Mapping[TemplateRegion, int] | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    mip_gap: float = DEFAULT_MIP_GAP,
    baselines: bool = True,
    on_message: Callable[[str], None] | None = None,
    engine: str = DEFAULT_ENGINE,
    robust: float | None = None,
    spot: Any = None,
) -> PlanResult:
    """Plan `scenario`: templates (built or reused unless given), allocation, baselines.

    `current` is the deployment running now (column id, region) -> instances; instances
    beyond it pay the scenario's start-up penalty. `nmax` overrides the scenario's `n_max` for
    template building (and the baselines), and the result says so. `engine`: every instance
    of the plan is deployable on it (templates built for it; given `ScenarioTemplates` must
    have been built for it, and given templates it cannot run are left out). The baselines
    are not engine-restricted. `robust`: R of a plan that keeps every demand covered with any
    one GPU type `1 + R` times slower than modelled (`coral.allocator.robust`); the plan file
    then says so (`robust`), with the nominal plan's cost beside it. `spot`: a
    `coral.allocator.spot.SpotOptions`, plan aggregated serving on spot and on-demand
    instances under a chance constraint (the plan file's `spot` object says what it risks).
    """
    engine = check_engine(engine)
    if perf is None:
        from coral.templates.parallel import default_perf_factory

        perf = default_perf_factory(catalog)
    if scenario.saturation_of is None:
        scenario = scenario.with_perf(perf, catalog)
    if templates is None:
        templates = templates_for_scenario(
            scenario, catalog, perf, out_root=out_root, workers=workers, nmax=nmax,
            progress=progress, on_message=on_message, engine=engine,
        )
    if isinstance(templates, ScenarioTemplates):
        if templates.engine != engine:
            raise ValueError(f"the templates were built for engine {templates.engine}, the plan "
                             f"asks for engine {engine}")
        n_used, n_scenario = templates.nmax, templates.scenario_nmax
        notes = list(templates.notes())
    else:
        n_used = int(scenario.spec.n_max if nmax is None else nmax)
        n_scenario = int(scenario.spec.n_max)
        notes = list(ScenarioTemplates({}, n_used, n_scenario).notes())
    # the baselines plan their own (unrestricted) shapes: with another engine they get no
    # templates of Coral's to reuse, as those are restricted, and solve every one they need
    baseline_templates: Mapping[str, Sequence[Template]] = (
        {m: tuple(t for t in tpls if t.topology == "flow") for m, tpls in templates.items()}
        if engine == "coral" else {m: () for m in templates})
    if engine != "coral":
        templates, dropped = _deployable(templates, engine, catalog)
        if dropped:
            notes.append(f"engine {engine}: {dropped} given templates it cannot run were left out")
    # the baselines first: their plans, where Coral's columns hold them, start Coral's
    # search, so that Coral's plan is never worse than one of them (`solve_allocation`'s
    # `starts`), however the time limit cuts the search short
    results: dict[str, Any] = {}
    if baselines:
        results, why = _run_baselines(scenario, baseline_templates, catalog, perf, n_used,
                                      time_limit_s=time_limit_s, mip_gap=mip_gap)
        if why:
            notes.append(why)
        elif engine != "coral":
            notes.append(f"engine {engine} restricts Coral's plan only: the baselines are not "
                         "engine-restricted (they solve their own templates as Coral's runtime "
                         "runs them; Helix's candidate clusters are the homogeneous ones only)")
    given = [start for start in (baseline_start(b) for b in results.values()) if start]
    robust_planner = None if robust is None else RobustPlanner(
        robust, perf=perf, catalog=catalog, slowed_perf=SlowedPerf,
        template_dirs=getattr(templates, "template_dirs", None))
    spot_planner = None
    if spot is not None:
        from coral.allocator.spot import SpotPlanError, SpotPlanner

        if robust is not None:
            raise SpotPlanError("--spot and --robust cannot be combined (yet)")
        spot_planner = SpotPlanner(spot, catalog)
    modes = (("aggregated",) if spot_planner is not None
             else AUTO_MODES if scenario.mode == "auto" else (scenario.mode,))
    tried = []
    for mode in modes:
        sub = scenario.in_mode(mode)
        cols, chosen = columns_and_templates(sub, templates)
        prob = sub.problem(cols, current=current, time_limit_s=time_limit_s, mip_gap=mip_gap)
        # mode auto plans mixed last: it holds every plan of the other modes, which start it
        starts = given + [dict(t[4].instances) for t in tried]
        plan = (spot_planner.solve(prob, starts) if spot_planner is not None
                else solve_allocation(prob, starts=starts) if robust_planner is None
                else robust_planner.solve(sub, prob, chosen, starts=starts))
        tried.append((mode, cols, chosen, prob, plan))
    mode, columns, chosen, problem, plan = min(tried, key=lambda t: _plan_rank(t[4]))
    extras: dict[str, Any] = {}
    if robust_planner is not None:
        robust_planner.check(mode, plan)
        extras["robust"] = robust_planner.summary(mode)
        notes.append(robust_planner.note(mode))
    markets = None
    if spot_planner is not None:
        columns, chosen = spot_planner.columns(columns, chosen)
        markets = spot_planner.markets()
        extras["spot"] = spot_planner.summary()
        notes.append(spot_planner.note())
    if len(tried) > 1:
        notes.append("mode auto: " + "; ".join(
            f"{m} ${p.cost_usd_per_hour:,.2f}/hour serving {_served_share(p):.1%}"
            for m, _, _, _, p in tried) + f" -> {mode}")
    if not plan.meets_demand:
        notes.append(infeasibility_message(problem, plan))
    return PlanResult(
        scenario=scenario.name,
        level=scenario.level,
        plan=plan,
        instances=decode_instances(plan, columns, chosen, markets),
        nmax=n_used,
        scenario_nmax=n_scenario,
        templates=sum(len(t) for t in templates.values()),
        columns=len(columns),
        baselines=results,
        notes=tuple(notes),
        mode=mode,
        engine=engine,
        slos={m.name: scenario_slo(scenario, m.name) for m in scenario.models},
        priorities={m.name: float(m.priority) for m in scenario.models},
        extras=extras,
    )


def baseline_start(result: Any) -> dict[TemplateRegion, int]:
    """A baseline's instances as Coral's columns would hold them: its column ids name
    (prefix, model, mode, combination), Coral's `model|mode|combination`. A column Coral
    lacks is dropped by the solve; one Coral holds is valued at Coral's own planned capacity
    and the scenario's prices, so the start is judged as Coral's plans are."""
    plan = getattr(result, "plan", None)
    out: dict[TemplateRegion, int] = {}
    for (tid, region), n in (plan.instances.items() if plan is not None else ()):
        parts = str(tid).split(":")
        if len(parts) < 4:
            continue
        key = (ID_SEP.join(parts[-3:]), region)
        out[key] = out.get(key, 0) + int(n)
    return out


def _deployable(templates: Mapping[str, Sequence[Template]], engine: str, catalog: Catalog
                ) -> tuple[dict[str, tuple[Template, ...]], int]:
    """`templates` less those one instance of which `engine` cannot run (and how many)."""
    out: dict[str, tuple[Template, ...]] = {}
    dropped = 0
    for model, tpls in templates.items():
        keep = tuple(t for t in tpls if not t.feasible or not t.is_pipeline
                     or not engine_violations(engine, t, catalog))
        dropped += len(tpls) - len(keep)
        out[model] = keep
    return out, dropped


def _served_share(plan: AllocationPlan) -> float:
    demand = sum(plan.demand_rps.values())
    return sum(plan.served_rps.values()) / demand if demand > 0 else 1.0


def _plan_rank(plan: AllocationPlan) -> tuple[float, float, float]:
    """The better of two plans of one scenario: the one meeting demand, then the one of more
    priority-weighted goodput (what the allocator maximises under scarcity), then the
    cheaper."""
    return (0.0 if plan.meets_demand else 1.0, -round(plan.goodput, 9), plan.cost_usd_per_hour)


def _run_baselines(scenario: Scenario, templates: Mapping[str, Sequence[Template]],
                   catalog: Catalog, perf: PerfLike, nmax: int, *, time_limit_s: float,
                   mip_gap: float) -> tuple[dict[str, Any], str | None]:
    """Every baseline but Coral's own allocation (that is the plan), or ({}, why not)."""
    try:
        from coral.baselines import BASELINES, run_baselines
    except ImportError as exc:
        return {}, f"baselines not run: coral.baselines is not available ({exc})"
    names = [n for n in BASELINES if n != "coral"]
    try:
        results = run_baselines(
            scenario, {m: list(t) for m, t in templates.items()}, catalog=catalog, perf=perf,
            tables=shared_tables(perf, catalog), time_limit_s=time_limit_s, mip_gap=mip_gap,
            baselines=names, n_max=nmax,
        )
    except ImportError as exc:
        return {}, f"baselines not run: {exc}"
    except Exception as exc:  # noqa: BLE001 - the plan stands without the comparison
        log.warning("baselines failed", exc_info=True)
        return {}, f"baselines failed, plan shown without them: {type(exc).__name__}: {exc}"
    return dict(results), None
