"""The perf model against public measurements on the cards without a profile (issue 33).

Reads `benchmarks/data/public_measurements.yaml` (every figure with its source) and predicts
each figure with Coral's perf model, on the committed efficiencies and catalog:

- `prefill` / `decode` (Helix's per-layer profiles): `PerfModel.iteration_seconds` of ONE layer
  on the 1-GPU node type, less the per-iteration host overhead (`ITERATION_OVERHEAD_S`): the
  profiles time a layer's kernels, not the engine's step; no embedding, no LM head.
- `step` (whole decode steps of an engine): every layer plus the embedding and the final norm
  and LM head (`first_stage`, `last_stage`) plus `ITERATION_OVERHEAD_S` (sampling and the host's
  per-step work), at the stated batch and mean context.
- `gemm` (square torch.mm benchmarks): one matmul kernel as the perf model times it
  (`coral.perf.kernel_time.kernel_seconds`: 2 n^3 FLOPs at the GPU's peak x eta_compute, 3 n^2
  fp16 elements at its bandwidth x eta_memory, plus the per-kernel time); a `best` figure
  against the best of the same sizes (1024-10240) predicted.

Error = predicted / measured time - 1: negative means the model predicts the card too fast.
Prints, per card and phase, the number of points, the signed median, the error of largest size
(with its sign) and how many points are too fast; then median and max |error| over the LLM
points (prefill, decode, step) and over the GEMM points.

    python benchmarks/perf_public.py [--points] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from coral.catalog.loader import Catalog, default_catalog
from coral.catalog.schema import ModelArch
from coral.perf.kernel_time import kernel_seconds
from coral.perf.model import ITERATION_OVERHEAD_S, PerfModel

DATA = Path(__file__).with_name("data") / "public_measurements.yaml"
#: Square sizes the GEMM benchmark times; a `best` figure is the best of these.
GEMM_SIZES = (1024, 2048, 4096, 8192, 10240)
#: A point whose rounding (half its resolution) can exceed this share of it is left out.
MAX_ROUNDING = 0.05
LLM_PHASES = ("prefill", "decode", "step")


@dataclass(frozen=True)
class Point:
    """One measured figure and its prediction (seconds)."""

    gpu: str
    phase: str
    what: str
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


def _models(doc: dict, catalog: Catalog) -> dict[str, ModelArch | str]:
    """Catalog models by name, plus the file's own architectures."""
    out: dict[str, ModelArch | str] = {name: name for name in catalog.models}
    for name, d in (doc.get("models") or {}).items():
        out[name] = ModelArch(name=name, **d)
    return out


def _gemm_seconds(perf: PerfModel, catalog: Catalog, gpu: str, n: int) -> float:
    """One n x n x n fp16 matmul as the perf model times a kernel."""
    g = catalog.gpu(gpu)
    eff = perf.efficiencies_for(g)
    compute = 2.0 * n**3 / (g.bf16_tflops * 1e12 * eff.eta_compute)
    memory = 3.0 * n * n * 2 / (g.mem_bandwidth_gb_per_s * 1e9 * eff.eta_memory)
    return kernel_seconds(compute, memory, eff.kernel_overhead_s)


def helix_points(doc: dict, perf: PerfModel, models: dict) -> list[Point]:
    """Helix's per-layer prefill and decode times, one layer on one GPU."""
    group = doc["helix_layers"]
    ctx = int(group["decode_context_tokens"])
    half = {"prefill": group["prefill_resolution_ms"] / 2,
            "decode": group["decode_resolution_ms"] / 2}
    out = []
    for e in group["entries"]:
        model, node, phase = models[e["model"]], f"1x-{e['gpu']}", e["phase"]
        pairs = e["tokens_ms"] if phase == "prefill" else e["batch_ms"]
        for count, ms in pairs:
            if half[phase] / ms > MAX_ROUNDING:
                continue
            if phase == "prefill":
                t = perf.iteration_seconds(model, node, 1, prefill_tokens=count)
                what = f"{e['model']} P {count}"
            else:
                t = perf.iteration_seconds(model, node, 1, decode_batch=count,
                                           context_tokens=count * ctx)
                what = f"{e['model']} B {count} C {ctx}"
            out.append(Point(e["gpu"], phase, what, ms * 1e-3, t - ITERATION_OVERHEAD_S))
    return out


def gemm_points(doc: dict, perf: PerfModel, catalog: Catalog) -> list[Point]:
    """Square matmuls: per size, a best-of-sizes figure, and continuous loops."""
    out = []
    for e in doc["gemm_square"]["entries"]:
        if e.get("variant"):  # another board than the catalog's: listed, not scored
            continue
        gpu = e["gpu"]
        if "n_tflops" in e:
            for n, tf in e["n_tflops"]:
                out.append(Point(gpu, "gemm", f"{e['dtype']} {n}^3", 2.0 * n**3 / (tf * 1e12),
                                 _gemm_seconds(perf, catalog, gpu, n)))
        else:
            # best of the sizes, measured and predicted alike, as a time for the 8192^3 work
            best = max(2.0 * n**3 / _gemm_seconds(perf, catalog, gpu, n) for n in GEMM_SIZES)
            work = 2.0 * 8192**3
            out.append(Point(gpu, "gemm", f"{e['dtype']} best of sizes",
                             work / (e["best_tflops"] * 1e12), work / best))
    for e in doc["gemm_continuous"]["entries"]:
        n = e["n"]
        out.append(Point(e["gpu"], "gemm", f"{e['dtype']} {n}^3 continuous",
                         2.0 * n**3 / (e["tflops"] * 1e12),
                         _gemm_seconds(perf, catalog, e["gpu"], n)))
    return out


def step_points(doc: dict, perf: PerfModel, models: dict, catalog: Catalog) -> list[Point]:
    """Whole decode steps: every layer, embedding, LM head and the per-step overhead."""
    out = []
    for e in doc["decode_steps"]["entries"]:
        model = models[e["model"]]
        arch = catalog.model(model) if isinstance(model, str) else model
        b = int(e["batch"])
        t = perf.iteration_seconds(model, f"1x-{e['gpu']}", arch.num_layers, decode_batch=b,
                                   context_tokens=b * int(e["mean_context_tokens"]),
                                   first_stage=True, last_stage=True)
        out.append(Point(e["gpu"], "step", f"{e['model']} B {b}", e["ms_per_token"] * 1e-3, t))
    return out


def all_points(catalog: Catalog | None = None, perf: PerfModel | None = None,
               path: Path = DATA) -> list[Point]:
    """Every scored figure of the file with its prediction."""
    catalog = catalog or default_catalog()
    perf = perf or PerfModel(catalog)
    doc = yaml.safe_load(path.read_text())
    models = _models(doc, catalog)
    return (helix_points(doc, perf, models) + step_points(doc, perf, models, catalog)
            + gemm_points(doc, perf, catalog))


def summary(points: list[Point]) -> list[dict]:
    """Per (card, phase): n, signed median, the error of largest size, points too fast."""
    rows = []
    for key in sorted({(p.gpu, p.phase) for p in points}):
        errs = [p.error for p in points if (p.gpu, p.phase) == key]
        rows.append({"gpu": key[0], "phase": key[1], "n": len(errs),
                     "signed_median": statistics.median(errs),
                     "max": max(errs, key=abs), "too_fast": sum(e < 0 for e in errs)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", action="store_true", help="list every point")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    points = all_points()
    rows = summary(points)
    llm = [abs(p.error) for p in points if p.phase in LLM_PHASES]
    gemm = [abs(p.error) for p in points if p.phase == "gemm"]
    totals = {"llm_median_abs": statistics.median(llm), "llm_max_abs": max(llm),
              "gemm_median_abs": statistics.median(gemm), "gemm_max_abs": max(gemm)}
    if args.json:
        json.dump({"rows": rows, "totals": totals,
                   "points": [asdict(p) | {"error": p.error} for p in points]}, sys.stdout,
                  indent=1)
        print()
        return 0
    print(f"{'card':10} {'phase':8} {'n':>3} {'signed median':>14} {'max':>8} {'too fast':>9}")
    for r in rows:
        print(f"{r['gpu']:10} {r['phase']:8} {r['n']:3d} {100 * r['signed_median']:+13.1f}% "
              f"{100 * r['max']:+7.1f}% {r['too_fast']:>5d}/{r['n']}")
    print(f"LLM points ({len(llm)}): |error| median {100 * totals['llm_median_abs']:.1f} %, "
          f"max {100 * totals['llm_max_abs']:.1f} %")
    print(f"GEMM points ({len(gemm)}): |error| median {100 * totals['gemm_median_abs']:.1f} %, "
          f"max {100 * totals['gemm_max_abs']:.1f} %")
    if args.points:
        for p in points:
            print(f"{p.gpu:10} {p.phase:8} {p.what:28} measured {p.measured_s * 1e3:9.3f} ms, "
                  f"predicted {p.predicted_s * 1e3:9.3f} ms, {100 * p.error:+6.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
