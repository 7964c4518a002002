"""The re-plan after a preemption, as the adaptation loop re-plans (`coral adapt`): the plan's
own scenario, mode, engine and spot options (a `coral plan --spot` plan is re-planned under
its chance constraint, so a replacement may be spot or on demand), its template libraries
(reused from `out/templates`), and the deployment that survives the event as the current
one, so that keeping an instance is free and every new one pays the start-up penalty
(`coral.planning.adapt`; a spot plan's stops pay one too, `coral.allocator.spot.ilp`). The
last plan (the plan file's, then each re-plan's) starts the search: restarting what was lost
is always a candidate, so a re-plan moves more only where that pays. A pool that was just reclaimed stays in the re-plan's market at
its catalog rate: the planner's events are memoryless, and so are the simulator's.
`coral.sim.preemption` sees only its `Replanner` protocol, so the simulator does not import
the planner that runs it.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from coral.allocator.scenario.load import AUTO_MODES, ScenarioError, load_scenario
from coral.planning.libraries import templates_for_scenario
from coral.planning.options import PlanOptions
from coral.planning.plan import plan_scenario
from coral.plans.file import PlanFile, PlanRow
from coral.sim.preemption import Key, PreemptionError

if TYPE_CHECKING:  # the spot planner loads only when a plan asks for spot
    from coral.allocator.spot.market import SpotOptions

log = logging.getLogger(__name__)


class AllocatorReplanner:
    """Re-plans a plan file's scenario from a surviving deployment (see the module)."""

    def __init__(self, plan: PlanFile, *, catalog: Any, perf: Any,
                 options: PlanOptions = PlanOptions(), scenario: str | Path | None = None):
        """`plan`: the plan file (its scenario, level, mode, engine, nmax and spot promise);
        `options`: the caller's (template root, workers, time limit), the plan's engine,
        `nmax` and spot options taking the place of theirs; `scenario`: where its scenario
        is, when the plan names a scenario file (a plan file holds the scenario's name only)."""
        ref = scenario if scenario is not None else plan.scenario
        try:
            loaded = load_scenario(ref, level=plan.level, catalog=catalog)
        except (ScenarioError, TypeError) as exc:
            raise PreemptionError(
                f"cannot re-plan: the plan's scenario {ref!r} does not load ({exc}); to fix: "
                "give the scenario file it was planned from (--replan-scenario FILE)") from None
        mode = plan.mode
        if mode in AUTO_MODES:  # the mode the plan was made in, not `auto` again
            loaded = loaded.in_mode(mode)
        self.catalog, self.perf = catalog, perf
        self.spot: SpotOptions | None = None
        if plan.spot is not None:
            from coral.allocator.spot.planner import SpotOptions, SpotPlanError

            try:
                self.spot = SpotOptions(risk_target=plan.spot.risk_target,
                                        window_s=plan.spot.window_s)
            except SpotPlanError as exc:
                raise PreemptionError(f"cannot re-plan: the plan's spot options do not read "
                                      f"({exc})") from None
        self.options = replace(
            options, build=replace(options.build, engine=str(plan.engine or "coral")),
            nmax=plan.nmax, spot=self.spot)
        self.scenario = loaded.with_perf(perf, catalog)
        self.templates = templates_for_scenario(self.scenario, catalog, perf,
                                                options=self.options.build,
                                                out_root=self.options.out_root,
                                                nmax=self.options.nmax)
        self.last = _counts(plan.instances)

    @property
    def startup_s(self) -> float:
        """Seconds a new instance loads before it serves (the scenario's)."""
        return float(self.scenario.spec.startup_s)

    def pools(self) -> list[tuple[str, str]]:
        """Every pool (node type, region) a re-plan may rent in."""
        return sorted(self.scenario.node_prices)

    def __call__(self, running: Mapping[Key, int], t: float) -> Sequence[PlanRow]:
        result = plan_scenario(self.scenario, catalog=self.catalog, options=self.options,
                               perf=self.perf, templates=self.templates, baselines=False,
                               current=dict(running), starts=[self.last] if self.last else [])
        log.info("re-plan at %.0f s: $%.2f/hour, %s", t, result.cost_per_hour, result.status)
        self.last = _counts(result.instances)
        return result.instances


def _counts(rows: Sequence[PlanRow]) -> dict[Key, int]:
    """Instances per (template id, region) of a plan's rows."""
    out: dict[Key, int] = {}
    for row in rows:
        key = (row.template_id, row.region)
        out[key] = out.get(key, 0) + row.count
    return out
