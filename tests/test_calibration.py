"""Calibration against Vidur's measured operator times, the committed fit, and `coral perf`."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from coral.catalog import default_catalog, load_catalog
from coral.cli.main import app
from coral.perf.calibration import (
    Calibration,
    _points,
    _predict,
    calibrate,
    write_efficiencies,
)
from coral.perf.efficiencies import efficiencies_for, load_efficiencies
from coral.perf.model import ITERATION_OVERHEAD_S, PerfModel
from coral.perf.vidur_profiles import (
    LAYER_OPERATORS,
    VIDUR_GPUS,
    load_vidur_profiles,
    model_arch,
)

runner = CliRunner()


@pytest.fixture(scope="module")
def cal() -> Calibration:
    return calibrate()


# ---------------------------------------------------------------- shipped data


def test_compact_vidur_profiles_are_complete_and_small() -> None:
    prof = load_vidur_profiles()
    assert len(prof) == 13_044
    assert set(prof.gpu.tolist()) == {"a100", "a40", "h100"}
    assert len(prof.groups()) == 11
    assert set(np.unique(prof.tp).tolist()) == {1, 2, 4, 8}
    for op in LAYER_OPERATORS:
        assert (prof.op_ms[op] > 0).all()
    data = resources.files("coral.perf") / "data" / "vidur"
    size = sum(p.stat().st_size for p in Path(str(data)).iterdir())
    assert size < 1.5e6
    assert (Path(str(data)) / "LICENSE").exists()
    arch = model_arch(prof, "meta-llama/Llama-2-70b-hf")
    assert (arch.hidden_size, arch.ffn_size, arch.num_heads, arch.num_kv_heads) == (
        8192, 28672, 64, 8,
    )


def test_vectorised_fit_predictor_matches_the_perf_model(cal, tmp_path) -> None:
    # The calibration's numpy predictor and PerfModel.profiled_ops_seconds are one formula.
    yaml_text = """
schema_version: 1
node_types:
  - {name: cal-1x-a100, gpu: a100-80gb, gpu_count: 1, nic_gbps: 10, instances: {other: a}}
  - {name: cal-4x-a100, gpu: a100-80gb, gpu_count: 4, nic_gbps: 10, instances: {other: b}}
"""
    path = tmp_path / "cat.yaml"
    path.write_text(yaml_text)
    cat = load_catalog([path])
    prof = load_vidur_profiles()
    model = "meta-llama/Llama-2-70b-hf"
    arch = model_arch(prof, model)
    pm = PerfModel(cat, efficiencies=cal.table())
    e = cal.fits["a100-80gb"].efficiencies
    for tp, node in ((1, "cal-1x-a100"), (4, "cal-4x-a100")):
        mask = (prof.gpu == "a100") & (prof.model == model) & (prof.tp == tp)
        sub = prof.select(mask)
        pts = _points(sub, default_catalog())
        vec = _predict(pts, e.eta_compute, e.eta_memory, e.eta_elementwise, e.kernel_overhead_s)
        for i in (0, len(sub) // 2, len(sub) - 1):
            scalar = pm.profiled_ops_seconds(arch, node, int(sub.num_tokens[i]))
            assert scalar == pytest.approx(vec[i], rel=1e-9)


# ---------------------------------------------------------------- fit quality


def test_fitted_gpus_are_within_ten_percent_median(cal) -> None:
    assert set(cal.fits) == {"a100-80gb", "h100-sxm"}
    for fit in cal.fits.values():
        assert fit.points > 3000
        assert fit.median_rel_error <= 0.10, fit
        assert fit.max_rel_error < 0.5, fit
        e = fit.efficiencies
        assert 0.4 < e.eta_compute <= 1.0 and 0.4 < e.eta_memory <= 1.0
        assert 0 < e.kernel_overhead_s < 20e-6
        assert e.borrowed_from is None
    assert len(cal.fits["a100-80gb"].models) == 5
    assert len(cal.fits["h100-sxm"].models) == 3


def test_held_out_a40_within_25_percent_median(cal) -> None:
    a40 = [h for h in cal.held_out if h.gpu == "a40"]
    assert len(a40) == 1
    report = a40[0]
    assert report.points == 3132
    assert "borrowed from a100-80gb" in report.efficiencies_from
    assert report.median_rel_error <= 0.25


def test_held_out_models_within_ten_percent_median(cal) -> None:
    cross = [h for h in cal.held_out if h.gpu != "a40"]
    assert {h.gpu for h in cross} == {"a100-80gb", "h100-sxm"}
    for report in cross:
        assert all("Llama-2" not in m for m in report.models)
        assert report.median_rel_error <= 0.10, report


def test_committed_efficiencies_match_a_fresh_fit(cal) -> None:
    committed = load_efficiencies()
    assert set(committed.entries) == set(cal.fits)
    for name, fit in cal.fits.items():
        c, f = committed.entries[name], fit.efficiencies
        for field in ("eta_compute", "eta_memory", "eta_elementwise"):
            assert getattr(c, field) == pytest.approx(getattr(f, field), abs=2e-3), (name, field)
        assert c.kernel_overhead_s == pytest.approx(f.kernel_overhead_s, rel=1e-2)
        assert c.architecture == f.architecture


def test_write_and_load_round_trip(cal, tmp_path) -> None:
    path = write_efficiencies(cal, tmp_path / "eff.yaml")
    table = load_efficiencies(path)
    assert table.entries["h100-sxm"].eta_memory == pytest.approx(
        cal.fits["h100-sxm"].efficiencies.eta_memory, abs=1e-4
    )
    path.write_text("schema_version: 99\n")
    with pytest.raises(ValueError, match="schema"):
        load_efficiencies(path)


@pytest.mark.parametrize(
    "gpu, donor",
    [
        ("a100-80gb", None),
        ("h100-sxm", None),
        ("a40", "a100-80gb"),
        ("a100-40gb", "a100-80gb"),
        ("l4", "a100-80gb"),
        ("l40s", "a100-80gb"),
        ("t4", "a100-80gb"),
        ("v100", "a100-80gb"),
        ("h100-pcie", "h100-sxm"),
    ],
)
def test_efficiencies_for_says_when_borrowed(gpu, donor) -> None:
    eff = efficiencies_for(default_catalog().gpu(gpu))
    assert eff.borrowed_from == donor
    assert eff.gpu == gpu


def test_vidur_gpu_names_are_catalog_gpus() -> None:
    cat = default_catalog()
    for name in VIDUR_GPUS.values():
        assert name in cat.gpus


# ---------------------------------------------------------------- CLI

CLI_CATALOG = """
schema_version: 1
node_types:
  - {name: clitest-1x-h100, gpu: h100-sxm, gpu_count: 1, nic_gbps: 100, instances: {other: a}}
  - {name: clitest-1x-l4, gpu: l4, gpu_count: 1, nic_gbps: 16, instances: {other: b}}
models:
  - {name: clitest-70b, hf_id: test/70b, num_layers: 80, hidden_size: 8192, ffn_size: 28672,
     num_heads: 64, num_kv_heads: 8, head_dim: 128, vocab_size: 128256, source: test}
"""


@pytest.fixture(scope="module")
def cli_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "catalog.yaml"
    path.write_text(CLI_CATALOG)
    return path


def _predict_args(cli_catalog: Path, *extra: str) -> list[str]:
    return ["perf", "predict", "--model", "clitest-70b", "--catalog", str(cli_catalog), *extra]


def test_cli_predict_json(cli_catalog) -> None:
    result = runner.invoke(app, _predict_args(
        cli_catalog, "--node", "clitest-1x-h100", "--layers", "20", "--prefill-tokens", "256",
        "--decode-batch", "8", "--context", "8000", "--json",
    ))
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    for key in ("model", "node", "layers", "prefill_tokens", "decode_batch", "context_tokens",
                "seconds", "breakdown", "source", "efficiencies_from"):
        assert key in out
    assert out["layers"] == 20 and out["context_tokens"] == 8000
    pm = PerfModel(load_catalog([cli_catalog]))
    assert out["seconds"] == pytest.approx(
        pm.iteration_seconds("clitest-70b", "clitest-1x-h100", 20, 256, 8, 8000)
    )
    parts = out["breakdown"]
    assert sum(parts[k] for k in ("compute_s", "memory_s", "comm_s", "overhead_s")) == (
        pytest.approx(out["seconds"])
    )
    assert out["source"] == "roofline"
    assert "h100-sxm" in out["efficiencies_from"]


def test_cli_predict_table(cli_catalog) -> None:
    result = runner.invoke(app, _predict_args(
        cli_catalog, "--node", "clitest-1x-h100", "--layers", "4", "--prefill-tokens", "128",
    ))
    assert result.exit_code == 0, result.output
    assert "time (ms)" in result.output and "total" in result.output


def test_cli_predict_uses_a_measured_profile(cli_catalog, tmp_path) -> None:
    table = tmp_path / "profile.csv"
    table.write_text(
        "# coral profile table v1\n# model: clitest-70b\n# node_type: clitest-1x-h100\n"
        "kind,prefill_tokens,decode_batch,context_tokens,seconds_per_layer\n"
        "prefill,16,0,0,0.001\nprefill,256,0,0,0.002\n"
        "decode,0,1,128,0.0005\ndecode,0,1,1024,0.0006\n"
    )
    result = runner.invoke(app, _predict_args(
        cli_catalog, "--node", "clitest-1x-h100", "--layers", "10", "--prefill-tokens", "256",
        "--profile", str(table), "--json",
    ))
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["source"] == "measured"
    assert out["seconds"] == pytest.approx(10 * 0.002 + ITERATION_OVERHEAD_S)


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--node", "clitest-1x-h100", "--layers", "4"), "nothing to predict"),
        (("--node", "clitest-1x-h100", "--layers", "4", "--decode-batch", "8", "--context", "4"),
         "must be at least --decode-batch"),
        (("--node", "clitest-1x-h100", "--layers", "4", "--decode-batch", "8"), "--context"),
        (("--node", "clitest-1x-h100", "--layers", "4", "--prefill-tokens", "8", "--context",
          "100"), "--decode-batch too"),
        (("--node", "clitest-1x-h100", "--layers", "81", "--prefill-tokens", "8"),
         "between 1 and 80"),
        (("--node", "clitest-1x-l4", "--layers", "40", "--prefill-tokens", "8"),
         "layers fit"),
        (("--node", "clitest-1x-l4", "--layers", "4", "--decode-batch", "1",
          "--context", "10000000"), "at most"),
        (("--node", "no-such-node", "--layers", "4", "--prefill-tokens", "8"),
         "unknown node type"),
    ],
)
def test_cli_predict_errors(cli_catalog, extra, message) -> None:
    result = runner.invoke(app, _predict_args(cli_catalog, *extra))
    assert result.exit_code == 2
    assert message in result.output


def test_cli_predict_says_how_many_layers_fit(cli_catalog) -> None:
    result = runner.invoke(app, _predict_args(
        cli_catalog, "--node", "clitest-1x-l4", "--layers", "80", "--prefill-tokens", "8",
    ))
    assert result.exit_code == 2
    pm = PerfModel(load_catalog([cli_catalog]))
    most = pm.max_layers("clitest-70b", "clitest-1x-l4")
    assert f"at most {most} layers fit" in result.output


def test_cli_calibrate_json() -> None:
    result = runner.invoke(app, ["perf", "calibrate", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    rows = {r["gpu"]: r for r in out["gpus"]}
    assert set(rows) == set(default_catalog().gpus)
    for name in ("a100-80gb", "h100-sxm"):
        assert rows[name]["fitted"] and rows[name]["borrowed_from"] is None
        assert rows[name]["median_rel_error"] <= 0.10
        assert rows[name]["points"] > 0
    assert not rows["a40"]["fitted"] and rows["a40"]["borrowed_from"] == "a100-80gb"
    assert rows["a40"]["median_rel_error"] is None
    assert rows["l4"]["borrowed_from"] == "a100-80gb"
    held = {h["gpu"]: h for h in out["held_out"] if h["gpu"] == "a40"}
    assert held["a40"]["median_rel_error"] <= 0.25
    assert out["written"] is None


def test_cli_calibrate_table() -> None:
    result = runner.invoke(app, ["perf", "calibrate"])
    assert result.exit_code == 0, result.output
    assert "a100-80gb" in result.output and "Held out" in result.output
