"""Benchmark: build template libraries and report how long generation takes.

Default run: every catalog model at its default SLO, N_max 6, rho 12, every node type,
aggregated mode, flow topology — the library the design calls for. Prints per model and in
total: combinations enumerated / pruned / solved / kept, median and p99 seconds per solve,
wall time, the share solved to proven optimality, and the option-table build time (the
memoised perf-model part). On a sample of the largest combinations it also solves the naive
MILP of the general DAG (topology `dag`, `method="naive"`: the obvious formulation) in the
same run and reports its time as a ratio of the default method's, and how close the staged
template comes to the DAG's proven bound.

    python benchmarks/templates.py                                 # the full default library
    python benchmarks/templates.py --models llama-3.1-8b --nmax 3  # a quick run
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from coral.catalog import default_catalog
from coral.templates.build import build_library, build_template
from coral.templates.enumerate import enumerate_combinations
from coral.templates.operating_points import DEFAULT_BATCHES, OperatingPointTables
from coral.templates.parallel import default_perf_factory
from coral.templates.slo import default_slo


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    idx = min(len(values) - 1, max(0, int(round(q * len(values) + 0.5)) - 1))
    return values[idx]


def _table_timing(cat, perf, models, batches) -> dict:
    """Option tables of every (model, node type, mode) from cold, then one node spec each."""
    tables = OperatingPointTables(perf, cat, batches=batches)
    start = time.perf_counter()
    for m in models:
        slo = default_slo(cat.model(m))
        for node in cat.node_types:
            for mode in ("aggregated", "prefill", "decode"):
                tables.node_spec(m, node, slo, mode, 6)
    wall = time.perf_counter() - start
    st = tables.stats
    return {
        "tables": st.time_tables,
        "perf_calls": st.perf_calls,
        "time_tables_s": st.time_table_s,
        "node_specs_s": st.node_spec_s,
        "wall_s": wall,
        "per_table_ms": 1e3 * wall / max(1, st.time_tables),
    }


def _naive_sample(cat, perf, model, slo, size, sample, time_limit, topology, batches, seed):
    enum = enumerate_combinations(model, cat, nmax=size)
    pool = [c for c in enum.combos if len(c) == size]
    if not pool:
        return None
    rng = random.Random(seed)
    picks = rng.sample(pool, min(sample, len(pool)))
    tables = OperatingPointTables(perf, cat, batches=batches)
    rows = []
    for combo in picks:
        fast = build_template(model, combo, slo, "aggregated", topology, perf, cat, tables=tables,
                              time_limit_s=time_limit)
        # the obvious formulation: the naive MILP of the general DAG (a superset of `flow`)
        naive = build_template(model, combo, slo, "aggregated", "dag", perf, cat,
                               tables=tables, time_limit_s=time_limit, method="naive")
        rows.append({
            "combo": list(combo),
            "auto_s": fast.solve_s,
            "auto_status": fast.status.value,
            "auto_throughput": fast.throughput,
            "naive_s": naive.solve_s,
            "naive_status": naive.status.value,
            "naive_gap": naive.gap,
            "naive_throughput": naive.throughput,
            "naive_bound": naive.upper_bound,
            "ratio": naive.solve_s / max(fast.solve_s, 1e-9),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated models [default: every catalog model]")
    ap.add_argument("--nmax", type=int, default=6)
    ap.add_argument("--rho", type=float, default=12.0)
    ap.add_argument("--nodes", help="comma-separated node types [default: all]")
    ap.add_argument("--topology", default="flow", choices=("flow", "chain", "dag"))
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve")
    ap.add_argument("--workers", type=int, default=None, help="[default: one per CPU]")
    ap.add_argument("--batches", help="comma-separated decode batch sizes [default: 1..256]")
    ap.add_argument("--sample", type=int, default=3,
                    help="largest combinations also solved with the naive MILP (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="library root [default: a temporary directory]")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    cat = default_catalog()
    models = args.models.split(",") if args.models else list(cat.models)
    for m in models:
        cat.model(m)
    nodes = args.nodes.split(",") if args.nodes else None
    batches = tuple(int(b) for b in args.batches.split(",")) if args.batches else DEFAULT_BATCHES
    perf = default_perf_factory(cat)
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="coral-templates-"))

    timing = _table_timing(cat, perf, models, batches)
    results = []
    t_all = time.perf_counter()
    for m in models:
        slo = default_slo(cat.model(m))
        _, report = build_library(
            m, cat, slo=slo, nmax=args.nmax, rho=args.rho, node_types=nodes, batches=batches,
            topology=args.topology, out=root / m / "aggregated", workers=args.workers,
            time_limit_s=args.time_limit, progress=not args.no_progress and sys.stderr.isatty(),
            on_message=lambda msg: print(msg, file=sys.stderr),
        )
        results.append(report)
    wall_all = time.perf_counter() - t_all

    naive = {}
    if args.sample > 0:
        for m in models:
            rows = _naive_sample(cat, perf, m, default_slo(cat.model(m)), args.nmax, args.sample,
                                 args.time_limit, args.topology, batches, args.seed)
            if rows:
                naive[m] = rows

    secs = [s for r in results for s in r.solve_seconds]
    solved = sum(r.solved for r in results)
    optimal = sum(r.optimal for r in results)
    out = {
        "models": models,
        "nmax": args.nmax,
        "rho": args.rho,
        "topology": args.topology,
        "batches": list(batches),
        "library_root": str(root),
        "option_tables": timing,
        "per_model": [r.summary() for r in results],
        "total": {
            "enumerated": sum(r.enumeration["enumerated"] for r in results),
            "pruned_memory": sum(r.enumeration["pruned_memory_low"]
                                 + r.enumeration["pruned_memory_high"] for r in results),
            "pruned_no_region": sum(r.enumeration["pruned_no_region"] for r in results),
            "candidates": sum(r.enumeration["candidates"] for r in results),
            "skipped_by_bound": sum(r.outcomes["bound"] for r in results),
            "solved": solved,
            "reused": sum(r.reused for r in results),
            "dominated": sum(r.outcomes["dominated"] for r in results),
            "infeasible_or_zero": sum(r.outcomes["infeasible"] + r.outcomes["zero"]
                                      for r in results),
            "kept": sum(r.kept for r in results),
            "solve_s_median": statistics.median(secs) if secs else None,
            "solve_s_p99": _quantile(secs, 0.99) if secs else None,
            "solve_s_sum": sum(secs),
            "optimal_share": optimal / solved if solved else None,
            "wall_s": wall_all,
        },
        "naive_sample": naive,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    _print(out)
    return 0


def _print(out: dict) -> None:
    t = out["option_tables"]
    print(f"option tables: {t['tables']} tables ({t['perf_calls']} perf-model calls) in "
          f"{t['wall_s']:.2f} s = {t['per_table_ms']:.1f} ms per (model, node type, mode)")
    hdr = (f"{'model':24} {'enum':>7} {'pruned':>7} {'cand':>6} {'bound':>5} {'solved':>6} "
           f"{'dom':>5} {'zero':>5} {'kept':>5} {'med s':>7} {'p99 s':>7} {'opt %':>6} "
           f"{'wall s':>8}")
    print(hdr)
    for s in out["per_model"]:
        o = s["outcomes"]
        pruned = (s["combos_pruned_memory_low"] + s["combos_pruned_memory_high"]
                  + s["combos_pruned_no_region"])
        med = s["solve_s_median"]
        p99 = s["solve_s_p99"]
        opt = s["optimal_share"]
        print(f"{s['model']:24} {s['combos_enumerated']:>7} {pruned:>7} "
              f"{s['combos_candidates']:>6} {o['bound']:>5} {s['solved_now']:>6} "
              f"{o['dominated']:>5} {o['infeasible'] + o['zero']:>5} {o['kept']:>5} "
              f"{'-' if med is None else f'{med:.3f}':>7} {'-' if p99 is None else f'{p99:.3f}':>7} "
              f"{'-' if opt is None else f'{100 * opt:.1f}':>6} {s['wall_s']:>8.1f}")
    tot = out["total"]
    print(f"total: enumerated {tot['enumerated']}, pruned by memory {tot['pruned_memory']}, "
          f"by region {tot['pruned_no_region']}, candidates {tot['candidates']}, skipped by "
          f"bound {tot['skipped_by_bound']}, solved {tot['solved']} (+{tot['reused']} reused), "
          f"dominated {tot['dominated']}, infeasible/zero {tot['infeasible_or_zero']}, kept "
          f"{tot['kept']}")
    if tot["solve_s_median"] is not None:
        print(f"solve seconds: median {tot['solve_s_median']:.3f}, p99 {tot['solve_s_p99']:.3f}, "
              f"sum {tot['solve_s_sum']:.1f}; optimal {100 * tot['optimal_share']:.1f}%; "
              f"wall {tot['wall_s']:.1f} s")
    for m, rows in out["naive_sample"].items():
        print(f"naive DAG MILP vs default (staged DP) on {len(rows)} {len(rows[0]['combo'])}-node "
              f"combinations of {m}:")
        for r in rows:
            bound = r["naive_bound"]
            share = (f"{100 * r['auto_throughput'] / bound:.1f}% of the DAG bound"
                     if bound and bound != float("inf") else "DAG bound unknown")
            print(f"  {','.join(r['combo'])}: default {r['auto_s']:.3f} s ({r['auto_status']}, "
                  f"{r['auto_throughput']:.4g}), naive DAG MILP {r['naive_s']:.3f} s "
                  f"({r['naive_status']}, {r['naive_throughput']:.4g}, gap "
                  f"{100 * r['naive_gap']:.1f}%), ratio {r['ratio']:.1f}x; staged = {share}")
        ratios = [r["ratio"] for r in rows]
        print(f"  naive/default time ratio: median {statistics.median(ratios):.1f}x"
              f" (naive runs hitting the time limit count at the limit)")


if __name__ == "__main__":
    sys.exit(main())
