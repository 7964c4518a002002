"""`--engine vllm`: plans and libraries.

vLLM runs one node per pipeline stage, one GPU count over a pipeline and one batch on every
node (`coral.templates.space.engines`). On a small scenario (one model, four node types of
1, 2 and 4 GPUs, one region, n_max 3, every serving mode; its libraries build in about a second
per engine) every instance of a vllm plan must be such a chain and cost no less than Coral's
plan. (The search a vLLM template comes from is checked against brute force over the step
model in `tests/test_placement_step.py`.)
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coral.planning.libraries import library_dir, templates_for_scenario
from coral.planning.options import PlanOptions
from coral.planning.plan import plan_scenario
from coral.allocator.scenario.load import load_scenario
from coral.catalog import default_catalog
from coral.cli.main import app
from coral.perf.pipeline import PipelineShape
from coral.templates.builder.build import build_library
from coral.templates.builder.build_options import BuildOptions
from coral.templates.builder.solve import build_template
from coral.templates.space.engines import engine_violations
from coral.templates.builder.parallel import default_perf_factory
from coral.templates.slo import SloSpec
from coral.templates.builder.store import LibraryInputs
from coral.templates.types import SolveStatus

runner = CliRunner(env={"COLUMNS": "220"})

SCENARIO = """\
schema_version: 1
name: tiny-engine
mode: auto
n_max: 3
rho: 12
startup_s: 300
node_types: [1x-l4, 2x-l4, 4x-l4, 1x-a100-40gb]
models:
  - {name: qwen3-14b, demand_rps: 20, input_tokens: 1024, output_tokens: 256, tpot_s: 0.10,
     ttft_s: 2.0}
regions:
  - {name: gcp-us-central1}
base_availability: {1x-l4: 12, 2x-l4: 6, 4x-l4: 4, 1x-a100-40gb: 2}
availability: abundant
levels:
  abundant: {scale: 1.0}
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("engine")
    path = folder / "tiny-engine.yaml"
    path.write_text(SCENARIO)
    catalog = default_catalog()
    perf = default_perf_factory(catalog)
    scenario = load_scenario(path, catalog=catalog)
    root = folder / "templates"
    plans = {}
    templates = {}
    for engine in ("coral", "vllm"):
        options = PlanOptions(build=BuildOptions(engine=engine))
        templates[engine] = templates_for_scenario(scenario, catalog, perf, out_root=root,
                                                   options=options.build)
        plans[engine] = plan_scenario(scenario, catalog=catalog, options=options, perf=perf,
                                      templates=templates[engine], baselines=False)
    return types.SimpleNamespace(folder=folder, path=path, catalog=catalog, perf=perf,
                                 scenario=scenario, root=root, plans=plans, templates=templates)


def _check_vllm_rows(rows: list[dict], catalog) -> None:
    assert rows, "the plan has no instances"
    for row in rows:
        shape = PipelineShape.from_row(row)
        assert shape.is_chain, f"{row['template_id']}: a stage has several nodes"
        gpus = {catalog.node_type(s.node_type).gpu_count for s in shape.stages}
        assert len(gpus) == 1, f"{row['template_id']}: GPU counts {gpus}"
        assert len({s.batch for s in shape.stages}) == 1, f"{row['template_id']}: batches"
        assert all(s["count"] == 1 for s in row["stages"])
        assert len({s["batch"] for s in row["stages"]}) == 1


# ---------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------


def test_vllm_plan_instances_are_vllm_chains(setup):
    result = setup.plans["vllm"]
    assert result.plan.meets_demand
    payload = result.to_dict()
    assert payload["engine"] == "vllm"
    _check_vllm_rows(payload["instances"], setup.catalog)
    # the plan uses pipelines (and PD halves), so the rule is exercised beyond single nodes
    assert any(len(r["stages"]) > 1 for r in payload["instances"])


def test_vllm_templates_obey_the_engine(setup):
    tpls = [t for ts in setup.templates["vllm"].values() for t in ts]
    assert tpls
    for t in tpls:
        assert t.topology == "chain"
        assert engine_violations("vllm", t, setup.catalog) == [], t.combo
    # Coral's own library holds shapes vLLM cannot run (else the comparison says nothing)
    coral = [t for ts in setup.templates["coral"].values() for t in ts if t.is_pipeline]
    assert any(engine_violations("vllm", t, setup.catalog) for t in coral)


def test_coral_templates_rate_no_less_than_vllms(setup):
    """Coral's search space holds every vLLM pipeline: on each combination of a vLLM
    template, Coral's template is at least as fast."""
    from coral.templates.builder.solve import build_template

    for tpls in setup.templates["vllm"].values():
        for t in tpls:
            if not t.feasible:
                continue
            mine = build_template(t.model, t.combo, t.slo, t.mode, "flow", setup.perf,
                                  setup.catalog, floor=0.0)
            assert mine.throughput >= t.throughput * (1 - 1e-9), t.combo


def test_vllm_costs_about_no_less_than_coral(setup):
    """The allocator plans a template at its *planned* capacity (its rate times the load at
    which queueing still leaves TTFT within the SLO), which is not monotone in the rate: a
    vLLM template a little slower but with a shorter TTFT can plan more on the same nodes.
    So vLLM's plan may undercut Coral's, by little."""
    coral, vllm = setup.plans["coral"], setup.plans["vllm"]
    assert coral.plan.meets_demand and vllm.plan.meets_demand
    assert coral.engine == "coral" and coral.to_dict()["engine"] == "coral"
    tol = coral.cost_per_hour * (coral.gap + vllm.gap + 5e-3)
    assert vllm.cost_per_hour >= coral.cost_per_hour - tol


def test_engine_is_part_of_the_library_key(setup):
    coral_dir = library_dir(setup.root, setup.scenario, "qwen3-14b", "aggregated", 3)
    vllm_dir = library_dir(setup.root, setup.scenario, "qwen3-14b", "aggregated", 3, "vllm")
    assert coral_dir != vllm_dir and "-vllm-" in vllm_dir.name
    assert (coral_dir / "manifest.json").exists() and (vllm_dir / "manifest.json").exists()
    inputs = json.loads((vllm_dir / "manifest.json").read_text())["inputs"]
    assert inputs["engine"] == "vllm" and inputs["topology"] == "chain"
    assert "engine" not in json.loads((coral_dir / "manifest.json").read_text())["inputs"]
    # reading back the other engine's templates for a plan is refused
    with pytest.raises(ValueError, match="engine"):
        plan_scenario(setup.scenario, catalog=setup.catalog, perf=setup.perf,
                      templates=setup.templates["coral"], baselines=False,
                      options=PlanOptions(build=BuildOptions(engine="vllm")))


def test_plan_cli_engine(setup):
    args = ["plan", str(setup.path), "--templates-dir", str(setup.root), "--workers", "1",
            "--no-baselines", "--time-limit", "5"]
    res = runner.invoke(app, args + ["--engine", "vllm", "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["engine"] == "vllm"
    _check_vllm_rows(payload["instances"], setup.catalog)
    res = runner.invoke(app, args + ["--engine", "vllm"])
    assert res.exit_code == 0, res.output
    assert "on engine vllm" in res.stdout
    bad = runner.invoke(app, args + ["--engine", "trt"])
    assert bad.exit_code == 2
    assert "coral" in bad.output and "vllm" in bad.output


def test_templates_build_cli_engine(tmp_path: Path):
    out = tmp_path / "lib"
    res = runner.invoke(app, ["templates", "build", "--model", "llama-3.1-8b", "--engine",
                              "vllm", "--nmax", "2", "--nodes", "1x-l4,2x-l4,1x-a10g",
                              "--workers", "1", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["combos_pruned_engine"] > 0  # 1x-l4 + 2x-l4 and the like
    assert Path(summary["path"]) == out / "llama-3.1-8b" / "aggregated-vllm"
    bad = runner.invoke(app, ["templates", "build", "--model", "llama-3.1-8b", "--engine",
                              "vllm", "--topology", "flow", "--out", str(out)])
    assert bad.exit_code == 2 and "chain" in bad.output


# ---------------------------------------------------------------------------------------------
# Libraries and operating points
# ---------------------------------------------------------------------------------------------


def test_vllm_library_keeps_only_deployable_combinations():
    catalog = default_catalog()
    perf = default_perf_factory(catalog)
    slo = SloSpec(tpot_s=0.1, ttft_s=2.0, input_tokens=1024, output_tokens=256)
    kept, report = build_library("llama-3.1-8b", catalog, slo=slo, nmax=3,
                                 node_types=["1x-l4", "2x-l4", "1x-a10g"],
                                 options=BuildOptions(engine="vllm"), perf=perf)
    assert report.enumeration["pruned_engine"] > 0
    assert kept
    for t in kept:
        assert t.topology == "chain" and not engine_violations("vllm", t, catalog)
    mixed = build_template("llama-3.1-8b", ["1x-l4", "2x-l4"], slo, "aggregated", "chain",
                           perf, catalog, engine="vllm")
    assert mixed.status is SolveStatus.INFEASIBLE and "GPU counts" in mixed.notes[0]
    with pytest.raises(ValueError, match="chain"):
        build_template("llama-3.1-8b", ["1x-l4"], slo, "aggregated", "flow", perf, catalog,
                       engine="vllm")


def test_library_digest_names_only_a_restricted_engine():
    catalog = default_catalog()
    slo = SloSpec(tpot_s=0.1, ttft_s=2.0, input_tokens=1024, output_tokens=256)
    common = dict(catalog=catalog, model="llama-3.1-8b", slo=slo, mode="aggregated",
                  topology="chain", nmax=2, rho=12.0, node_types=None, regions=None,
                  batches=(1, 2))
    coral = LibraryInputs.create(**common)
    vllm = LibraryInputs.create(**common, engine="vllm")
    assert "engine" not in coral.as_dict()
    assert vllm.as_dict()["engine"] == "vllm" and vllm.digest() != coral.digest()
