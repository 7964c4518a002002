"""Roofline performance model: time of one iteration of k layers of a model on a node type.

For one iteration of `layers` consecutive layers with `P` prefill tokens (one chunk that
attends causally over itself) and `B` decoding sequences whose contexts total `C` tokens, on a
node of `c` GPUs running tensor parallelism (TP = c: weights and heads sharded over the GPUs):

    t = layers * ( sum over operator groups g of roof(FLOPs_g / (F * eta_c), Bytes_g / (BW * eta_m))
                   + element-wise bytes / (BW * eta_e)
                   + kernels * t_kernel
                   + 2 TP all-reduces )
        + stage extras (embedding on the first stage, final norm + LM head on the last)
        + ITERATION_OVERHEAD_S

`roof(a, b) = (a^p + b^p)^(1/p)` is a smoothed maximum (`ROOFLINE_P`; p -> infinity is the
hard roofline max): measured matmuls run slower than either bound near the ridge point.

A dense matmul's compute time counts the work its kernel does, not the useful FLOPs: the token
dimension is rounded up to whole row tiles (`coral.perf.layer_costs.tile_padded_tokens`: 128
rows, 64 for at most 64 tokens), so a step of 264 tokens pays for 384 while 256 pays for 256 —
the staircase the measured GEMMs show. Memory time counts the real bytes.

FLOPs and bytes are per GPU (the matmul FLOPs and weights are divided over the c GPUs; inputs
that every GPU reads in full are counted in full). Operator groups:

- QKV projection, output projection, MLP up (gate+up) and MLP down: dense matmuls. For MoE
  the MLP is the router plus the experts: FLOPs use the `k` active experts per token, bytes use
  the expected number of distinct experts that `T` tokens touch, `E * (1 - (1 - k/E)^T)`. The
  routed experts run as grouped GEMMs (a serving engine's fused MoE): their compute time is
  scaled by `1 + GROUPED_GEMM_K0 / K` (small per-expert GEMMs), the engine's routing kernels
  are counted (`MOE_EXTRA_KERNELS`) and the sum of each token's expert outputs is element-wise.
- Attention: prefill FLOPs `4 * P(P+1)/2 * q_dim` (causal), bytes read Q, K, V and write the
  output; decode FLOPs `4 * C * q_dim`, bytes the KV cache read, `C * kv_bytes_per_token`.
- Element-wise: two RMSNorms, rotary embedding, the MLP activation, the residual add and the
  KV-cache write of the new tokens; bytes only, at the element-wise efficiency `eta_e`.

`F`, `BW` are the GPU's peak dense bf16 FLOP/s and memory bandwidth from the catalog; `eta_c`,
`eta_m`, `eta_e` and the per-kernel time `t_kernel` are the GPU's `Efficiencies`, fitted to
Vidur's measured operator times (see `coral.perf.calibration`); a GPU type without a fit
borrows a profiled type's, scaled by the two types' sustained throughput
(`coral.perf.sustained`: board power, clocks, measured matmul and copy figures; the
element-wise figure by the lesser of DRAM and the SMs' issue rate, which holds element-wise
kernels on HBM cards); where a public whole-layer profile of such a type exists, its matmul
efficiency is fitted on it instead (`coral.perf.layer_fits`). TP communication is a ring
all-reduce of the layer's activations twice per layer. When a measured table exists for a
(model, node type) it replaces the per-layer formula.

`iteration_seconds` is on the hot path of the template builder (called millions of times):
per (model, node) constants are computed once and the call itself is plain float arithmetic.

Why one module of ~540 lines: the formula's named constants, the per-(model, node) constants
(`_Consts`) and the `PerfModel` that reads them are one model; its memory queries
(`max_kv_tokens`, `fits`, `max_layers`) read the same constants from `coral.perf.memory`. The
operator-level counts live in `coral.perf.layer_costs`, sliding-window attention in
`coral.perf.sliding`, the expert precision per GPU type in `coral.perf.precision`, the
efficiencies in `coral.perf.efficiencies`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal, Mapping, Protocol, Sequence

from coral.catalog.loader import Catalog
from coral.catalog.schema import GpuType, ModelArch, NodeType
from coral.perf.efficiencies import (
    Efficiencies,
    EfficiencyTable,
    default_efficiencies,
    efficiencies_file,
)
from coral.perf.layer_costs import (
    Matmul,
    expected_distinct_experts,
    layer_coefficients,
    tile_padded_tokens,
)
from coral.perf.layer_fits import (
    LayerFit,
    apply_layer_fit,
    default_layer_fits,
    layer_fits_file,
)
from coral.perf.memory import MEMORY_RESERVE_FRACTION, MemoryQueries  # noqa: F401 (re-export)
from coral.perf.precision import expert_weight_bits
from coral.perf.sliding import mixed_attention_seconds
from coral.perf.kernel_time import ROOFLINE_P, elementwise_seconds, kernel_seconds
from coral.perf.sustained import elementwise_rate, scale_borrowed

_INV_P = 1.0 / ROOFLINE_P

#: Version of the formula; bump it when a change to this module changes predictions.
#: 2: borrowed efficiencies scaled to the borrower's sustained throughput (coral.perf.sustained).
#: 3: MoE layers as grouped expert GEMMs, the engine's MoE kernels and the expert-output sum.
#: 4: dense matmuls' compute over whole row tiles of tokens, with ROOFLINE_P at 2.5.
#: 5: borrowed element-wise figures carried by the SM-issue/DRAM ceilings (coral.perf.sustained).
#: 6: borrowed matmul figures carried like for like by one public benchmark's matmul throughput
#:    where borrower and donor both list it (the L4, T4 and V100 from the A100).
#: 7: sliding-window layers (attention and KV capped at the window) and 4-bit experts held and
#:    read at the GPU type's precision (GPT-OSS). Every earlier model's figures are unchanged;
#:    the bump retires libraries of the GPT-OSS entries built before their perf support.
#: 8: a borrowing card's matmul efficiency fitted on its own whole-layer profile where one is
#:    published (coral.perf.layer_fits: the A100-40GB, L4, T4 and V100).
FORMULA_VERSION = 8


def _efficiencies_digest() -> str:
    digest = hashlib.sha256()
    for path in (efficiencies_file(), layer_fits_file()):
        try:
            digest.update(path.read_bytes())
        except OSError:  # pragma: no cover - package data missing
            digest.update(b"none")
    return digest.hexdigest()[:8]


#: What cached results derived from the default perf model (e.g. template libraries) depend
#: on: the formula version, the committed calibration and the committed layer fits.
PERF_MODEL_VERSION = f"{FORMULA_VERSION}+{_efficiencies_digest()}"

# ---- named constants ----

#: Fixed time per iteration per pipeline stage, s: scheduling, input preparation and
#: sampling on the host. Not in Vidur's per-operator profiles, so not fitted; a nominal figure
#: of the order vLLM's per-step CPU work takes with CUDA graphs (approximate).
ITERATION_OVERHEAD_S = 1.0e-3

#: Latency of one NCCL all-reduce of a small message inside a node, s: NVLink/NVSwitch vs
#: PCIe. Approximate: no published small-message figure backs them here (an open item of
#: issue 22); at decode batch sizes they are a few percent of a TP layer's time.
ALLREDUCE_LATENCY_S: Mapping[str, float] = {"nvlink": 8.0e-6, "pcie": 25.0e-6}

#: Achieved ring all-reduce bandwidth as a fraction of the catalog's per-GPU link figure. The
#: catalog lists bidirectional bandwidth; a ring moves data one way per step (x0.5) and NCCL
#: reaches about 80% of that (x0.8). Checked against ASTRA-sim's NCCL validation on an
#: HGX-H100 (astra-sim.github.io, "Validation on GPU Systems - NCCL over HGX-H100 Systems",
#: read 2026-12-03): ring all-reduce peaks at 741 GB/s bidirectional of 900, 0.41 one way.
ALLREDUCE_BANDWIDTH_FRACTION = 0.4

#: Kernels of one dense layer that Vidur profiles: 2 norms, QKV, rope, O, up, act, down, add.
PROFILED_KERNELS_PER_LAYER = 9
#: Further kernels of a served layer: the KV-cache write, plus one attention kernel per phase
#: (prefill, decode) present in the batch.
KV_WRITE_KERNELS = 1
#: Extra kernels of an MoE layer over a dense one, as a serving engine's fused MoE runs it
#: (vLLM's fused_moe): the router matmul, the fused top-k softmax, the block alignment of the
#: sorted assignments and the weighted sum of each token's expert outputs.
MOE_EXTRA_KERNELS = 4

#: Grouped expert GEMMs: every expert's slice is a small GEMM whose tiles each pay a fixed
#: prologue/epilogue beside their K / BK main-loop steps, so the compute time of a routed
#: expert's matmul is its FLOPs' time times (1 + GROUPED_GEMM_K0 / K), K its reduction
#: dimension (hidden size for gate+up, the expert's FFN size for down). Dense matmuls' own
#: such cost is inside their fitted eta_compute. Fitted on the shipped H200 MoE tables
#: (`coral.perf.holdout.fit_grouped_gemm`; leave-one-model-out in
#: benchmarks/results/history.md, "MoE layers"); approximate.
GROUPED_GEMM_K0 = 3000.0

#: Weight streaming of grouped expert GEMMs as a fraction of a dense matmul's (eta_memory):
#: a few tokens per expert leave each expert's small GEMM too few tiles to keep the memory
#: system busy. Fitted with GROUPED_GEMM_K0; approximate.
GROUPED_GEMM_BANDWIDTH = 0.725
#: Kernels of the shared experts of an MoE layer (up, act, down).
SHARED_EXPERT_KERNELS = 3


class MeasuredTable(Protocol):
    """A measured per-layer profile of one model on one node type (e.g. `coral profile`)."""

    model: str
    node_type: str

    def layer_seconds(self, prefill_tokens: int, decode_batch: int, context_tokens: int) -> float:
        """Seconds for ONE layer of this iteration shape, interpolated between measurements."""
        ...


# ---- results ----


@dataclass(frozen=True)
class IterationTime:
    """One iteration's time and its parts (seconds). total = compute + memory + comm + overhead.

    compute_s/memory_s: operator groups whose roofline is compute-/memory-bound. For a measured
    table the measured per-layer time is reported in compute_s (the table does not split it).
    """

    total_s: float
    compute_s: float
    memory_s: float
    comm_s: float
    overhead_s: float
    source: Literal["roofline", "measured"]
    efficiencies_from: str


class _Consts:
    """Everything `iteration_seconds` needs for one (model, node), precomputed."""

    __slots__ = (
        "refs", "model", "node", "gpu", "eff", "coef", "num_layers", "tp", "flops", "bw", "bw_e",
        "t_kernel", "kernels", "ar_bw", "ar_lat", "hidden_bytes", "vocab", "hidden", "dt",
        "table", "lm_head", "ew_bytes_per_token", "up_routed_extra", "down_routed_extra",
        "grouped_bw", "expert_bits",
    )


class PerfModel(MemoryQueries):
    """Iteration times of model layers on node types, from the roofline or a measured table.

    `efficiencies`: None uses the committed calibration (`coral/perf/data/efficiencies.yaml`);
    an `Efficiencies` applies one set of figures to every GPU type; an `EfficiencyTable` (or a
    mapping GPU name -> Efficiencies) is looked up per GPU type, borrowing by architecture.
    `tables`: measured per-layer tables; one for a (model, node type) replaces the formula.
    `layer_fits`: matmul efficiencies fitted on borrowing cards' own whole-layer profiles
    (`coral.perf.layer_fits`), applied to those cards' borrowed figures; None uses the
    committed fits with the committed calibration and none with any other efficiencies (the
    fits were made on top of the committed calibration's borrowed figures).

    Memory capacity counts every expert's weights (`ModelArch.weight_bytes_per_layer`); the
    iteration time reads only the experts the batch touches.
    """

    def __init__(
        self,
        catalog: Catalog,
        efficiencies: Efficiencies | EfficiencyTable | Mapping[str, Efficiencies] | None = None,
        tables: Sequence[MeasuredTable] = (),
        *,
        grouped_gemm_k0: float = GROUPED_GEMM_K0,
        grouped_gemm_bandwidth: float = GROUPED_GEMM_BANDWIDTH,
        layer_fits: Mapping[str, LayerFit] | None = None,
    ):
        if grouped_gemm_k0 < 0 or not 0 < grouped_gemm_bandwidth <= 1:
            raise ValueError("grouped_gemm_k0 must be >= 0 and grouped_gemm_bandwidth in (0, 1]")
        self.grouped_gemm_k0 = float(grouped_gemm_k0)
        self.grouped_gemm_bandwidth = float(grouped_gemm_bandwidth)
        self.catalog = catalog
        if layer_fits is None:
            layer_fits = default_layer_fits() if efficiencies is None else {}
        self.layer_fits: dict[str, LayerFit] = dict(layer_fits)
        if efficiencies is None:
            efficiencies = default_efficiencies()
        elif isinstance(efficiencies, Mapping):
            efficiencies = EfficiencyTable(efficiencies)
        self.efficiencies = efficiencies
        #: element-wise bytes per SM per clock of the table's fitted HBM types (borrowing)
        self.elementwise_rate = (
            elementwise_rate(efficiencies, catalog)
            if isinstance(efficiencies, EfficiencyTable) else None
        )
        self._tables: dict[tuple[str, str], MeasuredTable] = {}
        for table in tables:
            self._tables[(table.model, table.node_type)] = table
        self._cache: dict[tuple[object, object], _Consts] = {}

    # ---- lookups ----

    def efficiencies_for(self, gpu: GpuType | str) -> Efficiencies:
        gpu_t = self.catalog.gpu(gpu) if isinstance(gpu, str) else gpu
        if isinstance(self.efficiencies, Efficiencies):
            return self.efficiencies
        eff = self.efficiencies.for_gpu(gpu_t)
        if eff.borrowed_from and eff.borrowed_from in self.catalog.gpus:
            # a borrowed fit describes the donor's clocks and memory; carry it to this GPU
            # type's sustained throughput (a power-capped board holds less than its donor)
            eff = scale_borrowed(eff, gpu_t, self.catalog.gpu(eff.borrowed_from), self.catalog,
                                 self.elementwise_rate)
        fit = self.layer_fits.get(gpu_t.name)
        if eff.borrowed_from and fit is not None:
            # the card's own layers measure the level its matmuls reach; nothing to carry
            eff = apply_layer_fit(eff, fit)
        return eff

    def has_table(self, model: str | ModelArch, node: str | NodeType) -> bool:
        m = model if isinstance(model, str) else model.name
        n = node if isinstance(node, str) else node.name
        return (m, n) in self._tables

    def _consts(self, model: str | ModelArch, node: str | NodeType) -> _Consts:
        key = (
            model if isinstance(model, str) else id(model),
            node if isinstance(node, str) else id(node),
        )
        k = self._cache.get(key)
        if k is not None and (isinstance(model, str) or k.refs[0] is model) and (
            isinstance(node, str) or k.refs[1] is node
        ):
            return k
        arch = self.catalog.model(model) if isinstance(model, str) else model
        node_t = self.catalog.node_type(node) if isinstance(node, str) else node
        gpu = self.catalog.gpu_of(node_t)
        eff = self.efficiencies_for(gpu)
        tp = node_t.gpu_count
        k = _Consts()
        k.refs = (model, node)
        k.model, k.node, k.gpu, k.eff = arch, node_t, gpu, eff
        k.expert_bits = (expert_weight_bits(arch, gpu, tp)
                         if arch.expert_weight_format is not None else None)
        k.coef = layer_coefficients(arch, tp, k.expert_bits)
        # bytes per token of each element-wise kernel of a served layer
        ew_kernels = [*k.coef.profiled_elementwise_kernels, k.coef.kv_write_bytes_per_token]
        k.up_routed_extra = k.down_routed_extra = 0.0
        k.grouped_bw = 1.0 / self.grouped_gemm_bandwidth  # time factor on expert weight bytes
        if arch.moe is not None:
            m = arch.moe
            nu = 2.0 if arch.gated_mlp else 1.0
            fe = m.expert_ffn_size / tp
            h = float(arch.hidden_size)
            # the weighted sum of each token's k expert outputs: k rows read, one written
            ew_kernels.append((m.experts_per_token + 1) * h * arch.dtype_bytes)
            # grouped GEMMs: FLOPs per token added to the routed experts' matmuls
            routed_up = 2.0 * h * nu * m.experts_per_token * fe
            routed_down = 2.0 * m.experts_per_token * fe * h
            k.up_routed_extra = routed_up * self.grouped_gemm_k0 / h
            k.down_routed_extra = routed_down * self.grouped_gemm_k0 / fe
        k.num_layers = arch.num_layers
        k.tp = tp
        k.flops = gpu.bf16_tflops * 1e12 * eff.eta_compute
        k.bw = gpu.mem_bandwidth_gb_per_s * 1e9 * eff.eta_memory
        k.bw_e = gpu.mem_bandwidth_gb_per_s * 1e9 * eff.eta_elementwise
        k.t_kernel = eff.kernel_overhead_s
        k.ew_bytes_per_token = sum(ew_kernels)
        kernels = PROFILED_KERNELS_PER_LAYER + KV_WRITE_KERNELS
        if arch.moe is not None:
            kernels += MOE_EXTRA_KERNELS + (SHARED_EXPERT_KERNELS if arch.moe.shared_experts else 0)
        k.kernels = kernels
        k.ar_bw = gpu.intra_node_link_gb_per_s * 1e9 * ALLREDUCE_BANDWIDTH_FRACTION
        k.ar_lat = ALLREDUCE_LATENCY_S[gpu.intra_node_link]
        k.dt = float(arch.dtype_bytes)
        k.hidden = float(arch.hidden_size)
        k.hidden_bytes = arch.hidden_size * k.dt
        k.vocab = float(arch.vocab_size)
        v = arch.vocab_size / tp
        h = float(arch.hidden_size)
        k.lm_head = Matmul(2.0 * h * v, h * v * k.dt, (h + v) * k.dt)
        k.table = self._tables.get((arch.name, node_t.name))
        self._cache[key] = k
        return k

    # ---- the formula ----

    def _allreduce(self, k: _Consts, nbytes: float) -> float:
        return 2.0 * (k.tp - 1) / k.tp * nbytes / k.ar_bw + k.ar_lat

    def _layer(self, k: _Consts, p: int, b: int, ctx: int) -> tuple[float, float, float, float]:
        """(compute, memory, comm, overhead) seconds of ONE layer by the roofline: each kernel's
        time is `coral.perf.kernel_time.kernel_seconds`, written out here because this is the
        template builder's hot path."""
        coef = k.coef
        t = p + b
        tq = tile_padded_tokens(t)  # rows the dense matmuls' kernels compute
        fl, bw = k.flops, k.bw
        comp = mem = 0.0
        # matmuls
        for mm in (coef.qkv, coef.o):
            tc = mm.flops_per_token * tq / fl
            tm = (mm.weight_bytes + mm.bytes_per_token * t) / bw
            tg = (tc**ROOFLINE_P + tm**ROOFLINE_P) ** _INV_P
            if tc >= tm:
                comp += tg
            else:
                mem += tg
        if coef.moe_experts:
            touched = expected_distinct_experts(coef.moe_experts, coef.moe_top_k, t)
            w_up = touched * coef.expert_up_bytes + coef.fixed_up_bytes
            w_down = touched * coef.expert_down_bytes + coef.fixed_down_bytes
            # routed experts' weights streamed by grouped GEMMs (fixed part: router, shared)
            w_up += touched * coef.expert_up_bytes * (k.grouped_bw - 1.0)
            w_down += touched * coef.expert_down_bytes * (k.grouped_bw - 1.0)
            mlp = ((coef.up, w_up, k.up_routed_extra), (coef.down, w_down, k.down_routed_extra))
            rows = t  # grouped GEMMs: their per-expert tiles are in GROUPED_GEMM_K0
        else:
            mlp = ((coef.up, coef.up.weight_bytes, 0.0), (coef.down, coef.down.weight_bytes, 0.0))
            rows = tq
        for mm, w, grouped in mlp:
            tc = (mm.flops_per_token + grouped) * rows / fl
            tm = (w + mm.bytes_per_token * t) / bw
            tg = (tc**ROOFLINE_P + tm**ROOFLINE_P) ** _INV_P
            if tc >= tm:
                comp += tg
            else:
                mem += tg
        kernels = k.kernels
        # attention: one kernel per phase present in the batch
        kernels += (1 if p else 0) + (1 if b else 0)
        if coef.sliding_share:
            c, m = mixed_attention_seconds(coef, p, b, ctx, fl, bw, k.dt)
            comp += c
            mem += m
        else:  # every layer over the whole context
            qg, kvg = coef.q_dim_per_gpu, coef.kv_dim_per_gpu
            if p:
                tc = 2.0 * p * (p + 1) * qg / fl
                tm = p * (2.0 * qg + 2.0 * kvg) * k.dt / bw
                tg = (tc**ROOFLINE_P + tm**ROOFLINE_P) ** _INV_P
                if tc >= tm:
                    comp += tg
                else:
                    mem += tg
            if b:
                tc = 4.0 * ctx * qg / fl
                tm = (ctx * 2.0 * kvg + b * 2.0 * qg) * k.dt / bw
                tg = (tc**ROOFLINE_P + tm**ROOFLINE_P) ** _INV_P
                if tc >= tm:
                    comp += tg
                else:
                    mem += tg
        # element-wise
        mem += t * k.ew_bytes_per_token / k.bw_e
        comm = 2.0 * self._allreduce(k, t * k.hidden_bytes) if k.tp > 1 else 0.0
        return comp, mem, comm, kernels * k.t_kernel

    def _extras(
        self, k: _Consts, p: int, b: int, first: bool, last: bool
    ) -> tuple[float, float, float, float]:
        """(compute, memory, comm, overhead) of the embedding and/or final norm + LM head."""
        comp = mem = comm = over = 0.0
        if first:
            t = p + b
            mem += 2.0 * t * k.hidden_bytes / k.bw_e
            over += k.t_kernel
            if k.tp > 1:  # vocab-parallel embedding: partial rows are summed
                comm += self._allreduce(k, t * k.hidden_bytes)
        if last:
            n = b + (1 if p else 0)
            mem += 2.0 * n * k.hidden_bytes / k.bw_e
            mm = k.lm_head
            tc = mm.flops_per_token * tile_padded_tokens(n) / k.flops
            tm = (mm.weight_bytes + mm.bytes_per_token * n) / k.bw
            tg = (tc**ROOFLINE_P + tm**ROOFLINE_P) ** _INV_P
            if tc >= tm:
                comp += tg
            else:
                mem += tg
            over += 2 * k.t_kernel
            if k.tp > 1:  # all-gather of the vocab-sharded logits
                comm += (k.tp - 1) / k.tp * n * k.vocab * k.dt / k.ar_bw + k.ar_lat
        return comp, mem, comm, over

    def _check(self, k: _Consts, layers: int, p: int, b: int, ctx: int) -> None:
        if not 1 <= layers <= k.num_layers:
            raise ValueError(
                f"layers must be between 1 and {k.num_layers} (the layers of "
                f"{k.model.name!r}), got {layers}"
            )
        if p < 0 or b < 0:
            raise ValueError("prefill_tokens and decode_batch must be >= 0")
        if p == 0 and b == 0:
            raise ValueError("an iteration needs prefill_tokens > 0 or decode_batch > 0")
        if ctx < b:
            raise ValueError(
                f"context_tokens ({ctx}) must be at least decode_batch ({b}): each decoding "
                "sequence has at least one token of context"
            )

    # ---- public API ----

    def iteration_seconds(self, model: str | ModelArch, node: str | NodeType, layers: int,
                          prefill_tokens: int = 0, decode_batch: int = 0,
                          context_tokens: int = 0, *, first_stage: bool = False,
                          last_stage: bool = False) -> float:
        """Seconds of one iteration of `layers` consecutive layers (see the module docstring)."""
        k = self._consts(model, node)
        self._check(k, layers, prefill_tokens, decode_batch, context_tokens)
        if k.table is not None:
            total = layers * k.table.layer_seconds(prefill_tokens, decode_batch, context_tokens)
        else:
            c, m, x, o = self._layer(k, prefill_tokens, decode_batch, context_tokens)
            total = layers * (c + m + x + o)
        if first_stage or last_stage:
            c, m, x, o = self._extras(k, prefill_tokens, decode_batch, first_stage, last_stage)
            total += c + m + x + o
        return total + ITERATION_OVERHEAD_S

    def breakdown(self, model: str | ModelArch, node: str | NodeType, layers: int,
                  prefill_tokens: int = 0, decode_batch: int = 0, context_tokens: int = 0, *,
                  first_stage: bool = False, last_stage: bool = False) -> IterationTime:
        """`iteration_seconds` with its parts and where the figures came from."""
        k = self._consts(model, node)
        self._check(k, layers, prefill_tokens, decode_batch, context_tokens)
        ec, em, ex, eo = self._extras(
            k, prefill_tokens, decode_batch, first_stage, last_stage
        )
        if k.table is not None:
            layer_s = k.table.layer_seconds(prefill_tokens, decode_batch, context_tokens)
            comp, mem, comm, over = layers * layer_s + ec, em, ex, eo + ITERATION_OVERHEAD_S
            source: Literal["roofline", "measured"] = "measured"
            origin = "measured table"
            if first_stage or last_stage:
                origin += f"; embedding/LM head {k.eff.label}"
        else:
            c, m, x, o = self._layer(k, prefill_tokens, decode_batch, context_tokens)
            comp, mem, comm = layers * c + ec, layers * m + em, layers * x + ex
            over = layers * o + eo + ITERATION_OVERHEAD_S
            source, origin = "roofline", k.eff.label
        return IterationTime(
            total_s=comp + mem + comm + over,
            compute_s=comp,
            memory_s=mem,
            comm_s=comm,
            overhead_s=over,
            source=source,
            efficiencies_from=origin,
        )

    def profiled_ops_seconds(
        self, model: str | ModelArch, node: str | NodeType, tokens: int
    ) -> float:
        """Seconds of ONE layer's operators that Vidur profiles (projections, MLP, norms, rope,
        activation, add) for `tokens` tokens on one GPU of the node's TP group: no attention, no
        KV write, no communication. The quantity the calibration fits (dense models)."""
        k = self._consts(model, node)
        coef = k.coef
        total = 0.0
        tq = tile_padded_tokens(tokens)
        for mm in (coef.qkv, coef.o, coef.up, coef.down):
            total += kernel_seconds(mm.flops_per_token * tq / k.flops,
                                    (mm.weight_bytes + mm.bytes_per_token * tokens) / k.bw,
                                    k.t_kernel)
        for nbytes in coef.profiled_elementwise_kernels:
            total += elementwise_seconds(tokens * nbytes / k.bw_e, k.t_kernel)
        return total
