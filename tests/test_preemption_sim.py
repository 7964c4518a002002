"""Preemptions in the simulator (`coral.sim.preemption`): the events drawn match the rate,
runs are deterministic for a seed, and an instance killed with requests in flight loses none
of them: each is completed, or counted as retried (then completed) or failed."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from coral.sim import SimConfig, Simulator, instances_from_plan, synthetic
from coral.sim.preemption import (
    KeepPlan,
    PreemptionConfig,
    PreemptionError,
    PreemptionRun,
    check_rates,
    draw_pool_events,
    pool_rng,
)
from coral.plans.file import PlanFile
from coral.sim.deployment import instances_from_rows
from coral.templates.slo import SloSpec

MODEL = "llama-3.1-8b"
SLO = SloSpec(tpot_s=0.1, ttft_s=2.0, percentile=0.9, input_tokens=512, output_tokens=64)
SLOS = {MODEL: SLO}


def row(template: str, region: str, count: int, market: str, node: str = "1x-l40s") -> dict:
    return {"region": region, "template_id": f"{MODEL}|aggregated|{template}", "model": MODEL,
            "mode": "aggregated", "count": count, "nodes": {node: 1}, "market": market,
            "stages": [{"node_type": node, "count": 1, "first_layer": 0, "layers": 32,
                        "batch": 64, "tp_degree": 1}],
            "capacity_rps": 4.0, "usd_per_hour": 1.0 if market == "spot" else 2.0}


ROW_DICTS = [row("1x-l40s", "r1", 2, "spot"), row("1x-l40s", "r2", 1, "on_demand")]


def typed(rows: list[dict]) -> tuple:
    """Plan rows as a plan file's reader gives them."""
    return PlanFile.from_payload({"instances": rows}).instances


ROWS = typed(ROW_DICTS)


class Rates:
    """Preemption figures of a test: one rate per pool, one notice per region."""

    def __init__(self, rate_per_hour: float = 0.0, notice_s: float = 5.0):
        self.rate, self.notice = rate_per_hour, notice_s

    def preemption_rate_per_hour(self, node_type: str, region: str) -> float:
        return self.rate

    def preemption_notice_s(self, region: str) -> float:
        return self.notice


def run(cat, perf, *, rates: Rates, seed: int = 0, events=(), duration_s: float = 120.0,
        startup_s: float = 20.0, horizon_s: float | None = None):
    sim = Simulator(instances_from_plan({"instances": ROW_DICTS}, SLOS), perf=perf,
                    catalog=cat, config=SimConfig(workers=1))
    reqs = synthetic(MODEL, rate_rps=6.0, duration_s=duration_s, seed=3,
                     prompt_tokens=SLO.input_tokens, output_tokens=SLO.output_tokens)
    pre = PreemptionRun(sim, ROWS, SLOS, rates, KeepPlan(ROWS),
                        PreemptionConfig(seed=seed, startup_s=startup_s, horizon_s=horizon_s))
    pre.install(reqs[-1].arrival_s)
    for t, pool in events:
        pre.preempt_at(t, pool)
    result = sim.run(reqs)
    return result, pre.report(result), pre


def test_events_drawn_over_a_long_horizon_match_the_rate():
    """A Poisson count over 20,000 h at 0.1 per hour has mean 2,000 and standard deviation
    sqrt(2,000) = 45: the count is within 4 of them (180); with share 0.5, events come twice
    as often (each reclaiming half the nodes)."""
    hours = 20_000.0
    for share, mean in ((1.0, 2_000.0), (0.5, 4_000.0)):
        n = len(draw_pool_events(0.1, hours * 3600, pool_rng(7, ("1x-l4", "r1")), share))
        assert abs(n - mean) <= 4 * math.sqrt(mean), (share, n)
    assert draw_pool_events(0.0, 1e6, pool_rng(0, ("a", "b"))) == []


def test_pools_draw_their_own_streams():
    a = draw_pool_events(1.0, 36_000, pool_rng(1, ("1x-l4", "r1")))
    assert a == draw_pool_events(1.0, 36_000, pool_rng(1, ("1x-l4", "r1")))
    assert a != draw_pool_events(1.0, 36_000, pool_rng(1, ("1x-l4", "r2")))
    assert a != draw_pool_events(1.0, 36_000, pool_rng(2, ("1x-l4", "r1")))


@pytest.mark.parametrize("notice_s", [0.0, 5.0])
def test_a_kill_with_requests_in_flight_loses_none(cat, perf, notice_s):
    """Both spot instances (one pool) are reclaimed at 30 s: the queued requests move at the
    notice, the kill retries what had no token and fails what had; every request ends done
    or failed (none unfinished, none vanished), the on-demand instance carries the model
    until the replacements serve, and the reclaimed instances get no request after the
    notice. With no notice the kill finds requests of both kinds; with 5 s (requests of 64
    tokens take about 1 s) the instances drain: nothing fails."""
    result, rep, pre = run(cat, perf, rates=Rates(0.0, notice_s),
                           events=[(30.0, ("1x-l40s", "r1"))])
    statuses = Counter(r.status for r in result.requests)
    assert set(statuses) <= {"done", "failed"}, statuses
    assert sum(statuses.values()) == len(result.requests)
    assert rep["events"] == 1 and rep["instances_reclaimed"] == 2
    assert rep["requests_failed"] == statuses.get("failed", 0)
    if notice_s == 0:
        assert rep["requests_retried"] > 0 and rep["requests_failed"] > 0
        retried = [r for r in result.requests if r.arrival_s <= 30.0 and r.end_s is not None
                   and r.first_token_s > 30.0 and "#r" not in r.instance]
        assert retried and all(r.status == "done" for r in retried)
    else:
        assert rep["requests_failed"] == 0
    assert rep["replacements_started"] == 2 and rep["replans"] == 1
    doomed = {"r1/llama-3.1-8b|aggregated|1x-l40s#0", "r1/llama-3.1-8b|aggregated|1x-l40s#1"}
    late = [r for r in result.requests if r.arrival_s > 30.0 and r.instance in doomed]
    assert late == []
    served_by_new = [r for r in result.requests if "#r" in r.instance and r.status == "done"]
    assert served_by_new and min(r.first_token_s for r in served_by_new) >= 30.0 + 20.0
    # cost: the reclaimed pair until the kill at 35 s, the replacements from 30 s
    horizon = rep["horizon_s"]
    expected = (2 * 1.0 * (30.0 + notice_s) + 2.0 * horizon + 2 * 1.0 * (horizon - 30.0)
                ) / 3600.0
    assert rep["cost_usd"] == pytest.approx(expected)


def test_runs_are_deterministic_for_a_seed(cat, perf):
    rates = Rates(rate_per_hour=60.0)  # one event a minute per pool
    a, rep_a, _ = run(cat, perf, rates=rates, seed=4, duration_s=300.0)
    b, rep_b, _ = run(cat, perf, rates=rates, seed=4, duration_s=300.0)
    assert rep_a == {**rep_b, "replan_cpu_s": rep_a["replan_cpu_s"]}
    assert [(r.status, r.instance, r.end_s) for r in a.requests] == \
        [(r.status, r.instance, r.end_s) for r in b.requests]
    assert rep_a["events"] >= 1
    _c, rep_c, _ = run(cat, perf, rates=rates, seed=5, duration_s=300.0)
    assert rep_c["events_drawn"] != rep_a["events_drawn"] or rep_c != rep_a


def test_no_events_changes_nothing(cat, perf):
    sim = Simulator(instances_from_plan({"instances": ROW_DICTS}, SLOS), perf=perf,
                    catalog=cat)
    reqs = synthetic(MODEL, rate_rps=6.0, duration_s=60.0, seed=3,
                     prompt_tokens=SLO.input_tokens, output_tokens=SLO.output_tokens)
    plain = sim.run(reqs)
    with_pre, rep, _ = run(cat, perf, rates=Rates(0.0), duration_s=60.0)
    assert [(r.status, r.instance, r.end_s) for r in plain.requests] == \
        [(r.status, r.instance, r.end_s) for r in with_pre.requests]
    assert rep["events"] == 0 and rep["cost_usd"] == pytest.approx(
        4.0 * rep["horizon_s"] / 3600.0)


def test_a_catalog_without_preemption_figures_is_refused(cat):
    with pytest.raises(PreemptionError, match="no preemption figures"):
        check_rates(object())
    assert check_rates(cat) is cat  # the built-in catalog carries them


def pd_row(role: str, market: str, count: int, batch: int) -> dict:
    return {"region": "r1", "template_id": f"{MODEL}|{role}|1x-l40s", "model": MODEL,
            "mode": role, "count": count, "nodes": {"1x-l40s": 1}, "market": market,
            "stages": [{"node_type": "1x-l40s", "count": 1, "first_layer": 0, "layers": 32,
                        "batch": batch, "tp_degree": 1}],
            "capacity_rps": 6.0, "usd_per_hour": 1.0}


def test_prefill_decode_instances_fail_over_too(cat, perf):
    """A PD deployment whose spot decode instance is reclaimed with no notice: its requests
    (all past their first token) fail, the prefill instance hands the rest to the on-demand
    decode instance, and no request is left unfinished or lost."""
    rows = typed([pd_row("prefill", "on_demand", 1, 4096), pd_row("decode", "spot", 1, 64),
                  {**pd_row("decode", "on_demand", 1, 64), "template_id": f"{MODEL}|decode|od"}])
    sim = Simulator(instances_from_rows(rows, SLOS), perf=perf, catalog=cat,
                    config=SimConfig(workers=1))
    reqs = synthetic(MODEL, rate_rps=6.0, duration_s=60.0, seed=3,
                     prompt_tokens=SLO.input_tokens, output_tokens=SLO.output_tokens)
    pre = PreemptionRun(sim, rows, SLOS, Rates(0.0, 0.0), KeepPlan(rows),
                        PreemptionConfig(startup_s=10.0))
    pre.install(reqs[-1].arrival_s)
    pre.preempt_at(20.0, ("1x-l40s", "r1"))
    result = sim.run(reqs)
    rep = pre.report(result)
    statuses = Counter(r.status for r in result.requests)
    assert set(statuses) <= {"done", "failed"} and statuses["failed"] > 0, statuses
    assert rep["instances_reclaimed"] == 1 and rep["replacements_started"] == 1
    lost = "r1/llama-3.1-8b|decode|1x-l40s#0"
    assert not [r for r in result.requests if r.decode_instance == lost
                and r.first_token_s > 20.0]


def test_an_unplannable_scenario_is_a_clear_error(tmp_path, cat):
    """`coral simulate --preemptions` on a plan whose scenario does not load says so."""
    import json

    from typer.testing import CliRunner

    from coral.cli.main import app

    if not hasattr(cat, "preemption_rate_per_hour"):
        pytest.skip("the catalog carries no preemption figures")
    plan = {"scenario": "no-such-scenario", "demand_rps": {MODEL: 2.0},
            "slos": {MODEL: SLO.model_dump()}, "instances": ROW_DICTS}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    res = CliRunner().invoke(app, ["simulate", str(path), "--preemptions", "--duration", "5",
                                   "--no-progress", "--out", str(tmp_path / "sim")])
    assert res.exit_code != 0
    assert "cannot re-plan" in res.output and "Traceback" not in res.output


#: One model, three node types with spot prices, one region (as tests/test_planning.py's).
TINY_SCENARIO = """\
schema_version: 1
name: tiny
mode: aggregated
n_max: 2
rho: 12
startup_s: 10
node_types: [1x-l4, 1x-a10g, 1x-l40s]
models:
  - {name: llama-3.1-8b, demand_rps: 6, input_tokens: 1024, output_tokens: 256, tpot_s: 0.10,
     ttft_s: 2.0}
regions:
  - {name: aws-us-east-1}
base_availability: {1x-l4: 8, 1x-a10g: 8, 1x-l40s: 4}
availability: abundant
levels:
  abundant: {scale: 1.0}
"""


@pytest.mark.parametrize("mode", ["aggregated", "pd"])
def test_simulate_preemptions_end_to_end(tmp_path, monkeypatch, mode):
    """`coral plan tiny.yaml --spot [--mode pd]` then `coral simulate --preemptions` with
    every pool preempted about twice a minute: events reclaim spot instances (prefill and
    decode halves too), each is re-planned by the allocator (the plan's mode and spot options
    kept), and no request is left unfinished."""
    import json

    from typer.testing import CliRunner

    from coral.catalog.loader import Catalog
    from coral.cli.main import app

    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_SCENARIO)
    plan, tpl = tmp_path / "plan.json", tmp_path / "templates"
    runner = CliRunner()
    res = runner.invoke(app, ["plan", str(scenario), "--spot", "--mode", mode,
                              "--no-baselines", "--templates-dir", str(tpl), "--out", str(plan)])
    assert res.exit_code == 0, res.output
    rows = json.loads(plan.read_text())["instances"]
    assert any(r["market"] == "spot" for r in rows)
    assert {r["mode"] for r in rows} <= ({"aggregated"} if mode == "aggregated"
                                         else {"prefill", "decode"})
    monkeypatch.setattr(Catalog, "preemption_rate_per_hour", lambda self, g, r: 120.0)
    res = runner.invoke(app, ["simulate", str(plan), "--preemptions", "--duration", "60",
                              "--replan-scenario", str(scenario), "--templates-dir", str(tpl),
                              "--no-progress", "--json", "--out", str(tmp_path / "sim")])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    pre = summary["preemptions"]
    assert pre["events"] >= 1 and pre["replans"] == pre["events"]
    assert pre["instances_reclaimed"] >= 1 and pre["replacements_started"] >= 1
    assert summary["unfinished"] == 0
    assert summary["cost_per_hour"] == pytest.approx(pre["cost_per_hour"])
