"""The roofline performance model: shape of its predictions, one value by hand, tables, memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coral.catalog import Catalog, load_catalog
from coral.perf.model import (
    ALLREDUCE_BANDWIDTH_FRACTION,
    ITERATION_OVERHEAD_S,
    MEMORY_RESERVE_FRACTION,
    ROOFLINE_P,
    Efficiencies,
    EfficiencyTable,
    PerfModel,
    expected_distinct_experts,
)

# A small, self-contained catalog: two GPU types (one made up with round numbers for the
# hand-computed check), node types of 1 and 8 GPUs, a dense model, an MoE model and its
# dense equivalent (the same weights in one wide MLP).
CATALOG_YAML = """
schema_version: 1
gpus:
  - {name: test-round, memory_gb: 80, bf16_tflops: 100, mem_bandwidth_gb_per_s: 1000,
     intra_node_link: nvlink, intra_node_link_gb_per_s: 500, architecture: ampere,
     source: test}
  - {name: test-h100, memory_gb: 80, bf16_tflops: 989, mem_bandwidth_gb_per_s: 3350,
     intra_node_link: nvlink, intra_node_link_gb_per_s: 900, architecture: hopper,
     source: test}
  - {name: test-pcie, memory_gb: 24, bf16_tflops: 121, mem_bandwidth_gb_per_s: 300,
     intra_node_link: pcie, intra_node_link_gb_per_s: 32, architecture: ada, source: test}
regions: []
node_types:
  - {name: test-1x-round, gpu: test-round, gpu_count: 1, nic_gbps: 10, instances: {other: r1}}
  - {name: test-1x-h100, gpu: test-h100, gpu_count: 1, nic_gbps: 100, instances: {other: h1}}
  - {name: test-8x-h100, gpu: test-h100, gpu_count: 8, nic_gbps: 400, instances: {other: h8}}
  - {name: test-1x-pcie, gpu: test-pcie, gpu_count: 1, nic_gbps: 16, instances: {other: p1}}
  - {name: test-4x-pcie, gpu: test-pcie, gpu_count: 4, nic_gbps: 16, instances: {other: p4}}
models:
  - {name: test-tiny, hf_id: test/tiny, num_layers: 4, hidden_size: 1024, ffn_size: 4096,
     num_heads: 8, num_kv_heads: 8, head_dim: 128, vocab_size: 1000, source: test}
  - {name: test-8b, hf_id: test/8b, num_layers: 32, hidden_size: 4096, ffn_size: 14336,
     num_heads: 32, num_kv_heads: 8, head_dim: 128, vocab_size: 128256, source: test}
  - {name: test-70b, hf_id: test/70b, num_layers: 80, hidden_size: 8192, ffn_size: 28672,
     num_heads: 64, num_kv_heads: 8, head_dim: 128, vocab_size: 128256, source: test}
  - name: test-moe
    hf_id: test/moe
    num_layers: 32
    hidden_size: 4096
    ffn_size: 14336
    num_heads: 32
    num_kv_heads: 8
    head_dim: 128
    vocab_size: 32000
    moe: {num_experts: 8, experts_per_token: 2, expert_ffn_size: 14336}
    source: test
  - {name: test-moe-dense, hf_id: test/moe-dense, num_layers: 32, hidden_size: 4096,
     ffn_size: 114688, num_heads: 32, num_kv_heads: 8, head_dim: 128, vocab_size: 32000,
     source: test}
"""

EFF = Efficiencies(
    gpu="test",
    architecture="ampere",
    eta_compute=0.5,
    eta_memory=0.8,
    eta_elementwise=0.5,
    kernel_overhead_s=2e-6,
    fitted_on="hand-picked for tests",
)


@pytest.fixture(scope="module")
def catalog_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("perf") / "catalog.yaml"
    path.write_text(CATALOG_YAML)
    return path


@pytest.fixture(scope="module")
def cat(catalog_file: Path) -> Catalog:
    return load_catalog([catalog_file], include_builtin=False)


@pytest.fixture(scope="module")
def pm(cat: Catalog) -> PerfModel:
    return PerfModel(cat, efficiencies=EFF)


# ---------------------------------------------------------------- one value by hand


def _roof(tc: float, tm: float) -> float:
    return (tc**ROOFLINE_P + tm**ROOFLINE_P) ** (1 / ROOFLINE_P)


def test_closed_form_decode_value(pm: PerfModel) -> None:
    # test-tiny on one 100 TFLOP/s, 1000 GB/s GPU; 2 layers, 1 sequence decoding over 10 tokens.
    fl, bw, bw_e, tk = 100e12 * 0.5, 1000e9 * 0.8, 1000e9 * 0.5, 2e-6
    h, q, kv, f, dt = 1024, 1024, 1024, 4096, 2
    t = 1  # tokens in the iteration
    r = 64  # rows the matmul kernels compute for one token: one skinny row tile
    matmuls = [  # (FLOPs, bytes): weights + activations in/out
        (2 * h * (q + 2 * kv) * r, h * (q + 2 * kv) * dt + (h + q + 2 * kv) * dt * t),  # QKV
        (2 * q * h * r, q * h * dt + (q + h) * dt * t),  # O
        (2 * h * 2 * f * r, h * 2 * f * dt + (h + 2 * f) * dt * t),  # gate+up
        (2 * f * h * r, f * h * dt + (f + h) * dt * t),  # down
        (4 * 10 * q, (10 * 2 * kv + 1 * 2 * q) * dt),  # decode attention over 10 tokens
    ]
    per_layer = sum(_roof(fl_ / fl, by / bw) for fl_, by in matmuls)
    elementwise = (2 * 2 * h + 2 * (q + kv) + 3 * f + 3 * h + 2 * 2 * kv) * dt * t
    per_layer += elementwise / bw_e
    per_layer += 11 * tk  # 9 profiled kernels + KV write + decode attention
    expected = 2 * per_layer + ITERATION_OVERHEAD_S
    got = pm.iteration_seconds("test-tiny", "test-1x-round", 2, 0, 1, 10)
    assert got == pytest.approx(expected, rel=1e-12)
    bd = pm.breakdown("test-tiny", "test-1x-round", 2, 0, 1, 10)
    assert bd.total_s == pytest.approx(got, rel=1e-12)
    assert bd.compute_s + bd.memory_s + bd.comm_s + bd.overhead_s == pytest.approx(bd.total_s)
    # one token computes a whole 64-row tile: 64 FLOP per weight byte, above this GPU's ridge
    # (50 TFLOP/s / 800 GB/s = 62.5), so the matmuls count as compute-bound
    assert bd.compute_s > bd.memory_s > 0.0
    assert bd.comm_s == 0.0
    assert bd.overhead_s == pytest.approx(2 * 11 * tk + ITERATION_OVERHEAD_S)
    assert bd.source == "roofline"


def test_tp_allreduce_cost_by_hand(cat: Catalog) -> None:
    # Two all-reduces per layer: ring 2(c-1)/c * T*h*dt over the achieved link bandwidth.
    pm = PerfModel(cat, efficiencies=EFF)
    bd = pm.breakdown("test-8b", "test-8x-h100", 3, prefill_tokens=512)
    link = 900e9 * ALLREDUCE_BANDWIDTH_FRACTION
    one = 2 * 7 / 8 * 512 * 4096 * 2 / link + 8e-6
    assert bd.comm_s == pytest.approx(3 * 2 * one, rel=1e-12)
    one_gpu = pm.breakdown("test-8b", "test-1x-h100", 3, prefill_tokens=512)
    assert one_gpu.comm_s == 0.0


# ---------------------------------------------------------------- roofline shape


@settings(max_examples=40, deadline=None)
@given(
    p=st.integers(0, 8192),
    b=st.integers(0, 256),
    per_seq=st.integers(1, 4096),
    dp=st.integers(1, 4096),
    db=st.integers(1, 64),
    dc=st.integers(1, 100_000),
)
def test_time_increases_with_tokens_batch_and_context(pm, p, b, per_seq, dp, db, dc) -> None:
    if p == 0 and b == 0:
        p = 1
    c = b * per_seq
    base = pm.iteration_seconds("test-8b", "test-1x-h100", 8, p, b, c)
    assert pm.iteration_seconds("test-8b", "test-1x-h100", 8, p + dp, b, c) > base
    assert pm.iteration_seconds("test-8b", "test-1x-h100", 8, p, b + db, c + db * per_seq) > base
    if b:
        assert pm.iteration_seconds("test-8b", "test-1x-h100", 8, p, b, c + dc) > base


def test_decode_batch_one_is_memory_bound_at_weights_over_bandwidth(cat, pm) -> None:
    model = cat.model("test-8b")
    layers = 32
    bd = pm.breakdown(model, "test-1x-h100", layers, decode_batch=1, context_tokens=1)
    assert bd.compute_s == 0.0
    weights_time = layers * model.weight_bytes_per_layer / (3350e9 * EFF.eta_memory)
    assert bd.memory_s == pytest.approx(weights_time, rel=0.05)


def test_large_prefill_is_compute_bound(cat, pm) -> None:
    bd = pm.breakdown("test-8b", "test-1x-h100", 32, prefill_tokens=8192)
    assert bd.compute_s > 5 * bd.memory_s
    model = cat.model("test-8b")
    matmul_flops = 32 * 2 * 8192 * (model.params_per_layer - 2 * model.hidden_size)
    assert bd.compute_s >= matmul_flops / (989e12 * EFF.eta_compute)


def test_tensor_parallel_over_8_gpus_is_faster_but_sublinear(pm) -> None:
    for p, b, c in ((2048, 0, 0), (0, 64, 64 * 2048), (512, 32, 32 * 1024)):
        one = pm.iteration_seconds("test-70b", "test-1x-h100", 10, p, b, c)
        eight = pm.iteration_seconds("test-70b", "test-8x-h100", 10, p, b, c)
        assert eight < one
        assert eight > one / 8


def test_moe_reads_and_computes_only_active_experts(cat: Catalog) -> None:
    # Same weights in total; the MoE model touches 2 of 8 experts per token. The accounting
    # is checked with the grouped-GEMM costs off (they are tested below).
    pm = PerfModel(cat, efficiencies=EFF, grouped_gemm_k0=0.0, grouped_gemm_bandwidth=1.0)
    moe_prefill = pm.breakdown("test-moe", "test-8x-h100", 4, prefill_tokens=8192)
    dense_prefill = pm.breakdown("test-moe-dense", "test-8x-h100", 4, prefill_tokens=8192)
    assert moe_prefill.compute_s < 0.5 * dense_prefill.compute_s
    moe_decode = pm.iteration_seconds("test-moe", "test-1x-h100", 4, 0, 1, 100)
    dense_decode = pm.iteration_seconds("test-moe-dense", "test-1x-h100", 4, 0, 1, 100)
    assert moe_decode < 0.5 * dense_decode
    # a large decode batch touches every expert: it reads (nearly) all the weights
    moe = pm.catalog.model("test-moe")
    moe_big = pm.breakdown(moe, "test-1x-h100", 4, 0, 64, 6400)
    all_weights = 4 * moe.weight_bytes_per_layer / (3350e9 * EFF.eta_memory)
    assert all_weights <= moe_big.memory_s < 1.2 * all_weights


def test_grouped_expert_gemms_cost_more_than_dense_ones(cat: Catalog) -> None:
    """Small per-expert GEMMs: compute scaled by 1 + k0/K (K: hidden size for gate+up, the
    per-GPU expert FFN size for down), expert weights streamed at a fraction of eta_memory."""
    plain = PerfModel(cat, efficiencies=EFF, grouped_gemm_k0=0.0, grouped_gemm_bandwidth=1.0)
    k0 = PerfModel(cat, efficiencies=EFF, grouped_gemm_k0=1000.0, grouped_gemm_bandwidth=1.0)
    bw = PerfModel(cat, efficiencies=EFF, grouped_gemm_k0=0.0, grouped_gemm_bandwidth=0.5)
    args = ("test-moe", "test-1x-h100", 4)
    assert k0.breakdown(*args, prefill_tokens=8192).compute_s > plain.breakdown(
        *args, prefill_tokens=8192).compute_s
    moe = cat.model("test-moe")
    expert_bytes = 4 * moe.moe.num_experts * moe.expert_params * moe.dtype_bytes
    extra = bw.breakdown(*args, 0, 64, 6400).memory_s - plain.breakdown(*args, 0, 64, 6400).memory_s
    # every expert touched: its weights take twice as long (smoothed roofline: about)
    assert extra == pytest.approx(expert_bytes / (3350e9 * EFF.eta_memory), rel=0.05)
    # dense models are untouched
    for m in (plain, k0, bw):
        assert m.iteration_seconds("test-8b", "test-1x-h100", 4, 512) == plain.iteration_seconds(
            "test-8b", "test-1x-h100", 4, 512)
    with pytest.raises(ValueError):
        PerfModel(cat, grouped_gemm_bandwidth=0.0)


def test_expected_distinct_experts() -> None:
    assert expected_distinct_experts(8, 2, 0) == 0.0
    assert expected_distinct_experts(8, 2, 1) == pytest.approx(2.0)
    assert expected_distinct_experts(128, 8, 10_000) == pytest.approx(128.0)
    values = [expected_distinct_experts(64, 4, t) for t in range(1, 200)]
    assert all(a < b for a, b in zip(values, values[1:]))


def test_layers_scale_linearly(pm) -> None:
    for args in ((1024, 0, 0), (0, 16, 16 * 512), (256, 8, 8000)):
        t1 = pm.iteration_seconds("test-8b", "test-8x-h100", 4, *args) - ITERATION_OVERHEAD_S
        t2 = pm.iteration_seconds("test-8b", "test-8x-h100", 8, *args) - ITERATION_OVERHEAD_S
        t8 = pm.iteration_seconds("test-8b", "test-8x-h100", 32, *args) - ITERATION_OVERHEAD_S
        assert t2 == pytest.approx(2 * t1, rel=1e-12)
        assert t8 == pytest.approx(8 * t1, rel=1e-12)


def test_stage_extras_add_embedding_and_lm_head(pm) -> None:
    mid = pm.iteration_seconds("test-8b", "test-1x-h100", 4, 128, 8, 800)
    first = pm.iteration_seconds("test-8b", "test-1x-h100", 4, 128, 8, 800, first_stage=True)
    last = pm.iteration_seconds("test-8b", "test-1x-h100", 4, 128, 8, 800, last_stage=True)
    both = pm.iteration_seconds(
        "test-8b", "test-1x-h100", 4, 128, 8, 800, first_stage=True, last_stage=True
    )
    assert mid < first < both and mid < last < both
    # the LM head reads its 128256 x 4096 weights once: about one layer's worth of bytes
    lm_bytes = 128256 * 4096 * 2
    assert last - mid >= lm_bytes / (3350e9 * EFF.eta_memory)
    assert both - mid == pytest.approx((first - mid) + (last - mid), rel=1e-9)


def test_pcie_node_pays_more_for_communication(pm) -> None:
    bd = pm.breakdown("test-8b", "test-4x-pcie", 8, prefill_tokens=2048)
    assert bd.comm_s > 0.1 * bd.total_s


def test_objects_and_names_give_the_same_answer(cat, pm) -> None:
    by_name = pm.iteration_seconds("test-8b", "test-8x-h100", 5, 100, 3, 300)
    by_obj = pm.iteration_seconds(
        cat.model("test-8b"), cat.node_type("test-8x-h100"), 5, 100, 3, 300
    )
    assert by_name == by_obj


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, 0, 0, 0), "layers must be between"),
        ((33, 10, 0, 0), "layers must be between"),
        ((4, 0, 0, 0), "prefill_tokens > 0 or decode_batch > 0"),
        ((4, 0, 8, 4), "context_tokens"),
        ((4, -1, 0, 0), ">= 0"),
    ],
)
def test_invalid_iterations_are_refused(pm, args, message) -> None:
    with pytest.raises(ValueError, match=message):
        pm.iteration_seconds("test-8b", "test-1x-h100", *args)


@pytest.mark.perf
def test_iteration_seconds_is_fast(pm) -> None:
    import time

    pm.iteration_seconds("test-70b", "test-8x-h100", 10, 0, 1, 1)
    n = 20_000
    start = time.perf_counter()
    for i in range(n):
        pm.iteration_seconds("test-70b", "test-8x-h100", 10, 0, 1 + i % 128, 1000 + i)
    per_call = (time.perf_counter() - start) / n
    assert per_call < 50e-6


# ---------------------------------------------------------------- measured tables


@dataclass(frozen=True)
class FakeTable:
    model: str
    node_type: str
    seconds: float = 1e-3

    def layer_seconds(self, prefill_tokens: int, decode_batch: int, context_tokens: int) -> float:
        return self.seconds * (1 + prefill_tokens / 1000 + decode_batch / 100)


def test_measured_table_overrides_formula(cat) -> None:
    pm = PerfModel(cat, efficiencies=EFF, tables=[FakeTable("test-8b", "test-1x-h100")])
    got = pm.iteration_seconds("test-8b", "test-1x-h100", 4, 1000, 0, 0)
    assert got == pytest.approx(4 * 2e-3 + ITERATION_OVERHEAD_S)
    bd = pm.breakdown("test-8b", "test-1x-h100", 4, 0, 100, 1000)
    assert bd.source == "measured"
    assert bd.total_s == pytest.approx(4 * 2e-3 + ITERATION_OVERHEAD_S)
    assert "measured" in bd.efficiencies_from
    assert pm.has_table("test-8b", "test-1x-h100")
    # stage extras still come from the formula
    last = pm.iteration_seconds("test-8b", "test-1x-h100", 4, 1000, 0, 0, last_stage=True)
    assert last > got
    # other (model, node) pairs keep the roofline
    assert pm.breakdown("test-8b", "test-8x-h100", 4, 1000).source == "roofline"
    assert pm.breakdown("test-70b", "test-1x-h100", 4, 1000).source == "roofline"


# ---------------------------------------------------------------- memory


def test_max_kv_tokens_by_hand(cat, pm) -> None:
    model = cat.model("test-8b")
    usable = 80e9 * (1 - MEMORY_RESERVE_FRACTION)
    free = usable - 16 * model.weight_bytes_per_layer
    per_token = 16 * model.kv_bytes_per_token_per_layer
    assert pm.max_kv_tokens("test-8b", "test-1x-h100", 16) == int(free // per_token)
    # first and last stages also hold the embedding and the LM head
    fewer = pm.max_kv_tokens("test-8b", "test-1x-h100", 16, first_stage=True, last_stage=True)
    assert fewer == int((free - 2 * 128256 * 4096 * 2 - 4096 * 2) // per_token)


def test_kv_heads_replicate_when_tp_exceeds_them(cat, pm) -> None:
    # 8 KV heads over 8 GPUs: one each, so the node holds exactly the model's KV bytes...
    model = cat.model("test-8b")
    assert pm.kv_bytes_per_token("test-8b", "test-8x-h100", 1) == model.kv_bytes_per_token_per_layer
    # ...but a model with 4 KV heads over 8 GPUs stores each head twice
    four = model.model_copy(update={"name": "test-8b-kv4", "num_kv_heads": 4})
    assert pm.kv_bytes_per_token(four, "test-8x-h100", 1) == 2 * four.kv_bytes_per_token_per_layer


def test_fits_and_max_layers(cat, pm) -> None:
    assert pm.fits("test-8b", "test-1x-h100", 32)
    assert not pm.fits("test-70b", "test-1x-h100", 80)
    most = pm.max_layers("test-70b", "test-1x-pcie")
    assert 0 < most < 80
    assert pm.fits("test-70b", "test-1x-pcie", most)
    assert not pm.fits("test-70b", "test-1x-pcie", most + 1)
    model = cat.model("test-70b")
    usable = 24e9 * (1 - MEMORY_RESERVE_FRACTION)
    by_hand = max(
        k for k in range(1, 81)
        if usable - k * model.weight_bytes_per_layer >= k * model.kv_bytes_per_token_per_layer
    )
    assert most == by_hand
    # MoE capacity counts every expert, not just the active ones
    moe = cat.model("test-moe")
    assert pm.stage_weight_bytes(moe, 32) == 32 * moe.weight_bytes_per_layer
    assert moe.weight_bytes_per_layer > moe.active_params_per_layer * moe.dtype_bytes


# ---------------------------------------------------------------- efficiencies


def test_efficiency_table_borrows_by_architecture(cat) -> None:
    amp = Efficiencies("test-round", "ampere", 0.7, 0.8, 0.6, 4e-6, "test fit")
    hop = Efficiencies("test-h100", "hopper", 0.72, 0.9, 0.6, 4e-6, "test fit")
    table = EfficiencyTable({"test-round": amp, "test-h100": hop})
    assert table.for_gpu(cat.gpu("test-h100")) is hop
    borrowed = table.for_gpu(cat.gpu("test-pcie"))  # ada -> ampere
    assert borrowed.borrowed_from == "test-round"
    assert borrowed.gpu == "test-pcie" and borrowed.architecture == "ada"
    assert borrowed.eta_compute == amp.eta_compute
    assert "borrowed from test-round" in borrowed.label
    pm = PerfModel(cat, efficiencies=table)
    assert "borrowed" in pm.breakdown("test-8b", "test-1x-pcie", 1, 10).efficiencies_from
    assert "fitted" in pm.breakdown("test-8b", "test-1x-h100", 1, 10).efficiencies_from


def test_efficiencies_are_validated() -> None:
    with pytest.raises(ValueError, match="eta_memory"):
        Efficiencies("x", "ampere", 0.5, 1.5, 0.5, 0.0, "bad")


def test_default_efficiencies_load_from_the_committed_file(cat) -> None:
    pm = PerfModel(cat)  # no efficiencies given: the committed fit
    h100 = pm.efficiencies_for("test-h100")
    assert h100.borrowed_from == "h100-sxm"  # same architecture as the fitted H100 SXM
    assert 0.3 < h100.eta_compute <= 1.0
    assert pm.iteration_seconds("test-8b", "test-1x-h100", 32, 0, 1, 100) > 0
