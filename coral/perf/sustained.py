"""Sustained throughput: the fraction of its datasheet peaks a GPU type holds under load.

Datasheet tensor FLOP/s are counted at the boost clock, which a board holds under a long run
of tensor-core work only when its power limit (TDP) allows. A GPU type's catalog entry carries
its board power, base and boost clocks, silicon process and memory kind, and, where one is
published, a measured sustained matmul throughput and copy bandwidth
(`coral.catalog.schema.SustainedFigures`, each with its source). From them:

- compute: a measured matmul throughput over the peak; else the energy per tensor FLOP that a
  measurement on the same process gives (measured TFLOP/s per board watt) times this board's
  power, over its peak, at most 1 and at least base / boost clock (the clock the vendor
  guarantees at TDP); else 1 (no claim).
- memory: a measured copy bandwidth over the peak; else one measured on the same memory kind,
  as a fraction; else 1 (no claim).

A GPU type without its own profile borrows a profiled type's efficiencies
(`coral.perf.efficiencies.DONOR_ARCHITECTURE`); `scale_borrowed` multiplies them by the ratio
of the two types' sustained fractions, so a power-capped card (L4, T4) is not credited with
the clock a well-powered donor holds. Where the borrower and its donor both list one public
benchmark's matmul figure (`benchmark_gemm_tflops`), the compute ratio is theirs
(`compute_ratio`). The figure is the benchmark's throughput over runs as long as a layer's
prefill (the median of its 4096^2-10240^2 sizes), not its best size: a prefill layer on a
70 W card runs for tens of milliseconds and a stage runs several back to back, so the card
works at the clock its power limit settles on, which the benchmark's millisecond bursts at
small sizes do not reach; a donor that is not power-capped (the 400 W A100) holds its best
figure over long runs (benchmarks/results/perf-model.md, "Perf model 7"). Energy per FLOP is
taken as constant with clock, which is pessimistic where a capped board also lowers its voltage;
the base-clock floor bounds that. Where the borrower's own whole-layer profile is published, the
perf model replaces the carried matmul figure by one fitted on it (`coral.perf.layer_fits`).

Element-wise kernels (norms, rope, activation, residual add) are not held by DRAM alone: on
HBM cards the SMs cannot issue their loads and stores fast enough (Vidur's profiles: about
6.4 bytes per SM per clock on both the A100 and the H100, half their DRAM bandwidth), while a
GDDR6 card's DRAM is slower than its SMs (the A40: 76 % of its 696 GB/s). Their bandwidth is
bounded by `elementwise_ceiling`, the lesser of the DRAM bandwidth a weight-streaming matmul
reaches and the SMs' issue rate at `elementwise_rate` bytes per SM per clock, fitted on the
fitted HBM types; a borrowed element-wise figure is carried by the ratio of the two types'
ceilings, so it follows the SMs between HBM cards and DRAM to and from GDDR cards.
"""

from __future__ import annotations

import math
from dataclasses import replace

from coral.catalog.loader import Catalog
from coral.catalog.schema import GpuType
from coral.perf.efficiencies import Efficiencies, EfficiencyTable


def _tflops_per_watt(catalog: Catalog, process: str) -> float | None:
    """Measured sustained TFLOP/s per board watt on `process` (the best measured board)."""
    figures = [
        g.sustained.gemm_tflops / g.sustained.board_power_w
        for g in catalog.gpus.values()
        if g.sustained and g.sustained.process == process and g.sustained.gemm_tflops
    ]
    return max(figures) if figures else None


def compute_fraction(gpu: GpuType, catalog: Catalog) -> float:
    """Fraction of the datasheet dense tensor FLOP/s `gpu` sustains (1: no claim)."""
    s = gpu.sustained
    if s is None:
        return 1.0
    if s.gemm_tflops:
        return min(1.0, s.gemm_tflops / gpu.bf16_tflops)
    per_watt = _tflops_per_watt(catalog, s.process)
    if per_watt is None:
        return 1.0
    power_bound = s.board_power_w * per_watt / gpu.bf16_tflops
    return min(1.0, max(power_bound, s.base_clock_mhz / s.boost_clock_mhz))


def _benchmark_fraction(gpu: GpuType) -> float | None:
    """The cross-card benchmark's matmul figure over the datasheet peak, None if not listed."""
    s = gpu.sustained
    if s is None or s.benchmark_gemm_tflops is None:
        return None
    return s.benchmark_gemm_tflops / gpu.bf16_tflops


def compute_ratio(gpu: GpuType, donor: GpuType, catalog: Catalog) -> float:
    """Factor on a donor's fitted matmul efficiency for `gpu`.

    Where both types list the same benchmark's matmul figure, the ratio of their fractions of
    peak: like for like, so the benchmark's own kernel efficiency cancels and what is left is
    the clock each board holds under tensor-core load at its power limit. Else the ratio of
    `compute_fraction`s (a measurement over the peak, or board power times a measured energy
    per FLOP on the same process)."""
    mine, theirs = _benchmark_fraction(gpu), _benchmark_fraction(donor)
    if mine is not None and theirs is not None:
        return mine / theirs
    return compute_fraction(gpu, catalog) / compute_fraction(donor, catalog)


def memory_fraction(gpu: GpuType, catalog: Catalog) -> float:
    """Fraction of the datasheet memory bandwidth `gpu` sustains (1: no claim)."""
    s = gpu.sustained
    if s is None:
        return 1.0
    if s.copy_gb_per_s:
        return min(1.0, s.copy_gb_per_s / gpu.mem_bandwidth_gb_per_s)
    same = [
        g.sustained.copy_gb_per_s / g.mem_bandwidth_gb_per_s
        for g in catalog.gpus.values()
        if g.sustained and g.sustained.memory == s.memory and g.sustained.copy_gb_per_s
    ]
    return min(1.0, max(same)) if same else 1.0


def _sm_issue(gpu: GpuType) -> float | None:
    """SMs x boost clock (SM-cycles per second), None when the catalog lacks either."""
    s = gpu.sustained
    if s is None or s.sm_count is None:
        return None
    return s.sm_count * s.boost_clock_mhz * 1e6


def elementwise_rate(table: EfficiencyTable, catalog: Catalog) -> float | None:
    """Element-wise bytes per SM per clock of the fitted HBM types in `table` (geometric mean
    of each type's fitted element-wise bandwidth over its SMs x boost clock), None if none."""
    logs = []
    for name, eff in table.entries.items():
        if eff.borrowed_from or name not in catalog.gpus:
            continue
        gpu = catalog.gpu(name)
        issue = _sm_issue(gpu)
        if issue is None or not gpu.sustained or not gpu.sustained.memory.startswith("hbm"):
            continue
        logs.append(math.log(eff.eta_elementwise * gpu.mem_bandwidth_gb_per_s * 1e9 / issue))
    return math.exp(sum(logs) / len(logs)) if logs else None


def elementwise_ceiling(gpu: GpuType, eta_memory: float, rate: float | None) -> float:
    """Bytes/s element-wise kernels can reach on `gpu`: the lesser of its DRAM bandwidth at
    `eta_memory` and its SMs' issue rate at `rate` bytes per SM per clock (DRAM alone when
    either figure is missing)."""
    dram = gpu.mem_bandwidth_gb_per_s * 1e9 * eta_memory
    issue = _sm_issue(gpu)
    if rate is None or issue is None:
        return dram
    return min(dram, rate * issue)


def scale_borrowed(eff: Efficiencies, gpu: GpuType, donor: GpuType,
                   catalog: Catalog, elementwise_rate: float | None = None) -> Efficiencies:
    """A donor's efficiencies carried to `gpu` by the ratio of their sustained fractions; the
    element-wise figure by the ratio of their element-wise ceilings when `elementwise_rate`
    (bytes per SM per clock) is given and both types list SMs and clocks."""
    c = compute_ratio(gpu, donor, catalog)
    m = memory_fraction(gpu, catalog) / memory_fraction(donor, catalog)
    eta_m = min(1.0, eff.eta_memory * m)
    if elementwise_rate is not None and _sm_issue(gpu) and _sm_issue(donor):
        # the donor's element-wise bandwidth as a fraction of its ceiling (at most all of it:
        # a figure above the ceiling was not measured apart from the rest of a layer)
        share = min(1.0, eff.eta_elementwise * donor.mem_bandwidth_gb_per_s * 1e9
                    / elementwise_ceiling(donor, eff.eta_memory, elementwise_rate))
        eta_e = min(1.0, share * elementwise_ceiling(gpu, eta_m, elementwise_rate)
                    / (gpu.mem_bandwidth_gb_per_s * 1e9))
        how = f"element-wise x{eta_e / eff.eta_elementwise:.3f} (SM issue or DRAM)"
    else:
        eta_e = min(1.0, eff.eta_elementwise * m)
        how = ""
    if c == 1.0 and m == 1.0 and eta_e == eff.eta_elementwise:
        return eff
    return replace(
        eff,
        eta_compute=min(1.0, eff.eta_compute * c),
        eta_memory=eta_m,
        eta_elementwise=eta_e,
        fitted_on=f"{eff.fitted_on}; scaled to sustained throughput (compute x{c:.3f}, "
                  f"memory x{m:.3f}{', ' + how if how else ''})",
    )
