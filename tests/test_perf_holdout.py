"""Sustained throughput from the catalog, and the leave-one-GPU-out validation (issue 22)."""

from __future__ import annotations

import pytest

from coral.catalog import load_catalog
from coral.perf.holdout import leave_one_gpu_out, moe_leave_one_model_out
from coral.perf.model import PerfModel
from coral.perf.sustained import compute_fraction, memory_fraction, scale_borrowed

CATALOG = load_catalog()


def test_sustained_fractions_follow_the_cited_figures():
    gpu = CATALOG.gpu
    # measured: T4 ~24 of 65 TFLOP/s; the H200's own matmul and copy probes
    assert compute_fraction(gpu("t4"), CATALOG) == pytest.approx(24.0 / 65.0)
    assert compute_fraction(gpu("h200"), CATALOG) == pytest.approx(799.9 / 989.0)
    assert memory_fraction(gpu("h200"), CATALOG) == pytest.approx(4294.7 / 4800.0)
    # same process as the H200 (TSMC 4N): the L4's 72 W hold less than its boost-clock peak,
    # the L40S's 350 W hold all of it
    l4 = compute_fraction(gpu("l4"), CATALOG)
    assert 795 / 2040 < l4 < 0.8
    assert l4 == pytest.approx(72 * 799.9 / 700 / 121)
    assert compute_fraction(gpu("l40s"), CATALOG) == 1.0
    # the base clock bounds the power estimate from below
    s = gpu("h100-pcie").sustained
    assert compute_fraction(gpu("h100-pcie"), CATALOG) == pytest.approx(
        s.base_clock_mhz / s.boost_clock_mhz)
    # no measurement on the process or memory kind: no claim
    assert compute_fraction(gpu("a100-80gb"), CATALOG) == 1.0
    assert memory_fraction(gpu("l4"), CATALOG) == 1.0


def test_borrowed_figures_are_scaled_and_own_fits_are_not():
    perf = PerfModel(CATALOG)
    donor = perf.efficiencies_for("a100-80gb")
    l4 = perf.efficiencies_for("l4")
    assert l4.borrowed_from == "a100-80gb"
    assert l4.eta_compute == pytest.approx(
        donor.eta_compute * compute_fraction(CATALOG.gpu("l4"), CATALOG))
    assert l4.eta_memory == donor.eta_memory
    assert scale_borrowed(donor, CATALOG.gpu("a40"), CATALOG.gpu("a100-80gb"), CATALOG) is donor
    # a power-capped card's prefill is slower than its datasheet peak and donor suggest
    plain = PerfModel(CATALOG, efficiencies=donor)  # one set of figures: applied as it is
    assert perf.iteration_seconds("llama-3.1-8b", "1x-l4", 8, 2048) > 1.3 * (
        plain.iteration_seconds("llama-3.1-8b", "1x-l4", 8, 2048))


def test_leave_one_gpu_out_medians():
    """Issue 22's target: median within 10 % per held-out GPU type, prefill and decode."""
    for r in leave_one_gpu_out(CATALOG):
        for kind in ("prefill", "decode"):
            err = r.kind(kind)
            assert err.n > 0
            assert err.median_abs <= 0.10, (r.gpu, kind, err.median_abs)


def test_moe_leave_one_model_out_median():
    """Grouped-GEMM figures fitted on the other MoE tables: median within 15 %."""
    for model, (_, errs) in moe_leave_one_model_out(CATALOG).items():
        for kind, e in errs.items():
            assert e.median_abs <= 0.15, (model, kind, e.median_abs)
