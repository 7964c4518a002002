"""Benchmark: build a scenario's template libraries as `coral plan` does, one by one, and say
how long each took (wall and CPU, this process and its workers); optionally dump every
library's templates (combination, rate, TPOT, TTFT, stages) to compare two trees exactly.

    python benchmarks/library_build.py --models llama-3.1-8b --modes aggregated --nmax 4
    python benchmarks/library_build.py --nmax 6 --workers 2 --dump /tmp/after.json
    python benchmarks/library_build.py --compare /tmp/before.json /tmp/after.json

The libraries are built afresh (nothing cached: `out=None`) with the arguments
`coral.planning.libraries.templates_for_scenario` passes: the scenario's SLO per model, its
node types, regions and `rho`, engine and topology as asked.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from typing import Any

from coral.allocator.scenario.load import scenario_slo
from coral.planning.libraries import build_regions
from coral.allocator.scenario.load import load_scenario
from coral.catalog import default_catalog
from coral.templates.builder.build import build_library
from coral.templates.builder.build_options import BuildOptions
from coral.templates.space.engines import engine_topology
from coral.templates.builder.parallel import default_perf_factory
from coral.templates.template import Template

#: Relative tolerance of the comparison of two dumps (rates, TPOT, TTFT).
RTOL = 1e-9


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def template_record(t: Template) -> dict[str, Any]:
    """What must not change when the search gets faster: the combination, its rate and
    latencies, and the instance's stages."""
    return {
        "combo": list(t.combo),
        "throughput": t.throughput,
        "upper_bound": t.upper_bound,
        "tpot_s": t.tpot_s,
        "ttft_s": t.ttft_s,
        "nodes": [[n.node_type, n.first_layer, n.layers, n.batch] for n in t.nodes],
    }


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        if math.isinf(a) or math.isinf(b):
            return a == b
        return abs(a - b) <= RTOL * max(abs(a), abs(b), 1e-30)
    return a == b


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Differences between two dumps, in words (empty: the same templates). How the dropped
    combinations split between the bound, dominance and zero may differ (a tighter bound
    skips what the search would have found dominated); the kept ones may not."""
    out: list[str] = []
    for lib in sorted(set(before) | set(after)):
        if lib not in before or lib not in after:
            out.append(f"{lib}: in one dump only")
            continue
        a = {tuple(r["combo"]): r for r in before[lib]["templates"]}
        b = {tuple(r["combo"]): r for r in after[lib]["templates"]}
        for combo in sorted(set(a) ^ set(b)):
            out.append(f"{lib} {'+'.join(combo)}: kept in {'before' if combo in a else 'after'}"
                       " only")
        for combo in sorted(set(a) & set(b)):
            for key in ("throughput", "upper_bound", "tpot_s", "ttft_s", "nodes"):
                if not _close(a[combo][key], b[combo][key]):
                    out.append(f"{lib} {'+'.join(combo)}: {key} {a[combo][key]} -> "
                               f"{b[combo][key]}")
        if before[lib]["outcomes"]["kept"] != after[lib]["outcomes"]["kept"]:
            out.append(f"{lib}: kept {before[lib]['outcomes']['kept']} -> "
                       f"{after[lib]['outcomes']['kept']}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="core")
    ap.add_argument("--models", default=None, help="comma-separated (default: the scenario's)")
    ap.add_argument("--modes", default=None, help="comma-separated (default: the scenario's "
                    "template modes for mode auto: aggregated,prefill,decode)")
    ap.add_argument("--nmax", type=int, default=None, help="default: the scenario's n_max")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--engine", default="coral")
    ap.add_argument("--dump", default=None, help="write every library's templates here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), default=None,
                    help="compare two dumps and exit (1 when they differ)")
    args = ap.parse_args(argv)

    if args.compare:
        with open(args.compare[0]) as fa, open(args.compare[1]) as fb:
            diffs = compare(json.load(fa), json.load(fb))
        for line in diffs:
            print(line)
        print("identical" if not diffs else f"{len(diffs)} difference(s)")
        return 1 if diffs else 0

    catalog = default_catalog()
    scenario = load_scenario(args.scenario, catalog=catalog)
    models = args.models.split(",") if args.models else [m.name for m in scenario.models]
    modes = args.modes.split(",") if args.modes else ["aggregated", "prefill", "decode"]
    nmax = int(args.nmax or scenario.spec.n_max)
    topology = engine_topology(args.engine, None)
    perf = default_perf_factory(catalog)
    dump: dict[str, Any] = {}
    wall0, cpu0 = time.perf_counter(), _cpu_s()
    print(f"{'library':<34} {'wall s':>8} {'cpu s':>8} {'kept':>6} {'solved':>7} {'bound':>6}")
    for model in models:
        slo = scenario_slo(scenario, model)
        for mode in modes:
            w0, c0 = time.perf_counter(), _cpu_s()
            kept, report = build_library(
                model, catalog, slo=slo, mode=mode, nmax=nmax, rho=scenario.spec.rho,
                node_types=scenario.node_types, regions=build_regions(scenario),
                options=BuildOptions(topology=topology, engine=args.engine,
                                     workers=args.workers),
                out=None, perf=perf)
            wall, cpu = time.perf_counter() - w0, _cpu_s() - c0
            name = f"{model}/{mode}"
            print(f"{name:<34} {wall:8.1f} {cpu:8.1f} {len(kept):6d} {report.solved:7d} "
                  f"{report.outcomes['bound']:6d}", flush=True)
            dump[name] = {"wall_s": wall, "cpu_s": cpu, "outcomes": report.outcomes,
                          "templates": [template_record(t) for t in kept]}
    print(f"{'total':<34} {time.perf_counter() - wall0:8.1f} {_cpu_s() - cpu0:8.1f}")
    if args.dump:
        with open(args.dump, "w") as fh:
            json.dump(dump, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
