"""The plan a user gets, simulated at its planned demand and beyond: do planner and simulator
agree at the margin?

Plans a scenario as `coral demo` does (`coral plan SCENARIO --mode auto --nmax 3`, baselines
off), writes the plan file, and runs `coral simulate` on that file for `--duration` simulated
seconds at each demand scale (default 1.0 and 1.3 of the planned demand). Prints, per model
and scale, the SLO attainment and the TTFT/TPOT at the SLO's percentile. The planner sizes
every instance for its SLO at the planned demand, so at 1.0 every model should attain its SLO
(>= 99 % of requests within both targets), and at 1.3 some model should not (the plan has
no more headroom than it needs).

    python benchmarks/e2e.py [--scenario core] [--nmax 3] [--duration 1800] [--scales 1.0 1.3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _coral(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "coral.cli.main", *args], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"coral {' '.join(args)} failed:\n{proc.stderr}")
    return proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="core")
    ap.add_argument("--nmax", type=int, default=3)
    ap.add_argument("--mode", default="auto")
    ap.add_argument("--duration", type=float, default=1800.0, help="simulated seconds")
    ap.add_argument("--scales", type=float, nargs="+", default=[1.0, 1.3])
    ap.add_argument("--templates-dir", default="out/templates")
    args = ap.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="coral-e2e-"))
    plan_path = folder / "plan.json"
    t0 = time.perf_counter()
    _coral("plan", args.scenario, "--mode", args.mode, "--nmax", str(args.nmax),
           "--no-baselines", "--no-progress", "--templates-dir", args.templates_dir,
           "--out", str(plan_path), "--json")
    plan = json.loads(plan_path.read_text())
    demand = sum(plan["demand_rps"].values())
    print(f"plan: {args.scenario} mode {plan['mode']} n_max {args.nmax}: "
          f"${plan['cost_per_hour']:,.2f}/hour, {sum(r['count'] for r in plan['instances'])} "
          f"instances, {demand:g} req/s planned ({time.perf_counter() - t0:.0f} s)")
    rows = []
    for scale in args.scales:
        t0 = time.perf_counter()
        out = json.loads(_coral("simulate", str(plan_path), "--rate", f"{demand * scale:g}",
                                "--duration", f"{args.duration:g}", "--json", "--no-progress",
                                "--out", str(folder / f"sim-{scale:g}")))
        for model, m in sorted(out["models"].items()):
            rows.append((scale, model, m))
        print(f"simulated x{scale:g}: {out['requests']:,} requests, attainment "
              f"{out['slo_attainment'] * 100:.1f}% ({time.perf_counter() - t0:.0f} s)")
    print()
    print(f"{'demand':>7} {'model':<16} {'attainment':>10} {'TTFT s':>8} {'target':>7} "
          f"{'TPOT ms':>8} {'target':>7}")
    for scale, model, m in rows:
        print(f"{scale:>6.2f}x {model:<16} {m['slo_attainment'] * 100:>9.1f}% "
              f"{m['ttft_s_at_percentile']:>8.2f} {m['ttft_target_s']:>7.2f} "
              f"{m['tpot_s_at_percentile'] * 1e3:>8.1f} {m['tpot_target_s'] * 1e3:>7.1f}")


if __name__ == "__main__":
    main()
