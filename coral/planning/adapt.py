"""The adaptation loop: replay a timeline (`coral.planning.timeline`) of demand, availability
and prices, re-planning as it goes.

Each period is planned with the previous period's deployment as the current one, so new
instances pay the scenario's start-up penalty and keeping running ones is free. Recorded per
period: $/hour, the start-up penalty paid, the period's cost, demand and served goodput
(req/s and share, also per model), instances running, started and stopped, status, gap and
solve time. `coral.planning.adapt_report` writes them as a CSV file and a PNG plot.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.problem import AllocationPlan, TemplateRegion
from coral.catalog.loader import Catalog
from coral.errors import InputError
from coral.planning.columns import columns_from_templates
from coral.planning.libraries import ScenarioTemplates, templates_for_scenario
from coral.planning.options import PlanOptions
from coral.planning.timeline import Timeline, apply_period
from coral.templates.builder.build import Template
from coral.templates.space.operating_points import PerfLike

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class PeriodRecord:
    """What happened in one period."""

    index: int
    name: str
    start_s: float
    duration_s: float
    status: str  # the allocator's `PlanStatus` value
    cost_usd_per_hour: float  # $/hour of the deployment run during the period
    startup_penalty_usd: float  # one-off cost of the instances started at its start
    period_cost_usd: float  # cost_usd_per_hour * duration + startup_penalty_usd
    demand_rps: float  # all models
    served_rps: float  # all models, min(demand, capacity) each
    served_fraction: float  # served_rps / demand_rps (1 when there is no demand)
    served_fraction_by_model: Mapping[str, float]
    instances: int  # running during the period
    started: int  # started at its start
    stopped: int  # stopped at its start
    gap: float  # proven relative gap of the cost (inf: none proven)
    solve_s: float
    short_models: tuple[str, ...]


@dataclass(frozen=True)
class AdaptResult:
    """The whole replay: one record per period, and where its files went."""

    timeline: str
    scenario: str
    nmax: int
    scenario_nmax: int
    records: tuple[PeriodRecord, ...]
    plans: tuple[AllocationPlan, ...]
    csv_path: Path | None = None
    png_path: Path | None = None
    notes: tuple[str, ...] = ()

    @property
    def total_cost_usd(self) -> float:
        return sum(r.period_cost_usd for r in self.records)

    @property
    def total_started(self) -> int:
        return sum(r.started for r in self.records)

    @property
    def total_stopped(self) -> int:
        return sum(r.stopped for r in self.records)

    @property
    def served_fraction(self) -> float:
        """Requests served over requests asked, over the whole timeline."""
        asked = sum(r.demand_rps * r.duration_s for r in self.records)
        served = sum(r.served_rps * r.duration_s for r in self.records)
        return served / asked if asked > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "timeline": self.timeline,
            "scenario": self.scenario,
            "nmax": self.nmax,
            "scenario_nmax": self.scenario_nmax,
            "nmax_reduced": self.nmax != self.scenario_nmax,
            "total_cost_usd": self.total_cost_usd,
            "served_fraction": self.served_fraction,
            "total_started": self.total_started,
            "total_stopped": self.total_stopped,
            "csv": str(self.csv_path) if self.csv_path else None,
            "png": str(self.png_path) if self.png_path else None,
            "periods": [_record_dict(r) for r in self.records],
            "notes": list(self.notes),
        }


def _record_dict(r: PeriodRecord) -> dict[str, Any]:
    return {
        "index": r.index,
        "name": r.name,
        "start_s": r.start_s,
        "duration_s": r.duration_s,
        "status": r.status,
        "cost_usd_per_hour": r.cost_usd_per_hour,
        "startup_penalty_usd": r.startup_penalty_usd,
        "period_cost_usd": r.period_cost_usd,
        "demand_rps": r.demand_rps,
        "served_rps": r.served_rps,
        "served_fraction": r.served_fraction,
        "served_fraction_by_model": dict(r.served_fraction_by_model),
        "instances": r.instances,
        "started": r.started,
        "stopped": r.stopped,
        "gap": r.gap if math.isfinite(r.gap) else None,
        "solve_s": r.solve_s,
        "short_models": list(r.short_models),
    }


def run_timeline(
    timeline: Timeline,
    *,
    catalog: Catalog,
    options: PlanOptions = PlanOptions(),
    perf: PerfLike | None = None,
    templates: Mapping[str, Sequence[Template]] | None = None,
    progress: bool = False,
    on_message: Callable[[str], None] | None = None,
    on_period: Callable[[PeriodRecord], None] | None = None,
) -> AdaptResult:
    """Re-plan every period of `timeline`, each against the previous period's deployment,
    as `options` say (nominal on-demand plans: robust and spot re-planning is not offered).

    Templates are built once for the scenario (its SLOs do not change over the timeline), at
    `options.nmax` nodes if given, else the timeline's `nmax`, else the scenario's.
    """
    if options.robust is not None or options.spot is not None:
        raise InputError(f"timeline {timeline.name!r}: periods are re-planned nominally on "
                         "demand; to fix: plan without robust or spot options")
    scenario = timeline.scenario
    n = options.nmax if options.nmax is not None else timeline.spec.nmax
    if perf is None:
        from coral.templates.builder.parallel import default_perf_factory

        perf = default_perf_factory(catalog)
    scenario = scenario.with_perf(perf, catalog)
    if templates is None:
        templates = templates_for_scenario(scenario, catalog, perf, options=options.build,
                                           out_root=options.out_root, nmax=n,
                                           progress=progress, on_message=on_message)
    if isinstance(templates, ScenarioTemplates):
        n_used, notes = templates.nmax, templates.notes()
    else:
        n_used = int(scenario.spec.n_max if n is None else n)
        notes = ScenarioTemplates({}, n_used, int(scenario.spec.n_max)).notes()

    records: list[PeriodRecord] = []
    plans: list[AllocationPlan] = []
    current: dict[TemplateRegion, int] = {}
    start_s = 0.0
    for i, period in enumerate(timeline.periods):
        here = apply_period(scenario, period)
        columns = columns_from_templates(here, templates)
        problem = here.problem(columns, current=current, time_limit_s=options.time_limit_s,
                               mip_gap=options.mip_gap, scarcity=options.scarcity)
        t0 = time.perf_counter()
        plan = solve_allocation(problem)
        log.info("period %d: $%.2f/hour, %s in %.2f s", i, plan.cost_usd_per_hour,
                 plan.status.value, time.perf_counter() - t0)
        demand = sum(plan.demand_rps.values())
        served = sum(plan.served_rps.values())
        record = PeriodRecord(
            index=i,
            name=timeline.period_label(i),
            start_s=start_s,
            duration_s=float(period.duration_s),
            status=plan.status.value,
            cost_usd_per_hour=float(plan.cost_usd_per_hour),
            startup_penalty_usd=float(plan.penalty_usd),
            period_cost_usd=float(plan.cost_usd_per_hour * period.duration_s / 3600.0
                                  + plan.penalty_usd),
            demand_rps=float(demand),
            served_rps=float(served),
            served_fraction=float(served / demand) if demand > 0 else 1.0,
            served_fraction_by_model=dict(plan.served_fraction),
            instances=plan.total_instances,
            started=sum(plan.started.values()),
            stopped=sum(plan.stopped.values()),
            gap=float(plan.gap),
            solve_s=float(plan.solve_s),
            short_models=plan.short_models,
        )
        records.append(record)
        plans.append(plan)
        if on_period is not None:
            on_period(record)
        current = dict(plan.instances)
        start_s += float(period.duration_s)
    return AdaptResult(timeline=timeline.name, scenario=scenario.name, nmax=n_used,
                       scenario_nmax=int(scenario.spec.n_max), records=tuple(records),
                       plans=tuple(plans), notes=tuple(notes))
