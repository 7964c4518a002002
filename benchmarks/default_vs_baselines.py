"""Check: `coral plan`'s default plan (mode auto) against every baseline, per built-in
scenario and level.

For each scenario and availability level it plans as `coral plan SCENARIO --level L` does
(mode auto; templates reused from `out/templates` or built) at `--nmax` nodes, runs the
baselines on the same templates, prices and availability, and prints Coral's $/hour and
priority-weighted goodput beside each baseline's. A row passes when Coral's plan is no dearer
than any baseline that serves all demand and serves no less priority-weighted goodput than
any (a baseline short of demand is compared on goodput only). Coral's plan carries its proven
gap: a baseline within it of Coral's cost is reported as such, not as a loss.

    python benchmarks/default_vs_baselines.py                  # core and advanced, n_max 2
    python benchmarks/default_vs_baselines.py --scenarios core --nmax 3
"""

from __future__ import annotations

import argparse
import sys
import time

from coral.planning.plan import plan_scenario
from coral.planning.options import PlanOptions
from coral.allocator.scenario.load import load_scenario
from coral.catalog import default_catalog
from coral.templates.builder.build_options import BuildOptions
from coral.templates.builder.parallel import default_perf_factory


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", nargs="+", default=["core", "advanced"])
    ap.add_argument("--levels", nargs="+", default=None,
                    help="availability levels (default: every level of the scenario)")
    ap.add_argument("--nmax", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    catalog = default_catalog()
    perf = default_perf_factory(catalog)
    failures = 0
    for name in args.scenarios:
        for level in args.levels or load_scenario(name, catalog=catalog).levels:
            t0 = time.perf_counter()
            scenario = load_scenario(name, level=level, catalog=catalog).in_mode("auto")
            result = plan_scenario(scenario, catalog=catalog, perf=perf, options=PlanOptions(
                build=BuildOptions(workers=args.workers), nmax=args.nmax))
            priority = {m.name: m.priority for m in scenario.models}
            demand = result.plan.demand_rps

            def goodput(served: dict[str, float]) -> float:
                return sum(priority[m] * served.get(m, 0.0) * d for m, d in demand.items())

            mine = goodput(result.served_fraction)
            print(f"{name} {level} n_max {args.nmax}: coral ({result.mode}) "
                  f"${result.cost_per_hour:,.2f}/hour, goodput {mine:,.2f}, "
                  f"{'meets demand' if result.plan.meets_demand else 'short'}, "
                  f"gap {result.gap:.2%} ({time.perf_counter() - t0:.0f} s)")
            for bname, b in result.baselines.items():
                theirs = goodput(dict(b.served_fraction))
                verdict = "ok"
                if theirs > mine * (1 + 1e-6):
                    verdict = "MORE GOODPUT THAN CORAL"
                elif b.meets_demand and b.cost_per_hour < result.cost_per_hour:
                    within = b.cost_per_hour >= result.cost_per_hour * (1 - result.gap)
                    verdict = "cheaper, within Coral's proven gap" if within \
                        else "CHEAPER THAN CORAL"
                failures += verdict.startswith(("MORE", "CHEAPER"))
                ratio = (f"{b.cost_per_hour / result.cost_per_hour:.2f}x" if b.meets_demand
                         and result.plan.meets_demand and result.cost_per_hour > 0
                         else "short" if not b.meets_demand else "-")
                print(f"    {bname:17} ${b.cost_per_hour:>11,.2f}/hour {ratio:>6}  goodput "
                      f"{theirs:>9,.2f}  {'meets demand' if b.meets_demand else 'short':12}  "
                      f"{verdict}", flush=True)
    print("default plan never beaten" if not failures else f"{failures} rows beaten")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
