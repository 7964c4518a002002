"""Where a spot plan's solve time goes: `coral plan core --nmax 3 --spot --no-baselines` in
each serving mode, with the wall and CPU seconds of every phase of the spot solve (the plan
file's `spot.phases`: the on-demand comparison, the naive spot plan, the repair, the local
search, each model alone, the scenario generation, the exact judging), the command's own
CPU and wall time, the plan's $/hour, proven gap and bound.

    python benchmarks/spot_phases.py [--modes aggregated pd mixed] [--time-limit 10]
        [--out-dir out/bench-spot-phases] [--json FILE]

Libraries are read from `out/templates` (built once, reused). The machine may be shared:
the time limit is on wall time, so read the CPU column for the work a phase does.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def run_mode(mode: str, time_limit: float, out_dir: Path, extra: list[str]) -> dict:
    out = out_dir / f"spot-{mode}.json"
    cmd = [str(Path(sys.executable).with_name("coral")), "plan", "core", "--nmax", "3", "--mode", mode, "--spot", "--no-baselines",
           "--time-limit", f"{time_limit:g}", "--out", str(out), *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    payload = json.loads(out.read_text())
    spot = payload["spot"]
    return {"mode": mode, "command": " ".join(cmd), "wall_s": wall,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "usd_per_hour": payload["cost_per_hour"], "gap": payload["gap"],
            "solve_s": payload["solve_seconds"], "phases": spot.get("phases", []),
            "p_short": {m: v["p_short"] for m, v in spot["per_model"].items()},
            "notes": [n for n in payload["solver_notes"] + payload["notes"]
                      if "spot plan" in n or "round" in n]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs="+", default=["aggregated", "pd", "mixed"])
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--out-dir", type=Path, default=Path("out/bench-spot-phases"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("extra", nargs="*", help="more `coral plan` options (after --)")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in args.modes:
        r = run_mode(mode, args.time_limit, args.out_dir, args.extra)
        rows.append(r)
        print(f"{mode}: ${r['usd_per_hour']:,.2f}/hour, gap {r['gap']:.1%}, command "
              f"{r['cpu_s']:.1f} s CPU / {r['wall_s']:.1f} s wall", flush=True)
        for p in r["phases"]:
            print(f"    {p['phase']:22s} {p['cpu_s']:7.2f} s CPU {p['wall_s']:7.2f} s wall")
        for n in r["notes"]:
            print(f"    {n}")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
