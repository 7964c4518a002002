"""Closed loop: workers' measured step times in /metrics, and a node type's efficiencies
fitted from them (`coral perf calibrate --from-metrics`); an injected slowdown is recovered."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from coral.cli.main import app
from coral.runtime.metrics import GatewayMetrics
from coral.runtime.step_times import (
    INJECT_SLOWDOWN_ENV,
    StepTimes,
    injected_slowdown,
    parse_step_metrics,
    size_bucket,
)

runner = CliRunner()

TINY_CATALOG = """
schema_version: 1
models:
  - name: tiny-random
    hf_id: none/tiny-random
    num_layers: 6
    hidden_size: 64
    ffn_size: 128
    num_heads: 4
    num_kv_heads: 2
    head_dim: 16
    vocab_size: 260
    source: "coral.runtime.config.ModelConfig defaults (the test model)"
"""


def test_rows_round_trip_through_the_metrics_text():
    times = StepTimes("tiny-random", [(0, 3), (3, 6)], node_type="1x-l4")
    times.record("s0n0", 0, 19, 0, 0, 0.010)
    times.record("s0n0", 0, 0, 2, 40, 0.002)
    times.record("s0n0", 0, 0, 2, 42, 0.004)
    times.record("s1n0", 1, 0, 2, 40, 0.003)
    text = GatewayMetrics().render({}, times.rows())
    assert 'coral_stage_step_seconds_total{bucket="32"' in text
    rows = {(r.node, r.kind): r for r in parse_step_metrics(text)}
    dec = rows[("s0n0", "decode")]
    assert (dec.steps, dec.decode_batch, dec.context_tokens) == (2, 4, 82)
    assert dec.seconds == pytest.approx(0.006)
    assert dec.mean_shape() == (0, 2, 41)
    assert (dec.first_layer, dec.layers, dec.stages) == (0, 3, 2)
    assert rows[("s0n0", "prefill")].mean_shape() == (19, 0, 0)
    assert size_bucket(19, 0) == 32 and size_bucket(0, 1) == 1


def test_rows_carry_each_stage_node_type():
    """A plan's stages may run on different node types; each row says its own."""
    times = StepTimes("tiny-random", [(0, 3), (3, 6)], ["1x-l4", "1x-a10g"])
    times.record("s0n0", 0, 0, 2, 40, 0.002)
    times.record("s1n0", 1, 0, 2, 40, 0.003)
    rows = parse_step_metrics(GatewayMetrics().render({}, times.rows()))
    assert {(r.node, r.node_type) for r in rows} == {("s0n0", "1x-l4"), ("s1n0", "1x-a10g")}
    with pytest.raises(ValueError, match="2 node types for 1 stages"):
        StepTimes("tiny-random", [(0, 6)], ["1x-l4", "1x-a10g"])


def test_injected_slowdown_hook():
    assert injected_slowdown("s1n1", {INJECT_SLOWDOWN_ENV: "s0n0=2,s1n1=1.5"}) == 1.5
    assert injected_slowdown("s1n0", {INJECT_SLOWDOWN_ENV: "s0n0=2,s1n1=1.5"}) == 1.0


def test_calibrate_from_metrics_errors(tmp_path):
    times = StepTimes("tiny-random", [(0, 6)])
    times.record("s0n0", 0, 0, 1, 10, 0.001)
    path = tmp_path / "m.txt"
    path.write_text(GatewayMetrics().render({}, times.rows()))
    res = runner.invoke(app, ["perf", "calibrate", "--from-metrics", str(path)])
    assert res.exit_code != 0 and "give --node-type" in res.output
    res = runner.invoke(app, ["perf", "calibrate", "--from-metrics", str(path),
                              "--node-type", "1x-l4"])
    assert res.exit_code != 0 and "not in the catalog" in res.output
    empty = tmp_path / "e.txt"
    empty.write_text("")
    res = runner.invoke(app, ["perf", "calibrate", "--from-metrics", str(empty),
                              "--node-type", "1x-l4"])
    assert res.exit_code != 0 and "no coral_stage_step" in res.output


def test_a_known_slowdown_is_recovered_exactly_from_the_metrics(tmp_path):
    """Twins with the same steps, one reporting 1.5x the time: the fit from the /metrics text
    gives it exactly 1.5x its twin's scale (the deterministic half of the closed loop)."""
    times = StepTimes("tiny-random", [(0, 2), (2, 6)], node_type="1x-l4")
    for k in range(6):
        for node, factor in (("s1n0", 1.0), ("s1n1", 1.5)):
            times.record(node, 1, 0, 2 + k, 40 + 8 * k, factor * (0.002 + 0.0005 * k))
            times.record(node, 1, 16 + 8 * k, 0, 0, factor * (0.004 + 0.001 * k))
        times.record("s0n0", 0, 0, 2 + k, 40 + 8 * k, 0.001 + 0.0002 * k)
    path = tmp_path / "metrics.txt"
    path.write_text(GatewayMetrics().render({}, times.rows()))
    cat = tmp_path / "tiny.yaml"
    cat.write_text(TINY_CATALOG)
    res = runner.invoke(app, ["perf", "calibrate", "--from-metrics", str(path), "--node-type",
                              "1x-l4", "--catalog", str(cat), "--json"])
    assert res.exit_code == 0, res.output
    scale = {w["node"]: w["scale"] for w in json.loads(res.stdout)["workers"]}
    assert scale["s1n1"] / scale["s1n0"] == pytest.approx(1.5, rel=1e-9)


def test_injected_slowdown_is_recovered_from_the_metrics(tmp_path, monkeypatch):
    """Two data-parallel twins of one stage on the CPU, one slowed 3x by the test hook: the
    fit from /metrics gives the slowed worker about 3x its twin's scale. The twins' own CPU
    times differ run to run on so small a workload (with a 1.5x hook the ratio measured
    1.35-1.62 on a loaded 2-core machine, and 1.03 once in a clean-clone CI run), so this
    checks the live loop end to end,
    not its precision (the test above does that exactly; benchmarks/closed_loop.py measures
    it)."""
    pytest.importorskip("torch")
    pytest.importorskip("zmq")
    from coral.runtime.config import ModelConfig, PipelineSpec, StageSpec
    from coral.runtime.batching_engine import BatchingEngine
    from coral.runtime.worker import ZmqPipeline

    monkeypatch.setenv(INJECT_SLOWDOWN_ENV, "s1n1=3")
    tiny = ModelConfig(num_layers=6, max_seq_len=256, seed=7)
    spec = PipelineSpec(tiny, (StageSpec(0, 2), StageSpec(2, 6, (1.0, 1.0))))
    pipeline = ZmqPipeline(spec)
    try:
        engine = BatchingEngine(pipeline, max_seq_len=tiny.max_seq_len)
        done: list[int] = []
        for k in range(8):  # requests alternate between the twins
            engine.submit(list(b"The quick brown fox jumps"), 48,
                          lambda t, f, e, k=k: f and done.append(k), stop_on_eos=False)
        while engine.has_work():
            engine.step()
        pipeline.idle()
        rows = pipeline.step_times.rows()
    finally:
        pipeline.close()
    assert {r.node for r in rows} == {"s0n0", "s1n0", "s1n1"}
    path = tmp_path / "metrics.txt"
    path.write_text(GatewayMetrics().render({}, rows))
    cat = tmp_path / "tiny.yaml"
    cat.write_text(TINY_CATALOG)
    res = runner.invoke(app, ["perf", "calibrate", "--from-metrics", str(path), "--node-type",
                              "1x-l4", "--catalog", str(cat), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    scale = {w["node"]: w["scale"] for w in out["workers"]}
    assert scale["s1n1"] / scale["s1n0"] == pytest.approx(3.0, rel=0.4)
    (fit,) = out["node_types"]
    assert fit["node_type"] == "1x-l4" and fit["scale"] > 0


def _l40s_metrics(tmp_path, perf, factor: float):
    """Metrics of two 1x-l40s workers serving llama-3.1-8b (one stage each of 16 layers),
    each step taking `factor` times what the perf model predicts."""
    times = StepTimes("llama-3.1-8b", [(0, 16), (16, 32)], node_type="1x-l40s")
    for stage, node in ((0, "s0n0"), (1, "s1n0")):
        for p, b, c in ((512, 0, 0), (0, 16, 16 * 600), (0, 32, 32 * 700)):
            t = perf.iteration_seconds("llama-3.1-8b", "1x-l40s", 16, p, b, c,
                                       first_stage=stage == 0, last_stage=stage == 1)
            times.record(node, stage, p, b, c, factor * t)
    path = tmp_path / f"metrics-{factor}.txt"
    path.write_text(GatewayMetrics().render({}, times.rows()))
    return path


def test_calibrate_says_what_the_measured_speeds_do_to_a_plan(tmp_path, perf, one_model_plan):
    """`--plan`: the plan simulated as modelled and at the measured speeds; L40S workers
    measured at the model's speed keep the plan's SLO, at 4x its time they miss it."""
    def run(factor: float) -> dict:
        res = runner.invoke(app, ["perf", "calibrate", "--from-metrics",
                                  str(_l40s_metrics(tmp_path, perf, factor)), "--plan",
                                  str(one_model_plan), "--duration", "30", "--json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["plan"]

    same, slow = run(1.0), run(4.0)
    assert same["gpu_factors"] == {"l40s": pytest.approx(1.0)}
    assert slow["gpu_factors"] == {"l40s": pytest.approx(4.0)}
    model = same["models"]["llama-3.1-8b"]
    assert model["slo_met_modelled"] and model["slo_met_measured"]
    assert model["slo_attainment_measured"] == model["slo_attainment_modelled"]
    assert slow["models_missing"] == ["llama-3.1-8b"]
    assert slow["models"]["llama-3.1-8b"]["tpot_s_measured"] > 3 * model["tpot_s_measured"]


def test_calibrate_plan_needs_metrics(one_model_plan):
    res = runner.invoke(app, ["perf", "calibrate", "--plan", str(one_model_plan)])
    assert res.exit_code != 0 and "--plan needs --from-metrics" in res.output
