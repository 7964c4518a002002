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

The cards with Helix profiles have their matmul efficiency fitted on their own prefill layers
(`coral.perf.layer_fits`): on `FIT_MODEL`'s, scored on `HELD_OUT_MODEL`'s, a cross-model
hold-out. `--fits` prints each card's carried and fitted figure with its in-sample and
held-out signed errors; `--write-fits` writes `coral/perf/data/layer_fits.yaml`;
`--no-layer-fits` scores the model without them (borrowed figures only, perf model 7).
`--curves` scores every batch of 2-100 of Helix's decode files instead of the three each
`helix_layers` entry keeps (`helix_decode_curves`), per card and model, to show where the
boards' kernels change with the row count.

    python benchmarks/perf_public.py [--points] [--json] [--fits] [--no-layer-fits] [--curves]
    python benchmarks/perf_public.py --write-fits
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from coral.catalog.loader import Catalog, default_catalog
from coral.catalog.schema import ModelArch
from coral.perf.kernel_time import kernel_seconds
from coral.perf.layer_fits import LayerFit, write_layer_fits
from coral.perf.model import ITERATION_OVERHEAD_S, PerfModel

DATA = Path(__file__).with_name("data") / "public_measurements.yaml"
#: Square sizes the GEMM benchmark times; a `best` figure is the best of these.
GEMM_SIZES = (1024, 2048, 4096, 8192, 10240)
#: A point whose rounding (half its resolution) can exceed this share of it is left out.
MAX_ROUNDING = 0.05
LLM_PHASES = ("prefill", "decode", "step")
#: Helix model whose prefill layers each card's matmul efficiency is fitted on, and the one it
#: is scored on (LLaMA-1-30B: no grouped KV heads; Llama-2-70B: grouped, 1.6x a layer's
#: weights).
FIT_MODEL = "llama-1-30b"
HELD_OUT_MODEL = "llama-2-70b"
#: Bracket of the fitted efficiency and the golden-section steps that narrow it below 1e-6.
FIT_BRACKET = (0.05, 1.0)
FIT_STEPS = 40


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


def curve_points(doc: dict, perf: PerfModel, models: dict) -> list[Point]:
    """Every batch of Helix's decode files (`helix_decode_curves`), scored as `helix_points`
    scores a decode point; `what` names the model and the batch."""
    group = doc["helix_decode_curves"]
    ctx = int(group["decode_context_tokens"])
    half = group["decode_resolution_ms"] / 2
    out = []
    for e in group["entries"]:
        for count, ms in e["batch_ms"]:
            if half / ms > MAX_ROUNDING:
                continue
            t = perf.iteration_seconds(models[e["model"]], f"1x-{e['gpu']}", 1,
                                       decode_batch=count, context_tokens=count * ctx)
            out.append(Point(e["gpu"], "decode", f"{e['model']} B {count}", ms * 1e-3,
                             t - ITERATION_OVERHEAD_S))
    return out


def curves_report(points: list[Point]) -> list[str]:
    """Per card and model: points, signed median, the error of largest size, how many within
    10 %, and every batch's error."""
    lines = [f"{'card':10} {'model':12} {'n':>3} {'signed median':>14} {'max':>8} "
             f"{'within 10 %':>12}"]
    keys = sorted({(p.gpu, p.what.split(' B ')[0]) for p in points})
    for gpu, model in keys:
        mine = [p for p in points if p.gpu == gpu and p.what.startswith(model + " B ")]
        worst = max(mine, key=lambda p: abs(p.error))
        lines.append(f"{gpu:10} {model:12} {len(mine):3d} "
                     f"{100 * statistics.median(p.error for p in mine):+13.1f}% "
                     f"{100 * worst.error:+7.1f}% "
                     f"{sum(abs(p.error) <= 0.10 for p in mine):>7d}/{len(mine)}")
        lines.append("    " + " ".join(f"{p.what.split(' B ')[1]}:{100 * p.error:+.0f}"
                                        for p in mine))
    return lines


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


def _signed_median(points: list[Point]) -> float:
    return statistics.median(p.error for p in points)


def _prefill(points: list[Point], gpu: str, model: str) -> list[Point]:
    return [p for p in points if p.gpu == gpu and p.phase == "prefill"
            and p.what.startswith(f"{model} P ")]


def fit_layer_levels(catalog: Catalog | None = None, path: Path = DATA) -> dict[str, LayerFit]:
    """Each borrowing card's matmul efficiency fitted on its own `FIT_MODEL` prefill layers
    (least squares on log predicted / measured, golden section: the prediction falls
    monotonically with the efficiency), with its in-sample and `HELD_OUT_MODEL` errors."""
    catalog = catalog or default_catalog()
    doc = yaml.safe_load(path.read_text())
    models = _models(doc, catalog)
    carried = PerfModel(catalog, layer_fits={})
    gpus = sorted({e["gpu"] for e in doc["helix_layers"]["entries"]
                   if e["model"] == FIT_MODEL and e["phase"] == "prefill"})
    fits = {}
    for gpu in gpus:
        if not carried.efficiencies_for(gpu).borrowed_from:
            continue  # an operator fit of its own stands

        def scored(eta: float, gpu: str = gpu) -> list[Point]:
            fit = LayerFit(gpu, eta, "", 0, 0.0, "", 0, 0.0)
            perf = PerfModel(catalog, layer_fits={gpu: fit})
            return [p for p in helix_points(doc, perf, models) if p.gpu == gpu]

        def loss(eta: float, gpu: str = gpu) -> float:
            return sum(math.log1p(p.error) ** 2 for p in _prefill(scored(eta), gpu, FIT_MODEL))

        lo, hi = FIT_BRACKET
        for _ in range(FIT_STEPS):
            a, b = lo + (hi - lo) * 0.381966, hi - (hi - lo) * 0.381966
            if loss(a) < loss(b):
                hi = b
            else:
                lo = a
        eta = round((lo + hi) / 2, 4)
        points = scored(eta)
        fitted, held = _prefill(points, gpu, FIT_MODEL), _prefill(points, gpu, HELD_OUT_MODEL)
        if not fitted or not held:
            raise ValueError(f"{path}: helix_layers: {gpu} needs prefill points of both "
                             f"{FIT_MODEL} and {HELD_OUT_MODEL} (after the rounding rule)")
        fits[gpu] = LayerFit(
            gpu=gpu, eta_compute=eta,
            fitted_on=f"Helix's {FIT_MODEL} prefill layers on the {gpu} ({len(fitted)} "
                      f"point{'s' if len(fitted) != 1 else ''}, "
                      "benchmarks/data/public_measurements.yaml)",
            points=len(fitted), in_sample_error=_signed_median(fitted),
            held_out_on=f"Helix's {HELD_OUT_MODEL} prefill layers",
            held_out_points=len(held), held_out_error=_signed_median(held))
    return fits


def unfitted_errors(catalog: Catalog | None = None, perf: PerfModel | None = None,
                    path: Path = DATA) -> dict[str, dict[str, list[float]]]:
    """Per layer-fitted card (`perf.layer_fits`) and phase ("prefill", "decode"), the errors of
    its LLM points that its fit did not use (every point but `FIT_MODEL`'s prefill layers; a
    whole decode step counts as decode): the held-out figures `coral.perf.uncertainty` takes
    the card's slowdowns from."""
    catalog = catalog or default_catalog()
    perf = perf or PerfModel(catalog)
    points = [p for p in all_points(catalog, perf, path) if p.phase in LLM_PHASES]
    out: dict[str, dict[str, list[float]]] = {}
    for gpu in sorted(perf.layer_fits):
        used = set(map(id, _prefill(points, gpu, FIT_MODEL)))
        phases: dict[str, list[float]] = {}
        for p in points:
            if p.gpu == gpu and id(p) not in used:
                phases.setdefault("prefill" if p.phase == "prefill" else "decode",
                                  []).append(p.error)
        if phases:
            out[gpu] = phases
    return out


def fits_report(catalog: Catalog, fits: dict[str, LayerFit]) -> list[str]:
    """Per fitted card: carried and fitted efficiency, the fitted one over the card's benchmark
    figure (where listed), and the signed in-sample and held-out errors of each."""
    carried = PerfModel(catalog, layer_fits={})
    doc = yaml.safe_load(DATA.read_text())
    models = _models(doc, catalog)
    before = helix_points(doc, carried, models)
    lines = [f"{'card':10} {'carried':>8} {'fitted':>7} {'/bench':>7} "
             f"{'in-sample ' + FIT_MODEL:>24} {'held-out ' + HELD_OUT_MODEL:>24}"]
    for gpu, fit in sorted(fits.items()):
        g = catalog.gpu(gpu)
        bench = g.sustained.benchmark_gemm_tflops if g.sustained else None
        level = f"{fit.eta_compute * g.bf16_tflops / bench:7.3f}" if bench else f"{'-':>7}"
        was_in = _signed_median(_prefill(before, gpu, FIT_MODEL))
        was_out = _signed_median(_prefill(before, gpu, HELD_OUT_MODEL))
        lines.append(f"{gpu:10} {carried.efficiencies_for(gpu).eta_compute:8.3f} "
                     f"{fit.eta_compute:7.4f} {level} "
                     f"{100 * was_in:+9.1f} -> {100 * fit.in_sample_error:+5.1f}% ({fit.points}) "
                     f"{100 * was_out:+9.1f} -> {100 * fit.held_out_error:+5.1f}% "
                     f"({fit.held_out_points})")
    return lines


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
    ap.add_argument("--fits", action="store_true",
                    help="fit each card's matmul efficiency afresh and print it with its errors")
    ap.add_argument("--write-fits", action="store_true",
                    help="fit and write coral/perf/data/layer_fits.yaml")
    ap.add_argument("--no-layer-fits", action="store_true",
                    help="score the borrowed figures alone (no layer fits)")
    ap.add_argument("--curves", action="store_true",
                    help="score every batch of Helix's decode files instead (not in the "
                         "default score)")
    args = ap.parse_args(argv)
    catalog = default_catalog()
    if args.fits or args.write_fits:
        fits = fit_layer_levels(catalog)
        print("\n".join(fits_report(catalog, fits)))
        if args.write_fits:
            source = yaml.safe_load(DATA.read_text())["helix_layers"]["source"]
            print(f"wrote {write_layer_fits(fits, source)}")
        return 0
    perf = PerfModel(catalog, layer_fits={}) if args.no_layer_fits else PerfModel(catalog)
    if args.curves:
        doc = yaml.safe_load(DATA.read_text())
        print("\n".join(curves_report(curve_points(doc, perf, _models(doc, catalog)))))
        return 0
    points = all_points(catalog, perf)
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
