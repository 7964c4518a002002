"""Planning: scenario -> template libraries -> allocation ILP -> a decoded deployment.

This is the whole planner in three calls, each usable alone:

1. `coral.planning.libraries.templates_for_scenario`: one template library per (model,
   template mode) of the scenario, built or reused from disk.
2. `coral.planning.columns.columns_from_templates`: every kept template as an allocator
   column priced in the scenario's regions (its price overrides included).
3. `plan_scenario` (here): the allocation ILP over those columns (with the start-up penalty
   against a `current` deployment), in each serving mode the scenario allows, on spot
   (`--spot`) or robust to model error (`--robust`) as the options' `Planner` solves it
   (`coral.planning.planners`), decoded into a `PlanResult`: instances
   per region with each template's node mix and layer placement, $/hour, status, proven gap,
   solve time, served share and headroom per model, and the baselines run on the same
   templates (`coral.planning.baseline_runs`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from coral.allocator.solve.ilp import infeasibility_message, solve_allocation
from coral.allocator.plan.decode import decode_instances
from coral.allocator.problem import (
    SCARCITY_DESCRIPTIONS,
    AllocationPlan,
    TemplateRegion,
)
from coral.allocator.scenario.load import AUTO_MODES, Scenario, scenario_slo
from coral.allocator.scarcity.uniform_scale import (
    SCALE_TOL,
    goodput_tokens_per_s,
    largest_scale,
    scaled_problem,
)
from coral.catalog.loader import Catalog
from coral.errors import InputError
from coral.planning.baseline_runs import baseline_start, baselines_beside
from coral.planning.columns import columns_and_templates
from coral.planning.libraries import ScenarioTemplates, templates_for_scenario
from coral.planning.options import PlanOptions
from coral.planning.planners import ModePlan, planner_for
from coral.planning.result import PlanResult
from coral.templates.builder.build import Template
from coral.templates.space.engines import engine_violations
from coral.templates.space.operating_points import PerfLike


def plan_scenario(
    scenario: Scenario,
    *,
    catalog: Catalog,
    options: PlanOptions = PlanOptions(),
    perf: PerfLike | None = None,
    templates: Mapping[str, Sequence[Template]] | None = None,
    baselines: bool = True,
    current: Mapping[TemplateRegion, int] | None = None,
    starts: Sequence[Mapping[TemplateRegion, int]] = (),
    progress: bool = False,
    on_message: Callable[[str], None] | None = None,
) -> PlanResult:
    """Plan `scenario` as `options` say: templates (built or reused unless given),
    allocation, baselines.

    `current` is the deployment running now (column id, region) -> instances; instances
    beyond it pay the scenario's start-up penalty. `options.nmax` overrides the scenario's
    `n_max` for template building (and the baselines), and the result says so. The options'
    engine: every instance of the plan is deployable on it (templates built for it; given
    `ScenarioTemplates` must have been built for it, and given templates it cannot run are
    left out). The baselines are not engine-restricted. `options.robust` and `options.spot`
    choose the `Planner` (`coral.planning.planners`): a plan robust to model error, the plan
    file then saying so (`robust`) with the nominal plan's cost beside it; or one on spot and
    on-demand instances under a chance constraint (the plan file's `spot` object says what
    it risks). `starts`: plans known beforehand ((column id, region) -> instances; a
    re-plan's last plan), which start every mode's search beside the baselines' plans.
    `options.scarcity`: what the allocation maximises when demand cannot be met
    (`AllocationProblem.scarcity`; the plan file's `scarcity` names it).
    """
    engine = options.engine
    time_limit_s, mip_gap, nmax = options.time_limit_s, options.mip_gap, options.nmax
    if perf is None:
        from coral.templates.builder.parallel import default_perf_factory

        perf = default_perf_factory(catalog)
    if scenario.saturation_of is None:
        scenario = scenario.with_perf(perf, catalog)
    if templates is None:
        templates = templates_for_scenario(
            scenario, catalog, perf, options=options.build, out_root=options.out_root,
            nmax=nmax, progress=progress, on_message=on_message,
        )
    if isinstance(templates, ScenarioTemplates):
        if templates.engine != engine:
            raise InputError(f"the templates were built for engine {templates.engine}, the plan "
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
        results, why = baselines_beside(scenario, baseline_templates, catalog, perf, n_used,
                                      time_limit_s=time_limit_s, mip_gap=mip_gap)
        if why:
            notes.append(why)
        elif engine != "coral":
            notes.append(f"engine {engine} restricts Coral's plan only: the baselines are not "
                         "engine-restricted (they solve their own templates as Coral's runtime "
                         "runs them; Helix's candidate clusters are the homogeneous ones only)")
    given = [*starts, *(start for start in (baseline_start(b) for b in results.values())
                        if start)]
    planner = planner_for(options, catalog=catalog, perf=perf,
                          template_dirs=getattr(templates, "template_dirs", None))
    modes = AUTO_MODES if scenario.mode == "auto" else (scenario.mode,)
    tried: list[ModePlan] = []
    for mode in modes:
        sub = scenario.in_mode(mode)
        cols, chosen = columns_and_templates(sub, templates)
        prob = sub.problem(cols, current=current, time_limit_s=time_limit_s, mip_gap=mip_gap,
                           scarcity=options.scarcity)
        # mode auto plans mixed last: it holds every plan of the other modes, which start it
        mode_starts = given + [dict(t.plan.instances) for t in tried]
        tried.append(ModePlan(mode, cols, chosen, prob,
                              planner.solve(sub, prob, chosen, mode_starts)))
    kept = min(tried, key=lambda t: _plan_rank(t.plan))
    mode, problem, plan = kept.mode, kept.problem, kept.plan
    decoded = planner.decode(kept)
    extras: dict[str, Any] = dict(decoded.extras)
    if decoded.note is not None:
        notes.append(decoded.note)
    if len(tried) > 1:
        notes.append("mode auto: " + "; ".join(
            f"{t.mode} ${t.plan.cost_usd_per_hour:,.2f}/hour serving "
            f"{_served_share(t.plan):.1%}" for t in tried) + f" -> {mode}")
    _fill_scarcity(extras, plan, scenario)
    if not plan.meets_demand:
        if planner.scarcity_rule:
            extras["uniform_scale"], scaled = uniform_scale(problem, plan, scenario)
            if (options.scarcity == "fair"
                    and extras["uniform_scale"]["factor"] > plan.fair_level):
                # the rule's plan holds a higher floor than the fair search reached in its
                # time: the fair phases run again from it (phase A starts from the best plan
                # given), so Coral's plan never starves a model further than the rule does
                again = solve_allocation(problem, starts=[dict(scaled.instances),
                                                          dict(plan.instances)])
                if _plan_rank(again) < _plan_rank(plan):
                    notes.append(f"fair plan re-solved from the scarcity rule's plan (floor "
                                 f"{plan.fair_level:.4f} -> {again.fair_level:.4f})"
                                 + (f": it meets every demand, ${again.cost_usd_per_hour:,.2f}"
                                    f"/hour in mode {mode}" if again.meets_demand else ""))
                    plan = again
                    _fill_scarcity(extras, plan, scenario)
            if plan.meets_demand:  # the rule's plan led to one meeting demand: no rule
                del extras["uniform_scale"]
            else:
                notes.append(f"scarcity rule (as for the baselines): every model's demand "
                             f"scaled down uniformly, Coral's allocation meets "
                             f"{extras['uniform_scale']['factor']:.4f} of it at "
                             f"${extras['uniform_scale']['cost_per_hour']:,.2f}/hour")
        if not plan.meets_demand:
            notes.append(infeasibility_message(problem, plan))
    return PlanResult(
        scenario=scenario.name,
        level=scenario.level,
        plan=plan,
        instances=decode_instances(plan, decoded.columns, decoded.chosen, decoded.markets),
        nmax=n_used,
        scenario_nmax=n_scenario,
        templates=sum(len(t) for t in templates.values()),
        columns=len(decoded.columns),
        baselines=results,
        notes=tuple(notes),
        mode=mode,
        engine=engine,
        slos={m.name: scenario_slo(scenario, m.name) for m in scenario.models},
        priorities={m.name: float(m.priority) for m in scenario.models},
        extras=extras,
    )


def _fill_scarcity(extras: dict[str, Any], plan: AllocationPlan, scenario: Scenario) -> None:
    """The plan's goodput and scarcity figures, as `coral plan` and the plan file state them."""
    extras["goodput_tokens_per_s"] = goodput_tokens_per_s(plan.served_fraction,
                                                           scenario.demands())
    extras["goodput_rps"] = sum(plan.served_rps.values())
    extras["served_tokens_per_s"] = {d.model: plan.served_rps.get(d.model, 0.0) * d.output_tokens
                                     for d in scenario.demands()}
    extras["scarcity"] = {
        "objective": plan.scarcity,
        "description": SCARCITY_DESCRIPTIONS[plan.scarcity],
        "applied": not plan.meets_demand,
        "fair_level": plan.fair_level,
        "min_served_fraction": plan.min_served_fraction,
        "tokens_served_share": _tokens_share(plan, scenario),
        "phase_gaps": {k: (v if v != float("inf") else None)
                       for k, v in plan.phase_gaps.items()},
        "phase_seconds": dict(plan.phase_s),
    }


def uniform_scale(problem: Any, plan: AllocationPlan, scenario: Scenario
                  ) -> tuple[dict[str, Any], AllocationPlan]:
    """The paper's scarcity rule on Coral's allocation
    (`coral.allocator.scarcity.uniform_scale`): the largest uniform factor on every model's
    demand that the allocation meets in the chosen mode, with its $/hour, served share (the
    factor, for every model) and goodput in tokens/s against the full demand; and the plan at
    that factor (instance counts that also fit the full-demand problem)."""
    def attempt(f: float) -> tuple[bool, AllocationPlan]:
        p = plan if f == 1.0 else solve_allocation(scaled_problem(problem, f),
                                                   scarcity_search=False)
        return p.meets_demand, p

    hint = min(plan.served_fraction.values(), default=0.0)
    found = largest_scale(attempt, hint=hint if hint > 0 else None)
    served = {m: found.factor for m in plan.served_fraction}
    return {
        "factor": found.factor,
        "tolerance": SCALE_TOL,
        "cost_per_hour": float(found.result.cost_usd_per_hour) if found.factor > 0 else 0.0,
        "served_fraction": served,
        "goodput_tokens_per_s": goodput_tokens_per_s(served, scenario.demands()),
        "runs": found.runs,
    }, found.result


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


def _plan_rank(plan: AllocationPlan) -> tuple[float, ...]:
    """The better of two plans of one scenario: the one meeting demand, then the better by
    the scarcity objective (fair: the higher fairness level, then more priority-weighted
    tokens/s, as its tokens phase maximises; goodput: more priority-weighted goodput), then
    the cheaper."""
    if plan.scarcity == "fair":
        return (0.0 if plan.meets_demand else 1.0, -round(plan.fair_level, 9),
                -round(plan.priority_tokens_per_s, 6), plan.cost_usd_per_hour)
    return (0.0 if plan.meets_demand else 1.0, -round(plan.goodput, 9), plan.cost_usd_per_hour)


def _tokens_share(plan: AllocationPlan, scenario: Scenario) -> float:
    """Share of the generated tokens/s asked for that the plan serves."""
    asked = sum(d.requests_per_s * d.output_tokens for d in scenario.demands())
    return plan.tokens_per_s / asked if asked > 0 else 1.0
