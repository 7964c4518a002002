"""Benchmark: how fast a running plan is re-planned after a small change (`coral adapt`).

On a scenario's real template libraries (built, or reused from `out/templates`, as `coral
plan --nmax N` builds them; default: `core` at n_max 3, the `day` timeline's), it plans the
scenario once, then re-plans `--draws` times from that plan as the running deployment, each
time after one change drawn at random:

- `demand+-10%`: every model's demand x 1.1 or x 0.9, drawn per model;
- `gpu-20%`: one region loses 20% (rounded down) of one GPU type, every node type of that GPU
  there, a (region, GPU type) the running plan uses.

It prints per change the re-plan time (the allocator's own `solve_s`) median / p95 / max,
the median CPU time of a re-plan (all threads; on a shared machine the wall time is longer),
how many re-plans met every demand, the largest proven gap and the instances started and
stopped per re-plan (median). Target (issue 20): median re-plan time at most 1 s on `core`.

    python benchmarks/replan.py                                  # core, limited, 20 draws
    python benchmarks/replan.py --levels abundant limited --modes aggregated mixed
    python benchmarks/replan.py --cold                          # without the warm start
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import replace

from coral.allocator.problem import AllocationPlan
from coral.allocator.solve.ilp import solve_allocation
from coral.allocator.problem import DEFAULT_MIP_GAP, DEFAULT_TIME_LIMIT_S, AllocationProblem
from coral.allocator.scenario.load import load_scenario
from coral.catalog import Catalog, default_catalog

#: Median re-plan time target per scenario (s).
TARGET_MEDIAN_S = {"core": 1.0}
CHANGES = ("demand+-10%", "gpu-20%")


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    idx = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
    return values[idx]


def changed(problem: AllocationProblem, plan: AllocationPlan, change: str, catalog: Catalog,
            rng: random.Random) -> AllocationProblem:
    """`problem` after `change`, with `plan` as the running deployment."""
    current = dict(plan.instances)
    if change.startswith("demand"):
        demands = tuple(replace(d, requests_per_s=d.requests_per_s * rng.choice((0.9, 1.1)))
                        for d in problem.demands)
        return replace(problem, demands=demands, current=current)
    used = sorted({(catalog.node_type(g).gpu, r) for (g, r), n in plan.nodes_used.items()
                   if n > 0})
    gpu, region = rng.choice(used)
    availability = {
        (g, r): (int(n * 0.8) if r == region and catalog.node_type(g).gpu == gpu else n)
        for (g, r), n in problem.availability.items()}
    return replace(problem, availability=availability, current=current)


def run(size: str, level: str, mode: str, *, draws: int, nmax: int, seed: int,
        catalog: Catalog, time_limit_s: float, mip_gap: float
        ) -> dict[str, list[tuple[AllocationPlan, float]]]:
    """Per change, each re-plan with the CPU seconds its solve took (every thread's: the
    machine's load stretches the wall time, not this)."""
    sys.path.insert(0, "benchmarks")
    from allocator import real_templates  # noqa: PLC0415 - the library loader the benchmarks share

    scenario = load_scenario(size, level=level, catalog=catalog).in_mode(mode)
    templates = real_templates(scenario, catalog, nmax)
    base = scenario.problem(templates, time_limit_s=time_limit_s, mip_gap=mip_gap)
    running = solve_allocation(base)
    rng = random.Random(seed)
    out: dict[str, list] = {c: [] for c in CHANGES}
    for i in range(draws):
        change = CHANGES[i % len(CHANGES)]
        problem = changed(base, running, change, catalog, rng)
        cpu = time.process_time()
        plan = solve_allocation(problem)
        out[change].append((plan, time.process_time() - cpu))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["core"], choices=["core", "advanced"])
    ap.add_argument("--levels", nargs="+", default=["limited"])
    ap.add_argument("--modes", nargs="+", default=["aggregated"],
                    choices=["aggregated", "pd", "mixed"])
    ap.add_argument("--nmax", type=int, default=3)
    ap.add_argument("--draws", type=int, default=21)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S)
    ap.add_argument("--mip-gap", type=float, default=DEFAULT_MIP_GAP)
    ap.add_argument("--cold", action="store_true",
                    help="do not start from the running plan (the comparison: each re-plan "
                         "from the LP's rounded plan alone)")
    args = ap.parse_args(argv)
    if args.cold:
        from coral.allocator.solve import ilp

        ilp.running_plan = lambda dec: None
    catalog = default_catalog()
    print(f"re-plans from the running plan, gap {args.mip_gap:g}, time limit "
          f"{args.time_limit:g} s, n_max {args.nmax}, {args.draws} draws per row")
    print(f"{'size':9} {'mode':10} {'level':9} {'change':11} {'n':>3} {'median_s':>9} "
          f"{'p95_s':>7} {'max_s':>7} {'max_gap':>8} {'met':>5} {'started':>7} "
          f"{'stopped':>7} {'cpu_med_s':>9}  target")
    verdicts = []
    for size in args.sizes:
        for mode in args.modes:
            for level in args.levels:
                t0 = time.perf_counter()
                got = run(size, level, mode, draws=args.draws, nmax=args.nmax, seed=args.seed,
                          catalog=catalog, time_limit_s=args.time_limit,
                          mip_gap=args.mip_gap)
                every = [r for runs in got.values() for r in runs]
                for change, runs in [*got.items(), ("all", every)]:
                    if not runs:
                        continue
                    plans = [p for p, _ in runs]
                    times = [p.solve_s for p in plans]
                    cpu = statistics.median(c for _, c in runs)
                    median = statistics.median(times)
                    target = TARGET_MEDIAN_S.get(size)
                    verdict = "-" if target is None else ("yes" if median <= target else "NO")
                    if change == "all":
                        verdicts.append(verdict != "NO")
                    print(f"{size:9} {mode:10} {level:9} {change:11} {len(plans):>3} "
                          f"{median:>9.3f} {_quantile(times, 0.95):>7.3f} {max(times):>7.3f} "
                          f"{max(max(p.gap, p.goodput_gap) for p in plans):>8.2%} "
                          f"{sum(p.meets_demand for p in plans):>2}/{len(plans):<2} "
                          f"{statistics.median(sum(p.started.values()) for p in plans):>7.0f} "
                          f"{statistics.median(sum(p.stopped.values()) for p in plans):>7.0f}"
                          f" {cpu:>9.3f}  {verdict}", flush=True)
                print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"targets: {'met' if all(verdicts) else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
