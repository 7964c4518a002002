"""Benchmark: Helix's placement of Llama 2 70B on Helix's cluster (`paper-helix.yaml`), or a
cluster of the same mix, by step.

`--method boundary` (what `coral evaluate --paper` runs): the boundary MILP of
`coral.baselines.helix_cluster` under `--time-limit`, with its size, warm start, bound and
gap, then the share of its flow on paths meeting the SLO. `--method staged`: the per-node
path `helix_placement` took before, step by step (the no-SLO staged DP, the SLO-bound one,
the path LP); it grows with the product of (nodes of a type + 1), so keep the cluster small.

    python benchmarks/helix_cluster.py --counts 4,6,16,38 --time-limit 30
    python benchmarks/helix_cluster.py --counts 1,2,4,10 --method staged
    python benchmarks/helix_cluster.py --counts 4,6,16,38 --time-limit 150 --log
"""

from __future__ import annotations

import argparse
import time
from importlib import resources

TYPES = ("1x-a100-40gb", "1x-v100", "1x-l4", "1x-t4")
MODEL = "llama-2-70b"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default="4,6,16,38",
                    help="nodes of A100-40GB, V100, L4, T4 (Helix's cluster: 4,6,16,38)")
    ap.add_argument("--method", choices=("boundary", "staged"), default="boundary")
    ap.add_argument("--time-limit", type=float, default=30.0, help="MILP time limit, s")
    ap.add_argument("--log", action="store_true", help="HiGHS's progress log")
    args = ap.parse_args()

    from coral.allocator.scenario.load import load_scenario, scenario_slo
    from coral.baselines.helix import no_slo, slo_share
    from coral.catalog import load_catalog
    from coral.templates.builder.parallel import default_perf_factory
    from coral.templates.space.operating_points import shared_tables

    counts = [int(x) for x in args.counts.split(",")]
    if len(counts) != len(TYPES):
        raise SystemExit(f"--counts: give {len(TYPES)} numbers ({', '.join(TYPES)})")
    nodes = [t for t, n in zip(TYPES, counts) for _ in range(n)]
    t0 = time.perf_counter()
    cat = load_catalog(())
    path = resources.files("coral.evaluation") / "data" / "paper-helix.yaml"
    slo = scenario_slo(load_scenario(str(path), catalog=cat), MODEL)
    perf = default_perf_factory(cat)
    tables = shared_tables(perf, cat)
    print(f"{len(nodes)} nodes {dict(zip(TYPES, counts))}; catalog and operating points "
          f"{time.perf_counter() - t0:.2f} s")
    if args.method == "staged":
        from coral.baselines.common import TemplateBuilder

        b = TemplateBuilder(cat, perf, tables)
        combo = tuple(sorted(nodes))
        for what, s in (("no-SLO placement", no_slo(slo)), ("SLO-bound placement", slo)):
            t = time.perf_counter()
            tpl = b.get(MODEL, combo, s, "aggregated", one_pipeline=False)
            print(f"{what}: {time.perf_counter() - t:.2f} s, {tpl.throughput_rps:.4g} req/s")
            if s is not slo:
                loose = tpl
        t = time.perf_counter()
        share = slo_share(loose, slo)
        print(f"path LP: {time.perf_counter() - t:.3f} s, share {share:.3f}")
        return

    from coral.baselines.helix_cluster import cluster_placement

    t = time.perf_counter()
    cp = cluster_placement(MODEL, nodes, no_slo(slo), catalog=cat, tables=tables,
                           time_limit_s=args.time_limit, log=args.log)
    st = cp.stats
    print(f"boundary MILP: {int(st['cols']):,} columns ({int(st['integers']):,} integer), "
          f"{int(st['rows']):,} rows, {int(st['nonzeros']):,} nonzeros; problem, warm start "
          f"and build {st['build_s']:.2f} s, HiGHS {st['solve_s']:.2f} s "
          f"({int(st['bb_nodes'])} B&B nodes), all {time.perf_counter() - t:.2f} s")
    print(f"warm start {st['warm_start']:.4g} req/s; coverage bound "
          f"{st['coverage_bound']:.4g}, layer-cover bound {st['layer_cover_bound']:.4g} req/s "
          f"({st['bound_s']:.2f} s); placement {cp.describe()}")
    t = time.perf_counter()
    share = cp.slo_share(slo)
    print(f"path LP over entries: {time.perf_counter() - t:.4f} s, share meeting the SLO "
          f"{share:.3f}")


if __name__ == "__main__":
    main()
