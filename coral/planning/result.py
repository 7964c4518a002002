"""The decoded plan: what `plan_scenario` returns and what the plan file holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from coral.allocator.plan.decode import baseline_summary, finite
from coral.allocator.problem import AllocationPlan, TemplateRegion
from coral.plans.file import PlanFile, PlanRow
from coral.templates.space.engines import DEFAULT_ENGINE
from coral.templates.slo import SloSpec


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
    instances: tuple[PlanRow, ...]  # by region, then template id
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

    def by_region(self) -> dict[str, list[PlanRow]]:
        out: dict[str, list[PlanRow]] = {}
        for inst in self.instances:
            out.setdefault(inst.region, []).append(inst)
        return out

    def current(self) -> dict[TemplateRegion, int]:
        """This deployment as the `current` of a later plan."""
        return dict(self.plan.instances)

    def plan_file(self) -> PlanFile:
        """The plan as its file holds it (`coral.plans.file.write_plan` writes it)."""
        return PlanFile.from_payload(self.to_dict(), source=f"the plan of {self.scenario}")

    def to_dict(self) -> dict[str, Any]:
        """The plan file's JSON object."""
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
