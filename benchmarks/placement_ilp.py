"""Micro-benchmark of the placement solvers: naive MILP vs tightened MILP vs the front door.

For each instance it reports the model size, the status (optimal / time limit), the
throughput found, the proven gap and the wall time of:

* `naive`  — `solve_ilp(naive=True)`: the MILP written down directly;
* `tight`  — `solve_ilp()`: the tightened MILP alone (filtered points, tight big-M, bounds,
  symmetry breaking, latency bounds; no warm start, no upper bound);
* `auto`   — `solve_placement()`: replica heuristic + path-LP bound, and the tightened MILP
  warm-started and capped by them only if the two do not meet.

Instances (all `flow` topology unless named `-chain`):

* `synthetic6` — 6 nodes of 3 types (2x A100-80G, 2x 4xL4, 2x 4xA10G, each twice), L = 80,
  8 batch sizes (so up to 80 * 8 * 2 points per node), TPOT 120 ms and TTFT 2 s, numbers
  from a roofline-like formula (self-contained, no catalog).
* `synthetic4a100` — 4 identical 2x A100-80G nodes, L = 80, TPOT 120 ms.
* `mid4` — 4 nodes of 2 types, L = 24, 4 batch sizes (small enough for every MILP to close).
* `catalog6` — llama-3.3-70b on 2x 4x-a100-40gb + 2x 4x-l40s + 2x 8x-a10g, aggregated mode,
  default SLO, operating points from the perf model (needs the catalog).
* `synthetic6-chain` — `synthetic6` as a chain (the DP; MILPs for comparison).

    python benchmarks/placement_ilp.py                       # everything, 120 s per MILP
    python benchmarks/placement_ilp.py --only mid4 --time-limit 30
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from coral.templates.placement.exact import solve_placement
from coral.templates.placement.ilp import make_placement_milp, solve_ilp
from coral.templates.placement.prep import prepare
from coral.templates.types import NodeSpec, OperatingPoint, PlacementProblem
from coral.templates.placement.verify import verify_placement

GB = 1e9
# name: (memory, NIC bytes/s, s per layer (weights), s per layer per sequence, fixed s,
#        prefill s per layer)
NODE_TYPES = {
    "2xA100-80G": (160 * GB, 100e9 / 8, 0.62e-3, 0.010e-3, 2.0e-3, 5.6e-3),
    "4xL4": (96 * GB, 50e9 / 8, 1.45e-3, 0.030e-3, 2.5e-3, 9.0e-3),
    "4xA10G": (96 * GB, 50e9 / 8, 1.05e-3, 0.022e-3, 2.5e-3, 8.0e-3),
}
W_LAYER = 1.75 * GB  # a 70B model's bf16 weights per layer
KV_SEQ_LAYER = 8e6  # 2k tokens of KV cache per sequence per layer
SEND_S = 0.6e-3  # handing activations to the next stage


def synthetic_node(name: str, L: int, batches) -> NodeSpec:
    mem, nic, c0, c1, fixed, cp = NODE_TYPES[name]
    opts = []
    for k in range(1, L + 1):
        for b in batches:
            for last in (False, True):
                if not last and k == L:
                    continue
                t = k * (c0 + c1 * b) + fixed + (0.0 if last else SEND_S)
                opts.append(OperatingPoint(
                    layers=k, batch=b, is_last=last, step_s=t,
                    prefill_s=k * cp * (1 + 0.02 * b) + fixed, capacity=b / t,
                    mem_bytes=k * (W_LAYER + b * KV_SEQ_LAYER) * 80 / L))
    return NodeSpec(node_type=name, mem_bytes=mem, nic_bytes_per_s=nic, options=tuple(opts))


def synthetic(names, L=80, batches=(1, 2, 4, 8, 16, 32, 64, 128), tpot=0.12, ttft=2.0,
              topology="flow") -> PlacementProblem:
    return PlacementProblem(
        num_layers=L, nodes=tuple(synthetic_node(n, L, batches) for n in names), tpot_s=tpot,
        ttft_s=ttft, first_stage_extra_bytes=2.1 * GB, edge_bytes_per_unit=16384.0,
        topology=topology)


def catalog_problem() -> PlacementProblem:
    from coral.catalog import default_catalog
    from coral.perf.model import PerfModel
    from coral.templates.space.operating_points import OperatingPointTables
    from coral.templates.slo import default_slo

    cat = default_catalog()
    arch = cat.model("llama-3.3-70b")
    tables = OperatingPointTables(PerfModel(cat), cat)
    combo = ["4x-a100-40gb"] * 2 + ["4x-l40s"] * 2 + ["8x-a10g"] * 2
    return tables.problem(arch, combo, default_slo(arch), "aggregated", "flow")


SIX = ["2xA100-80G"] * 2 + ["4xL4"] * 2 + ["4xA10G"] * 2
INSTANCES = {
    "synthetic6": lambda: synthetic(SIX),
    "synthetic4a100": lambda: synthetic(["2xA100-80G"] * 4, ttft=None),
    "mid4": lambda: synthetic(["2xA100-80G"] * 2 + ["4xA10G"] * 2, L=24,
                              batches=(8, 16, 32, 64), tpot=0.05, ttft=None),
    "catalog6": catalog_problem,
    "synthetic6-chain": lambda: synthetic(SIX, topology="chain"),
}


def run(name: str, problem: PlacementProblem, time_limit: float) -> list[dict]:
    rows = []
    prep = prepare(problem)
    sizes = {}
    for naive in (True, False):
        m = make_placement_milp(problem, naive=naive)
        if not m.prep.infeasible and m.prep.active:
            m.build()
        sizes[naive] = (m.stats.cols, m.stats.integers, m.stats.rows)
    points = sum(len(n.options) for n in problem.nodes)
    print(f"\n== {name}: {len(problem.nodes)} nodes, L={problem.num_layers}, {points} points "
          f"({prep.stats.get('kept', 0)} after filtering), topology {problem.topology}")
    runs = [
        ("naive", lambda: solve_ilp(problem, naive=True, time_limit_s=time_limit), True),
        ("tight", lambda: solve_ilp(problem, time_limit_s=time_limit), False),
        ("auto", lambda: solve_placement(problem, time_limit_s=time_limit), False),
    ]
    for label, fn, naive in runs:
        t0 = time.perf_counter()
        p = fn()
        wall = time.perf_counter() - t0
        errs = verify_placement(problem, p) if p.nodes or p.status.value == "infeasible" else []
        cols, ints, nrows = sizes[naive] if label != "auto" else sizes[False]
        row = dict(instance=name, solver=label, status=p.status.value, throughput=p.throughput,
                   gap=p.gap, seconds=round(wall, 2), method=p.method, cols=cols,
                   integers=ints, rows=nrows, valid=not errs, notes=list(p.notes))
        rows.append(row)
        print(f"  {label:6s} {p.status.value:10s} thr {p.throughput:12.6g}  gap {p.gap:8.4f}  "
              f"{wall:7.2f} s  [{p.method}; {ints} int / {cols} cols / {nrows} rows]"
              f"{'' if not errs else '  INVALID: ' + errs[0]}")
        for note in p.notes:
            print(f"         {note}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per MILP")
    ap.add_argument("--only", nargs="*", choices=sorted(INSTANCES), help="instances to run")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args(argv)
    rows = []
    for name in args.only or list(INSTANCES):
        try:
            problem = INSTANCES[name]()
        except Exception as exc:  # the catalog instance needs the perf model
            print(f"\n== {name}: skipped ({exc})")
            continue
        rows += run(name, problem, args.time_limit)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
