"""Leave-one-GPU-out validation of the perf model (issue 22).

Each measured GPU type (a100-80gb, h100-sxm, a40 from Vidur's operator profiles; h200 from the
shipped whole-layer tables) is predicted with the figures a GPU type without a profile gets,
borrowed from fits on the other types only; `--no-sustained` borrows without the sustained-
throughput scaling (the model before it); `--no-elementwise` carries the element-wise figure by
the DRAM ratio alone instead of the SM-issue/DRAM ceilings (perf model 4). Prints, per
held-out type, |predicted/measured - 1| median and max for prefill and decode separately
(whole layers; the h200's dense models), per operator class, and the h200's MoE layers.

    python benchmarks/perf_holdout.py [--no-sustained] [--no-elementwise] [--json] [--worst N]
    python benchmarks/perf_holdout.py --write-uncertainty

`--write-uncertainty` writes `coral/perf/data/uncertainty.yaml`, the per-GPU slowdowns that
`coral plan --robust auto` plans against (`coral.perf.uncertainty`).

`--worst N` lists each held-out type's N worst whole-layer points per step kind (model, TP,
tokens or batch and context, measured and predicted), where the maxima sit.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from coral.catalog.loader import Catalog, default_catalog
from coral.perf.model import PerfModel
from coral.perf.calibration import _points, predict_kernels
from coral.perf import uncertainty
from coral.perf.holdout import DECODE_TOKENS, VIDUR_CLASSES, HeldOutGpu, leave_one_gpu_out
from coral.perf.validation import PACKAGED_PROFILES, compare, load_tables
from coral.perf.vidur_profiles import VIDUR_GPUS, load_vidur_profiles
from perf_public import unfitted_errors  # the layer-fitted cards' public points

CLASSES = (*VIDUR_CLASSES, "layer", "dense layer", "moe layer")


def worst_points(catalog: Catalog, held: HeldOutGpu, n: int) -> list[str]:
    """The `n` worst whole-layer points of each step kind for one held-out type."""
    eff, out = held.figures, []
    vgpu = {v: k for k, v in VIDUR_GPUS.items()}.get(held.gpu)
    if vgpu:
        prof = load_vidur_profiles()
        sub = prof.select(prof.gpu == vgpu)
        roof, ew = predict_kernels(_points(sub, catalog), eff.eta_compute, eff.eta_memory,
                                   eff.eta_elementwise, eff.kernel_overhead_s)
        pred = roof.sum(axis=0) + ew.sum(axis=0)
        err = pred / (sub.layer_ms * 1e-3) - 1.0
        for kind, mask in (("decode", sub.num_tokens <= DECODE_TOKENS),
                           ("prefill", sub.num_tokens > DECODE_TOKENS)):
            idx = np.flatnonzero(mask)
            for i in idx[np.argsort(-np.abs(err[idx]))][:n]:
                out.append(f"{held.gpu:10} {kind:8} {sub.model[i].split('/')[-1]:28} "
                           f"TP {sub.tp[i]} T {sub.num_tokens[i]:5d}: measured "
                           f"{sub.layer_ms[i] * 1e3:8.1f} us, predicted {pred[i] * 1e6:8.1f} us, "
                           f"{100 * err[i]:+.1f} %")
        return out
    points = [p for v in compare(load_tables([PACKAGED_PROFILES / "h200"]), catalog, eff)
              for p in v.points]
    for kind in ("decode", "prefill"):
        pts = sorted((p for p in points if p.kind == kind), key=lambda p: -abs(p.rel_error))
        for p in pts[:n]:
            out.append(f"{held.gpu:10} {kind:8} {p.model:28} P {p.prefill_tokens} B "
                       f"{p.decode_batch} C {p.context_tokens}: measured {p.measured_s * 1e6:8.1f}"
                       f" us, predicted {p.predicted_s * 1e6:8.1f} us, {100 * p.rel_error:+.1f} %")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-sustained", action="store_true",
                    help="borrow figures without the sustained-throughput scaling")
    ap.add_argument("--no-elementwise", action="store_true",
                    help="carry element-wise figures by the DRAM ratio, not the SM/DRAM ceilings")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write-uncertainty", action="store_true",
                    help="write coral/perf/data/uncertainty.yaml (`coral plan --robust auto`'s "
                    "per-GPU slowdowns) from the figures plans use and this check")
    ap.add_argument("--worst", type=int, default=0, metavar="N",
                    help="list each held-out type's N worst points per step kind")
    args = ap.parse_args(argv)
    catalog = default_catalog()
    if args.write_uncertainty:
        perf = PerfModel(catalog)
        figures = uncertainty.measure(catalog, perf,
                                      layer_fitted=unfitted_errors(catalog, perf))
        print(f"wrote {uncertainty.write(figures)}: {json.dumps(figures)}")
        return 0
    results = leave_one_gpu_out(catalog, sustained=not args.no_sustained,
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
    if args.worst:
        print(f"\nWorst {args.worst} whole-layer points per held-out type and step kind")
        for r in results:
            print("\n".join(worst_points(catalog, r, args.worst)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
