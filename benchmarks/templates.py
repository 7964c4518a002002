"""Benchmark: build template libraries and report how long generation takes.

Default run: every catalog model at its default SLO, N_max 6, rho 12, every node type,
aggregated mode, flow topology — the full default library the design calls for — on one
worker per CPU. Prints per model and in total: combinations enumerated, pruned (memory too
low, memory above rho x the weights, no common region), skipped by a bound, solved,
dominated, kept; median and p99 seconds per solve; wall and CPU seconds (this process and its
workers); the share solved to proven optimality; and whether the whole default library was
built within the target (30 minutes).

Two checks run after the timed part (not counted in it):

* `--verify K`: per model, K random combinations are solved again from scratch with the
  reference method — the complete flow optimum (best split into replicas, each by the
  ordered DP), no floor — and the library's decision must agree: a kept template has that
  throughput, a dropped combination's optimum is no more than its parts' best.
* `--sample K`: on K of the largest combinations the naive MILP of the general DAG (topology
  `dag`, `method="naive"`: the obvious formulation) is solved too, and its time reported as
  a ratio of the default method's, with how close the staged template comes to the DAG's
  proven bound.

    python benchmarks/templates.py                                 # the full default library
    python benchmarks/templates.py --models llama-3.1-8b --nmax 3  # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from coral.catalog import default_catalog
from coral.templates.builder.build import build_library
from coral.templates.builder.build_options import BuildOptions
from coral.templates.builder.solve import DOMINANCE_RTOL, build_template
from coral.templates.space.enumerate import DEFAULT_NMAX, DEFAULT_RHO, enumerate_combinations
from coral.templates.space.operating_points import DEFAULT_BATCHES, OperatingPointTables
from coral.templates.builder.parallel import default_perf_factory
from coral.templates.placement.exact import solve_placement
from coral.templates.slo import default_slo
from coral.templates.builder.store import TemplateLibrary

#: The design's budget for the whole default library on a 2-core machine, s.
TARGET_S = 30 * 60.0


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    idx = min(len(values) - 1, max(0, int(round(q * len(values) + 0.5)) - 1))
    return values[idx]


def _cpu_s() -> tuple[float, float]:
    """CPU seconds of this process, and of its finished child processes (the workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def _cpu_since(start: tuple[float, float]) -> tuple[float, float]:
    now = _cpu_s()
    return now[0] - start[0], now[1] - start[1]


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


def _verify(cat, perf, model, slo, path, k, topology, batches, seed) -> dict:
    """Re-solve `k` random combinations of the library at `path` from scratch and compare."""
    records = TemplateLibrary.open(path).records_by_combo()
    rng = random.Random(seed)
    picks = rng.sample(sorted(records), min(k, len(records)))
    tables = OperatingPointTables(perf, cat, batches=batches)
    agree, rows = 0, []
    start = time.perf_counter()
    for combo in picks:
        rec = records[combo]
        problem = tables.problem(model, combo, slo, "aggregated", topology)
        ref = solve_placement(problem).throughput  # no floor: the complete optimum
        best_sub = float(rec.get("best_sub") or 0.0)
        if rec["outcome"] == "kept":
            ok = abs(float(rec["throughput"]) - ref) <= DOMINANCE_RTOL * max(ref, 1e-12)
        else:
            ok = ref <= best_sub * (1 + DOMINANCE_RTOL) or ref <= 0.0
        agree += ok
        rows.append({"combo": list(combo), "outcome": rec["outcome"],
                     "throughput": rec.get("throughput"), "best_sub": best_sub,
                     "reference": ref, "agrees": ok})
    return {"checked": len(picks), "agree": agree, "wall_s": time.perf_counter() - start,
            "rows": rows}


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
    ap.add_argument("--nmax", type=int, default=DEFAULT_NMAX)
    ap.add_argument("--rho", type=float, default=DEFAULT_RHO)
    ap.add_argument("--nodes", help="comma-separated node types [default: all]")
    ap.add_argument("--topology", default="flow", choices=("flow", "chain", "dag"))
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve")
    ap.add_argument("--workers", type=int, default=None, help="[default: one per CPU]")
    ap.add_argument("--batches", help="comma-separated decode batch sizes [default: 1..256]")
    ap.add_argument("--verify", type=int, default=20,
                    help="combinations per model re-solved from scratch and compared (0: skip)")
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
    full_default = (not args.models and nodes is None and args.nmax == DEFAULT_NMAX
                    and args.rho == DEFAULT_RHO and args.topology == "flow"
                    and batches == DEFAULT_BATCHES)

    timing = _table_timing(cat, perf, models, batches)
    results, cpu = [], []
    t_all, cpu_all = time.perf_counter(), _cpu_s()
    for m in models:
        slo = default_slo(cat.model(m))
        cpu0 = _cpu_s()
        _, report = build_library(
            m, cat, slo=slo, nmax=args.nmax, rho=args.rho, node_types=nodes,
            options=BuildOptions(batches=batches, topology=args.topology, workers=args.workers,
                                 time_limit_s=args.time_limit),
            out=root / m / "aggregated",
            progress=not args.no_progress and sys.stderr.isatty(),
            on_message=lambda msg: print(msg, file=sys.stderr),
        )
        cpu.append(_cpu_since(cpu0))
        results.append(report)
    wall_all = time.perf_counter() - t_all
    cpu_main, cpu_workers = _cpu_since(cpu_all)

    verify = {}
    if args.verify > 0:
        for m in models:
            verify[m] = _verify(cat, perf, m, default_slo(cat.model(m)),
                                root / m / "aggregated", args.verify, args.topology, batches,
                                args.seed)
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
    per_model = []
    for r, (c_main, c_workers) in zip(results, cpu):
        s = r.summary()
        s["cpu_s"] = c_main + c_workers
        s["cpu_main_s"] = c_main
        per_model.append(s)
    out = {
        "models": models,
        "nmax": args.nmax,
        "rho": args.rho,
        "topology": args.topology,
        "batches": list(batches),
        "workers": args.workers or os.cpu_count(),
        "cpus": os.cpu_count(),
        "library_root": str(root),
        "option_tables": timing,
        "per_model": per_model,
        "total": {
            "enumerated": sum(r.enumeration["enumerated"] for r in results),
            "pruned_memory_low": sum(r.enumeration["pruned_memory_low"] for r in results),
            "pruned_memory_high": sum(r.enumeration["pruned_memory_high"] for r in results),
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
            "cpu_s": cpu_main + cpu_workers,
            "cpu_main_s": cpu_main,
            "full_default_library": full_default,
            "target_s": TARGET_S,
            "target_met": full_default and wall_all < TARGET_S,
        },
        "verify": verify,
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
    print(f"workers: {out['workers']} on {out['cpus']} CPUs; N_max {out['nmax']}, rho "
          f"{out['rho']:g}, topology {out['topology']}")
    hdr = (f"{'model':22} {'enum':>7} {'mem<':>6} {'mem>':>7} {'region':>7} {'cand':>6} "
           f"{'bound':>6} {'solved':>6} {'dom':>6} {'zero':>5} {'kept':>6} {'med s':>7} "
           f"{'p99 s':>6} {'opt %':>6} {'wall s':>7} {'cpu s':>7}")
    print(hdr)
    for s in out["per_model"]:
        o = s["outcomes"]
        med, p99, opt = s["solve_s_median"], s["solve_s_p99"], s["optimal_share"]
        print(f"{s['model']:22} {s['combos_enumerated']:>7} {s['combos_pruned_memory_low']:>6} "
              f"{s['combos_pruned_memory_high']:>7} {s['combos_pruned_no_region']:>7} "
              f"{s['combos_candidates']:>6} {o['bound']:>6} {s['solved_now']:>6} "
              f"{o['dominated']:>6} {o['infeasible'] + o['zero']:>5} {o['kept']:>6} "
              f"{'-' if med is None else f'{med:.4f}':>7} "
              f"{'-' if p99 is None else f'{p99:.3f}':>6} "
              f"{'-' if opt is None else f'{100 * opt:.1f}':>6} {s['wall_s']:>7.1f} "
              f"{s['cpu_s']:>7.1f}")
    tot = out["total"]
    print(f"total: enumerated {tot['enumerated']}, pruned: memory below the weights "
          f"{tot['pruned_memory_low']}, memory above rho {tot['pruned_memory_high']}, no common "
          f"region {tot['pruned_no_region']}; candidates {tot['candidates']}, skipped by bound "
          f"{tot['skipped_by_bound']}, solved {tot['solved']} (+{tot['reused']} reused), "
          f"dominated {tot['dominated']}, infeasible/zero {tot['infeasible_or_zero']}, kept "
          f"{tot['kept']}")
    if tot["solve_s_median"] is not None:
        print(f"solve seconds: median {tot['solve_s_median']:.4f}, p99 {tot['solve_s_p99']:.3f}, "
              f"sum {tot['solve_s_sum']:.1f}; optimal {100 * tot['optimal_share']:.1f}%")
    print(f"wall {tot['wall_s']:.1f} s, CPU {tot['cpu_s']:.1f} s (this process "
          f"{tot['cpu_main_s']:.1f} s, its workers the rest)")
    if tot["full_default_library"]:
        verdict = "met" if tot["target_met"] else "NOT met"
        print(f"target (the full default library in under {tot['target_s'] / 60:.0f} min): "
              f"{verdict} ({tot['wall_s'] / 60:.1f} min)")
    else:
        print("target: not judged (not the full default library: models, nodes, N_max, rho, "
              "topology or batches differ from the defaults)")
    for m, v in out["verify"].items():
        bad = [r for r in v["rows"] if not r["agrees"]]
        print(f"verify {m}: {v['agree']}/{v['checked']} combinations agree with a from-scratch "
              f"solve ({v['wall_s']:.1f} s)" + (f"; DISAGREE: {bad}" if bad else ""))
    for m, rows in out["naive_sample"].items():
        print(f"naive DAG MILP vs default (staged DP) on {len(rows)} {len(rows[0]['combo'])}"
              f"-node combinations of {m}:")
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
