"""Leave-one-GPU-out validation of the perf model (issue 22).

Each measured GPU type (a100-80gb, h100-sxm, a40 from Vidur's operator profiles; h200 from the
shipped whole-layer tables) is predicted with the figures a GPU type without a profile gets,
borrowed from fits on the other types only; `--no-sustained` borrows without the sustained-
throughput scaling (the model before it); `--no-elementwise` carries the element-wise figure by
the DRAM ratio alone instead of the SM-issue/DRAM ceilings (perf model 4). Prints, per held-out type, |predicted/measured - 1|
median and max for prefill and decode separately (whole layers; the h200's dense models), per
operator class, and the h200's MoE layers.

    python benchmarks/perf_holdout.py [--no-sustained] [--no-elementwise] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from coral.catalog.loader import default_catalog
from coral.perf.holdout import VIDUR_CLASSES, leave_one_gpu_out

CLASSES = (*VIDUR_CLASSES, "layer", "dense layer", "moe layer")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-sustained", action="store_true",
                    help="borrow figures without the sustained-throughput scaling")
    ap.add_argument("--no-elementwise", action="store_true",
                    help="carry element-wise figures by the DRAM ratio, not the SM/DRAM ceilings")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results = leave_one_gpu_out(default_catalog(), sustained=not args.no_sustained,
                                elementwise=not args.no_elementwise)
    rows = []
    for r in results:
        e = r.figures
        for (cls, kind), err in sorted(r.errors.items(), key=lambda kv: (
                CLASSES.index(kv[0][0]), kv[0][1])):
            rows.append({"gpu": r.gpu, "class": cls, "kind": kind, "n": err.n,
                         "median_abs": err.median_abs, "median_signed": err.median_signed,
                         "max_abs": err.max_abs, "borrowed_from": e.borrowed_from,
                         "eta_compute": e.eta_compute, "eta_memory": e.eta_memory})
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        return 0
    label = "datasheet peaks" if args.no_sustained else "sustained throughput"
    print(f"Leave-one-GPU-out, borrowed figures scaled by {label}: "
          "|predicted/measured - 1| in %, signed median in brackets")
    print(f"{'held out':10} {'from':10} {'class':12} {'kind':8} {'n':>5} "
          f"{'median':>8} {'(signed)':>9} {'max':>7}")
    for x in rows:
        print(f"{x['gpu']:10} {x['borrowed_from'] or '-':10} {x['class']:12} {x['kind']:8} "
              f"{x['n']:5d} {100 * x['median_abs']:8.1f} {100 * x['median_signed']:+9.1f} "
              f"{100 * x['max_abs']:7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
