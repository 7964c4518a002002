"""Simulator speed: simulated requests and output tokens per wall-clock second.

Plans the `core` scenario with templates of at most `--nmax` nodes (libraries reused from
out/templates), generates Poisson arrivals at the plan's demand with the SLO's mean request
shape, and simulates `--sim-seconds` of it in the closed-form ("fast") mode, stopping early
once `--budget` wall seconds are spent (the report then says how much of the simulated hour it
covered). Then the same deployment runs a `--sample` seconds sample in both modes, to give the
speed-up of the closed form over one event per step, at the plan's demand and at a quarter
of it (a deployment near capacity changes its batches almost every step, so the closed form
gains most at lighter load).

    python benchmarks/simulator.py [--nmax 2] [--sim-seconds 3600] [--budget 60] [--sample 20]
        [--sample-loads 1 0.25]
"""

from __future__ import annotations

import argparse
import json
import time

from coral.allocator.planning import plan_scenario, scenario_slo
from coral.allocator.scenario import load_scenario
from coral.catalog import default_catalog
from coral.perf.model import PerfModel
from coral.sim import SimConfig, Simulator, instances_from_plan, synthetic
from coral.sim.workload import merge


def workload(result, slos, seconds: float, seed: int, load: float = 1.0):
    parts = []
    for k, (m, rate) in enumerate(sorted(result.plan.demand_rps.items())):
        slo = slos[m]
        parts.append(synthetic(m, rate_rps=load * rate, duration_s=seconds, seed=seed + 1000 * k,
                               prompt_tokens=slo.input_tokens, output_tokens=slo.output_tokens))
    return merge(*parts)


def timed(instances, reqs, perf, cat, mode: str, horizon: float | None = None):
    sim = Simulator(instances, perf=perf, catalog=cat,
                    config=SimConfig(mode=mode, horizon_s=horizon))
    t0 = time.perf_counter()
    res = sim.run(reqs)
    wall = time.perf_counter() - t0
    done = [r for r in res.requests if r.status == "done"]
    return {
        "mode": mode,
        "wall_s": wall,
        "simulated_s": res.end_s,
        "requests_done": len(done),
        "output_tokens": sum(r.output_tokens for r in done),
        "requests_per_wall_s": len(done) / wall,
        "output_tokens_per_wall_s": sum(r.output_tokens for r in done) / wall,
        "simulated_s_per_wall_s": res.end_s / wall,
        "events": res.events,
        "steps": res.steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nmax", type=int, default=2)
    ap.add_argument("--sim-seconds", type=float, default=3600.0)
    ap.add_argument("--budget", type=float, default=60.0, help="wall seconds for the long run")
    ap.add_argument("--sample", type=float, default=20.0, help="simulated seconds, both modes")
    ap.add_argument("--sample-loads", type=float, nargs="+", default=[1.0, 0.25],
                    help="sample arrival rates as fractions of the plan's demand")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    cat = default_catalog()
    perf = PerfModel(cat)
    scenario = load_scenario("core", catalog=cat)
    t0 = time.perf_counter()
    result = plan_scenario(scenario, catalog=cat, perf=perf, nmax=args.nmax, baselines=False)
    plan_s = time.perf_counter() - t0
    slos = {m.name: scenario_slo(scenario, m.name) for m in scenario.models}
    instances = instances_from_plan(result, slos)

    # long run: estimate how much fits in the budget from a short calibration run
    calib = timed(instances, workload(result, slos, 10.0, args.seed), perf, cat, "fast")
    fit_s = min(args.sim_seconds, 10.0 * args.budget / max(calib["wall_s"], 1e-9) * 1.5)
    long = timed(instances, workload(result, slos, fit_s, args.seed), perf, cat, "fast")
    long["fraction_of_requested"] = fit_s / args.sim_seconds

    samples = {}
    for load in args.sample_loads:
        sample = workload(result, slos, args.sample, args.seed + 1, load)
        fast = timed(instances, sample, perf, cat, "fast")
        naive = timed(instances, sample, perf, cat, "naive")
        samples[f"load_{load:g}"] = {
            "fast": fast, "naive": naive,
            "fast_over_naive_wall": naive["wall_s"] / fast["wall_s"],
            "fast_over_naive_events": naive["events"] / fast["events"],
        }
    report = {
        "plan": {"scenario": "core", "nmax": args.nmax, "instances": len(instances),
                 "demand_rps": sum(result.plan.demand_rps.values()), "plan_s": plan_s},
        "long_run": long,
        "samples": samples,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
