"""The profiler: layer construction, timing on CPU, skipping, and the `coral profile` CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from coral.catalog import ModelArch
from coral.cli.main import app
from coral.perf import profiler
from coral.perf.profile_table import ProfileTable
from coral.perf.profiler import (
    ProfileGrid,
    ProfilerWarning,
    build_layers,
    count_parameters,
    gpu_type_for_device,
    parse_int_list,
    profile_model,
    rope_tables,
)

TINY = {
    "name": "tiny-test",
    "hf_id": "local/tiny-test",
    "source": "unit test",
    "num_layers": 4,
    "hidden_size": 256,
    "ffn_size": 512,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 64,
    "vocab_size": 1000,
}
TINY_MOE = {
    **TINY,
    "name": "tiny-moe",
    "moe": {"num_experts": 8, "experts_per_token": 2, "expert_ffn_size": 128,
            "shared_experts": 1, "shared_expert_ffn_size": 256},
}
GRID = ProfileGrid(prefill_tokens=(16, 256), decode_batch=(1, 4), context=(32, 128))
CUDA = torch.cuda.is_available()


@pytest.fixture
def tiny() -> ModelArch:
    return ModelArch.model_validate(TINY)


@pytest.fixture
def tiny_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"models": [TINY]}))
    return path


@pytest.mark.parametrize(
    "config",
    [TINY, TINY_MOE, {**TINY, "gated_mlp": False, "name": "tiny-gelu"},
     {**TINY, "num_kv_heads": 4, "name": "tiny-mha"}],
    ids=["dense", "moe", "gelu", "mha"],
)
def test_layer_parameters_match_catalog(config):
    arch = ModelArch.model_validate(config)
    assert count_parameters(build_layers(arch, 1)) == arch.params_per_layer
    assert count_parameters(build_layers(arch, 3)) == 3 * arch.params_per_layer


@pytest.mark.parametrize("config", [TINY, TINY_MOE], ids=["dense", "moe"])
def test_decode_with_cache_matches_prefill(config):
    """Decoding the last token over a cache of the earlier ones equals causal prefill."""
    arch = ModelArch.model_validate(config)
    layer = build_layers(arch, 1)[0]
    p = 12
    x = torch.randn(p, arch.hidden_size)
    with torch.inference_mode():
        cos, sin = rope_tables(torch.arange(p), arch.head_dim, torch.float32)
        full = layer.prefill(x, cos, sin)
        _, k, v = layer._qkv(x, cos, sin)
        k_cache = k.transpose(0, 1).unsqueeze(0).clone()  # [1, KV, p, d]
        v_cache = v.transpose(0, 1).unsqueeze(0).clone()
        k_cache[:, :, -1] = 0  # decode must write the new token's K/V itself
        v_cache[:, :, -1] = 0
        last = layer.decode(x[-1:], cos[-1:], sin[-1:], k_cache, v_cache, p - 1)
    torch.testing.assert_close(last[0], full[-1], rtol=1e-4, atol=1e-4)


def test_moe_grouped_and_expert_loop_match_per_token_reference():
    """Both MoE paths (grouped matmul, experts one by one) equal a token-by-token sum of
    each token's top-k experts weighted by its renormalised router probabilities, plus the
    shared expert."""
    arch = ModelArch.model_validate(TINY_MOE)
    moe = build_layers(arch, 1)[0].mlp
    x = torch.randn(23, arch.hidden_size)
    with torch.inference_mode():
        probs = torch.softmax(x @ moe.router.T, dim=-1)
        w, e = torch.topk(probs, moe.top_k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        ref = torch.stack([
            sum(w[t, j] * (moe._act(x[t] @ moe.w_in[e[t, j]].T) @ moe.w_out[e[t, j]].T)
                for j in range(moe.top_k))
            for t in range(x.shape[0])
        ]) + moe.shared(x)
        grouped = moe(x)
        saved, moe.grouped_mm = moe.grouped_mm, None
        loop = moe(x)
        moe.grouped_mm = saved
    assert saved is not None  # torch's grouped matmul runs on CPU float32
    torch.testing.assert_close(grouped, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loop, ref, rtol=1e-4, atol=1e-5)


def _ordered(measure, attempts: int = 3) -> bool:
    """True when `measure()` (a small, a large time) is ordered in one of a few attempts:
    the sizes compared differ >10x in work, so only a busy machine can invert one attempt."""
    return any(small < large for small, large in (measure() for _ in range(attempts)))


def test_profile_tiny_dense(tiny: ModelArch):
    table = profile_model(tiny, node_type="cpu", layers=4, grid=GRID, repeats=3, warmup=1)
    assert table.model == "tiny-test" and table.node_type == "cpu"
    assert table.dtype == "float32" and table.layers_timed == 4 and table.repeats == 3
    assert table.torch_version == torch.__version__ and table.created
    assert len(table.rows) == GRID.size and not table.skipped
    keys = {(r.kind, r.prefill_tokens, r.decode_batch, r.context_tokens) for r in table.rows}
    assert keys == {("prefill", 16, 0, 0), ("prefill", 256, 0, 0), ("decode", 0, 1, 32),
                    ("decode", 0, 1, 128), ("decode", 0, 4, 128), ("decode", 0, 4, 512)}
    assert all(r.seconds_per_layer > 0 for r in table.rows)

    def prefill_16_256() -> tuple[float, float]:
        t = profile_model(tiny, node_type="cpu", layers=4, repeats=3, warmup=1, grid=ProfileGrid(
            prefill_tokens=(16, 256), decode_batch=(1,), context=(16,)))
        pre = {r.prefill_tokens: r.seconds_per_layer for r in t.prefill_rows}
        return pre[16], pre[256]

    pre = {r.prefill_tokens: r.seconds_per_layer for r in table.prefill_rows}
    assert pre[256] > pre[16] or _ordered(prefill_16_256)  # 16x the tokens
    for r in table.rows:  # the table reproduces its own grid points
        assert table.layer_seconds(r.prefill_tokens, r.decode_batch, r.context_tokens) == \
            pytest.approx(r.seconds_per_layer)


def test_decode_time_grows_with_context(tiny: ModelArch):
    grid = ProfileGrid(prefill_tokens=(16,), decode_batch=(16,), context=(16, 2048))

    def decode_16_2048() -> tuple[float, float]:
        table = profile_model(tiny, node_type="cpu", layers=2, grid=grid, repeats=3, warmup=1)
        dec = {r.context_tokens: r.seconds_per_layer for r in table.decode_rows}
        return dec[16 * 16], dec[16 * 2048]

    # 128x the KV cache (~34 MB per layer against ~0.3 MB): far apart.
    assert _ordered(decode_16_2048)


def test_profile_tiny_moe():
    arch = ModelArch.model_validate(TINY_MOE)
    table = profile_model(arch, node_type="cpu", layers=2, grid=GRID, repeats=2, warmup=1)
    assert len(table.rows) == GRID.size and all(r.seconds_per_layer > 0 for r in table.rows)


def test_profile_round_trip(tiny: ModelArch, tmp_path: Path):
    grid = ProfileGrid(prefill_tokens=(16, 64), decode_batch=(1, 2), context=(32,))
    table = profile_model(tiny, node_type="cpu", layers=1, grid=grid, repeats=1, warmup=0)
    assert ProfileTable.load(table.save(tmp_path / "t.csv")) == table


def test_out_of_memory_points_are_skipped(tiny: ModelArch, monkeypatch):
    real = profiler._measure

    def fake(point, *args, **kwargs):
        if point.kind == "decode" and point.decode_batch == 4:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(point, *args, **kwargs)

    monkeypatch.setattr(profiler, "_measure", fake)
    with pytest.warns(ProfilerWarning, match="skipped decode B=4"):
        table = profile_model(tiny, node_type="cpu", grid=GRID, repeats=1, warmup=0)
    assert len(table.rows) == GRID.size - 2
    assert [(s.decode_batch, s.context_tokens, s.reason) for s in table.skipped] == [
        (4, 128, "out of memory"), (4, 512, "out of memory")]
    # Other errors are not swallowed.
    monkeypatch.setattr(profiler, "_measure", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        profile_model(tiny, node_type="cpu", grid=GRID, repeats=1, warmup=0)


def test_argument_errors(tiny: ModelArch):
    with pytest.raises(ValueError, match="layers"):
        profile_model(tiny, node_type="cpu", layers=5, grid=GRID)
    with pytest.raises(ValueError, match="repeats"):
        profile_model(tiny, node_type="cpu", grid=GRID, repeats=0)
    with pytest.raises(ValueError, match="unknown dtype"):
        profile_model(tiny, node_type="cpu", grid=GRID, dtype="int8")
    with pytest.raises(ValueError, match="positive"):
        ProfileGrid(prefill_tokens=(0,), decode_batch=(1,), context=(1,))
    assert parse_int_list(" 16, 64,256 ", "--x") == (16, 64, 256)
    for bad in ("", "1,a", "4,-1"):
        with pytest.raises(ValueError, match="--x"):
            parse_int_list(bad, "--x")


@pytest.mark.skipif(CUDA, reason="CUDA is available here")
def test_cuda_unavailable_is_a_clear_error(tiny: ModelArch):
    with pytest.raises(ValueError, match="CUDA is not available"):
        profile_model(tiny, node_type="cuda", device="cuda", grid=GRID)


@pytest.mark.parametrize(
    "name, gpu",
    [("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
     ("NVIDIA H100 NVL", "h100-nvl"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
     ("NVIDIA A100 80GB PCIe", "a100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
     ("NVIDIA A40", "a40"), ("NVIDIA L40S", "l40s"), ("NVIDIA A10G", "a10g"), ("NVIDIA L4", "l4"),
     ("Tesla V100-SXM2-16GB", "v100"), ("Tesla T4", "t4"), ("NVIDIA H200", "h200"),
     ("Some Other GPU", None)],
)
def test_gpu_type_for_device(name, gpu):
    assert gpu_type_for_device(name) == gpu


def test_gpu_type_for_device_respects_catalog():
    assert gpu_type_for_device("NVIDIA H200", known=["h100-sxm"]) is None


# ---- CLI ----

runner = CliRunner()


def test_cli_json_writes_file(tiny_yaml: Path, tmp_path: Path):
    out = tmp_path / "profiles" / "tiny.csv"
    result = runner.invoke(app, [
        "profile", "--model", str(tiny_yaml), "--layers", "4", "--prefill-tokens", "16,64",
        "--decode-batch", "1,2", "--context", "32", "--repeats", "2", "--warmup", "0",
        "--out", str(out), "--json",
    ])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["model"] == "tiny-test" and payload["node_type"] == "cpu"
    assert payload["dtype"] == "float32" and payload["out"] == str(out)
    assert len(payload["rows"]) == 4
    assert all(r["seconds_per_layer"] > 0 for r in payload["rows"])
    table = ProfileTable.load(out)
    assert table.layers_timed == 4 and len(table.rows) == 4


def test_cli_default_out_and_bare_model_file(tmp_path: Path, monkeypatch):
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump({k: v for k, v in TINY.items()
                                    if k not in ("source", "hf_id")}))
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [
        "profile", "--model", str(bare), "--prefill-tokens", "16", "--decode-batch", "1",
        "--context", "16", "--repeats", "1", "--warmup", "0",
    ])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "profiles" / "tiny-test__cpu.csv").is_file()
    assert "ms / layer" in result.stdout


def test_cli_moe(tmp_path: Path):
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump({"models": [TINY_MOE]}))
    result = runner.invoke(app, [
        "profile", "--model", str(path), "--prefill-tokens", "16", "--decode-batch", "2",
        "--context", "16", "--repeats", "1", "--warmup", "0", "--out", str(tmp_path / "m.csv"),
        "--json",
    ])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"] == "tiny-moe"


@pytest.mark.skipif(CUDA, reason="CUDA is available here")
def test_cli_cuda_unavailable(tiny_yaml: Path):
    result = runner.invoke(app, ["profile", "--model", str(tiny_yaml), "--device", "cuda"])
    assert result.exit_code == 2
    assert "CUDA is not available" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "llama-3.1-8bb"], "Did you mean 'llama-3.1-8b'"),
        (["--model", "TINY", "--context", "1,x"], "--context"),
        (["--model", "TINY", "--decode-batch", "0"], "--decode-batch"),
        (["--model", "TINY", "--node", "1x-l44"], "unknown node type '1x-l44'"),
        (["--model", "TINY", "--dtype", "int4"], "unknown dtype"),
        (["--model", "missing.yaml"], "missing.yaml"),
    ],
)
def test_cli_errors(tiny_yaml: Path, args: list[str], message: str):
    args = [str(tiny_yaml) if a == "TINY" else a for a in args]
    result = runner.invoke(app, ["profile", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.parametrize("chunks", [(12,), (5, 1, 6), (1,) * 12], ids=["whole", "mixed", "tokens"])
def test_runtime_chunks_match_the_profiled_prefill(tiny: ModelArch, chunks):
    """The runtime's per-request `forward` (chunks after a growing cache) and the profiler's
    `prefill` are one layer: the same outputs for the same tokens."""
    from coral.perf.torch_layers import LayerCache

    layer = build_layers(tiny, 1)[0]
    p = sum(chunks)
    x = torch.randn(p, tiny.hidden_size)
    with torch.inference_mode():
        cos, sin = rope_tables(torch.arange(p), tiny.head_dim, torch.float32)
        full = layer.prefill(x, cos, sin)
        cache, outs, start = LayerCache(), [], 0
        for n in chunks:
            outs.append(layer(x[start:start + n], torch.arange(start, start + n), cache))
            start += n
    assert cache.length == p
    torch.testing.assert_close(torch.cat(outs), full, rtol=1e-4, atol=1e-4)


def test_default_layers_stream_their_weights_past_the_cache(tiny: ModelArch, monkeypatch):
    """By default the profiler stacks enough layers that their weights are twice the device's
    last-level cache (decode then streams them from memory, as a served stage does); fewer,
    when asked for, draw a warning that says how many would do."""
    per_layer = tiny.params_per_layer * 4  # float32
    assert profiler.layers_past_cache(tiny, 4, None) == 1
    assert profiler.layers_past_cache(tiny, 4, per_layer) == 2
    assert profiler.layers_past_cache(tiny, 4, int(1.2 * per_layer)) == 3
    assert profiler.layers_past_cache(tiny, 4, 100 * per_layer) == tiny.num_layers
    cache = profiler.last_level_cache_bytes(torch.device("cpu"))
    assert cache is None or cache > 0

    monkeypatch.setattr(profiler, "last_level_cache_bytes", lambda dev: per_layer)
    grid = ProfileGrid(prefill_tokens=(16,), decode_batch=(1,), context=(32,))
    table = profile_model(tiny, node_type="cpu", grid=grid, repeats=1, warmup=0)
    assert table.layers_timed == 2
    with pytest.warns(ProfilerWarning, match=r"profile 2 or more layers \(--layers\)"):
        assert profile_model(tiny, node_type="cpu", layers=1, grid=grid, repeats=1,
                             warmup=0).layers_timed == 1
