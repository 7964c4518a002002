"""Plain, spot and robust planning behind one `Planner` protocol.

`plan_scenario` solves one allocation problem per serving mode and keeps the best plan; what
differs between a nominal on-demand plan, a spot plan (`--spot`) and a plan robust to model
error (`--robust`) is how each mode's problem is solved and how the kept plan is decoded. A
`Planner` owns both steps, and `planner_for` picks it from the `PlanOptions` (the choice is
data, not a branch in the planning loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.problem import (
    AllocationPlan,
    AllocationProblem,
    TemplateColumn,
    TemplateRegion,
)
from coral.allocator.robust.planner import RobustPlanner
from coral.allocator.scenario.load import Scenario
from coral.catalog.loader import Catalog
from coral.perf.slowdown import Slowdown
from coral.perf.uncertainty import card_uncertainty
from coral.planning.options import PlanOptions
from coral.templates.space.operating_points import PerfLike
from coral.templates.template import Template

if TYPE_CHECKING:  # the spot planner loads only when a plan asks for spot
    from coral.allocator.spot.planner import SpotPlanner
    from coral.allocator.spot.market import SpotOptions

#: Starting plans of a solve: (column id, region) -> instances.
Starts = Sequence[Mapping[TemplateRegion, int]]


@dataclass(frozen=True)
class ModePlan:
    """One serving mode's solve: its columns, the template behind each, problem and plan."""

    mode: str
    columns: list[TemplateColumn]
    chosen: dict[str, Template]
    problem: AllocationProblem
    plan: AllocationPlan


@dataclass(frozen=True)
class Decoding:
    """What the plan file is decoded from for the kept mode, and what the planner adds to it."""

    columns: Sequence[TemplateColumn]
    chosen: Mapping[str, Any]  # column id -> template (spot copies included)
    markets: Mapping[str, str] | None = None  # column id -> market, where not on demand
    extras: Mapping[str, Any] = field(default_factory=dict)  # the plan file's planner entries
    note: str | None = None


@runtime_checkable
class Planner(Protocol):
    """How `plan_scenario` solves each serving mode's allocation and decodes the kept one."""

    #: Whether the paper's scarcity rule (demand scaled down uniformly) is stated beside a
    #: plan that does not meet demand; it is defined for nominal on-demand plans only.
    scarcity_rule: bool

    def solve(self, scenario: Scenario, problem: AllocationProblem,
              chosen: Mapping[str, Template], starts: Starts) -> AllocationPlan:
        """The plan of `problem` (the columns of `scenario`'s mode, `chosen` the template
        behind each), started from `starts`."""
        ...

    def decode(self, kept: ModePlan) -> Decoding:
        """The columns, templates and markets to decode the kept mode's plan with."""
        ...


class PlainPlanning:
    """A nominal plan on on-demand instances (`solve_allocation`)."""

    scarcity_rule = True

    def solve(self, scenario: Scenario, problem: AllocationProblem,
              chosen: Mapping[str, Template], starts: Starts) -> AllocationPlan:
        return solve_allocation(problem, starts=starts)

    def decode(self, kept: ModePlan) -> Decoding:
        return Decoding(kept.columns, kept.chosen)


class RobustPlanning:
    """`--robust R`: every demand covered with any one GPU type `1 + R` times slower
    (`coral.allocator.robust.planner.RobustPlanner`), or "auto": each GPU type as much slower as the
    perf model is unsure of it (`coral.perf.uncertainty`)."""

    scarcity_rule = False

    def __init__(self, robust: float | str, *, catalog: Catalog, perf: PerfLike,
                 template_dirs: Mapping[str, str] | None) -> None:
        basis: dict[str, str] = {}
        r: float | dict[str, Slowdown]
        if robust == "auto":
            cards = card_uncertainty(catalog, perf)
            r = {g: c.slowdown for g, c in cards.items()}
            basis = {g: c.describe() for g, c in cards.items()}
        else:
            r = robust  # type: ignore[assignment]
        self.planner = RobustPlanner(r, perf=perf, catalog=catalog, template_dirs=template_dirs,
                                     basis=basis)

    def solve(self, scenario: Scenario, problem: AllocationProblem,
              chosen: Mapping[str, Template], starts: Starts) -> AllocationPlan:
        return self.planner.solve(scenario, problem, chosen, starts=starts)

    def decode(self, kept: ModePlan) -> Decoding:
        self.planner.check(kept.mode, kept.plan)
        columns, chosen = self.planner.columns(kept.mode)
        return Decoding(columns, chosen, extras={"robust": self.planner.summary(kept.mode)},
                        note=self.planner.note(kept.mode))


class SpotPlanning:
    """`--spot`: spot and on-demand instances under a chance constraint
    (`coral.allocator.spot.planner.SpotPlanner`)."""

    scarcity_rule = False

    def __init__(self, planner: SpotPlanner) -> None:
        self.planner = planner

    def solve(self, scenario: Scenario, problem: AllocationProblem,
              chosen: Mapping[str, Template], starts: Starts) -> AllocationPlan:
        return self.planner.solve(problem, starts)

    def decode(self, kept: ModePlan) -> Decoding:
        columns, chosen = self.planner.columns(kept.columns, kept.chosen)
        markets = self.planner.markets()
        return Decoding(columns, chosen, markets, extras={"spot": self.planner.summary()},
                        note=self.planner.note())


def spot_planning(options: SpotOptions, catalog: Catalog) -> SpotPlanning:
    """The spot planner, imported only when a plan asks for spot, so that a nominal plan
    does not load the spot modules."""
    from coral.allocator.spot.planner import SpotPlanner

    return SpotPlanning(SpotPlanner(options, catalog))


def planner_for(options: PlanOptions, *, catalog: Catalog, perf: PerfLike,
                template_dirs: Mapping[str, str] | None = None) -> Planner:
    """The planner the options ask for: robust (`options.robust`), spot (`options.spot`;
    `PlanOptions` refuses both at once) or plain."""
    if options.robust is not None:
        return RobustPlanning(options.robust, catalog=catalog, perf=perf,
                              template_dirs=template_dirs)
    if options.spot is not None:
        return spot_planning(options.spot, catalog)
    return PlainPlanning()
