"""Where a spot plan's solve time goes: `core` (n_max 3, libraries cached, no baselines)
planned with `--spot` in each serving mode, as `coral plan` plans it (`plan_scenario`), with
the wall and CPU seconds of every phase of the mode's spot solve (the plan file's
`spot.phases`: the on-demand plan beside it, the naive spot plan, the failure-set tables,
the repair, the local search, each model alone, the scenario generation, the exact
judging), the whole call's CPU and wall time, and the plan's $/hour and proven gap.

    python benchmarks/spot_phases.py [--modes aggregated pd mixed] [--time-limit 10]
        [--package-from DIR] [--json FILE]

`--package-from DIR` imports `coral` from DIR instead of the installed package: an export of
an earlier tree (`git archive COMMIT coral | tar -x -C DIR`) to measure it the same way (its
`plan_spot` must fill `spot.phases`). The time limit is on wall time: on a shared machine
read the CPU columns for the work a phase does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs="+", default=["aggregated", "pd", "mixed"])
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--package-from", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.package_from is not None:
        # ahead of the installed (editable) package, whose finder would otherwise win
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        sys.path.insert(0, str(args.package_from.resolve()))
    from coral.allocator.spot import planner as spot
    from coral.allocator.scenario.load import load_scenario
    from coral.catalog import default_catalog
    from coral.planning.options import PlanOptions
    from coral.planning.plan import plan_scenario

    print(f"coral from {Path(spot.__file__).parents[2]}", flush=True)
    catalog = default_catalog()
    rows = []
    for mode in args.modes:
        scenario = load_scenario("core", catalog=catalog).in_mode(mode)
        cpu, wall = time.process_time(), time.perf_counter()
        options = PlanOptions(nmax=3, time_limit_s=args.time_limit, spot=spot.SpotOptions())
        result = plan_scenario(scenario, catalog=catalog, options=options, baselines=False)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        summary = result.extras["spot"]
        phases = summary.get("phases", [])
        rows.append({"mode": mode, "usd_per_hour": result.plan.cost_usd_per_hour,
                     "gap": result.plan.gap, "cpu_s": cpu, "wall_s": wall, "phases": phases,
                     "p_short": {m: v["p_short"] for m, v in summary["per_model"].items()},
                     "notes": [n for n in result.plan.notes if "spot plan" in n]})
        print(f"{mode}: ${result.plan.cost_usd_per_hour:,.2f}/hour, gap {result.plan.gap:.1%};"
              f" call {cpu:.1f} s CPU / {wall:.1f} s wall; phases "
              f"{sum(p['cpu_s'] for p in phases):.2f} s CPU / "
              f"{sum(p['wall_s'] for p in phases):.2f} s wall", flush=True)
        for p in phases:
            print(f"    {p['phase']:22s} {p['cpu_s']:7.2f} s CPU {p['wall_s']:7.2f} s wall")
        for n in rows[-1]["notes"]:
            print(f"    {n}")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
