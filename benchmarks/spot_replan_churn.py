"""How much a re-plan after a preemption moves: for a spot plan file, each spot pool in turn
(the likeliest to have an event first, at most `--pools`) has every instance on it
reclaimed, and the plan's scenario is re-planned from the survivors as `coral simulate
--preemptions` re-plans (`AllocatorReplanner`: the running deployment is the start, keeping
an instance is free, a new one pays its start-up). Prints per pool the instances reclaimed,
started and stopped, the $/hour before and after, and the re-plan's CPU time.

    python benchmarks/spot_replan_churn.py PLAN.json [--pools 8] [--json FILE]
        [--package-from DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any


def churn(payload: Any, replanner: Any, pool: tuple[str, str]) -> dict:
    from coral.sim.preemption import row_market, row_pools

    running: Counter = Counter()
    lost = 0
    for row in payload.instances:
        key = (row.template_id, row.region)
        n = row.count
        if row_market(row) == "spot" and pool in row_pools(row):
            lost += n
            continue
        running[key] += n
    # each pool from the plan file's plan: the re-planner's last plan is that plan again
    replanner.last = {(r.template_id, r.region): r.count for r in payload.instances}
    t0 = time.process_time()
    rows = replanner(dict(running), 0.0)
    cpu = time.process_time() - t0
    target: Counter = Counter()
    for row in rows:
        target[(row.template_id, row.region)] += row.count
    started = sum(max(n - running.get(k, 0), 0) for k, n in target.items())
    stopped = sum(max(n - target.get(k, 0), 0) for k, n in running.items())
    cost = sum(r.usd_per_hour * r.count for r in rows)
    return {"pool": f"{pool[0]}@{pool[1]}", "reclaimed": lost, "started": started,
            "stopped": stopped, "usd_per_hour": cost, "cpu_s": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan", type=Path)
    ap.add_argument("--pools", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--package-from", type=Path, default=None,
                    help="import coral from this export of a tree (as spot_phases.py)")
    args = ap.parse_args()
    if args.package_from is not None:
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        sys.path.insert(0, str(args.package_from.resolve()))
    from coral.plans.file import read_plan
    from coral.catalog import default_catalog
    from coral.planning.preemption_replan import AllocatorReplanner
    from coral.sim.preemption import row_market, row_pools
    from coral.templates.builder.parallel import default_perf_factory

    payload = read_plan(args.plan)
    catalog = default_catalog()
    replanner = AllocatorReplanner(payload, catalog=catalog,
                                   perf=default_perf_factory(catalog))
    pools = sorted({p for r in payload.instances if row_market(r) == "spot"
                    for p in row_pools(r)},
                   key=lambda p: (-catalog.preemption_rate_per_hour(*p), p))[:args.pools]
    rows = []
    for pool in pools:
        r = churn(payload, replanner, pool)
        r["p_event_per_hour"] = -math.expm1(-catalog.preemption_rate_per_hour(*pool))
        rows.append(r)
        print(f"{r['pool']:32s} reclaimed {r['reclaimed']:3d} started {r['started']:3d} "
              f"stopped {r['stopped']:3d}  ${r['usd_per_hour']:,.2f}/hour  "
              f"{r['cpu_s']:.1f} s CPU", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
