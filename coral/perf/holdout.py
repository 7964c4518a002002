"""Leave-one-GPU-out validation: predict a GPU type's measurements from the others only.

Four GPU types have measurements: a100-80gb, h100-sxm and a40 (Vidur's per-operator profiles:
QKV and output projections, MLP up and down, element-wise kernels) and h200 (the shipped
whole-layer tables, `coral/perf/data/profiles/h200`). For each one in turn, every other type is
fitted as the calibration fits it (Vidur types by `coral.perf.calibration`, the h200 on its dense
models' tables by `coral.perf.validation.fit_tables`), and the held-out type gets the figures
the perf model gives a GPU type without a profile: a fitted type's figures borrowed by
architecture (`EfficiencyTable.for_gpu`), scaled by the sustained-throughput ratio of the two
types (`coral.perf.sustained`) when `sustained` is set. Its measurements are then predicted
with those figures and compared, per operator class and per step kind.

Step kinds: a table row says whether it is a prefill or a decode step; a Vidur point of at most
`DECODE_TOKENS` tokens counts as a decode batch and a larger one as a prompt chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from coral.catalog.loader import Catalog
from coral.perf.calibration import _fit_gpu, _points, predict_kernels
from coral.perf.efficiencies import Efficiencies, EfficiencyTable
from coral.perf.model import PerfModel
from coral.perf.profile_table import ProfileTable
from coral.perf.sustained import elementwise_rate, scale_borrowed
from coral.perf.validation import compare, fit_tables, load_tables, PACKAGED_PROFILES
from coral.perf.vidur_profiles import VIDUR_GPUS, load_vidur_profiles

#: A Vidur point of at most this many tokens is a decode batch; above it, a prompt chunk.
DECODE_TOKENS = 256

#: Operator classes of the Vidur profiles, with the operators each sums.
VIDUR_CLASSES: dict[str, tuple[str, ...]] = {
    "qkv": ("attn_pre_proj",),
    "o_proj": ("attn_post_proj",),
    "mlp_up": ("mlp_up_proj",),
    "mlp_down": ("mlp_down_proj",),
    "elementwise": ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act",
                    "add"),
}


@dataclass(frozen=True)
class Errors:
    """predicted/measured - 1 over a set of points."""

    errors: np.ndarray

    @property
    def n(self) -> int:
        return int(self.errors.size)

    @property
    def median_abs(self) -> float:
        return float(np.median(np.abs(self.errors))) if self.n else float("nan")

    @property
    def median_signed(self) -> float:
        return float(np.median(self.errors)) if self.n else float("nan")

    @property
    def max_abs(self) -> float:
        return float(np.abs(self.errors).max()) if self.n else float("nan")


@dataclass
class HeldOutGpu:
    """One held-out GPU type: the figures it got and its errors by (class, kind)."""

    gpu: str
    figures: Efficiencies
    errors: dict[tuple[str, str], Errors] = field(default_factory=dict)

    def kind(self, kind: str, classes: tuple[str, ...] | None = None) -> Errors:
        """Every point of one step kind (of the given classes; default: whole layers)."""
        parts = [e.errors for (c, k), e in self.errors.items()
                 if k == kind and (classes is None and c in ("layer", "dense layer")
                                   or classes is not None and c in classes)]
        return Errors(np.concatenate(parts) if parts else np.zeros(0))


def _vidur_gpu_names() -> dict[str, str]:
    return dict(VIDUR_GPUS)


def _dense(tables: list[ProfileTable], catalog: Catalog) -> list[ProfileTable]:
    return [t for t in tables if catalog.model(t.model).moe is None]


def training_fits(catalog: Catalog, held_out: str, h200_tables: list[ProfileTable]
                  ) -> EfficiencyTable:
    """Own fits of every measured GPU type except `held_out`."""
    profiles = load_vidur_profiles()
    entries: dict[str, Efficiencies] = {}
    for vgpu, name in _vidur_gpu_names().items():
        if name != held_out:
            entries[name] = _fit_gpu(profiles, catalog, vgpu).efficiencies
    if held_out != "h200" and h200_tables:
        entries["h200"] = fit_tables(_dense(h200_tables, catalog), catalog).efficiencies
    return EfficiencyTable(entries)


def _per_operator(table: EfficiencyTable) -> EfficiencyTable:
    """The fits on per-operator profiles (Vidur's), where element-wise kernels are timed on
    their own; a whole-layer table's element-wise figure is not separable from the rest (the
    h200 fit runs into its bound, 1.0)."""
    vidur = set(VIDUR_GPUS.values())
    return EfficiencyTable({g: e for g, e in table.entries.items() if g in vidur})


def held_out_figures(catalog: Catalog, table: EfficiencyTable, gpu: str,
                     sustained: bool, elementwise: bool = True) -> Efficiencies:
    """What the perf model gives `gpu` without its own profile, from `table`."""
    gpu_t = catalog.gpu(gpu)
    eff = table.for_gpu(gpu_t)
    if sustained and eff.borrowed_from:
        rate = elementwise_rate(_per_operator(table), catalog) if elementwise else None
        eff = scale_borrowed(eff, gpu_t, catalog.gpu(eff.borrowed_from), catalog, rate)
    return eff


def _vidur_errors(catalog: Catalog, vgpu: str, eff: Efficiencies
                  ) -> dict[tuple[str, str], Errors]:
    profiles = load_vidur_profiles()
    sub = profiles.select(profiles.gpu == vgpu)
    pts = _points(sub, catalog)
    roof, ew = predict_kernels(pts, eff.eta_compute, eff.eta_memory, eff.eta_elementwise,
                               eff.kernel_overhead_s)
    predicted = {
        "qkv": roof[0], "o_proj": roof[1], "mlp_up": roof[2], "mlp_down": roof[3],
        "elementwise": ew.sum(axis=0),
    }
    predicted["layer"] = sum(predicted[c] for c in VIDUR_CLASSES)
    measured = {c: sum(sub.op_ms[op] for op in ops) * 1e-3 for c, ops in VIDUR_CLASSES.items()}
    measured["layer"] = sub.layer_ms * 1e-3
    decode = sub.num_tokens <= DECODE_TOKENS
    out = {}
    for cls in predicted:
        err = predicted[cls] / measured[cls] - 1.0
        out[(cls, "decode")] = Errors(err[decode])
        out[(cls, "prefill")] = Errors(err[~decode])
    return out


def _table_errors(catalog: Catalog, tables: list[ProfileTable], eff: Efficiencies
                  ) -> dict[tuple[str, str], Errors]:
    out: dict[tuple[str, str], list[float]] = {}
    for v in compare(tables, catalog, eff):
        cls = "moe layer" if catalog.model(v.model).moe is not None else "dense layer"
        for p in v.points:
            out.setdefault((cls, p.kind), []).append(p.rel_error)
    return {k: Errors(np.array(v)) for k, v in out.items()}


def leave_one_gpu_out(catalog: Catalog, *, sustained: bool = True, elementwise: bool = True,
                      h200_tables: list[ProfileTable] | None = None) -> list[HeldOutGpu]:
    """Every measured GPU type predicted from fits on the others (`elementwise`: carry the
    element-wise figure by the SM-issue/DRAM ceilings, else by the DRAM ratio alone)."""
    if h200_tables is None:
        h200_tables = load_tables([PACKAGED_PROFILES / "h200"])
    results = []
    for vgpu, name in [*_vidur_gpu_names().items(), ("", "h200")]:
        table = training_fits(catalog, name, h200_tables)
        eff = held_out_figures(catalog, table, name, sustained, elementwise)
        res = HeldOutGpu(name, eff)
        if vgpu:
            res.errors = _vidur_errors(catalog, vgpu, eff)
        else:
            res.errors = _table_errors(catalog, h200_tables, eff)
        results.append(res)
    return results


def committed_check(catalog: Catalog, perf: PerfModel | None = None) -> HeldOutGpu:
    """The shipped h200 tables against the figures plans use (no refit)."""
    perf = perf or PerfModel(catalog)
    tables = load_tables([PACKAGED_PROFILES / "h200"])
    eff = perf.efficiencies_for("h200")
    return HeldOutGpu("h200", eff, _table_errors(catalog, tables, eff))


# ---- MoE layers: the grouped-GEMM figures, leave one MoE model out ----

#: Grid of (GROUPED_GEMM_K0, GROUPED_GEMM_BANDWIDTH) searched by `fit_grouped_gemm`.
K0_GRID = tuple(float(x) for x in range(0, 4001, 250))
BANDWIDTH_GRID = tuple(round(0.5 + 0.025 * i, 3) for i in range(21))


def _moe_errors(catalog: Catalog, tables: list[ProfileTable], k0: float, g: float,
                eff: Efficiencies | None = None) -> np.ndarray:
    res = compare(tables, catalog, eff, grouped_gemm_k0=k0, grouped_gemm_bandwidth=g)
    return np.concatenate([[p.rel_error for p in v.points] for v in res])


def fit_grouped_gemm(catalog: Catalog, tables: list[ProfileTable],
                     eff: Efficiencies | None = None) -> tuple[float, float]:
    """(k0, bandwidth) minimising the squared log error on MoE `tables` over the grid."""
    best, arg = float("inf"), (0.0, 1.0)
    for k0 in K0_GRID:
        for g in BANDWIDTH_GRID:
            e = _moe_errors(catalog, tables, k0, g, eff)
            loss = float(np.sum(np.log1p(e) ** 2))
            if loss < best:
                best, arg = loss, (k0, g)
    return arg


def moe_leave_one_model_out(catalog: Catalog, tables: list[ProfileTable] | None = None
                            ) -> dict[str, tuple[tuple[float, float], dict[str, Errors]]]:
    """Each MoE model's h200 table predicted with grouped-GEMM figures fitted on the other
    MoE tables: model -> ((k0, bandwidth), errors by step kind)."""
    if tables is None:
        tables = load_tables([PACKAGED_PROFILES / "h200"])
    moe = [t for t in tables if catalog.model(t.model).moe is not None]
    out = {}
    for i, t in enumerate(moe):
        rest = [x for j, x in enumerate(moe) if j != i]
        k0, g = fit_grouped_gemm(catalog, rest)
        res = compare([t], catalog, grouped_gemm_k0=k0, grouped_gemm_bandwidth=g)[0]
        out[t.model] = ((k0, g), {kind: Errors(np.array(
            [p.rel_error for p in res.points if p.kind == kind])) for kind in ("prefill", "decode")})
    return out
