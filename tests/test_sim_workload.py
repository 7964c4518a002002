"""Workload generators and trace readers."""

from __future__ import annotations

import numpy as np
import pytest

from coral.sim.workload import (
    SAMPLE_TRACE,
    WorkloadError,
    arrival_times,
    merge,
    read_trace,
    synthetic,
    trace_requests,
    trace_span_s,
)


def test_poisson_rate_and_seed():
    t = arrival_times(50.0, 200.0, seed=1)
    assert len(t) == pytest.approx(10_000, rel=0.05)
    assert np.all(np.diff(t) >= 0) and t[-1] < 200.0
    assert np.array_equal(t, arrival_times(50.0, 200.0, seed=1))
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)


def test_gamma_is_bursty_with_the_asked_cv():
    gaps = np.diff(arrival_times(50.0, 400.0, seed=2, process="gamma", cv=3.0))
    assert gaps.mean() == pytest.approx(1 / 50.0, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)


def test_lognormal_lengths_have_the_mean():
    reqs = synthetic("m", rate_rps=100, duration_s=100, seed=3, length_dist="lognormal",
                     prompt_tokens=1000, output_tokens=200)
    assert np.mean([r.prompt_tokens for r in reqs]) == pytest.approx(1000, rel=0.05)
    assert min(r.output_tokens for r in reqs) >= 1


def test_sample_trace_and_rescaling():
    rows = read_trace(SAMPLE_TRACE)
    assert len(rows) == 300 and rows[0].arrival_s == 0.0
    reqs = trace_requests(SAMPLE_TRACE, "m", rate_rps=10.0)
    span = reqs[-1].arrival_s
    assert (len(reqs) - 1) / span == pytest.approx(10.0, rel=1e-9)
    assert [r.prompt_tokens for r in reqs] == [r.prompt_tokens for r in rows]


def test_a_rescaled_trace_says_where_it_ends():
    """The span of a trace rescaled to a rate is where its last request arrives."""
    reqs = trace_requests(SAMPLE_TRACE, "m", rate_rps=10.0)
    assert trace_span_s(SAMPLE_TRACE, rate_rps=10.0) == pytest.approx(reqs[-1].arrival_s)
    assert trace_span_s(SAMPLE_TRACE, rate_rps=20.0) == pytest.approx(reqs[-1].arrival_s / 2)
    assert trace_span_s(SAMPLE_TRACE) == read_trace(SAMPLE_TRACE)[-1].arrival_s


def test_simulate_names_the_models_whose_trace_ends_early(tmp_path, one_model_plan):
    """A replay longer than a model's rescaled trace says so (summary and text), rather
    than reporting a quiet tail as served."""
    import json

    from typer.testing import CliRunner

    from coral.cli.main import app
    from coral.plans.file import read_plan

    plan = read_plan(one_model_plan)
    (model, demand), = plan.demand_rps.items()
    span = trace_span_s(SAMPLE_TRACE, rate_rps=demand)
    base = ["simulate", str(one_model_plan), "--trace", str(SAMPLE_TRACE), "--no-progress",
            "--workers", "1", "--out", str(tmp_path / "sim")]
    res = CliRunner().invoke(app, [*base, "--duration", f"{2 * span:.3f}", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["trace_ends_s"] == {model: pytest.approx(span)}
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, [*base, "--duration", f"{2 * span:.3f}"])
    assert res.exit_code == 0 and "the trace ends before --duration" in res.output
    assert model in res.output.split("the trace ends before")[1]
    res = CliRunner().invoke(app, [*base, "--duration", f"{0.5 * span:.3f}", "--json"])
    assert json.loads(res.stdout)["trace_ends_s"] == {}


def test_azure_format(tmp_path):
    p = tmp_path / "azure.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,109\n")
    rows = read_trace(p)
    assert rows[1].arrival_s == pytest.approx(4.314579, abs=1e-5)
    assert (rows[1].prompt_tokens, rows[1].output_tokens) == (396, 109)


@pytest.mark.parametrize("body, match", [
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,x\n",
     r"row 2, column num_decode_tokens: 'x'"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,0,5\n",
     r"row 3, column num_prefill_tokens"),
    ("a,b,c\n1,2,3\n", "neither the processed columns"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", "row 2, column TIMESTAMP"),
])
def test_bad_traces_name_file_row_and_column(tmp_path, body, match):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(WorkloadError, match=match) as info:
        read_trace(p)
    assert "bad.csv" in str(info.value)


def test_bad_parameters():
    with pytest.raises(WorkloadError, match="rate must be > 0"):
        arrival_times(0, 10, seed=1)
    with pytest.raises(WorkloadError, match="valid: 'poisson', 'gamma'"):
        arrival_times(1, 10, seed=1, process="weibull")
    with pytest.raises(WorkloadError, match="does not exist"):
        read_trace("/nonexistent/trace.csv")


def test_merge_renumbers_in_arrival_order():
    a = synthetic("a", rate_rps=5, duration_s=10, seed=1)
    b = synthetic("b", rate_rps=5, duration_s=10, seed=2)
    m = merge(a, b)
    assert len(m) == len(a) + len(b)
    assert [r.id for r in m] == list(range(len(m)))
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(m, m[1:]))


def test_merge_orders_as_sorted_by_arrival_model_and_id():
    """Guards the numpy merge: the order of `sorted` by (arrival, model, id), stable on full
    ties, with the fields untouched."""
    from coral.sim.workload import Request

    rng = np.random.default_rng(0)
    ws = [[Request(int(i), m, float(round(t, 1)), 5 + k, 7) for i, t in
           enumerate(rng.uniform(0, 5, 60))] for k, m in enumerate(["b", "a", "c", "aa", "B"])]
    ws.append([Request(3, "a", 1.0, 70, 7), Request(3, "a", 1.0, 80, 8)])  # a full-key tie
    got = merge(*ws)
    want = sorted((r for w in ws for r in w), key=lambda r: (r.arrival_s, r.model, r.id))
    assert [r[1:] for r in got] == [r[1:] for r in want]
    assert [r.id for r in got] == list(range(len(want)))
    assert merge() == [] and merge([]) == []


def test_synthetic_requests_hold_plain_python_numbers():
    reqs = synthetic("m", rate_rps=20, duration_s=5, seed=1, length_dist="lognormal")
    assert all(type(r.arrival_s) is float and type(r.prompt_tokens) is int
               and type(r.output_tokens) is int and type(r.id) is int for r in reqs)
