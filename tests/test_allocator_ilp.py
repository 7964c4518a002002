"""The allocation ILP on hand-made problems with known answers."""

from __future__ import annotations

from dataclasses import replace

import math

import pytest
from test_allocator_support import column

from coral.allocator.problem import AllocationProblem, ModelDemand, PlanStatus, priced_column
from coral.allocator.solve.ilp import InfeasiblePlanError, solve_allocation
from coral.allocator.core.presolve import dominated_templates, presolve_columns
from coral.allocator.solve.bruteforce import solve_bruteforce


def _problem(templates, demands, availability, **kw) -> AllocationProblem:
    kw.setdefault("mip_gap", 0.0)
    return AllocationProblem(
        demands=tuple(demands),
        templates=tuple(templates),
        regions=kw.pop("regions", ("r1", "r2")),
        availability=availability,
        **kw,
    )


# ------------------------------------------------------------------------- cost problem


def test_cheapest_mix_meets_demand() -> None:
    # 5 req/s: big (4 req/s, $3) + small (1.5 req/s, $1.1) beats 4 small ($4.4) or 2 big ($6)
    small = column("small", "m", {"a": 1}, 1.5, {"r1": 1.1})
    big = column("big", "m", {"b": 1}, 4.0, {"r1": 3.0})
    plan = solve_allocation(_problem([small, big], [ModelDemand("m", 5.0)],
                                     {("a", "r1"): 10, ("b", "r1"): 10}))
    assert plan.status is PlanStatus.OPTIMAL and plan.is_ok and plan.meets_demand
    assert plan.instances == {("big", "r1"): 1, ("small", "r1"): 1}
    assert plan.cost_usd_per_hour == pytest.approx(4.1)
    assert plan.capacity_rps["m"] == pytest.approx(5.5)
    assert plan.headroom_rps["m"] == pytest.approx(0.5)
    assert plan.served_fraction["m"] == pytest.approx(1.0)
    assert plan.nodes_used == {("a", "r1"): 1, ("b", "r1"): 1}
    assert plan.started == plan.instances and plan.stopped == {}
    assert plan.gap <= 1e-9 and plan.solve_s > 0


def test_availability_moves_load_to_other_region() -> None:
    t = column("t", "m", {"a": 2}, 1.0, {"r1": 2.0, "r2": 3.0})
    plan = solve_allocation(_problem([t], [ModelDemand("m", 5.0)],
                                     {("a", "r1"): 5, ("a", "r2"): 100}))
    # r1 fits two instances (5 // 2); the other three go to the dearer r2
    assert plan.instances == {("t", "r1"): 2, ("t", "r2"): 3}
    assert plan.nodes_used[("a", "r1")] == 4
    assert plan.cost_usd_per_hour == pytest.approx(2 * 2.0 + 3 * 3.0)


def test_missing_availability_means_none() -> None:
    t = column("t", "m", {"a": 1, "b": 1}, 1.0, {"r1": 2.0})
    plan = solve_allocation(_problem([t], [ModelDemand("m", 1.0)], {("a", "r1"): 5}))
    assert plan.status is PlanStatus.INFEASIBLE
    assert plan.instances == {}


def test_zero_demand_stops_everything() -> None:
    t = column("t", "m", {"a": 1}, 1.0, {"r1": 2.0})
    plan = solve_allocation(_problem([t], [ModelDemand("m", 0.0)], {("a", "r1"): 5},
                                     current={("t", "r1"): 3}))
    assert plan.is_ok and plan.instances == {} and plan.stopped == {("t", "r1"): 3}


# ------------------------------------------------------------------------- start-up penalty


def _incumbent_problem(startup_s: float) -> AllocationProblem:
    cheap = column("cheap", "m", {"a": 1}, 2.0, {"r1": 1.00})
    dear = column("dear", "m", {"b": 1}, 2.0, {"r1": 1.05})
    return _problem([cheap, dear], [ModelDemand("m", 4.0)],
                    {("a", "r1"): 10, ("b", "r1"): 10},
                    current={("dear", "r1"): 2}, startup_s=startup_s)


def test_high_startup_penalty_keeps_running_instances() -> None:
    plan = solve_allocation(_incumbent_problem(startup_s=3600.0))  # an hour of loading
    assert plan.instances == {("dear", "r1"): 2}
    assert plan.started == {} and plan.stopped == {} and plan.penalty_usd == 0.0


def test_zero_startup_penalty_switches_to_cheaper_template() -> None:
    plan = solve_allocation(_incumbent_problem(startup_s=0.0))
    assert plan.instances == {("cheap", "r1"): 2}
    assert plan.started == {("cheap", "r1"): 2}
    assert plan.stopped == {("dear", "r1"): 2}


def test_penalty_is_price_times_loading_hours() -> None:
    # 0.05 $/h cheaper per instance, 2 instances, penalty 1.0 $/h * 0.5 h each: keep "dear"
    plan = solve_allocation(_incumbent_problem(startup_s=1800.0))
    assert plan.instances == {("dear", "r1"): 2}
    # growing demand: the extra instance pays its start-up penalty
    grown = _incumbent_problem(startup_s=1800.0)
    grown = AllocationProblem(**{**grown.__dict__, "demands": (ModelDemand("m", 6.0),)})
    plan = solve_allocation(grown)
    assert plan.total_instances == 3
    assert plan.penalty_usd == pytest.approx(sum(
        n * grown.template(tid).price_usd_per_hour[r] * 0.5
        for (tid, r), n in plan.started.items()))


# ------------------------------------------------------------------------- PD pairing


def test_pd_halves_pair_inside_one_region() -> None:
    # 1 req/s of 1000 prompt + 100 output tokens: 2 prefill (600 tok/s) and 3 decode (40 tok/s)
    pre = column("pre", "m", {"a": 1}, 600.0, {"r1": 1.0, "r2": 1.0}, mode="prefill")
    dec = column("dec", "m", {"b": 1}, 40.0, {"r1": 1.0, "r2": 1.0}, mode="decode")
    demand = ModelDemand("m", 1.0, input_tokens=1000, output_tokens=100)
    plan = solve_allocation(_problem([pre, dec], [demand],
                                     {("a", "r1"): 9, ("b", "r1"): 9}))
    assert plan.instances == {("pre", "r1"): 2, ("dec", "r1"): 3}
    # prefill only in r1, decode only in r2: nothing can be served
    split = _problem([pre, dec], [demand], {("a", "r1"): 9, ("b", "r2"): 9})
    plan = solve_allocation(split)
    assert plan.status is PlanStatus.INFEASIBLE
    assert plan.served_rps["m"] == 0.0 and plan.instances == {}
    with pytest.raises(InfeasiblePlanError) as err:
        solve_allocation(split, strict=True)
    assert "m:" in str(err.value) and err.value.plan.short_models == ("m",)


def test_pd_capacity_counts_the_scarcer_half() -> None:
    pre = column("pre", "m", {"a": 1}, 1000.0, {"r1": 1.0}, mode="prefill")
    dec = column("dec", "m", {"b": 1}, 50.0, {"r1": 1.0}, mode="decode")
    demand = ModelDemand("m", 10.0, input_tokens=1000, output_tokens=100)
    plan = solve_allocation(_problem([pre, dec], [demand], {("a", "r1"): 8, ("b", "r1"): 4},
                                     regions=("r1",)))
    # decode: 4 x 50 / 100 = 2 req/s; prefill needs only 2 instances for that
    assert plan.capacity_rps["m"] == pytest.approx(2.0)
    assert plan.instances == {("pre", "r1"): 2, ("dec", "r1"): 4}


def test_a_model_mixes_aggregated_instances_and_pd_pairs() -> None:
    # 3 req/s; a PD pair serves 1 req/s for $2 but only two decode nodes exist, an aggregated
    # instance 1 req/s for $3: aggregated alone costs $9, PD alone falls short, both $7
    demand = ModelDemand("m", 3.0, input_tokens=1000, output_tokens=100)
    pre = column("pre", "m", {"a": 1}, 1000.0, {"r1": 1.0}, mode="prefill")
    dec = column("dec", "m", {"b": 1}, 100.0, {"r1": 1.0}, mode="decode")
    agg = column("agg", "m", {"c": 1}, 1.0, {"r1": 3.0})
    avail = {("a", "r1"): 9, ("b", "r1"): 2, ("c", "r1"): 9}

    def plan_of(templates):
        return solve_allocation(_problem(templates, [demand], avail, regions=("r1",)))

    assert plan_of([agg]).cost_usd_per_hour == pytest.approx(9.0)
    assert not plan_of([pre, dec]).meets_demand
    mixed = _problem([pre, dec, agg], [demand], avail, regions=("r1",))
    plan = solve_allocation(mixed)
    assert plan.meets_demand and plan.cost_usd_per_hour == pytest.approx(7.0)
    assert plan.instances == {("pre", "r1"): 2, ("dec", "r1"): 2, ("agg", "r1"): 1}
    assert plan.cost_usd_per_hour == pytest.approx(solve_bruteforce(mixed).cost_usd_per_hour)


# ------------------------------------------------------------------------- scarcity


def _scarce(priority_b: float) -> AllocationProblem:
    """A scarce pool under the goodput objective (the fair one: `test_allocator_fair.py`)."""
    ta = column("ta", "a", {"g": 1}, 1.0, {"r1": 1.0})
    ta2 = column("ta2", "a", {"g": 2}, 2.0, {"r1": 1.5})  # cheaper per request, same nodes/rps
    tb = column("tb", "b", {"g": 1}, 1.0, {"r1": 2.0})
    return replace(_problem([ta, ta2, tb],
                            [ModelDemand("a", 3.0), ModelDemand("b", 3.0, priority=priority_b)],
                            {("g", "r1"): 4}, regions=("r1",)), scarcity="goodput")


def test_scarcity_maximises_priority_weighted_goodput() -> None:
    plan = solve_allocation(_scarce(priority_b=2.0))
    assert plan.status is PlanStatus.INFEASIBLE and not plan.is_ok
    assert plan.served_rps == {"a": pytest.approx(1.0), "b": pytest.approx(3.0)}
    assert plan.shortfall_rps == {"a": pytest.approx(2.0), "b": pytest.approx(0.0)}
    assert plan.short_models == ("a",)
    assert plan.goodput == pytest.approx(1.0 + 2.0 * 3.0)


def test_scarcity_then_cheapest_at_that_goodput() -> None:
    # equal priorities: 4 req/s in any split; cheapest is all "a" via ta2 (2 x $1.5) + one ta
    plan = solve_allocation(_scarce(priority_b=1.0))
    oracle = solve_bruteforce(_scarce(priority_b=1.0))
    assert plan.goodput == pytest.approx(4.0)
    assert plan.cost_usd_per_hour == pytest.approx(oracle.cost_usd_per_hour)
    assert plan.served_rps["a"] == pytest.approx(3.0)
    assert plan.served_rps["b"] == pytest.approx(1.0)


def test_thread_count_can_change_between_solves() -> None:
    # HiGHS's scheduler is global: a solve asking for another thread count than the one it
    # started with used to fail inside HiGHS and leave the phases without a plan
    default = solve_allocation(_scarce(priority_b=1.0))
    for threads in (1, 2, 1):
        plan = solve_allocation(_scarce(priority_b=1.0), threads=threads)
        assert plan.goodput == pytest.approx(default.goodput)
        assert plan.cost_usd_per_hour == pytest.approx(default.cost_usd_per_hour)
        assert plan.gap <= 1e-9 and plan.goodput_gap <= 1e-9
    with pytest.raises(ValueError, match="threads"):
        solve_allocation(_scarce(priority_b=1.0), threads=0)


def test_strict_mode_names_the_short_model() -> None:
    with pytest.raises(InfeasiblePlanError) as err:
        solve_allocation(_scarce(priority_b=2.0), strict=True)
    message = str(err.value)
    assert "a: 1 of 3 req/s served, short by 2" in message
    assert "b:" not in message
    assert "To fix" in message
    assert err.value.plan.served_rps["b"] == pytest.approx(3.0)


def test_strict_mode_explains_a_model_without_templates() -> None:
    t = column("t", "m", {"a": 1}, 1.0, {"r1": 2.0})
    problem = _problem([t], [ModelDemand("m", 1.0), ModelDemand("orphan", 2.0)],
                       {("a", "r1"): 5})
    plan = solve_allocation(problem)
    assert plan.short_models == ("orphan",)
    assert plan.served_rps["m"] == pytest.approx(1.0)
    with pytest.raises(InfeasiblePlanError) as err:
        solve_allocation(problem, strict=True)
    assert "orphan" in str(err.value) and "no template serves it" in str(err.value)


def test_strict_mode_explains_unavailable_templates() -> None:
    t = column("t", "m", {"a": 1}, 1.0, {"r1": 2.0})
    with pytest.raises(InfeasiblePlanError) as err:
        solve_allocation(_problem([t], [ModelDemand("m", 1.0)], {("a", "r2"): 5}), strict=True)
    assert "none of its 1 templates can run" in str(err.value)


# ------------------------------------------------------------------------- presolve


def test_dominance_needs_sub_multiset_and_capacity() -> None:
    base = column("base", "m", {"a": 1}, 2.0, {"r1": 1.0})
    bigger = column("bigger", "m", {"a": 1, "b": 1}, 2.0, {"r1": 2.0})  # more nodes, no gain
    better = column("better", "m", {"a": 2}, 5.0, {"r1": 2.0})  # beats 2 x base
    twin = column("twin", "m", {"a": 1}, 2.0, {"r1": 1.0})  # identical to base
    cheap_per_rps = column("cheap", "m", {"c": 1}, 10.0, {"r1": 3.0})  # other nodes
    other_mode = column("pre", "m", {"a": 1, "b": 1}, 2.0, {"r1": 2.0}, mode="prefill")
    out = dominated_templates([base, bigger, better, twin, cheap_per_rps, other_mode])
    assert out == {"bigger": ("base",), "twin": ("base",)}


def test_dominance_by_data_parallel_parts() -> None:
    one = column("one", "m", {"a": 1}, 2.0, {"r1": 1.0, "r2": 1.2})
    other = column("other", "m", {"b": 1}, 3.0, {"r1": 2.0, "r2": 2.5})
    pair = column("pair", "m", {"a": 2}, 4.0, {"r1": 2.0, "r2": 2.4})  # = 2 x one
    mixed = column("mixed", "m", {"a": 1, "b": 1}, 5.0, {"r1": 3.0, "r2": 3.7})  # = one + other
    piped = column("piped", "m", {"a": 3}, 6.5, {"r1": 3.0, "r2": 3.6})  # > 3 x one: kept
    padded = column("padded", "m", {"a": 2, "b": 2}, 9.0, {"r1": 6.0})  # < pair + 2 x other
    out = dominated_templates([one, other, pair, mixed, piped, padded])
    assert out["pair"] == ("one", "one")
    assert sorted(out["mixed"]) == ["one", "other"]
    assert sorted(out["padded"]) == ["mixed", "mixed"] or sorted(out["padded"]) in (
        ["one", "one", "other", "other"], ["other", "other", "pair"])
    assert "piped" not in out and "one" not in out and "other" not in out


def test_dominance_checks_prices_of_the_parts() -> None:
    one = column("one", "m", {"a": 1}, 1.0, {"r1": 1.0})
    pair = column("pair", "m", {"a": 2}, 2.0, {"r1": 1.5})  # cheaper than two singles
    wide = column("wide", "m", {"a": 2}, 2.0, {"r1": 2.0, "r9": 2.0})  # the others: not in r9
    dear = column("zz", "m", {"a": 2}, 2.0, {"r1": 1.6})  # pair's twin, dearer
    assert dominated_templates([one, pair, wide]) == {}
    assert dominated_templates([one, pair, wide, dear]) == {"zz": ("pair",)}


def test_dominance_over_the_templates_that_fit_keeps_the_same_columns() -> None:
    # presolve tests dominance only among templates some region can run; the columns it keeps
    # are those of the test over every template
    from coral.allocator.core import presolve

    one = column("one", "m", {"a": 1}, 2.0, {"r1": 1.0, "r2": 1.2})
    pair = column("pair", "m", {"a": 2}, 4.0, {"r1": 2.0, "r2": 2.4})  # = 2 x one
    piped = column("piped", "m", {"a": 3}, 6.5, {"r1": 3.0, "r2": 3.6})
    big = column("big", "m", {"b": 4}, 30.0, {"r1": 9.0})  # b: 2 nodes, fits nowhere
    big_pair = column("bigpair", "m", {"b": 8}, 60.0, {"r1": 18.0})
    n = column("n", "n", {"a": 1}, 1.0, {"r2": 1.0})  # no demand for n
    problem = _problem([one, pair, piped, big, big_pair, n], [ModelDemand("m", 9.0)],
                       {("a", "r1"): 2, ("a", "r2"): 3, ("b", "r1"): 2})
    presolve._DOMINANCE_CACHE.clear()
    subset = presolve_columns(problem)
    assert len(presolve._DOMINANCE_CACHE) == 1
    (held, _), = presolve._DOMINANCE_CACHE.values()
    assert [t.id for t in held] == ["one", "pair", "piped"]  # only these fit somewhere
    presolve._DOMINANCE_CACHE.clear()
    presolve._cached_dominance(problem.templates)  # the whole set's, as before
    whole = presolve_columns(problem)
    assert subset.columns == whole.columns == 3  # one r1, one r2, piped r2; pair dominated
    assert subset.dominated == whole.dominated == 2


def test_presolve_keeps_running_dominated_templates() -> None:
    base = column("base", "m", {"a": 1}, 2.0, {"r1": 1.0})
    bigger = column("bigger", "m", {"a": 1, "b": 1}, 2.0, {"r1": 1.9})
    avail = {("a", "r1"): 4, ("b", "r1"): 4}
    running = _problem([base, bigger], [ModelDemand("m", 4.0)], avail,
                       current={("bigger", "r1"): 2}, startup_s=36000.0, regions=("r1",))
    assert presolve_columns(running).dominated == 0
    plan = solve_allocation(running)
    assert plan.instances == {("bigger", "r1"): 2}  # 10 h of loading outweighs 0.9 $/h
    idle = _problem([base, bigger], [ModelDemand("m", 4.0)], avail, regions=("r1",))
    report = presolve_columns(idle)
    assert report.dominated == 1 and report.columns == 1
    assert report.dominated_by == {"bigger": ("base",)}


def test_presolve_bounds_by_demand_and_availability() -> None:
    t = column("t", "m", {"a": 3}, 1.0, {"r1": 1.0, "r2": 1.0, "r3": 1.0})
    orphan = column("o", "nobody", {"a": 1}, 1.0, {"r1": 1.0})
    problem = _problem([t, orphan], [ModelDemand("m", 2.5)],
                       {("a", "r1"): 2, ("a", "r2"): 3}, regions=("r1", "r2", "r3"))
    report = presolve_columns(problem)
    assert (report.priced, report.unavailable, report.unneeded, report.columns) == (4, 2, 1, 1)


# ------------------------------------------------------------------------- limits and inputs


def test_time_limit_returns_best_plan_with_gap() -> None:
    templates = []
    for i in range(60):
        nodes = {f"g{i % 7}": 1 + i % 3, f"g{(i * 3) % 7}": 1}
        templates.append(column(f"t{i}", f"m{i % 3}", nodes, 1.0 + (i * 37 % 11) / 3,
                                {f"r{k}": 1.0 + ((i + k) * 13 % 17) / 7 for k in range(4)}))
    problem = AllocationProblem(
        demands=tuple(ModelDemand(f"m{j}", 200.0 + 17 * j) for j in range(3)),
        templates=tuple(templates),
        regions=tuple(f"r{k}" for k in range(4)),
        availability={(f"g{g}", f"r{k}"): 150 for g in range(7) for k in range(4)},
        time_limit_s=0.02,
        mip_gap=0.0,
    )
    plan = solve_allocation(problem)
    assert plan.status in (PlanStatus.OPTIMAL, PlanStatus.TIME_LIMIT)
    assert plan.solve_s < 2.0
    if plan.status is PlanStatus.TIME_LIMIT:
        assert plan.gap > 0 or not plan.meets_demand
    else:
        assert plan.gap == 0.0
    # the same problem without the limit is solved, and never worse
    full = solve_allocation(AllocationProblem(**{**problem.__dict__, "time_limit_s": 30.0}))
    assert full.meets_demand
    if plan.meets_demand:
        assert full.objective <= plan.objective + 1e-6


def test_priced_column_sums_node_prices_where_all_are_priced() -> None:
    prices = {("a", "r1"): 1.0, ("b", "r1"): 2.5, ("a", "r2"): 1.5}
    col = priced_column("t", "m", "aggregated", {"a": 2, "b": 1}, 3.0, prices, ["r1", "r2"])
    assert col.price_usd_per_hour == {"r1": 4.5}


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: ModelDemand("m", -1.0), "requests_per_s must be a finite number >= 0"),
        (lambda: ModelDemand("m", 1.0, priority=0.0), "priority must be a finite number > 0"),
        (lambda: ModelDemand("m", math.nan), "requests_per_s"),
        (lambda: column("t", "m", {"a": 0}, 1.0, {}), "node_counts must be positive"),
        (lambda: column("t", "m", {"a": 1}, 0.0, {}), "capacity must be"),
        (lambda: column("t", "m", {"a": 1}, 1.0, {"r1": -2.0}), "price in 'r1'"),
        (lambda: column("t", "m", {"a": 1}, 1.0, {}, mode="both"), "mode 'both'"),
        (lambda: _problem([column("t", "m", {"a": 1}, 1.0, {}),
                           column("t", "m", {"a": 2}, 1.0, {})], [], {}),
         "template id 't' is listed twice"),
        (lambda: _problem([], [ModelDemand("m", 1.0), ModelDemand("m", 2.0)], {}),
         "model 'm' is listed twice"),
        (lambda: _problem([], [], {("a", "r1"): -1}), "availability of 'a' in 'r1'"),
        (lambda: _problem([], [], {("a", "r1"): 1.5}), "whole number"),
        (lambda: _problem([], [], {}, current={("t", "r1"): -1}), "current count"),
        (lambda: _problem([], [], {}, time_limit_s=0.0), "time_limit_s"),
    ],
)
def test_bad_inputs_are_refused(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def _coupled_problem(mip_gap: float, time_limit_s: float) -> AllocationProblem:
    """Three models over 42 templates sharing every node type's availability. Small enough
    that HiGHS proves its optimum in well under a second (tenths of a second on a loaded
    2-core machine), far inside the limits the tests give, so no verdict rests on the clock."""
    templates = []
    for i in range(42):
        nodes = {f"g{i % 7}": 1 + i % 3, f"g{(i * 3) % 7}": 1}
        templates.append(column(f"t{i}", f"m{i % 3}", nodes, 1.0 + (i * 37 % 11) / 3,
                                {f"r{k}": 1.0 + ((i + k) * 13 % 17) / 7 for k in range(4)}))
    return AllocationProblem(
        demands=tuple(ModelDemand(f"m{j}", 200.0 + 17 * j) for j in range(3)),
        templates=tuple(templates),
        regions=tuple(f"r{k}" for k in range(4)),
        availability={(f"g{g}", f"r{k}"): 25 for g in range(7) for k in range(4)},
        time_limit_s=time_limit_s,
        mip_gap=mip_gap,
    )


def test_highs_takes_over_where_branch_and_price_stops_short(monkeypatch) -> None:
    """Branch and price held to its share of the time, HiGHS on the whole ILP gets the rest,
    below its plan; the plan and the better of the two bounds are what comes back: at gap 0
    the optimum HiGHS alone finds."""
    from coral.allocator.solve import ilp

    monkeypatch.setattr(ilp, "DECOMPOSED_SHARE", 0.0)  # branch and price: MIN_PHASE_S only
    plan = solve_allocation(_coupled_problem(0.0, 60.0))
    alone = solve_allocation(_coupled_problem(0.0, 60.0), decompose=False)
    assert alone.status is PlanStatus.OPTIMAL and alone.meets_demand
    assert any(n.startswith("HiGHS after branch and price") for n in plan.notes), plan.notes
    assert plan.status is PlanStatus.OPTIMAL and plan.gap == 0.0 and plan.meets_demand
    assert plan.objective == pytest.approx(alone.objective, rel=1e-9)


def _coupled_ilp():
    """`_coupled_problem`'s ILP, its decomposition and a first plan (the LP rounded)."""
    from coral.allocator.decomposition.branch_price import round_and_repair
    from coral.allocator.core.formulation import (
        LpBuilder,
        add_plan_rows,
        add_variables,
        decomposition_of,
    )
    from coral.allocator.core.highs_runs import lp_relaxation
    from coral.allocator.core.presolve import Index, run_presolve

    problem = _coupled_problem(0.0, 60.0)
    ix = Index.build(problem)
    lp = LpBuilder()
    v = add_variables(lp, problem, ix, run_presolve(problem, ix, dominance=True))
    add_plan_rows(lp, ix, v)
    arr = lp.arrays()
    dec = decomposition_of(ix, v, lp)
    relaxed = lp_relaxation(arr, arr.cost, arr.col_lb, arr.row_lb, lp, len(v.x))
    first = round_and_repair(dec, relaxed.x)
    assert first is not None and dec.fits(first) and dec.covers(first)
    return problem, arr, v, dec, relaxed, first


def test_neighbourhood_run_keeps_plans_but_proves_nothing() -> None:
    """HiGHS on a neighbourhood of columns (the LP's and the plan's) after branch and
    price: its plan is kept when cheaper, still fits and meets demand, and the bound stays
    the one given (a run on some columns bounds nothing); with the whole ILP after it, the
    optimum and its proof come back (gap 0, as HiGHS alone)."""
    from coral.allocator.core.highs_runs import highs_after_decomposition

    problem, arr, v, dec, relaxed, first = _coupled_ilp()
    near = relaxed.x > 1e-9
    notes: list[str] = []
    counts, cost, bound = highs_after_decomposition(
        arr, v, dec, first.copy(), dec.cost(first), relaxed.value, mip_gap=0.0,
        time_limit_s=60.0, threads=None, notes=notes, neighbourhood=near,
        min_run_s=math.inf)
    assert cost <= dec.cost(first) and cost == pytest.approx(dec.cost(counts), rel=1e-12)
    assert dec.fits(counts) and dec.covers(counts)
    assert bound == relaxed.value
    assert notes and notes[0].startswith("HiGHS on the root's and the plan's")
    assert not any(n.startswith("HiGHS after branch and price") for n in notes)

    alone = solve_allocation(problem, decompose=False)
    assert alone.status is PlanStatus.OPTIMAL
    counts, cost, bound = highs_after_decomposition(
        arr, v, dec, first.copy(), dec.cost(first), relaxed.value, mip_gap=0.0,
        time_limit_s=60.0, threads=None, notes=notes, neighbourhood=near)
    assert cost == pytest.approx(alone.objective, rel=1e-9)
    assert bound == pytest.approx(cost, rel=1e-6)
