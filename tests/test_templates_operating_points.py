"""Operating points: monotonicity, memory/SLO filters, memoisation, bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_templates_support import TINY_BATCHES, reference_solve, tiny_catalog, tiny_slo

from coral.catalog import default_catalog
from coral.perf.model import PerfModel
from coral.templates.space.operating_points import (
    NET_LATENCY_S,
    OperatingPointTables,
    edge_bytes_per_unit,
    prefill_chunks,
)
from coral.templates.slo import default_slo


@pytest.fixture(scope="module")
def real():
    cat = default_catalog()
    return cat, OperatingPointTables(PerfModel(cat), cat)


def _by(spec, last, batch=None):
    return {(o.layers, o.batch): o for o in spec.options
            if o.is_last == last and (batch is None or o.batch == batch)}


def test_capacity_decreases_in_layers_and_memory_increases_in_batch(real):
    cat, tables = real
    slo = default_slo(cat.model("llama-3.1-8b"))
    t = tables.time_table("llama-3.1-8b", "1x-a100-80gb", slo, "aggregated")
    # raw tables, before any filtering: time up with layers and with batch
    assert np.all(np.diff(t.t, axis=0) > 0)
    assert np.all(np.diff(t.t, axis=1) > 0)
    for mode in ("aggregated", "decode", "prefill"):
        # n = 1: one round of resident sequences, so memory is monotone in layers and batch
        # (with more nodes, fewer rounds fit in the SLO as an iteration slows down)
        spec = tables.node_spec("llama-3.1-8b", "1x-a100-80gb", slo, mode, 1)
        assert spec.options
        for last in (False, True):
            opts = _by(spec, last)
            for (k, b), o in opts.items():
                nxt = opts.get((k + 1, b))
                if nxt is not None:
                    assert nxt.capacity < o.capacity
                    assert nxt.mem_bytes > o.mem_bytes
                    assert nxt.step_s >= o.step_s and nxt.prefill_s >= o.prefill_s
                for (k2, b2), p in opts.items():
                    if k2 == k and b2 > b:
                        assert p.mem_bytes > o.mem_bytes


def test_options_respect_memory_and_slo(real):
    cat, tables = real
    for model in ("llama-3.1-8b", "qwen3-30b-a3b", "llama-3.3-70b"):
        slo = default_slo(cat.model(model))
        for node in ("1x-t4", "1x-l4", "4x-a100-40gb", "8x-h100-sxm"):
            for mode in ("aggregated", "decode", "prefill"):
                spec = tables.node_spec(model, node, slo, mode, 4)
                usable = cat.node_memory_bytes(node) * 0.9
                assert spec.mem_bytes == pytest.approx(usable)
                for o in spec.options:
                    assert o.mem_bytes <= usable
                    assert 1 <= o.layers <= cat.model(model).num_layers
                    if mode != "prefill":
                        assert o.step_s <= slo.tpot_s
                    if mode != "decode":
                        assert o.prefill_s <= slo.ttft_s
                    if not o.is_last:
                        assert o.step_s >= NET_LATENCY_S or mode == "prefill"


def test_memory_grows_with_node_count_until_slo_bound(real):
    cat, tables = real
    slo = default_slo(cat.model("llama-3.1-8b"))
    specs = [tables.node_spec("llama-3.1-8b", "1x-h100-sxm", slo, "decode", n) for n in (1, 2, 6)]
    mems = [{(o.layers, o.batch, o.is_last): o.mem_bytes for o in s.options} for s in specs]
    common = set(mems[0]) & set(mems[1]) & set(mems[2])
    assert common
    for key in common:
        assert mems[0][key] <= mems[1][key] <= mems[2][key]
    # n = 1: one round of b sequences of I + O tokens, plus the weights
    arch = cat.model("llama-3.1-8b")
    o = next(o for o in specs[0].options if not o.is_last)
    kv = o.batch * (slo.input_tokens + slo.output_tokens) * o.layers * arch.kv_bytes_per_token_per_layer
    assert o.mem_bytes == pytest.approx(o.layers * arch.weight_bytes_per_layer + kv)


def test_aggregated_formulas(real):
    cat, tables = real
    perf = tables.perf
    arch = cat.model("qwen3-14b")
    slo = default_slo(arch)
    I, O = slo.input_tokens, slo.output_tokens
    spec = tables.node_spec(arch, "4x-l4", slo, "aggregated", 2)
    o = next(o for o in spec.options if not o.is_last and o.batch == 8)
    b, k = o.batch, o.layers
    p = math.ceil(b * I / O)
    t = perf.iteration_seconds(arch, "4x-l4", k, p, b, int(b * (I + O / 2)))
    nic = cat.node_type("4x-l4").nic_gbps * 1e9 / 8
    hb = arch.hidden_size * arch.dtype_bytes
    assert o.capacity == pytest.approx(b / (t * O))
    assert o.step_s == pytest.approx(t + (p + b) * hb / nic + NET_LATENCY_S)
    tp = perf.iteration_seconds(arch, "4x-l4", k, I, b, int(b * (I + O / 2)))
    assert o.prefill_s == pytest.approx(tp + I * hb / nic + NET_LATENCY_S)
    assert edge_bytes_per_unit(arch, slo, "aggregated") == (I + O) * hb
    assert edge_bytes_per_unit(arch, slo, "decode") == hb
    assert prefill_chunks(slo) == (1024, 2048, 4096, 8192, 16384)


def _spec_twice(tables, slo):
    import time

    start = time.perf_counter()
    a = tables.node_spec("qwen3-235b-a22b", "8x-h100-sxm", slo, "aggregated", 6)
    first = time.perf_counter() - start
    start = time.perf_counter()
    b = tables.node_spec("qwen3-235b-a22b", "8x-h100-sxm", slo, "aggregated", 6)
    return a, b, first, time.perf_counter() - start


def test_tables_are_memoised(real):
    cat, tables = real
    a, b, _, _ = _spec_twice(tables, default_slo(cat.model("qwen3-235b-a22b")))
    assert a is b


@pytest.mark.perf
def test_tables_are_fast(real):
    cat, tables = real
    _, _, first, again = _spec_twice(tables, default_slo(cat.model("qwen3-235b-a22b")))
    assert again < 1e-3 and first < 2.0


def test_useless_node_types_and_problem(tmp_path):
    cat = tiny_catalog(tmp_path)
    tables = OperatingPointTables(PerfModel(cat), cat, batches=TINY_BATCHES)
    slo = tiny_slo()
    useful, useless = tables.useful_node_types("tiny-4l", list(cat.node_types), slo, "aggregated")
    assert useless == [] and len(useful) == 4
    strict = slo.with_overrides(tpot_s=1e-4, ttft_s=1e-4)
    useful, useless = tables.useful_node_types("tiny-4l", list(cat.node_types), strict, "aggregated")
    assert useful == []
    prob = tables.problem("tiny-4l", ["1x-s", "1x-b"], slo, "aggregated", "chain")
    assert prob.topology == "chain" and prob.num_layers == 4 and len(prob.nodes) == 2
    assert prob.first_stage_extra_bytes == 32000 * 4096 * 2
    assert prob.tpot_s == slo.tpot_s and prob.ttft_s == slo.ttft_s
    dec = tables.problem("tiny-4l", ["1x-b"], slo, "decode")
    pre = tables.problem("tiny-4l", ["1x-b"], slo, "prefill")
    assert dec.ttft_s is None and pre.tpot_s is None


@pytest.mark.parametrize("combo", [("1x-s", "1x-s"), ("1x-b", "1x-s"), ("1x-s", "2x-s"),
                                   ("1x-b",), ("2x-s", "2x-s")])
@pytest.mark.parametrize("mode", ["aggregated", "decode"])
def test_throughput_bound_is_a_true_bound(tmp_path, combo, mode):
    cat = tiny_catalog(tmp_path)
    tables = OperatingPointTables(PerfModel(cat), cat, batches=TINY_BATCHES)
    slo = tiny_slo()
    prob = tables.problem("tiny-4l", combo, slo, mode)
    best = reference_solve(prob).throughput
    bound = tables.throughput_bound("tiny-4l", combo, slo, mode)
    assert best > 0
    assert best <= bound * (1 + 1e-9)
