"""`coral templates solve | build | show` through the CLI runner, with the real solver."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from coral.cli.main import app

runner = CliRunner(env={"COLUMNS": "220"})
SMALL = ["--model", "llama-3.1-8b", "--batches", "8,32"]


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_solve_prints_a_placement():
    result = runner.invoke(app, ["templates", "solve", *SMALL, "--combo", "1x-l4"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    for label in ("layers [a, b)", "batch", "TP", "capacity (req/s)", "step (ms)",
                  "prefill (ms)", "throughput:", "predicted TTFT", "TPOT", "status: optimal",
                  "solve time"):
        assert label in out


def test_solve_json_and_pd():
    payload = _json(runner.invoke(app, ["templates", "solve", *SMALL, "--combo", "1x-a10g",
                                        "--json"]))
    assert payload["combo"] == ["1x-a10g"] and payload["status"] == "optimal"
    assert payload["throughput"] > 0 and payload["unit"] == "req/s"
    assert payload["nodes"][0]["first_layer"] == 0 and payload["nodes"][0]["layers"] == 32
    assert payload["tpot_s"] <= payload["slo"]["tpot_s"]
    assert set(payload["usd_per_hour"]) >= {"aws-us-east-1"}
    both = _json(runner.invoke(app, ["templates", "solve", *SMALL, "--combo", "1x-a10g",
                                     "--mode", "pd", "--json"]))
    assert [p["mode"] for p in both] == ["prefill", "decode"]
    assert both[0]["unit"] == "prompt tokens/s" and both[1]["unit"] == "output tokens/s"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "llama-3.1-8bb", "--combo", "1x-l4"], "Did you mean"),
        (["--model", "llama-3.1-8b", "--combo", "1x-l5"], "Did you mean"),
        (["--model", "llama-3.1-8b", "--combo", "1x-l4,,1x-t4"], "empty entry"),
        (["--model", "llama-3.1-8b", "--combo", "1x-l4*0"], "COUNT"),
        (["--model", "llama-3.1-8b", "--combo", "1x-l4", "--tpot", "-1"], "tpot_s"),
        (["--model", "llama-3.1-8b", "--combo", "1x-l4", "--tpot", "0.001"], "no aggregated"),
        (["--model", "llama-3.3-70b", "--combo", "1x-l4"], "usable memory"),
        (["--model", "llama-3.1-8b", "--combo", "1x-l4", "--mode", "both"], "unknown mode"),
        (["--model", "llama-3.1-8b", "--combo", "1x-l4", "--topology", "ring"],
         "unknown topology"),
        (["--model", "llama-3.1-8b", "--combo", "1x-l4", "--batches", "0,4"], "--batches"),
    ],
)
def test_solve_errors_exit_2(args, message):
    result = runner.invoke(app, ["templates", "solve", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_build_json_then_show(tmp_path):
    args = ["templates", "build", *SMALL, "--nodes", "1x-l4,1x-a10g", "--nmax", "2",
            "--out", str(tmp_path), "--workers", "1", "--json"]
    report = _json(runner.invoke(app, args))
    assert report["combos_enumerated"] == 5 and report["combos_candidates"] == 5
    assert report["solved_now"] + report["outcomes"]["bound"] == 5
    assert report["outcomes"]["kept"] >= 2
    assert report["optimal_share"] == 1.0
    lib_dir = tmp_path / "llama-3.1-8b" / "aggregated"
    assert (lib_dir / "manifest.json").exists() and (lib_dir / "templates.jsonl").exists()
    again = _json(runner.invoke(app, args))
    assert again["solved_now"] == 0 and again["reused"] == 5
    assert "reusing" in again["message"]

    shown = _json(runner.invoke(app, ["templates", "show", str(tmp_path), "--json", "--top", "2"]))
    assert shown["inputs"]["model"] == "llama-3.1-8b" and shown["complete"]
    assert len(shown["templates"]) == 2
    per_dollar = [t["throughput"] / t["min_usd_per_hour"] for t in shown["templates"]]
    assert per_dollar == sorted(per_dollar, reverse=True)
    text = runner.invoke(app, ["templates", "show", str(lib_dir)])
    assert text.exit_code == 0 and "throughput (req/s)" in text.stdout
    assert "min $/hour" in text.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "llama-3.1-8b", "--nodes", "1x-l4,1x-tt4"], "Did you mean"),
        (["--model", "llama-3.1-8b", "--regions", "mars-1"], "unknown region"),
        (["--model", "llama-3.1-8b", "--nmax", "0"], "--nmax"),
        (["--model", "llama-3.1-8b", "--rho", "-2"], "--rho"),
        (["--model", "llama-3.1-8b", "--workers", "0"], "--workers"),
        (["--model", "llama-3.1-8b", "--mode", "split"], "unknown mode"),
    ],
)
def test_build_errors_exit_2(tmp_path, args, message):
    result = runner.invoke(app, ["templates", "build", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_show_errors(tmp_path):
    result = runner.invoke(app, ["templates", "show", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "no such directory" in result.output
    result = runner.invoke(app, ["templates", "show", str(tmp_path)])
    assert result.exit_code == 2 and "no template library" in result.output


def test_json_stdout_is_clean_in_a_real_process(tmp_path):
    """Native solver output must not leak into stdout when --json is asked for."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "coral.cli.main", "templates", "solve", *SMALL,
           "--combo", "1x-l4,1x-a10g", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["combo"] == ["1x-a10g", "1x-l4"]
    cmd = [sys.executable, "-m", "coral.cli.main", "templates", "build", *SMALL, "--nodes",
           "1x-l4", "--nmax", "2", "--workers", "2", "--out", str(tmp_path), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["combos_candidates"] == 2
