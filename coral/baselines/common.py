"""What every baseline shares: the result record, name checks, pricing and problem building.

Each baseline turns a scenario plus templates into template columns and instance counts, and
is judged by the same two figures as Coral's own plan: the $/hour of what it rents and the
share of each model's demand it serves. Columns are priced from the scenario's node prices
(price overrides included), never from the catalog prices stored in a template, so a baseline
and Coral's plan always pay the same for the same nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from coral.messages import did_you_mean
from coral.allocator.problem import (
    DEFAULT_MIP_GAP,
    DEFAULT_TIME_LIMIT_S,
    DEMAND_REL_TOL,
    AllocationPlan,
    AllocationProblem,
    PlanStatus,
    TemplateColumn,
    TemplateRegion,
    make_plan,
)
from coral.allocator.plan.decode import decode_instances
from coral.allocator.scenario.load import Scenario, ScenarioModel
from coral.catalog.loader import Catalog
from coral.templates.builder.build import DEFAULT_TIME_LIMIT_S as DEFAULT_PLACEMENT_TIME_LIMIT_S
from coral.templates.builder.build import Solver, Template
from coral.templates.step.search import METHOD as STEP_METHOD
from coral.templates.space.enumerate import Combo, combo_key, node_counts
from coral.templates.builder.homogeneous import homogeneous_combos
from coral.templates.space.operating_points import OperatingPointTables, PerfLike, shared_tables
from coral.templates.slo import SloSpec
from coral.templates.builder.solve import build_template
from coral.templates.types import Mode, Topology

#: Relative slack under which two SLO figures count as the same (templates vs scenario).
SLO_RTOL = 1e-9
#: The note `heuristic_plan` gives every plan it makes.
HEURISTIC_NOTE = "heuristic plan: no optimality claimed (gap inf)"


@dataclass(frozen=True)
class BaselineResult:
    """One baseline's deployment, judged like Coral's plan."""

    name: str  # "homo", "homo-joint", "cauchy", "melange", "helix", "coral", ...
    cost_per_hour: float  # $/hour of every node it rents
    served_fraction: dict[str, float]  # model -> served req/s / demand, in [0, 1]
    plan: AllocationPlan | None  # instances per (template column, region), when it has one
    notes: tuple[str, ...]  # approximations and heuristics, said plainly
    #: The plan's instances with their templates' nodes and placement (`PlanRow`),
    #: so that the deployment can be simulated like Coral's; empty when not decodable.
    instances: tuple = ()
    #: The uniform factor on every model's demand its plan meets (`scale_down`): 1.0 when it
    #: meets the full demand; below 1, `plan` is planned for that share of the demand.
    demand_scale: float = 1.0
    #: Generated tokens/s it serves (served req/s times output tokens per request, summed
    #: over models; NaN when not computed).
    goodput_tokens_per_s: float = math.nan

    def __post_init__(self) -> None:
        clipped = {m: min(1.0, max(0.0, float(f))) for m, f in self.served_fraction.items()}
        object.__setattr__(self, "served_fraction", clipped)

    @property
    def heuristic(self) -> bool:
        """Its counts come from a heuristic: nothing bounds how far its cost is from the best
        its own restriction allows."""
        return self.plan is None or HEURISTIC_NOTE in self.plan.notes

    @property
    def gap(self) -> float:
        """The proven relative gap of its allocation (inf for a heuristic plan): a plan
        stopped by the time limit may cost up to this share less at its optimum."""
        return math.inf if self.heuristic else float(self.plan.gap)

    @property
    def solved(self) -> str:
        """How its plan was reached: "heuristic, no bound", or the allocation's status and
        proven gaps (`AllocationPlan.proof`)."""
        return "heuristic, no bound" if self.heuristic else self.plan.proof

    @property
    def meets_demand(self) -> bool:
        """Every model served in full (within the allocator's relative demand tolerance)."""
        return all(f >= 1.0 - DEMAND_REL_TOL for f in self.served_fraction.values())


def check_model(catalog: Catalog, model: str) -> None:
    """Raise a `ValueError` naming the model and the close catalog names when it is unknown."""
    if model not in catalog.models:
        raise ValueError(
            f"unknown model {model!r}: the catalog has no such model."
            f"{did_you_mean(model, catalog.models)} (`coral catalog list` shows them all)"
        )


def check_node_types(catalog: Catalog, names: Iterable[str]) -> None:
    """Raise a `ValueError` for the first name that is not a catalog node type."""
    for name in names:
        if name not in catalog.node_types:
            raise ValueError(
                f"unknown node type {name!r}: the catalog has no such node type."
                f"{did_you_mean(name, catalog.node_types)} (`coral catalog list` shows them all)"
            )


def scenario_model(scenario: Scenario, model: str) -> ScenarioModel:
    for m in scenario.models:
        if m.name == model:
            return m
    names = [m.name for m in scenario.models]
    raise ValueError(
        f"unknown model {model!r}: scenario {scenario.name!r} serves {', '.join(names)}."
        f"{did_you_mean(model, names)}"
    )


def same_slo(a: SloSpec, b: SloSpec) -> bool:
    """Same targets and request shape (what a placement depends on)."""
    pairs = ((a.tpot_s, b.tpot_s), (a.ttft_s, b.ttft_s),
             (a.input_tokens, b.input_tokens), (a.output_tokens, b.output_tokens))
    return all(math.isclose(x, y, rel_tol=SLO_RTOL) for x, y in pairs)


def check_templates(
    scenario: Scenario, templates: Mapping[str, Sequence[Template]]
) -> dict[str, list[Template]]:
    """Every scenario model with its templates (none for a model the mapping leaves out).

    Raises `ValueError` for a model the scenario does not serve, a template filed under another
    model, or a template built for another SLO than the scenario's (its throughput would not be
    comparable).
    """
    out: dict[str, list[Template]] = {m.name: [] for m in scenario.models}
    for model, tpls in templates.items():
        scenario_model(scenario, model)
        slo = scenario_model(scenario, model).slo
        for t in tpls:
            if t.model != model:
                raise ValueError(
                    f"template on {'+'.join(t.combo)} is for model {t.model!r} but is listed "
                    f"under {model!r}"
                )
            if not same_slo(t.slo, slo):
                raise ValueError(
                    f"template of {model!r} on {'+'.join(t.combo)} was built for "
                    f"{t.slo.describe()}, but scenario {scenario.name!r} asks "
                    f"{slo.describe()}; rebuild the templates for the scenario's SLO"
                )
        out[model] = list(tpls)
    return out




def template_column(
    scenario: Scenario, template: Template, *, prefix: str, capacity: float | None = None
) -> TemplateColumn | None:
    """The template as an allocator column priced in the scenario, or None when it cannot run
    (no capacity, or no scenario region prices all its node types). The capacity defaults to
    the scenario's planned capacity of the template, as for Coral's own columns."""
    cap = scenario.planned_capacity(template) if capacity is None else capacity
    if not template.feasible or not cap > 0:
        return None
    col = scenario.column(
        f"{prefix}:{template.model}:{template.mode}:{combo_key(template.combo)}",
        template.model, template.mode, node_counts(template.combo), cap,
    )
    return col if col.price_usd_per_hour else None


def columns_of(scenario: Scenario, templates: Iterable[Template], *, prefix: str
               ) -> list[TemplateColumn]:
    """Priced columns of `templates`, one per (model, mode, combination): the best throughput."""
    return columns_and_templates(scenario, templates, prefix=prefix)[0]


def columns_and_templates(scenario: Scenario, templates: Iterable[Template], *, prefix: str
                          ) -> tuple[list[TemplateColumn], dict[str, Template]]:
    """`columns_of`, with the template behind each column id."""
    best: dict[str, tuple[TemplateColumn, Template]] = {}
    for t in templates:
        col = template_column(scenario, t, prefix=prefix)
        if col is not None and (col.id not in best or col.capacity > best[col.id][0].capacity):
            best[col.id] = (col, t)
    return [best[k][0] for k in sorted(best)], {k: best[k][1] for k in sorted(best)}


def deployment_of(scenario: Scenario, plan: AllocationPlan, templates: Iterable[Template], *,
                  prefix: str) -> tuple:
    """The plan's instances decoded with their templates' nodes and placement, as Coral's own
    plan is (`decode_instances`), for simulating a baseline."""
    columns, by_id = columns_and_templates(scenario, templates, prefix=prefix)
    used = {tid for tid, _ in plan.instances}
    return decode_instances(plan, [c for c in columns if c.id in used],
                            {k: t for k, t in by_id.items() if k in used})


def scenario_problem(
    scenario: Scenario,
    columns: Sequence[TemplateColumn],
    *,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    mip_gap: float = DEFAULT_MIP_GAP,
) -> AllocationProblem:
    """The scenario's allocation problem over `columns`, whatever their mode.

    (`Scenario.problem` keeps only the modes the scenario serves with; a baseline may serve an
    aggregated scenario disaggregated, or the other way round.)
    """
    return AllocationProblem(
        demands=scenario.demands(),
        templates=tuple(columns),
        regions=scenario.regions,
        availability=scenario.availability,
        startup_s=scenario.spec.startup_s,
        time_limit_s=time_limit_s,
        mip_gap=mip_gap,
    )


def heuristic_plan(
    problem: AllocationProblem, instances: Mapping[TemplateRegion, int], *, notes: Sequence[str]
) -> AllocationPlan:
    """A plan for instance counts chosen by a heuristic rather than the ILP.

    Its `gap` is infinite (nothing is proven about its cost); its status says only whether it
    meets every demand (`optimal`) or not (`infeasible`), as `PlanStatus` has no word for
    "heuristic".
    """
    probe = make_plan(problem, instances, status=PlanStatus.OPTIMAL, gap=math.inf, solve_s=0.0)
    status = PlanStatus.OPTIMAL if probe.meets_demand else PlanStatus.INFEASIBLE
    return make_plan(problem, instances, status=status, gap=math.inf, solve_s=0.0,
                     notes=tuple(notes) + (HEURISTIC_NOTE,))


def result_of(name: str, plan: AllocationPlan, notes: Sequence[str], *,
              instances: tuple = ()) -> BaselineResult:
    """A `BaselineResult` from a plan: its $/hour and its served share per model."""
    return BaselineResult(
        name=name,
        cost_per_hour=float(plan.cost_usd_per_hour),
        served_fraction=dict(plan.served_fraction),
        plan=plan,
        notes=tuple(notes),
        instances=instances,
    )



@dataclass
class TemplateBuilder:
    """`build_template` with a memo, shared by the baselines of one run.

    Homo, Melange and Cauchy need the same homogeneous combinations, Helix re-solves Coral's
    combinations without the SLO, and the joint search asks for the same node set many times:
    each (model, mode, SLO, combination) is solved once. Templates handed in by the planner
    are seeded, so a combination Coral already solved is never solved again.
    """

    catalog: Catalog
    perf: PerfLike
    tables: OperatingPointTables | None = None
    topology: Topology = "flow"
    time_limit_s: float = DEFAULT_PLACEMENT_TIME_LIMIT_S
    solver: Solver | None = None  # the placement solver (default: the project's exact one)
    solved: int = 0  # placements solved by this builder (cache misses)
    _memo: dict[tuple[str, str, str, Combo], Template] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tables is None:
            self.tables = shared_tables(self.perf, self.catalog)
        elif self.tables.catalog is not self.catalog:
            raise ValueError("the operating-point tables were built for another catalog; pass "
                             "tables made from the same catalog (or none)")

    @staticmethod
    def _key(model: str, mode: str, slo: SloSpec, combo: Sequence[str], one_pipeline: bool
             ) -> tuple[str, str, str, Combo, bool]:
        return (model, mode, slo.key(), tuple(sorted(combo)), one_pipeline)

    def seed(self, templates: Iterable[Template]) -> None:
        """Remember already solved templates: those of this builder's topology that the
        step-model search solved (a library's), which is what `get` solves for one pipeline.
        A one-pipeline answer of the flow DP (`templates solve`) is rated by another model
        and is not seeded."""
        for t in templates:
            if t.topology == self.topology and t.is_pipeline and t.method == STEP_METHOD:
                self._memo.setdefault(self._key(t.model, t.mode, t.slo, t.combo, True), t)

    def get(self, model: str, combo: Sequence[str], slo: SloSpec, mode: Mode, *,
            one_pipeline: bool = True) -> Template:
        """The template of `model` on `combo`: one pipeline over every node (what one
        instance deploys), or with `one_pipeline=False` the best split of the nodes into
        pipelines side by side (Helix's max flow over a whole cluster)."""
        key = self._key(model, mode, slo, combo, one_pipeline)
        hit = self._memo.get(key)
        if hit is None:
            floor = 0.0 if one_pipeline and self.topology in ("flow", "chain") else None
            hit = build_template(
                model, key[3], slo, mode, self.topology, self.perf, self.catalog,
                tables=self.tables, time_limit_s=self.time_limit_s, solver=self.solver,
                floor=floor,
            )
            self.solved += 1
            self._memo[key] = hit
        return hit

    def homogeneous_combos(
        self,
        model: str,
        slo: SloSpec,
        mode: Mode,
        *,
        node_types: Sequence[str],
        n_max: int,
        rho: float,
    ) -> list[Combo]:
        """`k` copies of one node type, `k <= n_max`, that Coral's enumeration would keep
        (`coral.templates.builder.homogeneous.homogeneous_combos`)."""
        assert self.tables is not None
        return homogeneous_combos(model, self.catalog, slo, mode, node_types=node_types,
                                  n_max=n_max, rho=rho,
                                  memory_reserve=self.tables.memory_reserve)
