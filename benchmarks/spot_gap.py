"""Where a spot plan's proven gap comes from: a weak bound or a poor plan. For each mode of
`coral plan core --nmax 3 --spot` (libraries cached), the problem the planner solves is
captured and then, with a longer time limit `--long`:

- the naive spot optimum (no risk rows; a lower bound of the spot optimum): its plan and its
  proven bound, by `ilp.solve_allocation`;
- the scenario ILP's first relaxation (every model's single-pool failure sets,
  `spot_ilp.solve_round` with no cut-off): its proven bound;
- the spot plan itself (`plan_spot`) with the longer limit;

beside the plan of the default limit. Figures are objectives (expected $/hour plus the
start-up of every instance started), as the planner's gaps are.

    python benchmarks/spot_gap.py [--modes pd mixed] [--long 60] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from coral.allocator.spot import planner as spot
from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.scenario.load import load_scenario
from coral.allocator.spot.ilp import ScenarioFamily, solve_round
from coral.allocator.spot.market import expected_price_problem, spot_arrays, spot_columns
from coral.catalog import default_catalog
from coral.planning.options import PlanOptions
from coral.planning.plan import plan_scenario


def captured(mode: str, time_limit: float) -> tuple[tuple, spot.SpotPlan]:
    """The spot problem `coral plan core --nmax 3 --mode MODE --spot` solves, and its plan."""
    seen: list = []
    original = spot.plan_spot

    def capture(problem, market, options, starts=(), **kw):
        result = original(problem, market, options, starts, **kw)
        seen.append(((problem, market, options, list(starts)), result))
        return result

    spot.plan_spot = capture
    try:
        cat = default_catalog()
        scenario = load_scenario("core", catalog=cat).in_mode(mode)
        plan_scenario(scenario, catalog=cat, baselines=False, options=PlanOptions(
            nmax=3, time_limit_s=time_limit, spot=spot.SpotOptions()))
    finally:
        spot.plan_spot = original
    return seen[-1]


def measure(mode: str, limit: float, long: float) -> dict:
    (problem, market, options, starts), default = captured(mode, limit)
    cols = spot_columns(problem, market)
    a = spot_arrays(cols, market)
    out: dict = {"mode": mode, "default_limit_s": limit, "long_limit_s": long,
                 "default_plan": a.objective(a.vector(default.plan.instances)),
                 "default_gap": default.plan.gap, "default_notes": list(default.notes)}
    t = time.process_time()
    naive = solve_allocation(replace(expected_price_problem(cols, market), time_limit_s=long),
                             starts=starts)
    out["naive_plan"] = naive.objective
    out["naive_bound"] = naive.objective * (1.0 - naive.gap)
    out["naive_cpu_s"] = time.process_time() - t
    budget = 1.0 - options.risk_target
    families = [ScenarioFamily.singles(a.spot_pools_of(m), market.prob_down)
                if a.spot_pools_of(m) else None for m in range(len(a.models))]
    t = time.process_time()
    first = solve_round(a, families, budget, cutoff=float("inf"), time_limit_s=long,
                        mip_gap=1e-4)
    out["relaxation_bound"] = first.bound
    out["relaxation_plan"] = a.objective(first.x) if first.x is not None else None
    out["relaxation_detail"] = first.detail
    out["relaxation_cpu_s"] = time.process_time() - t
    t = time.process_time()
    longer = spot.plan_spot(replace(problem, time_limit_s=long), market, options, starts)
    out["long_plan"] = a.objective(a.vector(longer.plan.instances))
    out["long_gap"] = longer.plan.gap
    out["long_notes"] = list(longer.notes)
    out["long_cpu_s"] = time.process_time() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs="+", default=["pd", "mixed"])
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--long", type=float, default=60.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for mode in args.modes:
        r = measure(mode, args.time_limit, args.long)
        rows.append(r)
        best_bound = max(r["naive_bound"], r["relaxation_bound"])
        print(f"{mode}: plan {r['default_plan']:.2f} at {args.time_limit:g} s, "
              f"{r['long_plan']:.2f} at {args.long:g} s ({r['long_cpu_s']:.0f} s CPU); "
              f"naive plan {r['naive_plan']:.2f} bound {r['naive_bound']:.2f}; relaxation "
              f"bound {r['relaxation_bound']:.2f} ({r['relaxation_detail']}, "
              f"{r['relaxation_cpu_s']:.0f} s CPU); gap of the long plan against the best "
              f"bound {(r['long_plan'] - best_bound) / r['long_plan']:.1%}", flush=True)
        for n in r["long_notes"]:
            print(f"    {n}")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
