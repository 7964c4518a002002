"""`coral simulate --slowdown`: a plan run with some GPU types slower than the perf model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from coral.catalog import load_catalog
from coral.cli.main import app
from coral.perf.model import PerfModel
from coral.perf.slowdown import (
    PhaseSlowdown,
    SlowdownError,
    SlowedPerf,
    parse_slowdown,
    slowdown_from_json,
    slowdown_json,
    slowdown_spec,
)

CATALOG = load_catalog()


def test_parse():
    assert parse_slowdown("l4=1.3, t4=1.25", CATALOG.gpus) == {"l4": 1.3, "t4": 1.25}


def test_parse_per_phase():
    """A card's phases apart; a phase not given is not slowed; two equal phases are one
    number; `slowdown_spec` and the plan file's form read back to the same slowdown."""
    got = parse_slowdown("l4:prefill=1.1, l4:decode=1.05, t4:decode=1.2, a10g:prefill=1.3,"
                         "a10g:decode=1.3", CATALOG.gpus)
    assert got == {"l4": PhaseSlowdown(1.1, 1.05), "t4": PhaseSlowdown(1.0, 1.2),
                   "a10g": 1.3}
    for gpu, value in got.items():
        assert parse_slowdown(slowdown_spec(gpu, value), CATALOG.gpus) == {gpu: value}
        assert slowdown_from_json(json.loads(json.dumps(slowdown_json(value)))) == value


@pytest.mark.parametrize("text, words", [
    ("l5=1.3", "unknown GPU type 'l5'"),
    ("l4", "is not GPU=FACTOR"),
    ("l4=", "is not GPU=FACTOR"),
    ("l4=fast", "must be a number"),
    ("l4=0", "finite number > 0"),
    ("l4=-1", "finite number > 0"),
    ("l4=nan", "finite number > 0"),
    ("l4=1.2,l4=1.3", "given twice"),
    ("l4=1.2,l4:decode=1.3", "given twice"),
    ("l4:decode=1.2,l4:decode=1.3", "given twice"),
    ("l4:both=1.2", "phase must be one of prefill, decode"),
    ("l4:=1.2", "phase must be one of prefill, decode"),
    ("l9:prefill=1.2", "unknown GPU type 'l9'"),
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


def test_each_phase_takes_its_own_factor_and_a_mixed_step_lies_between():
    """Prefill alone takes the prefill factor, decode alone the decode factor; a mixed step
    the two weighted by each part's own time; one factor for both is the plain slowdown."""
    perf = PerfModel(CATALOG)
    slow = SlowedPerf(perf, CATALOG, {"l4": PhaseSlowdown(1.3, 1.1)})
    model, node = "llama-3.1-8b", "1x-l4"

    def t(p, b, c, wrapped=perf):
        return wrapped.iteration_seconds(model, node, 8, p, b, c)

    assert t(512, 0, 0, slow) == pytest.approx(1.3 * t(512, 0, 0))
    assert t(0, 16, 8192, slow) == pytest.approx(1.1 * t(0, 16, 8192))
    tp, td, both = t(512, 0, 0), t(0, 16, 8192), t(512, 16, 8192)
    assert t(512, 16, 8192, slow) == pytest.approx(both * (1.3 * tp + 1.1 * td) / (tp + td))
    assert 1.1 * both < t(512, 16, 8192, slow) < 1.3 * both
    same = SlowedPerf(perf, CATALOG, {"l4": PhaseSlowdown(1.2, 1.2)})
    assert t(512, 16, 8192, same) == pytest.approx(1.2 * both)


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
