"""Supply of the paper scenarios' `scarce` level: MARGIN above the estimated demand.

The demand is estimated in GPUs as the GPUs of the homogeneous baseline's plan (`homo`: one
node type per replica, the cheapest such plan) at the default level, in the scenario's own
mode and n_max, on the template libraries under out/templates. The scarce supply,
(1 + MARGIN) times that many GPUs, is spread over the (node type, region) pools in proportion
to each pool's GPUs at the default level: a pool's share in nodes is `f * base nodes`, with
`f` = target GPUs / default GPUs. Whole nodes: every pool first gets the floor of its share,
then pools take one more node in order of their largest remainder until the GPUs reach the
target. Prints the level as YAML to paste into the scenario.

Run: `python benchmarks/paper_scarce.py paper-core 0.25 [NMAX]` (paper-extended: 0.75;
NMAX defaults to the scenario's n_max).
"""

from __future__ import annotations

import math
import sys

from coral.allocator.scenario.load import load_scenario
from coral.catalog import default_catalog
from coral.planning.options import PlanOptions
from coral.planning.plan import plan_scenario
from coral.templates.builder.build_options import BuildOptions


def main(scenario: str, margin: float, nmax: int | None = None,
         baseline: str = "homo") -> None:
    cat = default_catalog()
    sc = load_scenario(scenario, level="default", catalog=cat)
    result = plan_scenario(sc, catalog=cat, options=PlanOptions(
        build=BuildOptions(workers=None), nmax=nmax))
    base = result.baselines[baseline]
    if not base.meets_demand:
        raise SystemExit(f"{baseline} does not serve all demand at the default level")
    gpus = sum(cat.node_types[g].gpu_count * n * inst.count for inst in base.instances
               for g, n in inst.node_counts.items())
    source = (f"{baseline}'s plan at n_max {result.nmax}, "
              f"${base.cost_per_hour:.2f}/hour")
    target = math.ceil((1.0 + margin) * gpus)
    pools = {(g, r): n for (g, r), n in sc.availability.items()}
    default_gpus = sum(cat.node_types[g].gpu_count * n for (g, _), n in pools.items())
    f = target / default_gpus
    share = {k: f * n for k, n in pools.items()}
    counts = {k: math.floor(s) for k, s in share.items()}
    have = sum(cat.node_types[g].gpu_count * n for (g, _), n in counts.items())
    order = sorted(pools, key=lambda k: (-(share[k] - counts[k]), k))
    i = 0
    while have < target:
        k = order[i % len(order)]
        counts[k] += 1
        have += cat.node_types[k[0]].gpu_count
        i += 1
    print(f"# demand estimate: {gpus} GPUs ({source}); "
          f"target {target} GPUs; placed {have}")
    print("  scarce:")
    print(f'    description: "supply {margin:.0%} above the estimated demand ({gpus} GPUs): '
          f'{have} GPUs"')
    print("    scale: 0.0  # pools not listed have none")
    print("    counts:")
    for r in sc.regions:
        row = {g: counts[(g, rr)] for (g, rr) in pools if rr == r}
        body = ", ".join(f"{g}: {n}" for g, n in row.items())
        print(f"      {r}: {{{body}}}")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
