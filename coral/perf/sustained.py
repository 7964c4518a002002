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
the clock a well-powered donor holds. Energy per FLOP is taken as constant with clock, which
is pessimistic where a capped board also lowers its voltage; the base-clock floor bounds that.
"""

from __future__ import annotations

from dataclasses import replace

from coral.catalog.loader import Catalog
from coral.catalog.schema import GpuType
from coral.perf.efficiencies import Efficiencies


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


def scale_borrowed(eff: Efficiencies, gpu: GpuType, donor: GpuType,
                   catalog: Catalog) -> Efficiencies:
    """A donor's efficiencies carried to `gpu` by the ratio of their sustained fractions."""
    c = compute_fraction(gpu, catalog) / compute_fraction(donor, catalog)
    m = memory_fraction(gpu, catalog) / memory_fraction(donor, catalog)
    if c == 1.0 and m == 1.0:
        return eff
    return replace(
        eff,
        eta_compute=min(1.0, eff.eta_compute * c),
        eta_memory=min(1.0, eff.eta_memory * m),
        eta_elementwise=min(1.0, eff.eta_elementwise * m),
        fitted_on=f"{eff.fitted_on}; scaled to sustained throughput (compute x{c:.3f}, "
                  f"memory x{m:.3f})",
    )
