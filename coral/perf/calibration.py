"""Fit per-GPU efficiencies of the roofline model to Vidur's measured operator times.

For every measured point (GPU, model, TP degree, token count) the target is the sum of the
medians of one layer's profiled operators (embedding excluded): QKV/O projections, MLP up,
activation and down, both norms, rope and the residual add. The model's prediction of exactly
those operators is `PerfModel.profiled_ops_seconds` (no attention, no communication), with the
weights and heads sharded over `num_tensor_parallel_workers` GPUs.

Four figures per GPU type are fitted by least squares on the log of predicted/measured
(Nelder-Mead on logit/log-transformed parameters, pure numpy; the smoothing exponent
`ROOFLINE_P` of the roofline is a fixed constant):

- `eta_compute`    achieved fraction of peak bf16 FLOP/s in matmuls,
- `eta_memory`     achieved fraction of peak bandwidth when streaming weights,
- `eta_elementwise` achieved fraction of peak bandwidth in element-wise kernels,
- `kernel_overhead_s` fixed GPU time per kernel.

Fitted: A100-80GB and H100 SXM (every model profiled on them). Held out: A40 (Ampere, never
fitted) is predicted with the figures it borrows from A100-80GB by the architecture rule, and a
cross-model check fits on the Llama-2 models only and predicts CodeLlama-34B and Llama-3.

The fitted figures are committed in `coral/perf/data/efficiencies.yaml`
(`coral perf calibrate --write`), which `PerfModel` loads by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from coral.catalog.loader import Catalog, default_catalog
from coral.perf.efficiencies import (
    EFFICIENCIES_SCHEMA,
    Efficiencies,
    EfficiencyTable,
    default_efficiencies,
    efficiencies_file,
)
from coral.perf.layer_costs import layer_coefficients, tile_padded_tokens_array
from coral.perf.kernel_time import elementwise_seconds, kernel_seconds
from coral.perf.sustained import elementwise_rate, scale_borrowed
from coral.perf.vidur_profiles import (
    VIDUR_GPUS,
    VidurProfiles,
    load_vidur_profiles,
    model_arch,
    short_model_name,
)

#: Vidur GPUs whose measurements are fitted; the others are held out.
FITTED_VIDUR_GPUS: tuple[str, ...] = ("a100", "h100")
#: Held-out GPU: predicted with borrowed figures, never fitted.
HELD_OUT_VIDUR_GPUS: tuple[str, ...] = ("a40",)
#: Cross-model check: fit on these models only, test on the rest of the same GPUs.
CROSS_MODEL_FIT_MODELS: tuple[str, ...] = ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf")

_START = (0.7, 0.8, 0.4, 3e-6)  # eta_c, eta_m, eta_e, t_kernel


@dataclass(frozen=True)
class FitReport:
    """One GPU type's fit and how well it reproduces the points it was fitted on."""

    gpu: str
    efficiencies: Efficiencies
    models: tuple[str, ...]
    points: int
    median_rel_error: float
    max_rel_error: float


@dataclass(frozen=True)
class HeldOutReport:
    """Prediction error on measurements that were not used in the fit."""

    name: str
    gpu: str
    models: tuple[str, ...]
    efficiencies_from: str
    figures: str  # short form of efficiencies_from
    points: int
    median_rel_error: float
    max_rel_error: float


@dataclass(frozen=True)
class Calibration:
    fits: dict[str, FitReport]  # catalog GPU name -> fit
    held_out: tuple[HeldOutReport, ...]

    def table(self) -> EfficiencyTable:
        return EfficiencyTable({g: f.efficiencies for g, f in self.fits.items()})


# ---- design matrix ----


@dataclass(frozen=True)
class _Points:
    """Per-point coefficients (per GPU of the TP group) and the measured seconds."""

    tokens: np.ndarray
    peak_flops: np.ndarray
    peak_bw: np.ndarray
    mm_flops: np.ndarray  # (4, n): qkv, o, up, down FLOPs the kernels do (whole row tiles)
    mm_bytes: np.ndarray  # (4, n): weights + activations bytes
    ew_bytes: np.ndarray  # (5, n): norm, norm, rope, activation, add
    measured_s: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)


def _points(profiles: VidurProfiles, catalog: Catalog) -> _Points:
    n = len(profiles)
    tokens = profiles.num_tokens.astype(float)
    peak_flops = np.empty(n)
    peak_bw = np.empty(n)
    mm_flops = np.empty((4, n))
    mm_bytes = np.empty((4, n))
    ew_bytes = np.empty((5, n))
    for vgpu, vmodel in profiles.groups():
        gpu = catalog.gpu(VIDUR_GPUS[vgpu])
        arch = model_arch(profiles, vmodel)
        in_group = (profiles.gpu == vgpu) & (profiles.model == vmodel)
        for tp in np.unique(profiles.tp[in_group]):
            rows = in_group & (profiles.tp == tp)
            t = tokens[rows]
            tq = tile_padded_tokens_array(t)
            coef = layer_coefficients(arch, int(tp))
            peak_flops[rows] = gpu.bf16_tflops * 1e12
            peak_bw[rows] = gpu.mem_bandwidth_gb_per_s * 1e9
            for i, mm in enumerate((coef.qkv, coef.o, coef.up, coef.down)):
                mm_flops[i, rows] = mm.flops_per_token * tq
                mm_bytes[i, rows] = mm.weight_bytes + mm.bytes_per_token * t
            for i, per_token in enumerate(coef.profiled_elementwise_kernels):
                ew_bytes[i, rows] = per_token * t
    return _Points(
        tokens, peak_flops, peak_bw, mm_flops, mm_bytes, ew_bytes, profiles.layer_ms * 1e-3
    )


def predict_kernels(pts: _Points, eta_c: float, eta_m: float, eta_e: float, t_k: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of each profiled kernel: the four matmuls (4, n) and the five element-wise
    kernels (5, n)."""
    compute = pts.mm_flops / (pts.peak_flops * eta_c)
    memory = pts.mm_bytes / (pts.peak_bw * eta_m)
    return (kernel_seconds(compute, memory, t_k),
            elementwise_seconds(pts.ew_bytes / (pts.peak_bw * eta_e), t_k))


def _predict(pts: _Points, eta_c: float, eta_m: float, eta_e: float, t_k: float) -> np.ndarray:
    matmuls, elementwise = predict_kernels(pts, eta_c, eta_m, eta_e, t_k)
    return matmuls.sum(axis=0) + elementwise.sum(axis=0)


def _errors(pts: _Points, params: tuple[float, float, float, float]) -> np.ndarray:
    return np.abs(_predict(pts, *params) / pts.measured_s - 1.0)


# ---- fitting ----


def _to_params(x: np.ndarray) -> tuple[float, float, float, float]:
    sig = 1.0 / (1.0 + np.exp(-x[:3]))
    return float(sig[0]), float(sig[1]), float(sig[2]), float(math.exp(x[3]))


def _from_params(p: tuple[float, float, float, float]) -> np.ndarray:
    etas = np.array(p[:3])
    return np.array([*np.log(etas / (1.0 - etas)), math.log(p[3])])


def _nelder_mead(f, x0: np.ndarray, step: float = 0.5, iters: int = 2000, tol: float = 1e-12):
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if values[-1] - values[0] <= tol * (abs(values[0]) + tol):
            break
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        xr = centroid + (centroid - worst)
        fr = f(xr)
        if fr < values[0]:
            xe = centroid + 2.0 * (centroid - worst)
            fe = f(xe)
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (worst - centroid) if fr >= values[-1] else centroid + 0.5 * (
                xr - centroid
            )
            fc = f(xc)
            if fc < min(fr, values[-1]):
                simplex[-1], values[-1] = xc, fc
            else:  # shrink towards the best
                best = simplex[0]
                simplex = [best] + [best + 0.5 * (x - best) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    i = int(np.argmin(values))
    return simplex[i], values[i]


def fit_points(pts: _Points) -> tuple[float, float, float, float]:
    """Least squares on log(predicted / measured); returns (eta_c, eta_m, eta_e, t_kernel)."""
    log_measured = np.log(pts.measured_s)

    def loss(x: np.ndarray) -> float:
        r = np.log(_predict(pts, *_to_params(x))) - log_measured
        return float(np.dot(r, r))

    x, best = _nelder_mead(loss, _from_params(_START))
    for _ in range(3):  # restarts guard against a collapsed simplex
        x2, v2 = _nelder_mead(loss, x, step=0.2)
        if v2 >= best - 1e-12 * abs(best):
            break
        x, best = x2, v2
    return _to_params(x)


def _describe(models: tuple[str, ...], vgpu: str, n: int) -> str:
    short = ", ".join(short_model_name(m) for m in models)
    return f"Vidur {vgpu} profiles: {short}; {n} points"


def _fit_gpu(
    profiles: VidurProfiles, catalog: Catalog, vgpu: str, models: tuple[str, ...] | None = None
) -> FitReport:
    mask = profiles.gpu == vgpu
    if models is not None:
        mask &= np.isin(profiles.model, models)
    sub = profiles.select(mask)
    pts = _points(sub, catalog)
    params = fit_points(pts)
    errs = _errors(pts, params)
    gpu = catalog.gpu(VIDUR_GPUS[vgpu])
    used = tuple(sorted(set(sub.model.tolist())))
    eff = Efficiencies(
        gpu=gpu.name,
        architecture=gpu.architecture,
        eta_compute=params[0],
        eta_memory=params[1],
        eta_elementwise=params[2],
        kernel_overhead_s=params[3],
        fitted_on=_describe(used, vgpu, len(pts)),
    )
    return FitReport(
        gpu=gpu.name,
        efficiencies=eff,
        models=used,
        points=len(pts),
        median_rel_error=float(np.median(errs)),
        max_rel_error=float(errs.max()),
    )


def _held_out(
    name: str,
    profiles: VidurProfiles,
    catalog: Catalog,
    mask: np.ndarray,
    eff: Efficiencies,
    figures: str,
) -> HeldOutReport:
    sub = profiles.select(mask)
    pts = _points(sub, catalog)
    errs = _errors(
        pts, (eff.eta_compute, eff.eta_memory, eff.eta_elementwise, eff.kernel_overhead_s)
    )
    return HeldOutReport(
        name=name,
        gpu=VIDUR_GPUS.get(str(sub.gpu[0]), str(sub.gpu[0])) if len(sub) else "",
        models=tuple(sorted(set(sub.model.tolist()))),
        efficiencies_from=eff.label,
        figures=figures,
        points=len(pts),
        median_rel_error=float(np.median(errs)),
        max_rel_error=float(errs.max()),
    )


def calibrate(catalog: Catalog | None = None, *, cross_model: bool = True) -> Calibration:
    """Fit the profiled GPU types and evaluate the held-out data."""
    catalog = catalog or default_catalog()
    profiles = load_vidur_profiles()
    fits = {}
    for vgpu in FITTED_VIDUR_GPUS:
        report = _fit_gpu(profiles, catalog, vgpu)
        fits[report.gpu] = report
    table = EfficiencyTable({g: f.efficiencies for g, f in fits.items()})
    held: list[HeldOutReport] = []
    rate = elementwise_rate(table, catalog)
    for vgpu in HELD_OUT_VIDUR_GPUS:
        gpu = catalog.gpu(VIDUR_GPUS[vgpu])
        eff = table.for_gpu(gpu)
        if eff.borrowed_from:  # as the perf model borrows: scaled to sustained throughput
            eff = scale_borrowed(eff, gpu, catalog.gpu(eff.borrowed_from), catalog, rate)
        held.append(
            _held_out(
                f"{gpu.name} (GPU type not fitted)",
                profiles, catalog, profiles.gpu == vgpu, eff,
                f"borrowed from {eff.borrowed_from}" if eff.borrowed_from else "own fit",
            )
        )
    if cross_model:
        for vgpu in FITTED_VIDUR_GPUS:
            partial = _fit_gpu(profiles, catalog, vgpu, CROSS_MODEL_FIT_MODELS)
            mask = (profiles.gpu == vgpu) & ~np.isin(profiles.model, CROSS_MODEL_FIT_MODELS)
            if not mask.any():
                continue
            fit_on = ", ".join(short_model_name(m) for m in CROSS_MODEL_FIT_MODELS)
            held.append(
                _held_out(
                    f"{partial.gpu} (models not fitted)",
                    profiles, catalog, mask, partial.efficiencies,
                    f"fitted on {fit_on} only",
                )
            )
    return Calibration(fits=fits, held_out=tuple(held))


# ---- persistence ----


def efficiencies_document(cal: Calibration) -> dict:
    gpus = {}
    for name, fit in sorted(cal.fits.items()):
        e = fit.efficiencies
        gpus[name] = {
            "architecture": e.architecture,
            "eta_compute": round(e.eta_compute, 4),
            "eta_memory": round(e.eta_memory, 4),
            "eta_elementwise": round(e.eta_elementwise, 4),
            "kernel_overhead_s": float(f"{e.kernel_overhead_s:.4g}"),
            "fitted_on": e.fitted_on,
            "points": fit.points,
            "median_rel_error": round(fit.median_rel_error, 4),
            "max_rel_error": round(fit.max_rel_error, 4),
        }
    return {"schema_version": EFFICIENCIES_SCHEMA, "gpus": gpus}


def write_efficiencies(cal: Calibration, path: Path | str | None = None) -> Path:
    """Write the fitted figures (default: the package's committed file)."""
    path = Path(path) if path is not None else efficiencies_file()
    header = (
        "# Fitted roofline efficiencies per GPU type. Generated by `coral perf calibrate "
        "--write`;\n# do not edit by hand. GPU types not listed borrow the figures of the "
        "nearest\n# profiled architecture (coral.perf.efficiencies.DONOR_ARCHITECTURE).\n"
    )
    path.write_text(header + yaml.safe_dump(efficiencies_document(cal), sort_keys=False))
    default_efficiencies.cache_clear()
    return path
