"""`coral simulate --slowdown`: a plan run with some GPU types slower than the perf model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from coral.catalog import load_catalog
from coral.cli.main import app
from coral.perf.model import PerfModel
from coral.perf.slowdown import SlowdownError, SlowedPerf, parse_slowdown

CATALOG = load_catalog()


def test_parse():
    assert parse_slowdown("l4=1.3, t4=1.25", CATALOG.gpus) == {"l4": 1.3, "t4": 1.25}


@pytest.mark.parametrize("text, words", [
    ("l5=1.3", "unknown GPU type 'l5'"),
    ("l4", "is not GPU=FACTOR"),
    ("l4=", "is not GPU=FACTOR"),
    ("l4=fast", "must be a number"),
    ("l4=0", "finite number > 0"),
    ("l4=-1", "finite number > 0"),
    ("l4=nan", "finite number > 0"),
    ("l4=1.2,l4=1.3", "given twice"),
    (",", "at least one"),
])
def test_bad_specifications(text, words):
    with pytest.raises(SlowdownError, match=words):
        parse_slowdown(text, CATALOG.gpus)


def test_only_the_named_gpu_type_is_slower():
    perf = PerfModel(CATALOG)
    slow = SlowedPerf(perf, CATALOG, {"l4": 1.5})
    args = ("llama-3.1-8b", 8, 512, 4, 4096)
    assert slow.iteration_seconds(args[0], "1x-l4", *args[1:]) == pytest.approx(
        1.5 * perf.iteration_seconds(args[0], "1x-l4", *args[1:]))
    assert slow.iteration_seconds(args[0], "1x-l40s", *args[1:]) == perf.iteration_seconds(
        args[0], "1x-l40s", *args[1:])
    assert slow.max_kv_tokens("llama-3.1-8b", "1x-l4", 8) == perf.max_kv_tokens(
        "llama-3.1-8b", "1x-l4", 8)


def _run(path, tmp_path, *extra):
    res = CliRunner().invoke(app, ["simulate", str(path), "--duration", "20", "--seed", "3",
                                   "--json", "--no-progress", "--workers", "1",
                                   "--out", str(tmp_path / "sim"), *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_simulate_under_slowdown(tmp_path, one_model_plan):
    path = one_model_plan
    base = _run(path, tmp_path)
    slow = _run(path, tmp_path, "--slowdown", "l40s=2")
    other = _run(path, tmp_path, "--slowdown", "t4=2")
    assert slow["slowdown"] == {"l40s": 2.0} and base["slowdown"] == {}
    assert slow["tpot_p50"] == pytest.approx(2 * base["tpot_p50"], rel=0.1)
    assert slow["ttft_p50"] > 1.5 * base["ttft_p50"]
    assert other["tpot_p50"] == base["tpot_p50"]  # no T4 in the plan


def test_simulate_refuses_a_bad_slowdown(one_model_plan):
    res = CliRunner().invoke(app, ["simulate", str(one_model_plan), "--slowdown", "h300=1.2"])
    assert res.exit_code != 0
    assert "unknown GPU type 'h300'" in res.output
