"""The typed plan file (`coral.plans.file`): a plan written, read and written again is the same
JSON (aggregated, prefill/decode, spot and robust plans of a tiny scenario), the file is what
the planner's `to_dict` always wrote, and its SLOs come back as checked `SloSpec`s."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from coral.allocator.scenario.load import load_scenario
from coral.allocator.spot.planner import SpotOptions
from coral.catalog import default_catalog
from coral.perf.slowdown import PhaseSlowdown
from coral.planning.libraries import templates_for_scenario
from coral.planning.options import PlanOptions
from coral.planning.plan import plan_scenario
from coral.plans.errors import PlanFileError
from coral.plans.file import PlanFile, plan_json, read_plan, write_plan
from coral.templates.builder.parallel import default_perf_factory
from coral.templates.slo import SloSpec

SCENARIO = """\
schema_version: 1
name: tiny-plan-file
mode: mixed
n_max: 2
rho: 12
startup_s: 0
node_types: [1x-l4, 1x-a10g, 1x-l40s]
models:
  - {name: llama-3.1-8b, demand_rps: 12, input_tokens: 1024, output_tokens: 256,
     tpot_s: 0.10, ttft_s: 2.0}
regions:
  - {name: aws-us-east-1}
base_availability: {1x-l4: 12, 1x-a10g: 12, 1x-l40s: 6}
"""

KINDS = ("aggregated", "pd", "spot", "robust")


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One plan of each kind, planned once from the same templates."""
    folder = tmp_path_factory.mktemp("plan-file")
    path = folder / "tiny.yaml"
    path.write_text(SCENARIO)
    catalog = default_catalog()
    perf = default_perf_factory(catalog)
    scenario = load_scenario(path, catalog=catalog).with_perf(perf, catalog)
    templates = templates_for_scenario(scenario, catalog, perf, out_root=folder / "templates")
    plain = PlanOptions(time_limit_s=10.0)
    common = dict(catalog=catalog, perf=perf, templates=templates, baselines=False)
    return {
        "aggregated": plan_scenario(scenario.in_mode("aggregated"), options=plain, **common),
        "pd": plan_scenario(scenario.in_mode("pd"), options=plain, **common),
        "spot": plan_scenario(scenario.in_mode("aggregated"),
                              options=replace(plain, spot=SpotOptions(risk_target=0.99)),
                              **common),
        "robust": plan_scenario(scenario.in_mode("aggregated"),
                                options=replace(plain, robust=0.2), **common),
    }


@pytest.mark.parametrize("kind", KINDS)
def test_a_plan_written_read_and_written_again_is_the_same_json(plans, kind, tmp_path):
    result = plans[kind]
    first = tmp_path / "first.json"
    write_plan(result.plan_file(), first)
    # the file is what `coral plan --out` wrote before the plan file had a type
    assert first.read_text() == json.dumps(result.to_dict(), indent=2, default=str) + "\n"
    plan = read_plan(first)
    second = tmp_path / "second.json"
    write_plan(plan, second)
    assert second.read_text() == first.read_text()
    assert read_plan(second) == plan


def test_each_kind_carries_its_own_entries(plans, tmp_path):
    read = {}
    for kind in KINDS:
        write_plan(plans[kind].plan_file(), tmp_path / f"{kind}.json")
        read[kind] = read_plan(tmp_path / f"{kind}.json")
    assert {r.mode for r in read["aggregated"].instances} == {"aggregated"}
    assert {r.mode for r in read["pd"].instances} == {"prefill", "decode"}
    assert read["spot"].spot is not None and read["spot"].spot.risk_target == 0.99
    assert {r.market for r in read["spot"].instances} <= {"spot", "on_demand"}
    assert read["robust"].robust is not None and read["robust"].robust.r == 0.2
    assert read["robust"].robust.factors and read["spot"].robust is None
    for plan in read.values():
        assert plan.scenario == "tiny-plan-file" and plan.engine == "coral"
        assert plan.slos == {"llama-3.1-8b": SloSpec(tpot_s=0.1, ttft_s=2.0)}
        assert plan.demand_rps == {"llama-3.1-8b": 12.0}
        assert all(r.shape is not None and r.count >= 1 for r in plan.instances)


def test_a_robust_promise_per_phase_reads_back(plans, tmp_path):
    """`--robust auto` writes a card whose phases differ as {"prefill": P, "decode": D}: the
    file reads back to the same promise and writes the same text again."""
    payload = plans["robust"].to_dict()
    payload["robust"].update(R="auto", factor=None, factors={
        "l4": {"prefill": 1.0835, "decode": 1.0685}, "a10g": 1.1841})
    first = _write(tmp_path, payload)
    plan = read_plan(first)
    assert plan.robust.factors == {"l4": PhaseSlowdown(1.0835, 1.0685), "a10g": 1.1841}
    second = tmp_path / "second.json"
    write_plan(plan, second)
    assert read_plan(second) == plan
    assert json.loads(second.read_text())["robust"]["factors"] == payload["robust"]["factors"]


def _write(tmp_path: Path, payload: dict) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(payload))
    return path


def test_a_bad_slo_names_the_file_the_entry_and_the_field(plans, tmp_path):
    payload = plans["aggregated"].to_dict()
    payload["slos"]["llama-3.1-8b"]["ttft_s"] = 0.01  # below its tpot_s
    path = _write(tmp_path, payload)
    with pytest.raises(PlanFileError) as err:
        read_plan(path)
    text = str(err.value)
    assert str(path) in text and "slos['llama-3.1-8b'].ttft_s" in text
    assert "below tpot_s" in text


@pytest.mark.parametrize("entry, value, field", [
    ("spot", {"risk_target": "high", "window_s": 3600}, "spot.risk_target"),
    ("robust", {"R": 0.2, "factor": 1.2, "factors": {"l4": "slow"}}, "robust.factors"),
    ("robust", {"R": "auto", "factor": None, "factors": {"l4": {"prefill": 1.1}}},
     "robust.factors"),
    ("robust", {"R": "auto", "factor": None,
                "factors": {"l4": {"prefill": 1.1, "decode": -1}}}, "robust.factors"),
    ("nmax", 0, "nmax"),
    ("engine", 7, "engine"),
])
def test_a_bad_promise_or_entry_is_named(plans, tmp_path, entry, value, field):
    payload = plans["aggregated"].to_dict()
    payload[entry] = value
    path = _write(tmp_path, payload)
    with pytest.raises(PlanFileError, match=rf"(?s){path}.*field '{field}'"):
        read_plan(path)


def test_a_lenient_read_keeps_the_bad_rows_aside(plans):
    payload = plans["aggregated"].to_dict()
    payload["instances"][0]["count"] = -1
    with pytest.raises(PlanFileError, match=r"instances\[0\].*field 'count'"):
        PlanFile.from_payload(payload)
    plan = PlanFile.from_payload(payload, skip_bad_rows=True)
    assert [r.index for r in plan.rejected] == [0]
    assert len(plan.instances) == len(payload["instances"]) - 1
    assert "rejected" not in json.loads(plan_json(plan))
