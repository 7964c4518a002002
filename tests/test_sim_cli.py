"""`coral simulate` on a small hand-written plan JSON (no planning, so it is quick)."""

from __future__ import annotations

import csv
import json

from typer.testing import CliRunner

from coral.cli.main import app


def test_simulate_plan_json_prints_only_json_and_writes_files(tmp_path, one_model_plan):
    out = tmp_path / "sim"
    res = CliRunner().invoke(app, ["simulate", str(one_model_plan), "--duration", "20",
                                   "--seed", "3", "--json", "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    for key in ("goodput_tokens_per_s", "slo_attainment", "ttft_p50", "ttft_p90", "ttft_p99",
                "tpot_p50", "tpot_p90", "tpot_p99", "cost_per_hour"):
        assert key in summary
    assert summary["cost_per_hour"] == 3.0
    assert json.loads((out / "summary.json").read_text())["requests"] == summary["requests"]
    rows = list(csv.DictReader((out / "requests.csv").open()))
    assert len(rows) == summary["requests"] > 0
    assert {r["instance"] for r in rows} == {"r1/llama-3.1-8b|aggregated|1x-l40s#0",
                                             "r1/llama-3.1-8b|aggregated|1x-l40s#1"}


def test_simulate_rejects_a_json_that_is_not_a_plan(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    res = CliRunner().invoke(app, ["simulate", str(bad)])
    assert res.exit_code == 2
    assert "is not a plan" in res.output


def test_a_model_without_instances_is_simulated_and_named(tmp_path, one_model_plan):
    """Demand of a model the plan has no instance of is not dropped: its requests are
    rejected, counted, and the model is named; worker processes do not change the figures."""
    path = one_model_plan
    plan = json.loads(path.read_text())
    plan["demand_rps"]["qwen3-14b"] = 1.0
    path.write_text(json.dumps(plan))
    outs = []
    for workers in ("1", "2"):
        res = CliRunner().invoke(app, ["simulate", str(path), "--duration", "20", "--json",
                                       "--workers", workers, "--out", str(tmp_path / workers),
                                       "--no-progress"])
        assert res.exit_code == 0, res.output
        outs.append(json.loads(res.stdout))
    one, two = outs
    assert one["models_without_instances"] == ["qwen3-14b"]
    assert one["rejected"] > 0 and one["models"]["qwen3-14b"]["slo_attainment"] == 0.0
    assert one["requests"] == two["requests"] and one["rejected"] == two["rejected"]
    assert one["goodput_tokens_per_s"] == two["goodput_tokens_per_s"]
    res = CliRunner().invoke(app, ["simulate", str(path), "--workers", "0"])
    assert res.exit_code == 2 and "--workers must be >= 1" in res.output
