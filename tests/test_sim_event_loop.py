"""Simulator: closed-form checks against the perf model, queueing, conservation, modes,
and agreement with the planner on one template."""

from __future__ import annotations


import numpy as np
import pytest

from coral.sim import (
    InstanceSpec,
    Request,
    SimConfig,
    Simulator,
    instance_from_template,
    simulate,
    summarize,
    synthetic,
)
from coral.sim.deployment import DeploymentError, stages_from_nodes
from coral.sim.event_loop import ARRIVAL, STEP_DONE
from coral.templates.space.operating_points import NET_LATENCY_S
from coral.templates.slo import SloSpec

MODEL = "llama-3.1-8b"


def one_node(batch: int = 128, node: str = "1x-l40s") -> InstanceSpec:
    return InstanceSpec("solo", MODEL, stages_from_nodes([(node, 0, 32, batch, 1.0)]), 1.0, 1.0)


def two_stage() -> InstanceSpec:
    st = stages_from_nodes([("1x-l4", 0, 14, 32, 1.0), ("1x-a10g", 14, 18, 32, 1.0)])
    return InstanceSpec("pipe", MODEL, st, 1.0, 2.0)


def test_event_order_is_stated():
    # a step ending at the same time as an arrival is handled first (see engine docstring)
    assert STEP_DONE < ARRIVAL


def test_single_request_matches_perf_model_along_the_pipeline(cat, perf):
    """Alone, TTFT = sum over stages of (prefill iteration + send) and TPOT = the mean over
    decode steps of the same sums with the growing context (exact contexts)."""
    inst = two_stage()
    prompt, out = 700, 40
    req = Request(0, MODEL, 1.5, prompt, out)
    res = simulate([inst], [req], perf=perf, catalog=cat,
                   config=SimConfig(context_buckets=0))
    r = res.requests[0]
    hb = cat.model(MODEL).hidden_size * cat.model(MODEL).dtype_bytes
    nic = cat.node_type("1x-l4").nic_gbps * 1e9 / 8

    def path(p: int, b: int, c: int) -> float:
        t1 = perf.iteration_seconds(MODEL, "1x-l4", 14, p, b, c, first_stage=True)
        t2 = perf.iteration_seconds(MODEL, "1x-a10g", 18, p, b, c, last_stage=True)
        return t1 + (p + b) * hb / nic + NET_LATENCY_S + t2

    assert r.status == "done"
    assert r.ttft_s == pytest.approx(path(prompt, 0, 0), rel=1e-9)
    decode = [path(0, 1, prompt + i) for i in range(out - 1)]
    assert r.tpot_s == pytest.approx(sum(decode) / (out - 1), rel=1e-9)
    # the default context rounding changes TPOT by well under 3 %
    fast = simulate([inst], [req], perf=perf, catalog=cat).requests[0]
    assert fast.tpot_s == pytest.approx(r.tpot_s, rel=0.03)
    assert fast.ttft_s == pytest.approx(r.ttft_s, rel=1e-9)


def test_single_server_matches_md1_queue(cat, perf):
    """batch 1 and one output token: an M/D/1 queue. Utilisation = lambda S and the mean wait
    is Pollaczek-Khinchine's rho S / (2 (1 - rho))."""
    inst = one_node(batch=1)
    service = perf.iteration_seconds(MODEL, "1x-l40s", 32, 512, 0, 0,
                                     first_stage=True, last_stage=True)
    rho = 0.6
    rate = rho / service
    duration = 4000 * service / rho  # about 4000 requests... x5 below
    reqs = synthetic(MODEL, rate_rps=rate, duration_s=5 * duration, seed=3,
                     prompt_tokens=512, output_tokens=1)
    res = simulate([inst], reqs, perf=perf, catalog=cat)
    last_arrival = reqs[-1].arrival_s
    util = res.nodes[0].busy_s / res.end_s
    assert util == pytest.approx(len(reqs) * service / res.end_s, rel=1e-9)
    assert util == pytest.approx(rate * service, rel=0.05)
    waits = np.array([r.ttft_s - service for r in res.requests])
    assert waits.min() >= -1e-12
    expected = rho * service / (2 * (1 - rho))
    assert waits.mean() == pytest.approx(expected, rel=0.12)
    assert last_arrival < res.end_s


def test_conservation_no_request_lost_or_duplicated(cat, perf):
    reqs = synthetic(MODEL, rate_rps=8.0, duration_s=60, seed=5, length_dist="lognormal",
                     sigma=1.0)
    insts = [one_node(), InstanceSpec("b", MODEL, two_stage().stages, 2.0, 1.0)]
    res = simulate(insts, reqs, perf=perf, catalog=cat)
    assert [r.id for r in res.requests] == [r.id for r in reqs]
    assert all(r.status == "done" for r in res.requests)
    assert {r.instance for r in res.requests} == {"solo", "b"}
    for r in res.requests:
        assert r.arrival_s <= r.first_token_s <= r.end_s
    # with a horizon the rest is reported unfinished, still exactly once
    cut = simulate(insts, reqs, perf=perf, catalog=cat, config=SimConfig(horizon_s=30))
    assert sorted(r.id for r in cut.requests) == [r.id for r in reqs]
    assert any(r.status == "unfinished" for r in cut.requests)


def test_kv_pressure_preempts_and_still_finishes_everything(cat, perf):
    # the 8B model on one L4 with a large batch and long sequences fills the KV cache
    inst = one_node(batch=256, node="1x-l4")
    sim = Simulator([inst], perf=perf, catalog=cat)
    cap = sim.instances[0].kv_cap
    reqs = [Request(i, MODEL, 0.01 * i, 2000, 2000) for i in range(cap // 2000 + 8)]
    res = sim.run(reqs)
    assert all(r.status == "done" for r in res.requests)
    assert sum(r.preemptions for r in res.requests) > 0


def test_determinism_with_a_seed(cat, perf):
    def run(seed):
        reqs = synthetic(MODEL, rate_rps=6.0, duration_s=60, seed=seed, process="gamma", cv=2.0,
                         length_dist="lognormal")
        res = simulate([one_node(), InstanceSpec("b", MODEL, two_stage().stages, 2.0, 1.0)],
                       reqs, perf=perf, catalog=cat)
        return [(r.instance, r.first_token_s, r.end_s) for r in res.requests]

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_fast_mode_equals_naive_mode(cat, perf):
    reqs = synthetic(MODEL, rate_rps=3.0, duration_s=40, seed=7, length_dist="lognormal")
    insts = [one_node(batch=16), InstanceSpec("b", MODEL, two_stage().stages, 1.5, 1.0)]
    fast = simulate(insts, reqs, perf=perf, catalog=cat, config=SimConfig(mode="fast"))
    naive = simulate(insts, reqs, perf=perf, catalog=cat, config=SimConfig(mode="naive"))
    assert fast.steps == naive.steps
    assert fast.events < naive.events / 2
    for a, b in zip(fast.requests, naive.requests):
        assert (a.id, a.instance, a.status, a.preemptions) == (b.id, b.instance, b.status,
                                                               b.preemptions)
        assert a.first_token_s == pytest.approx(b.first_token_s, rel=1e-9, abs=1e-9)
        assert a.end_s == pytest.approx(b.end_s, rel=1e-9, abs=1e-9)


def test_router_follows_weights(cat, perf):
    a = InstanceSpec("a", MODEL, one_node().stages, 3.0, 1.0)
    b = InstanceSpec("b", MODEL, one_node().stages, 1.0, 1.0)
    reqs = [Request(i, MODEL, 10.0 * i, 16, 2) for i in range(400)]  # no load: pure weights
    res = simulate([a, b], reqs, perf=perf, catalog=cat)
    n_a = sum(r.instance == "a" for r in res.requests)
    assert n_a == 300
    # interleaved: never more than three in a row on "a"
    seq = "".join(r.instance for r in res.requests)
    assert "aaaa" not in seq


def test_duplicate_request_ids_are_refused(cat, perf):
    with pytest.raises(ValueError, match="unique"):
        simulate([one_node()], [Request(0, MODEL, 0.0, 8, 2)] * 2, perf=perf, catalog=cat)


def test_unknown_model_is_rejected_not_lost(cat, perf):
    res = simulate([one_node()], [Request(0, "other", 0.0, 10, 10)], perf=perf, catalog=cat)
    assert res.requests[0].status == "rejected"


def test_stages_must_tile_the_layers():
    with pytest.raises(DeploymentError, match="starts at layer 10, expected 8"):
        stages_from_nodes([("1x-l4", 0, 8, 16, 1.0), ("1x-l4", 10, 22, 16, 1.0)])


def test_config_errors_name_the_value():
    with pytest.raises(ValueError, match="'slow'"):
        SimConfig(mode="slow")


@pytest.fixture(scope="module")
def planned(cat, perf):
    from coral.templates.builder.solve import build_template

    slo = SloSpec(tpot_s=0.1, ttft_s=2.0, percentile=0.9, input_tokens=1024, output_tokens=256)
    tpl = build_template(MODEL, ["1x-l40s"], slo, "aggregated", "flow", perf, cat)
    assert tpl.feasible
    return tpl


def _run_at(tpl, frac, cat, perf):
    slo = tpl.slo
    reqs = synthetic(MODEL, rate_rps=frac * tpl.throughput_rps, duration_s=600, seed=1,
                     prompt_tokens=slo.input_tokens, output_tokens=slo.output_tokens)
    res = simulate([instance_from_template(tpl)], reqs, perf=perf, catalog=cat)
    return summarize(res, {MODEL: slo})["models"][MODEL]


def test_planner_consistency_at_and_past_planned_capacity(planned, cat, perf):
    """Guards agreement with the planner (docs/design.md). At 100 % of the template's
    planned capacity the TPOT target holds at the SLO percentile; at 130 % the SLO does not.

    Measured: TPOT p90 stays near the planned step (~0.088 s against 0.1 s) at 100 % and at
    130 %, because the batch is capped at the template's batch and overload turns into
    queueing: it is TTFT p90 that fails (tens of seconds at 100 %, where a Poisson queue at
    utilisation 1 does not settle; minutes at 130 %)."""
    at = _run_at(planned, 1.0, cat, perf)
    past = _run_at(planned, 1.3, cat, perf)
    assert at["tpot_s_at_percentile"] <= planned.slo.tpot_s
    assert not past["slo_met"]
    assert past["ttft_s_at_percentile"] > 10 * planned.slo.ttft_s
    # below capacity the whole SLO holds
    below = _run_at(planned, 0.8, cat, perf)
    assert below["slo_met"] and below["slo_attainment"] > 0.95
