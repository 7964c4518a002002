"""The one plan-file check (`coral.plans.check`): every reader refuses a careless or
hostile plan file with a clean exit naming file, instance and field, never a traceback, and
quickly, however large the numbers in it.

The command-line cases are the plan files of issue 35, each through `coral simulate` and
`coral serve --dry-run`; the property tests mutate a valid plan at random and hold the check
to one contract: it raises nothing, and a plan it passes is read by the simulator's and the
runtime's readers without an error.
"""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from coral.plans.check import (
    MAX_PLAN_INSTANCES,
    MAX_ROW_INSTANCES,
    PlanCheckError,
    check_plan,
)
from coral.plans.errors import PlanFileError
from coral.plans.file import PlanFile, read_plan
from coral.catalog import default_catalog
from coral.cli.main import app
from coral.errors import CoralError
from coral.runtime.deployment import RuntimeDeploymentError, read_instances
from coral.sim.deployment import instances_from_plan

runner = CliRunner(env={"COLUMNS": "300"})
CATALOG = default_catalog()
ROW = "instances[0] (model 'llama-3.1-8b', r1/llama-3.1-8b|aggregated|1x-l40s)"


def valid_plan() -> dict[str, Any]:
    """Two llama-3.1-8b instances on one L40S each, with the plan's SLOs and demand."""
    return {
        "scenario": "core",
        "demand_rps": {"llama-3.1-8b": 2.0},
        "slos": {"llama-3.1-8b": {"tpot_s": 0.1, "ttft_s": 2.0, "percentile": 0.9,
                                  "input_tokens": 1024, "output_tokens": 256}},
        "instances": [{
            "region": "r1", "template_id": "llama-3.1-8b|aggregated|1x-l40s",
            "model": "llama-3.1-8b", "mode": "aggregated", "count": 2,
            "nodes": {"1x-l40s": 1},
            "stages": [{"node_type": "1x-l40s", "count": 1, "first_layer": 0, "layers": 32,
                        "batch": 128, "tp_degree": 1}],
            "capacity_rps": 5.8, "usd_per_hour": 1.5,
        }],
    }


def _stage(plan: dict, **values: Any) -> None:
    plan["instances"][0]["stages"][0].update(values)


def _row(plan: dict, **values: Any) -> None:
    plan["instances"][0].update(values)


#: name -> (how the valid plan is spoiled, what the error must say)
CASES = {
    "half_layers": (lambda p: _stage(p, layers=16),
                    [ROW, "field 'stages'", "cover layers [0, 16)", "has 32 layers"]),
    "huge_count": (lambda p: _row(p, count=1_000_000_000),
                   [ROW, "field 'count'", "got 1000000000", f"to {MAX_ROW_INSTANCES}"]),
    "infinity_batch": (lambda p: _stage(p, batch=math.inf),
                       [ROW, "field 'stages[0].batch'", "got Infinity"]),
    "nan_batch": (lambda p: _stage(p, batch=math.nan),
                  [ROW, "field 'stages[0].batch'", "got NaN"]),
    "two_count": (lambda p: _row(p, count="two"),
                  [ROW, "field 'count'", "got the string 'two'"]),
    "string_instances": (lambda p: p.update(instances="llama-3.1-8b"),
                         ["field 'instances'", "must be a list of instance rows"]),
    "empty_slos": (lambda p: p.update(slos={}),
                   ["field 'slos'", "no SLO for model 'llama-3.1-8b'", "instances[0]"]),
    "ttft_below_tpot": (lambda p: p["slos"]["llama-3.1-8b"].update(ttft_s=0.01),
                        ["field 'slos['llama-3.1-8b'].ttft_s'", "below tpot_s"]),
    "unknown_node_type": (lambda p: _stage(p, node_type="16x-b300-imaginary"),
                          [ROW, "field 'stages[0].node_type'",
                           "unknown node type '16x-b300-imaginary'"]),
    "unknown_model": (lambda p: _row(p, model="llama-9-imaginary"),
                      ["instances[0] (model 'llama-9-imaginary'", "field 'model'",
                       "unknown model 'llama-9-imaginary'"]),
    "negative_count": (lambda p: _row(p, count=-1), [ROW, "field 'count'", "got -1"]),
    "overlap": (lambda p: p["instances"][0]["stages"].append(
        {"node_type": "1x-l40s", "count": 1, "first_layer": 16, "layers": 16, "batch": 8}),
                [ROW, "field 'stages'", "not one pipeline"]),
}


def _write(tmp_path: Path, name: str) -> Path:
    plan = valid_plan()
    CASES[name][0](plan)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(plan))  # Infinity and NaN as Python's json writes them
    return path


def _check_refusal(result: Any, path: Path, expected: list[str], started: float) -> None:
    assert time.perf_counter() - started < 10, "a bad plan must be refused within 10 s"
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    text = " ".join(result.output.split())  # joined across wrapped lines
    assert "Traceback" not in text
    assert str(path) in text
    for part in expected:
        assert part in text, f"{part!r} not in {text}"
    assert "to fix:" in text.lower()
    assert "vllm" not in text.lower()  # the fix is in the plan file, not another engine


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulate_refuses_a_bad_plan_naming_file_instance_and_field(tmp_path, name):
    path = _write(tmp_path, name)
    started = time.perf_counter()
    result = runner.invoke(app, ["simulate", str(path), "--duration", "5", "--no-progress",
                                 "--workers", "1", "--out", str(tmp_path / "sim")])
    _check_refusal(result, path, CASES[name][1], started)
    assert not (tmp_path / "sim").exists()


@pytest.mark.parametrize("name", sorted(CASES))
def test_serve_dry_run_refuses_a_bad_plan_naming_file_instance_and_field(tmp_path, name):
    path = _write(tmp_path, name)
    started = time.perf_counter()
    result = runner.invoke(app, ["serve", str(path), "--dry-run"])
    _check_refusal(result, path, CASES[name][1], started)


def test_the_valid_plan_simulates_and_serves(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(valid_plan()))
    assert check_plan(valid_plan(), CATALOG).ok
    sim = runner.invoke(app, ["simulate", str(path), "--duration", "5", "--no-progress",
                              "--workers", "1", "--out", str(tmp_path / "sim")])
    assert sim.exit_code == 0, sim.output
    serve = runner.invoke(app, ["serve", str(path), "--dry-run"])
    assert serve.exit_code == 0, serve.output


def test_every_problem_is_listed_not_only_the_first():
    plan = valid_plan()
    _row(plan, count="two", model="nope")
    _stage(plan, batch=math.inf, node_type="nope-node")
    plan["slos"] = []
    check = check_plan(plan, CATALOG, "p.json")
    fields = {p.field for p in check.problems}
    assert {"count", "model", "stages[0].batch", "stages[0].node_type", "slos"} <= fields
    with pytest.raises(PlanCheckError, match=r"p\.json: the plan has \d+ problems"):
        check.raise_if_any()


def test_a_plan_with_too_many_instances_in_all_is_refused_as_a_whole():
    plan = valid_plan()
    row = plan["instances"][0]
    plan["instances"] = [dict(row, count=MAX_ROW_INSTANCES) for _ in range(2)]
    check = check_plan(plan, CATALOG)
    assert [p.field for p in check.of_plan()] == ["instances"]
    assert f"more than {MAX_PLAN_INSTANCES}" in check.message()
    with pytest.raises(RuntimeDeploymentError, match="instances in all"):
        read_instances(plan, CATALOG)


def test_serve_lists_a_bad_row_and_deploys_the_others_when_asked(tmp_path):
    plan = valid_plan()
    bad = dict(plan["instances"][0], template_id="bad", count=10**12)
    plan["instances"].append(bad)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    refused = runner.invoke(app, ["serve", str(path), "--dry-run"])
    assert refused.exit_code == 2 and "--skip-unservable" in refused.output
    assert "r1/bad" in refused.output and "field 'count'" in refused.output
    skipped = runner.invoke(app, ["serve", str(path), "--dry-run", "--skip-unservable"])
    assert skipped.exit_code == 0, skipped.output
    assert "would start 1 instances" in skipped.output


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000 + "]" * 100_000, "is not a plan's JSON"),  # nested past the recursion limit
    ('{"scenario": "core", "instances": [], "x": 1' + "0" * 5000 + "}", "is not a plan's JSON"),
    ("\xff\xfe not text", "is not JSON"),
])
def test_unreadable_json_is_a_plan_file_error(tmp_path, text, message):
    path = tmp_path / "plan.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(PlanFileError, match=message):
        read_plan(path)


def test_a_file_past_the_size_bound_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    import coral.plans.file as plan_file

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(valid_plan()))
    monkeypatch.setattr(plan_file, "MAX_PLAN_FILE_BYTES", 100)
    with pytest.raises(PlanFileError, match="more than a plan file's"):
        read_plan(path)


def test_infinity_outside_the_rows_fields_is_named(tmp_path):
    plan = valid_plan()
    plan["instances"][0]["nodes"] = {"1x-l40s": math.inf}
    plan["cost_per_hour"] = math.nan
    fields = {(p.row, p.field) for p in check_plan(plan, CATALOG).problems}
    assert fields == {(0, "nodes.1x-l40s"), (None, "cost_per_hour")}


# ------------------------------------------------------------- the contract, at random
_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a plan (keys and list indices)."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for j, v in enumerate(value):
            out += _paths(v, prefix + (j,))
    return out


@st.composite
def mutated_plans(draw) -> dict:
    """The valid plan (sometimes with a second, placement-form row) with up to three paths
    replaced by a small whole number or a random JSON value, or dropped."""
    plan = valid_plan()
    if draw(st.booleans()):
        row = copy.deepcopy(plan["instances"][0])
        del row["stages"]
        row["template_id"] = "old-form"
        row["placement"] = [{"node_type": "1x-l40s", "first_layer": 16, "layers": 16,
                             "batch": 8}, {"node_type": "1x-l40s", "first_layer": 0,
                                           "layers": 16, "batch": 8}]
        plan["instances"].append(row)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(plan)
        path = draw(st.sampled_from(paths))
        if not path:
            continue
        parent = plan
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            # small whole numbers move layer ranges and counts to values that parse
            parent[path[-1]] = draw(st.integers(-2, 64) | _json)
    return plan


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plan=mutated_plans())
def test_the_check_raises_nothing_and_what_it_passes_every_reader_reads(plan):
    check = check_plan(plan, CATALOG, "p.json")  # never raises
    if check.problems:
        with pytest.raises(PlanCheckError):
            check.raise_if_any()
        for p in check.problems:
            assert p.field and p.problem and p.fix and str(p)
        try:  # the runtime's reader refuses the plan or its bad rows, with a CoralError
            rows = read_instances(plan, CATALOG)
        except CoralError:
            return
        assert rows.refused or all(p.row is None for p in check.problems)
        return
    slos = PlanFile.from_payload(plan, CATALOG).slos or {}
    instances_from_plan(plan, slos)  # what `coral simulate` builds: no error
    if all(row["count"] == 0 for row in plan["instances"]):
        with pytest.raises(RuntimeDeploymentError, match="runs no instance"):
            read_instances(plan, CATALOG)
        return
    assert not read_instances(plan, CATALOG).refused


@settings(max_examples=100, deadline=None)
@given(value=_json)
def test_any_json_document_is_checked_without_an_exception(value):
    check = check_plan(value, CATALOG)
    if not isinstance(value, dict) or not isinstance(value.get("instances"), list):
        assert not check.ok
