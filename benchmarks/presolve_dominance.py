"""Benchmark: template dominance (`core/dominance.py`) on a scenario's real template libraries.

Every fresh solve of a library set pays `dominated_templates` once (presolve then remembers
it); on `paper-extended` at n_max 6 it is over every one of 40,936 templates at the default
level, where all of them fit somewhere. This times the array route against the scalar scan it
replaced (`_dominated_by_parts_scalar` on every group), alternating, in CPU seconds of this
process, and checks the two give the same collections for the same templates.

    python benchmarks/presolve_dominance.py                            # paper-extended, n_max 6
    python benchmarks/presolve_dominance.py --size advanced --nmax 6 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from allocator import DEFAULT_REAL_NMAX, SIZES, real_templates  # noqa: E402

from coral.allocator.core import dominance  # noqa: E402
from coral.allocator.scenario.load import load_scenario  # noqa: E402
from coral.catalog import default_catalog  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="paper-extended", choices=SIZES)
    ap.add_argument("--nmax", type=int, default=None,
                    help="n_max of the libraries (default: the benchmark's for the size)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    catalog = default_catalog()
    scenario = load_scenario(args.size, catalog=catalog)
    scenario = scenario.in_mode(scenario.spec.mode)
    templates = real_templates(scenario, catalog, args.nmax or DEFAULT_REAL_NMAX[args.size])
    seconds: dict[str, list[float]] = {"arrays": [], "scalar": []}
    found: dict[str, dict[str, tuple[str, ...]]] = {}
    for _ in range(args.repeat):
        for route in seconds:
            if route == "scalar":
                saved = dominance._fits_codes
                dominance._fits_codes = lambda first: False
            start = time.process_time()
            try:
                found[route] = dominance.dominated_templates(templates)
            finally:
                if route == "scalar":
                    dominance._fits_codes = saved
            seconds[route].append(time.process_time() - start)
    same = found["arrays"] == found["scalar"]
    print(f"{args.size}: {len(templates)} templates, {len(found['arrays'])} dominated; "
          f"the same collections on both routes: {'yes' if same else 'NO'}")
    for route, got in seconds.items():
        print(f"  {route:6} CPU s: median {statistics.median(got):.2f} "
              f"(runs {', '.join(f'{s:.2f}' for s in got)})")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
