"""The built-in catalog: what it holds, its derived quantities, and user files on top of it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml

from coral.catalog import (
    Catalog,
    ModelArch,
    NodeType,
    UnknownNameError,
    default_catalog,
    load_catalog,
)

# GPU types named in the project's reference sheet (V100 and T4 included; A40 and the H100
# NVL / PCIe variants are extras).
REFERENCE_GPUS = {
    "h100-sxm",
    "h100-pcie",
    "a100-80gb",
    "a100-40gb",
    "l40s",
    "a10g",
    "l4",
    "v100",
    "t4",
}

# (total, active) parameters in billions, as published for each model. Llama 4 Scout's
# published ~109B includes its vision tower; the text-only model we size is ~108B.
PUBLISHED_PARAMS_B: dict[str, tuple[float, float]] = {
    "llama-3.1-8b": (8.03, 8.03),
    "qwen3-14b": (14.8, 14.8),
    "qwen3-32b": (32.8, 32.8),
    "llama-3.3-70b": (70.6, 70.6),
    "llama-2-70b": (69.0, 69.0),
    "llama-4-scout-17b-16e": (108.6, 17.0),
    "mixtral-8x22b": (141.0, 39.0),
    "qwen3-30b-a3b": (30.5, 3.3),
    "qwen3-235b-a22b": (235.0, 22.0),
    "phi-4": (14.7, 14.7),
}
PARAMS_REL_TOL = 0.03

# GPT-OSS (model card, arXiv:2508.10925): (total, active) parameters in billions, counting
# the unembedding but not the input embedding as active, and the checkpoint in GiB (MXFP4
# experts, bf16 elsewhere). Biases, which the catalog does not count, are 0.03 % of the total.
GPT_OSS_PUBLISHED: dict[str, tuple[float, float, float]] = {
    "gpt-oss-20b": (20.9, 3.6, 12.8),
    "gpt-oss-120b": (116.8, 5.1, 60.8),
}
GPT_OSS_REL_TOL = 0.01


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog()


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---------------------------------------------------------------- contents and counts


def test_builtin_catalog_loads_and_default_is_cached(cat: Catalog) -> None:
    assert default_catalog() is default_catalog()
    assert default_catalog().content_hash() == cat.content_hash()
    assert all(f.startswith("<builtin>/") for f in cat.files)
    assert len(cat.files) == 5


def test_counts(cat: Catalog) -> None:
    assert len(cat.gpus) >= 9
    assert REFERENCE_GPUS <= set(cat.gpus)
    assert len(cat.node_types) >= 20
    assert len(cat.regions) >= 6
    assert len(cat.models) >= 8
    assert set(PUBLISHED_PARAMS_B) <= set(cat.models)


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_each_major_cloud_has_two_priced_regions(cat: Catalog, cloud: str) -> None:
    regions = {r.name for r in cat.regions.values() if r.cloud == cloud}
    assert len(regions) >= 2
    priced = {p.region for n in cat.node_types.values() for p in n.prices} & regions
    assert len(priced) >= 2, f"{cloud}: only {sorted(priced)} priced"


def test_at_least_six_regions_priced(cat: Catalog) -> None:
    priced = {p.region for n in cat.node_types.values() for p in n.prices}
    assert len(priced) >= 6


def test_every_node_type_is_priced_somewhere(cat: Catalog) -> None:
    unpriced = [n.name for n in cat.node_types.values() if not n.prices]
    assert unpriced == []


def test_node_type_names_follow_count_x_gpu(cat: Catalog) -> None:
    for node in cat.node_types.values():
        assert node.name == f"{node.gpu_count}x-{node.gpu}"
        assert node.gpu in cat.gpus


def test_every_price_is_sourced_dated_and_on_an_offering_cloud(cat: Catalog) -> None:
    for node in cat.node_types.values():
        for price in node.prices:
            assert price.source.strip(), (node.name, price.region)
            assert price.date is not None and price.date <= dt.date(2026, 12, 31)
            assert cat.region(price.region).cloud in node.instances
            assert node.price_in(price.region) == price.usd_per_hour
            # uncertain figures say so in their source string too
            if price.approximate:
                assert "uncertain" in price.source or "approximate" in price.source


def test_every_model_and_gpu_is_sourced_and_dated(cat: Catalog) -> None:
    for entry in [*cat.gpus.values(), *cat.models.values()]:
        assert entry.source.strip() and entry.date is not None, entry.name


def test_every_gpu_lists_sms_and_clocks(cat: Catalog) -> None:
    """The element-wise ceiling (coral.perf.sustained) needs SMs and the boost clock."""
    for gpu in cat.gpus.values():
        s = gpu.sustained
        assert s is not None and s.sm_count and s.boost_clock_mhz, gpu.name
        assert "sm_count" in s.source, gpu.name
    sms = {g.name: g.sustained.sm_count for g in cat.gpus.values()}
    assert sms["h100-sxm"] == sms["h200"] == 132 and sms["h100-pcie"] == 114
    assert sms["a100-80gb"] == 108 and sms["a40"] == 84 and sms["l4"] == 58 and sms["t4"] == 40


def test_known_prices_and_nics(cat: Catalog) -> None:
    assert cat.node_type("1x-l4").price_in("aws-us-east-1") == pytest.approx(0.8048)
    assert cat.node_type("1x-l4").price_in("gcp-us-central1") == pytest.approx(0.7068)
    assert cat.node_type("8x-h100-sxm").price_in("aws-us-east-1") == pytest.approx(55.04)
    assert cat.node_type("1x-h100-nvl").price_in("azure-westus2") is None
    # Where clouds differ, the lower NIC is kept (g2-standard-48 has 50, g6.12xlarge 40).
    assert cat.node_type("4x-l4").nic_gbps == 40
    assert cat.node_type("8x-a100-40gb").instances.keys() == {"aws", "gcp", "azure"}


def test_approximate_prices_are_flagged(cat: Catalog) -> None:
    a2_ultra = next(p for p in cat.node_type("1x-a100-80gb").prices if p.region.startswith("gcp"))
    assert a2_ultra.approximate
    a3_8g = next(p for p in cat.node_type("8x-h100-sxm").prices if p.region.startswith("gcp"))
    assert a3_8g.approximate
    p5 = next(p for p in cat.node_type("8x-h100-sxm").prices if p.region == "aws-us-east-1")
    assert not p5.approximate


# ---------------------------------------------------------------- model sizes


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS_B))
def test_parameter_totals_match_published(cat: Catalog, name: str) -> None:
    total_b, active_b = PUBLISHED_PARAMS_B[name]
    model = cat.model(name)
    assert model.total_params / 1e9 == pytest.approx(total_b, rel=PARAMS_REL_TOL)
    assert model.active_params / 1e9 == pytest.approx(active_b, rel=PARAMS_REL_TOL)
    if model.expert_weight_format is None:
        assert model.weight_bytes == model.total_params * model.dtype_bytes


@pytest.mark.parametrize("name", sorted(GPT_OSS_PUBLISHED))
def test_gpt_oss_sizes_match_the_model_card(cat: Catalog, name: str) -> None:
    total_b, active_b, checkpoint_gib = GPT_OSS_PUBLISHED[name]
    m = cat.model(name)
    assert m.total_params / 1e9 == pytest.approx(total_b, rel=GPT_OSS_REL_TOL)
    input_embedding = m.vocab_size * m.hidden_size
    assert (m.active_params - input_embedding) / 1e9 == pytest.approx(active_b,
                                                                      rel=GPT_OSS_REL_TOL)
    assert m.weight_bytes / 2**30 == pytest.approx(checkpoint_gib, rel=GPT_OSS_REL_TOL)
    # MXFP4 experts: 4.25 bits a weight; the same model at bf16 would be about 3x larger
    assert m.expert_weight_bits == 4.25
    assert m.weight_bytes < 0.35 * m.total_params * m.dtype_bytes


def test_gpt_oss_alternates_sliding_and_full_layers(cat: Catalog) -> None:
    for name, layers in (("gpt-oss-20b", 24), ("gpt-oss-120b", 36)):
        m = cat.model(name)
        assert m.num_layers == layers and m.sliding_window == 128
        assert [m.layer_is_sliding(i) for i in range(4)] == [True, False, True, False]
        assert m.sliding_layer_share == 0.5
        assert m.sliding_layers_in(0, 3) == 2 and m.sliding_layers_in(1, 3) == 1
        assert m.kv_tokens_stored(0, 1000) == 128 and m.kv_tokens_stored(1, 1000) == 1000
        assert m.kv_tokens_stored(0, 100) == 100
        assert m.sink_params_per_layer == 64
    assert all(cat.model(n).sliding_layer_share == 0.0
               for n in PUBLISHED_PARAMS_B)


def test_attention_pattern_needs_its_window() -> None:
    base = default_catalog().model("gpt-oss-20b").model_dump()
    with pytest.raises(ValueError, match="sliding_window is not set"):
        ModelArch.model_validate({**base, "sliding_window": None})
    with pytest.raises(ValueError, match="has no 'sliding' layer"):
        ModelArch.model_validate({**base, "attention_pattern": ["full"]})
    dense = default_catalog().model("phi-4").model_dump()
    with pytest.raises(ValueError, match="MoE models only"):
        ModelArch.model_validate({**dense, "expert_weight_format": "mxfp4"})


def test_dense_models_have_equal_total_and_active(cat: Catalog) -> None:
    for model in cat.models.values():
        if model.moe is None:
            assert model.active_params == model.total_params
        else:
            assert model.active_params < model.total_params


def test_no_builtin_model_ties_embeddings(cat: Catalog) -> None:
    assert not any(m.tied_embeddings for m in cat.models.values())


@pytest.mark.parametrize(
    ("name", "kv_bytes"),
    [
        ("llama-3.1-8b", 2 * 8 * 128 * 2),
        ("llama-3.3-70b", 2 * 8 * 128 * 2),
        ("qwen3-32b", 2 * 8 * 128 * 2),
        ("qwen3-30b-a3b", 2 * 4 * 128 * 2),
        ("qwen3-235b-a22b", 2 * 4 * 128 * 2),
    ],
)
def test_kv_bytes_per_token_per_layer(cat: Catalog, name: str, kv_bytes: int) -> None:
    assert cat.model(name).kv_bytes_per_token_per_layer == kv_bytes


def test_derived_sizes_llama_8b(cat: Catalog) -> None:
    m = cat.model("llama-3.1-8b")
    h = 4096
    assert m.q_dim == 4096 and m.kv_dim == 1024
    assert m.attn_params_per_layer == h * (4096 + 2 * 1024) + 4096 * h
    assert m.mlp_params_per_layer == 3 * h * 14336
    assert m.params_per_layer == m.attn_params_per_layer + m.mlp_params_per_layer + 2 * h
    assert m.embedding_params == 2 * 128256 * h + h
    assert m.activation_bytes_per_token == 2 * h
    assert m.weight_bytes_per_layer == 2 * m.params_per_layer


def test_qwen3_32b_query_projection_is_wider_than_hidden(cat: Catalog) -> None:
    m = cat.model("qwen3-32b")
    assert m.q_dim == 8192 > m.hidden_size
    assert m.attn_params_per_layer == 5120 * (8192 + 2 * 1024) + 8192 * 5120


def test_moe_sizes(cat: Catalog) -> None:
    scout = cat.model("llama-4-scout-17b-16e")
    assert scout.moe is not None and scout.moe.shared_experts == 1
    expert = 3 * 5120 * 8192
    assert scout.expert_params == expert
    assert scout.mlp_params_per_layer == 16 * expert + expert + 5120 * 16
    assert scout.active_mlp_params_per_layer == 1 * expert + expert + 5120 * 16

    mixtral = cat.model("mixtral-8x22b")
    assert mixtral.moe is not None
    assert mixtral.active_mlp_params_per_layer == 2 * 3 * 6144 * 16384 + 6144 * 8


def test_node_memory(cat: Catalog) -> None:
    assert cat.node_memory_bytes("8x-h100-sxm") == pytest.approx(8 * 80e9)
    assert cat.node_memory_bytes(cat.node_type("2x-l4")) == pytest.approx(2 * 24e9)
    assert cat.gpu_of("1x-h100-nvl").name == "h100-nvl"
    # bf16 Qwen3-235B (~470 GB) fits on one 8x H100 node, not on one 8x A100-40GB node
    weights = cat.model("qwen3-235b-a22b").weight_bytes
    assert cat.node_memory_bytes("8x-a100-40gb") < weights < cat.node_memory_bytes("8x-h100-sxm")


# ---------------------------------------------------------------- lookups


def test_unknown_model_suggests_close_names(cat: Catalog) -> None:
    with pytest.raises(UnknownNameError) as info:
        cat.model("llama-3-8b")
    msg = str(info.value)
    assert "llama-3-8b" in msg
    assert "Did you mean" in msg and "'llama-3.1-8b'" in msg


def test_unknown_names_in_every_section(cat: Catalog) -> None:
    with pytest.raises(UnknownNameError, match="Did you mean 'h100-sxm'"):
        cat.gpu("h100-sxn")
    with pytest.raises(UnknownNameError, match="unknown node type"):
        cat.node_type("3x-l4")
    with pytest.raises(UnknownNameError, match="aws-us-east-1"):
        cat.region("aws-us-east-3")
    with pytest.raises(UnknownNameError, match="no catalog entry"):
        cat.lookup("zzz-nothing-like-it")
    # KeyError's repr-quoting is not applied to the message
    with pytest.raises(UnknownNameError) as info:
        cat.model("qwen3-31b")
    assert not str(info.value).startswith('"')


def test_lookup_finds_any_section(cat: Catalog) -> None:
    assert isinstance(cat.lookup("llama-3.1-8b"), ModelArch)
    assert isinstance(cat.lookup("8x-l4"), NodeType)
    assert cat.lookup("aws-eu-west-1").cloud == "aws"  # type: ignore[attr-defined]


# ---------------------------------------------------------------- content hash


def test_content_hash_is_stable(cat: Catalog) -> None:
    h = cat.content_hash()
    assert len(h) == 16
    assert load_catalog().content_hash() == h
    assert cat.content_hash() == h


def test_content_hash_changes_with_a_price_override(cat: Catalog, tmp_path: Path) -> None:
    prices = cat.node_type("1x-l4").model_dump(mode="json")["prices"]
    prices[0]["usd_per_hour"] = 0.5
    doc = {"node_types": [{"name": "1x-l4", "prices": prices}]}
    user = write_yaml(tmp_path / "cheap.yaml", yaml.safe_dump(doc))
    changed = load_catalog([user])
    assert changed.node_type("1x-l4").price_in("aws-us-east-1") == 0.5
    assert changed.content_hash() != cat.content_hash()
    # the other fields and the other node types are untouched
    assert changed.node_type("1x-l4").nic_gbps == cat.node_type("1x-l4").nic_gbps
    assert changed.node_type("8x-l4") == cat.node_type("8x-l4")
    assert changed.files[-1] == str(user)


def test_content_hash_unchanged_by_a_no_op_override(cat: Catalog, tmp_path: Path) -> None:
    user = write_yaml(
        tmp_path / "same.yaml",
        f"node_types:\n  - name: 4x-l4\n    nic_gbps: {cat.node_type('4x-l4').nic_gbps}\n",
    )
    assert load_catalog([user]).content_hash() == cat.content_hash()


# ---------------------------------------------------------------- user files


USER_FILE = """\
schema_version: 1
gpus:
  - name: b200
    memory_gb: 180
    bf16_tflops: 2250
    mem_bandwidth_gb_per_s: 8000
    intra_node_link: nvlink
    intra_node_link_gb_per_s: 1800
    architecture: blackwell
    source: "vendor datasheet"
    date: 2026-01-15
    approximate: true
regions:
  - {name: lambda-us-east-1, cloud: lambda, location: "Virginia, US"}
node_types:
  - name: 8x-b200
    gpu: b200
    gpu_count: 8
    nic_gbps: 400
    instances: {lambda: gpu_8x_b200_sxm6}
    prices:
      - {region: lambda-us-east-1, usd_per_hour: 39.92, source: "test fixture"}
  - name: 4x-l4
    nic_gbps: 25
models:
  - name: tiny-moe
    hf_id: example/tiny-moe
    num_layers: 4
    hidden_size: 256
    ffn_size: 512
    num_heads: 8
    num_kv_heads: 2
    head_dim: 32
    vocab_size: 1000
    tied_embeddings: true
    moe: {num_experts: 4, experts_per_token: 2, expert_ffn_size: 128}
    source: "made up for this test"
"""


def test_user_file_adds_entries_and_merges_overrides(cat: Catalog, tmp_path: Path) -> None:
    user = write_yaml(tmp_path / "mine.yaml", USER_FILE)
    merged = load_catalog([user])

    assert merged.gpu("b200").memory_gb == 180
    assert merged.gpu_of("8x-b200").architecture == "blackwell"
    assert merged.node_type("8x-b200").price_in("lambda-us-east-1") == pytest.approx(39.92)
    assert merged.node_memory_bytes("8x-b200") == pytest.approx(8 * 180e9)
    assert merged.region("lambda-us-east-1").cloud == "lambda"

    tiny = merged.model("tiny-moe")
    assert tiny.tied_embeddings and tiny.moe is not None
    assert tiny.embedding_params == 1000 * 256 + 256
    assert tiny.kv_bytes_per_token_per_layer == 2 * 2 * 32 * 2

    # The override changed one field and kept the rest.
    before, after = cat.node_type("4x-l4"), merged.node_type("4x-l4")
    assert after.nic_gbps == 25
    assert after.model_dump(exclude={"nic_gbps"}) == before.model_dump(exclude={"nic_gbps"})

    # Built-in entries all still present; the user's come on top.
    assert set(cat.node_types) < set(merged.node_types)
    assert set(cat.models) < set(merged.models)
    assert merged.files == (*cat.files, str(user))
    assert merged.content_hash() != cat.content_hash()


def test_later_user_file_wins(tmp_path: Path) -> None:
    first = write_yaml(tmp_path / "a.yaml", "node_types:\n  - {name: 1x-t4, nic_gbps: 5}\n")
    second = write_yaml(tmp_path / "b.yaml", "node_types:\n  - {name: 1x-t4, nic_gbps: 7}\n")
    assert load_catalog([first, second]).node_type("1x-t4").nic_gbps == 7
    assert load_catalog([second, first]).node_type("1x-t4").nic_gbps == 5


def test_user_file_without_builtin(tmp_path: Path) -> None:
    text = USER_FILE.replace("  - name: 4x-l4\n    nic_gbps: 25\n", "")
    user = write_yaml(tmp_path / "alone.yaml", text)
    alone = load_catalog([user], include_builtin=False)
    assert set(alone.gpus) == {"b200"}
    assert set(alone.node_types) == {"8x-b200"}
    assert set(alone.models) == {"tiny-moe"}
    assert alone.files == (str(user),)


def test_empty_user_file_changes_nothing(cat: Catalog, tmp_path: Path) -> None:
    empty = write_yaml(tmp_path / "empty.yaml", "")
    sections_only = write_yaml(tmp_path / "nulls.yaml", "gpus:\nmodels:\n")
    assert load_catalog([empty, sections_only]).content_hash() == cat.content_hash()
