"""The perf model against measured whole-layer times, and a GPU type's own fit from them.

A profile table (`coral profile`, `benchmarks/profile_gpu.py`) times one decoder layer —
attention, MLP or MoE, norms, rope, residuals — at prompt lengths and at decode batch x context
points, each step replayed as a CUDA graph. The perf model's figure for exactly that is
`iteration_seconds(model, node, layers=1, ...)` less the per-iteration overhead, on a one-GPU
node of the table's GPU type: no tensor parallelism, no embedding or LM head, no network.

`compare` reports predicted/measured per point with the figures the planner uses (the committed
calibration, which borrows by architecture for GPU types without Vidur operator profiles);
`fit_tables` fits the four roofline figures of one GPU type to its tables (least squares on
log(predicted/measured), as `coral.perf.calibration` does for operator profiles), and
`leave_one_model_out` predicts each model with figures fitted on the others only — the error a
new model on that GPU would see.

The profiler's layer is plain torch (fused RMSNorm; rope, residual and activation kernels
unfused; grouped-GEMM MoE; decode attention without split keys), so measured times are an
upper bound on a serving engine's fused kernels. The prediction adds what the profiler's layer
does beyond the engine's (`profiler_extra_seconds`, `profiler_attention_extra_seconds`), so a
fit on the tables gives the engine's figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from coral.errors import CoralError
from coral.catalog.loader import Catalog
from coral.catalog.schema import GpuType, NodeType
from coral.perf.calibration import _from_params, _nelder_mead, _to_params
from coral.perf.devices import gpu_type_for_device
from coral.perf.model import ITERATION_OVERHEAD_S, Efficiencies, EfficiencyTable, PerfModel
from coral.perf.profile_table import ProfileTable

#: The measured tables shipped with the package, one directory per GPU type.
PACKAGED_PROFILES = Path(__file__).parent / "data" / "profiles"

#: Kernels the profiler's MoE layer (`coral.perf.torch_layers.MoE.forward`, grouped path)
#: launches beyond the serving engine's fused MoE the perf model counts: the router's float
#: cast, softmax, top-k and renormalisation as separate kernels, the stable argsort (about 3),
#: the index arithmetic and gathers, the zero fill, searchsorted and its cast, the explicit
#: gather of token rows, SiLU and multiply apart, the weighting and the scatter-add (15), plus
#: the shared experts' separate SiLU/multiply and residual add (2). Counted from the code.
PROFILER_MOE_EXTRA_KERNELS = 15
PROFILER_SHARED_EXPERT_EXTRA_KERNELS = 2
#: Kernels the profiler's decoder layer (dense or MoE) launches beyond the engine layer the
#: perf model counts: rope as five element-wise kernels instead of one (4), SiLU and multiply
#: apart (1), two residual adds instead of one fused add (1), the K and V cache writes apart
#: (1). Counted from `coral.perf.torch_layers.DecoderLayer`.
PROFILER_LAYER_EXTRA_KERNELS = 7

#: Start of the fit (eta_compute, eta_memory, eta_elementwise, kernel_overhead_s).
FIT_START = (0.7, 0.8, 0.5, 4e-6)


class ValidationError(CoralError, ValueError):
    """Tables that cannot be compared as given (the message names the table)."""


@dataclass(frozen=True)
class PointError:
    """One measured grid point beside the model's prediction (seconds per layer)."""

    model: str
    kind: str  # "prefill" | "decode"
    prefill_tokens: int
    decode_batch: int
    context_tokens: int
    measured_s: float
    predicted_s: float

    @property
    def rel_error(self) -> float:
        """predicted / measured - 1: negative when the model is optimistic."""
        return self.predicted_s / self.measured_s - 1.0


@dataclass(frozen=True)
class ErrorSummary:
    points: int
    median_abs: float
    median_signed: float
    max_abs: float

    @classmethod
    def of(cls, errors: Sequence[float]) -> "ErrorSummary":
        e = np.asarray(errors, dtype=float)
        if e.size == 0:
            return cls(0, float("nan"), float("nan"), float("nan"))
        return cls(int(e.size), float(np.median(np.abs(e))), float(np.median(e)),
                   float(np.abs(e).max()))


@dataclass(frozen=True)
class ModelValidation:
    """One table's points, with error summaries per step kind and overall."""

    model: str
    gpu: str
    points: tuple[PointError, ...]

    def summary(self, kind: str | None = None) -> ErrorSummary:
        return ErrorSummary.of([p.rel_error for p in self.points if kind in (None, p.kind)])


@dataclass(frozen=True)
class TableFit:
    """Figures fitted to tables of one GPU type, and how well they reproduce them."""

    efficiencies: Efficiencies
    models: tuple[str, ...]
    summary: ErrorSummary


# ---- inputs ----


def load_tables(paths: Iterable[str | Path]) -> list[ProfileTable]:
    """Profile tables from CSV files and directories holding them (searched recursively)."""
    tables: list[ProfileTable] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.rglob("*.csv"))
            if not found:
                raise ValidationError(f"{path}: no profile tables (*.csv) under this directory")
            tables.extend(ProfileTable.load(f) for f in found)
        elif path.is_file():
            tables.append(ProfileTable.load(path))
        else:
            raise ValidationError(f"{path}: no such file or directory")
    return tables


def table_gpu(table: ProfileTable, catalog: Catalog, gpu: str | None = None) -> GpuType:
    """The catalog GPU type a table was measured on: `gpu` if given, else the table's node
    type when the catalog knows it (one GPU), else its recorded device name."""
    if gpu:
        return catalog.gpu(gpu)
    if table.node_type in catalog.node_types:
        node = catalog.node_type(table.node_type)
        if node.gpu_count != 1:
            raise ValidationError(
                f"{table.model} table: node type {node.name} has {node.gpu_count} GPUs, but a "
                "profile table times one device")
        return catalog.gpu(node.gpu)
    name = gpu_type_for_device(table.device_name, catalog.gpus)
    if name is None:
        raise ValidationError(
            f"{table.model} table: device {table.device_name!r} (node {table.node_type!r}) is "
            "not a catalog GPU type; name it with --gpu")
    return catalog.gpu(name)


def single_gpu_node(gpu: GpuType) -> NodeType:
    """A one-GPU node of `gpu` for per-layer predictions. Not a rentable offering (no
    instances, no prices): one layer's time depends on neither its NIC nor its price."""
    return NodeType.model_construct(name=f"1x-{gpu.name}", gpu=gpu.name, gpu_count=1,
                                    nic_gbps=1.0, instances={}, prices=[])


# ---- prediction ----


def _rows(tables: Sequence[ProfileTable]) -> list[tuple[ProfileTable, object]]:
    return [(t, r) for t in tables for r in t.rows]


def profiler_extra_seconds(perf: PerfModel, model: str, node: NodeType) -> float:
    """Kernel time the profiler's torch layer spends beyond the engine layer the perf model
    describes (unfused rope, activation, residual and cache writes; MoE routing and dispatch
    as separate kernels)."""
    moe = perf.catalog.model(model).moe
    kernels = PROFILER_LAYER_EXTRA_KERNELS
    if moe is not None:
        kernels += PROFILER_MOE_EXTRA_KERNELS + (
            PROFILER_SHARED_EXPERT_EXTRA_KERNELS if moe.shared_experts else 0)
    return kernels * perf.efficiencies_for(perf.catalog.gpu_of(node)).kernel_overhead_s


def profiler_attention_extra_seconds(perf: PerfModel, model: str, node: NodeType,
                                     decode_batch: int, context_tokens: int) -> float:
    """Time the profiler's decode attention spends beyond the perf model's: torch's
    `scaled_dot_product_attention` does not split a sequence's keys over thread blocks, so it
    runs one block per (sequence, KV head), and with fewer blocks than SMs only that share of
    the SMs streams the cache, each at its SM's share of DRAM bandwidth (datasheet bandwidth /
    SMs). A serving engine's decode kernel splits the keys until every SM has work (vLLM's
    paged attention v2, FlashAttention's split-KV), which the perf model describes."""
    if decode_batch <= 0 or context_tokens <= 0:
        return 0.0
    gpu = perf.catalog.gpu_of(node)
    if gpu.sustained is None or gpu.sustained.sm_count is None:
        return 0.0
    arch = perf.catalog.model(model)
    kv_bytes = context_tokens * 2.0 * arch.kv_dim * arch.dtype_bytes
    blocks = decode_batch * arch.num_kv_heads
    dram = gpu.mem_bandwidth_gb_per_s * 1e9
    eta_memory = perf.efficiencies_for(gpu).eta_memory
    share = blocks / gpu.sustained.sm_count
    if share >= eta_memory:
        return 0.0
    return kv_bytes / (dram * share) - kv_bytes / (dram * eta_memory)


def _predict(perf: PerfModel, tables: Sequence[ProfileTable], node: NodeType) -> np.ndarray:
    extra = {t.model: profiler_extra_seconds(perf, t.model, node) for t in tables}
    return np.array([
        perf.iteration_seconds(t.model, node, 1, r.prefill_tokens, r.decode_batch,
                               r.context_tokens) - ITERATION_OVERHEAD_S + extra[t.model]
        + profiler_attention_extra_seconds(perf, t.model, node, r.decode_batch,
                                           r.context_tokens)
        for t, r in _rows(tables)
    ])


def compare(tables: Sequence[ProfileTable], catalog: Catalog,
            efficiencies: Efficiencies | EfficiencyTable | None = None,
            gpu: str | None = None, **perf_options: float) -> list[ModelValidation]:
    """Predicted beside measured for every point of every table (`perf_options`: the
    PerfModel's keyword figures, e.g. grouped_gemm_k0)."""
    perf = PerfModel(catalog, efficiencies=efficiencies, **perf_options)
    out = []
    for table in tables:
        gpu_t = table_gpu(table, catalog, gpu)
        predicted = _predict(perf, [table], single_gpu_node(gpu_t))
        points = tuple(
            PointError(table.model, r.kind, r.prefill_tokens, r.decode_batch, r.context_tokens,
                       r.seconds_per_layer, float(p))
            for r, p in zip(table.rows, predicted)
        )
        out.append(ModelValidation(table.model, gpu_t.name, points))
    return out


# ---- fitting ----


def _one_gpu(tables: Sequence[ProfileTable], catalog: Catalog, gpu: str | None) -> GpuType:
    gpus = {table_gpu(t, catalog, gpu).name for t in tables}
    if len(gpus) != 1:
        raise ValidationError(f"a fit is per GPU type; the tables span {sorted(gpus)}")
    return catalog.gpu(gpus.pop())


def fit_tables(tables: Sequence[ProfileTable], catalog: Catalog,
               gpu: str | None = None) -> TableFit:
    """Fit (eta_compute, eta_memory, eta_elementwise, kernel_overhead_s) of the tables' GPU
    type by least squares on log(predicted / measured) over every point."""
    if not tables:
        raise ValidationError("no tables to fit")
    gpu_t = _one_gpu(tables, catalog, gpu)
    node = single_gpu_node(gpu_t)
    measured = np.array([r.seconds_per_layer for _, r in _rows(tables)])
    log_measured = np.log(measured)
    models = tuple(sorted({t.model for t in tables}))

    def efficiencies(x: np.ndarray) -> Efficiencies:
        c, m, e, k = _to_params(x)
        return Efficiencies(gpu=gpu_t.name, architecture=gpu_t.architecture, eta_compute=c,
                            eta_memory=m, eta_elementwise=e, kernel_overhead_s=k,
                            fitted_on=f"measured layer tables: {', '.join(models)}; "
                                      f"{len(measured)} points")

    def loss(x: np.ndarray) -> float:
        predicted = _predict(PerfModel(catalog, efficiencies=efficiencies(x)), tables, node)
        r = np.log(np.maximum(predicted, 1e-12)) - log_measured
        return float(np.dot(r, r))

    x, best = _nelder_mead(loss, _from_params(FIT_START), iters=600, tol=1e-9)
    x2, v2 = _nelder_mead(loss, x, step=0.2, iters=300, tol=1e-9)  # restart: collapsed simplex
    if v2 < best:
        x = x2
    eff = efficiencies(x)
    predicted = _predict(PerfModel(catalog, efficiencies=eff), tables, node)
    return TableFit(eff, models, ErrorSummary.of(predicted / measured - 1.0))


def leave_one_model_out(tables: Sequence[ProfileTable], catalog: Catalog,
                        gpu: str | None = None) -> list[ModelValidation]:
    """Each table predicted with figures fitted on the other tables of its GPU type."""
    if len(tables) < 2:
        raise ValidationError("leave-one-model-out needs tables of at least two models")
    out = []
    for i, table in enumerate(tables):
        rest = [t for j, t in enumerate(tables) if j != i]
        fit = fit_tables(rest, catalog, gpu)
        out.extend(compare([table], catalog, fit.efficiencies, gpu))
    return out
