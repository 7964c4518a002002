"""GPT-OSS in the perf model: sliding-window layers, MXFP4 experts by GPU type, top-4 routing,
and templates and the simulator running it; models without these features keep their figures."""

from __future__ import annotations

import dataclasses

import pytest

from coral.catalog import ModelArch, load_catalog
from coral.perf.layer_costs import expected_distinct_experts, layer_coefficients
from coral.perf.model import PerfModel
from coral.perf.precision import expert_weight_bits
from coral.perf.sliding import (
    WINDOW_SEQUENCES,
    mixed_attention_seconds,
    sliding_prefill_pairs,
    window_capacity_tokens,
)
from coral.templates.slo import SloSpec

CAT = load_catalog()
WINDOW = 128
#: Catalog models that have neither sliding layers nor 4-bit experts.
PLAIN_MODELS = sorted(n for n, m in CAT.models.items()
                      if m.sliding_window is None and m.expert_weight_format is None)


@pytest.fixture(scope="module")
def perf() -> PerfModel:
    return PerfModel(CAT)


def all_full(name: str) -> ModelArch:
    """`name` with every layer attending over the whole context (a hypothetical variant)."""
    return CAT.model(name).model_copy(update={
        "name": f"{name}-all-full", "sliding_window": None, "attention_pattern": ("full",)})


def bf16_experts(name: str) -> ModelArch:
    """`name` with its experts stored in bf16 (a hypothetical variant)."""
    return CAT.model(name).model_copy(update={
        "name": f"{name}-bf16", "expert_weight_format": None})


# ---------------------------------------------------------------- sliding-window attention


def test_a_sliding_layer_stops_growing_past_its_window_and_a_full_one_does_not() -> None:
    coef = layer_coefficients(CAT.model("gpt-oss-20b"), 1)
    sliding = dataclasses.replace(coef, sliding_share=1.0)
    full = dataclasses.replace(coef, sliding_share=0.0)
    rates = (989e12 * 0.7, 3.35e12 * 0.8, 2.0)  # FLOP/s, bytes/s, dtype bytes
    batch = 8

    def decode_s(c: object, per_seq: int) -> float:
        return sum(mixed_attention_seconds(c, 0, batch, batch * per_seq, *rates))

    slide = [decode_s(sliding, n) for n in (64, WINDOW, 1024, 8192)]
    whole = [decode_s(full, n) for n in (64, WINDOW, 1024, 8192)]
    assert slide[0] < slide[1] == slide[2] == slide[3]
    assert whole[0] < whole[1] < whole[2] < whole[3]
    assert whole[1] == slide[1]  # within the window both read the same KV
    # prompts: a token pairs with at most the window's keys past it
    assert sliding_prefill_pairs(100, WINDOW) == 100 * 101 // 2
    assert sliding_prefill_pairs(1001, WINDOW) - sliding_prefill_pairs(1000, WINDOW) == WINDOW
    prefill = [sum(mixed_attention_seconds(c, 4096, 0, 0, *rates)) for c in (sliding, full)]
    assert prefill[0] < prefill[1]


def test_kv_tokens_a_layer_stores() -> None:
    arch = CAT.model("gpt-oss-120b")
    stored = [arch.kv_tokens_stored(i, 8192) for i in range(arch.num_layers)]
    assert stored == [WINDOW, 8192] * 18
    assert sum(arch.kv_tokens_stored(i, 50) for i in range(4)) == 200


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
def test_decode_grows_with_context_at_half_the_rate_of_an_all_full_variant(perf: PerfModel,
                                                                           name: str) -> None:
    """Half the layers slide: past the window only the full half reads more KV."""
    layers = CAT.model(name).num_layers
    for node in ("1x-h100-sxm", "1x-l40s", "4x-l4"):
        def grown(arch: str | ModelArch) -> float:
            short = perf.iteration_seconds(arch, node, layers, 0, 16, 16 * 1024)
            long = perf.iteration_seconds(arch, node, layers, 0, 16, 16 * 16384)
            return long - short

        assert grown(name) == pytest.approx(0.5 * grown(all_full(name)), rel=1e-9)


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
def test_kv_memory_of_a_long_sequence_is_about_half_an_all_full_variants(perf: PerfModel,
                                                                         name: str) -> None:
    """At 8,192 tokens a sequence keeps 8,192 tokens in the 50 % full layers and 128 in the
    sliding ones: 0.5 + 0.5 x 128 / 8192 = 0.5078 of what all-full layers keep."""
    layers = CAT.model(name).num_layers
    for node in ("1x-h100-sxm", "8x-l4"):
        ours = (perf.kv_bytes_per_token(name, node, layers) * 8192
                + perf.window_kv_bytes(name, node, layers))
        full = perf.kv_bytes_per_token(all_full(name), node, layers) * 8192
        assert ours / full == pytest.approx(0.5 + 0.5 * WINDOW / 8192, rel=1e-12)
        assert perf.window_kv_bytes(all_full(name), node, layers) == 0.0


def test_kv_capacity_holds_the_windows_of_its_sequences(perf: PerfModel) -> None:
    """The tokens `max_kv_tokens` gives fit for any split over up to WINDOW_SEQUENCES
    sequences, one more does not fit when that many hold full windows, and the capacity is
    more than an all-full variant's (which keeps every layer's KV per token)."""
    name, node = "gpt-oss-120b", "1x-h100-sxm"
    layers = CAT.model(name).num_layers
    tokens = perf.max_kv_tokens(name, node, layers, first_stage=True, last_stage=True)
    full = perf.kv_bytes_per_token(name, node, layers)
    window_bytes = perf.window_kv_bytes(name, node, layers)
    usable = CAT.node_memory_bytes(node) * 0.9
    free = usable - perf.stage_weight_bytes(name, layers, first_stage=True, last_stage=True,
                                            node=node)
    worst = full * tokens + window_bytes * WINDOW_SEQUENCES
    assert worst <= free < worst + full
    variant = perf.max_kv_tokens(all_full(name), node, layers, first_stage=True,
                                 last_stage=True)
    assert 1.5 * variant < tokens < 2 * variant
    # few tokens: fewer than WINDOW_SEQUENCES full windows, so every token counts its windows
    sliding = window_bytes / WINDOW
    small = window_capacity_tokens(1000 * (full + sliding), full, window_bytes, WINDOW,
                                   WINDOW_SEQUENCES)
    assert small == 1000


# ---------------------------------------------------------------- experts: precision, routing


def test_mxfp4_experts_are_served_as_stored_from_ampere_on() -> None:
    """4.25 bits a weight, padded as vLLM's kernels allocate them: Marlin (Ampere, Ada) to
    FFN shares of 128 and a hidden size of 256, Triton on Hopper to FFN shares of 64."""
    arch = CAT.model("gpt-oss-120b")
    marlin_1 = 4.25 * 2944 * 3072 / (2880 * 2880)  # 2880 -> 2944 and 3072
    marlin_8 = 4.25 * 384 * 3072 / (360 * 2880)  # a share of 360 -> 384
    for gpu in ("a100-80gb", "a10g", "l4", "l40s"):
        assert expert_weight_bits(arch, CAT.gpu(gpu)) == pytest.approx(marlin_1, rel=1e-12)
        assert expert_weight_bits(arch, CAT.gpu(gpu), 8) == pytest.approx(marlin_8, rel=1e-12)
    h100 = CAT.gpu("h100-sxm")
    assert expert_weight_bits(arch, h100) == 4.25  # 2880 is a multiple of 64
    assert expert_weight_bits(arch, h100, 8) == pytest.approx(4.25 * 384 / 360, rel=1e-12)
    for gpu in ("v100", "t4"):  # below vLLM's MXFP4 minimum (compute capability 8.0)
        assert expert_weight_bits(arch, CAT.gpu(gpu)) == 16.0, gpu
    assert expert_weight_bits(CAT.model("qwen3-30b-a3b"), CAT.gpu("h100-sxm")) == 16.0


def test_expert_bytes_held_and_read_follow_the_gpu_types_precision(perf: PerfModel) -> None:
    name = "gpt-oss-20b"
    arch = CAT.model(name)
    held = {n: perf.stage_weight_bytes(name, arch.num_layers, node=n)
            for n in ("1x-h100-sxm", "1x-l4", "1x-v100")}
    assert held["1x-h100-sxm"] == arch.num_layers * arch.weight_bytes_per_layer
    marlin = expert_weight_bits(arch, CAT.gpu("l4"))
    assert held["1x-l4"] == arch.num_layers * arch.weight_bytes_per_layer_at(marlin)
    assert held["1x-h100-sxm"] < held["1x-l4"] < 1.1 * held["1x-h100-sxm"]
    assert held["1x-v100"] == arch.num_layers * bf16_experts(name).weight_bytes_per_layer
    coef = layer_coefficients(arch, 1, 4.25)
    assert coef.expert_up_bytes == 2 * 2880 * 2880 * 4.25 / 8
    assert coef.expert_down_bytes == 2880 * 2880 * 4.25 / 8
    assert coef.moe_experts == 32 and coef.moe_top_k == 4
    # a small decode batch streams its experts' weights: 4-bit experts are faster than bf16
    for node in ("1x-h100-sxm", "1x-a100-80gb", "1x-l4"):
        ours = perf.iteration_seconds(name, node, arch.num_layers, 0, 4, 4 * 1000)
        bf16 = perf.iteration_seconds(bf16_experts(name), node, arch.num_layers, 0, 4, 4 * 1000)
        assert ours < 0.75 * bf16, node


@pytest.mark.parametrize(("name", "experts"), [("gpt-oss-20b", 32), ("gpt-oss-120b", 128)])
def test_top4_routing_touches_more_experts_as_the_batch_grows(perf: PerfModel, name: str,
                                                              experts: int) -> None:
    assert expected_distinct_experts(experts, 4, 1) == pytest.approx(4.0)
    assert expected_distinct_experts(experts, 4, 256) == pytest.approx(experts, rel=1e-3)
    times = [perf.iteration_seconds(name, "1x-h100-sxm", 1, 0, b, b * 1000)
             for b in (1, 4, 16, 64)]
    assert times == sorted(times) and times[0] < times[-1]


# ---------------------------------------------------------------- nothing else moves


@pytest.mark.parametrize("name", PLAIN_MODELS)
def test_models_without_the_new_fields_keep_their_figures(perf: PerfModel, name: str) -> None:
    arch = CAT.model(name)
    assert arch.sliding_layer_share == 0.0 and arch.sink_params_per_layer == 0
    assert arch.weight_bytes_per_layer == arch.params_per_layer * arch.dtype_bytes
    for tp in (1, 2, 4, 8):
        coef = layer_coefficients(arch, tp)
        assert coef.sliding_share == 0.0 and coef.window == 0
        assert coef == layer_coefficients(arch, tp, 8.0 * arch.dtype_bytes)
    node = "8x-h100-sxm"
    kvg = coef.kv_dim_per_gpu
    assert perf.kv_bytes_per_token(name, node, 3) == 3 * 8 * 2.0 * kvg * arch.dtype_bytes
    assert perf.window_kv_bytes(name, node, 3) == 0.0
    assert perf.stage_weight_bytes(name, 3, node=node) == perf.stage_weight_bytes(name, 3)


# ---------------------------------------------------------------- templates and the simulator

SLO = SloSpec(tpot_s=0.1, ttft_s=2.0, percentile=0.9, input_tokens=1024, output_tokens=256)


@pytest.mark.parametrize(("name", "combo"), [
    ("gpt-oss-20b", ["1x-l40s"]),
    ("gpt-oss-120b", ["1x-h100-sxm"]),
    ("gpt-oss-120b", ["1x-l40s", "1x-l40s"]),
    ("phi-4", ["1x-l40s"]),
])
def test_templates_build_and_simulate_at_their_planned_rate(perf: PerfModel, name: str,
                                                            combo: list[str]) -> None:
    from coral.allocator.scenario.headroom import planned_capacity
    from coral.perf.step import template_saturation
    from coral.sim import instance_from_template, simulate, summarize, synthetic
    from coral.templates.builder.solve import build_template

    tpl = build_template(name, combo, SLO, "aggregated", "flow", perf, CAT)
    assert tpl.feasible and tpl.tpot_s <= SLO.tpot_s and tpl.ttft_s <= SLO.ttft_s
    sat = template_saturation(tpl, perf=perf, catalog=CAT)
    rate = planned_capacity(tpl, saturation=sat) * tpl.throughput_rps / tpl.throughput
    assert rate > 0
    reqs = synthetic(name, rate_rps=rate, duration_s=300, seed=1,
                     prompt_tokens=SLO.input_tokens, output_tokens=SLO.output_tokens)
    res = simulate([instance_from_template(tpl)], reqs, perf=perf, catalog=CAT)
    summary = summarize(res, {name: SLO})["models"][name]
    assert summary["slo_attainment"] >= SLO.percentile, summary


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_disaggregated_halves_build_for_gpt_oss(perf: PerfModel, mode: str) -> None:
    from coral.templates.builder.solve import build_template

    tpl = build_template("gpt-oss-120b", ["1x-a100-80gb"], SLO, mode, "flow", perf, CAT)
    assert tpl.feasible and tpl.throughput_rps > 0


def test_operating_points_hold_4_bit_experts_and_the_windows(perf: PerfModel) -> None:
    """The template search's memory per layer: experts as the GPU type holds them, and one
    window a sequence in the sliding layers."""
    from coral.templates.space.operating_points import OperatingPointTables

    tables = OperatingPointTables(perf, CAT)
    arch = CAT.model("gpt-oss-120b")
    h100, v100 = CAT.node_type("1x-h100-sxm"), CAT.node_type("1x-v100")
    assert tables.weight_bytes_per_layer(arch, h100) == arch.weight_bytes_per_layer
    assert tables.weight_bytes_per_layer(arch, v100) == bf16_experts(
        "gpt-oss-120b").weight_bytes_per_layer
    assert tables.window_bytes_per_layer(arch, h100) == 0.5 * WINDOW * 2 * 8 * 64 * 2
    llama = CAT.model("llama-3.1-8b")
    assert tables.window_bytes_per_layer(llama, h100) == 0.0
    assert tables.weight_bytes_per_layer(llama, h100) == llama.weight_bytes_per_layer


def test_a_prompt_hands_over_its_full_layers_and_the_windows_of_the_sliding_ones(
        perf: PerfModel) -> None:
    """PD: a prefill instance sends every token's KV of the 50 % full layers and the last 128
    tokens' of the sliding ones; the simulated transfer is that over the slower NIC."""
    from coral.perf.step import KV_TRANSFER_LATENCY_S, kv_bytes_per_token, kv_transfer_bytes
    from coral.sim import InstanceSpec, Request, simulate
    from coral.sim.deployment import stages_from_nodes

    name, prompt = "gpt-oss-20b", 1000
    arch = CAT.model(name)
    per_layer = 2 * 8 * 64 * 2
    assert kv_bytes_per_token(arch) == 12 * per_layer
    assert kv_transfer_bytes(arch, prompt) == (12 * prompt + 12 * WINDOW) * per_layer
    assert kv_transfer_bytes(arch, 50) == 24 * 50 * per_layer
    llama = CAT.model("llama-3.1-8b")
    assert kv_transfer_bytes(llama, prompt) == prompt * 32 * 2 * 8 * 128 * 2

    def spec(role: str, node: str, batch: int) -> InstanceSpec:
        return InstanceSpec(role, name, stages_from_nodes([(node, 0, 24, batch, 1.0)]), 1.0,
                            1.0, role=role, region="")

    insts = [spec("prefill", "1x-l40s", 4096), spec("decode", "1x-l4", 32)]
    r = simulate(insts, [Request(0, name, 0.0, prompt, 5)], perf=perf, catalog=CAT).requests[0]
    nic = min(CAT.node_type(n).nic_gbps for n in ("1x-l40s", "1x-l4")) * 1e9 / 8
    assert r.status == "done" and r.decode_instance == "decode"
    assert r.transfer_s == pytest.approx(kv_transfer_bytes(arch, prompt) / nic
                                         + KV_TRANSFER_LATENCY_S, rel=1e-12)


def test_the_profiler_refuses_a_layer_it_does_not_run() -> None:
    from coral.errors import InputError
    from coral.perf.torch_layers import DecoderShape

    with pytest.raises(InputError, match="sliding-window attention, attention sinks, mxfp4"):
        DecoderShape.of_arch(CAT.model("gpt-oss-20b"))
    assert DecoderShape.of_arch(CAT.model("phi-4")).num_kv_heads == 10
