"""`coral serve PLAN`: a plan's instances as local approximate workers, as `vllm serve` commands
and as SkyPilot YAML."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from typer.testing import CliRunner

from coral.catalog import default_catalog
from coral.cli.main import app
from coral.runtime.deployment import (
    DeploymentError,
    approximate_specs,
    planned_instances,
    tiny_instance,
)
from coral.runtime.skypilot import SKYPILOT_ACCELERATORS, write_skypilot
from coral.runtime.vllm import PP_PARTITION_ENV, VllmNotServableError, vllm_launch

CATALOG = default_catalog()


def _node(node_type: str, first: int, layers: int, tp: int = 1, batch: int = 8) -> dict:
    return {"node_type": node_type, "first_layer": first, "layers": layers, "batch": batch,
            "tp_degree": tp}


def _row(model: str, region: str, tid: str, count: int, placement: list[dict],
         capacity_rps: float = 2.0) -> dict:
    return {"region": region, "template_id": tid, "model": model, "mode": "aggregated",
            "count": count, "nodes": {}, "placement": placement, "capacity": capacity_rps,
            "unit": "req/s", "capacity_rps": capacity_rps, "usd_per_hour": 3.0,
            "usd_per_hour_total": 3.0 * count, "started": count}


def make_plan() -> dict:
    """A plan as `coral plan --out` writes it: placements in node order, not layer order."""
    return {"scenario": "core", "level": None, "instances": [
        # mixed node types, same GPU count: a chain vLLM can run (as a Job Group)
        _row("llama-3.1-8b", "aws-us-east-1", "llama-3.1-8b|aggregated|1x-a10g+1x-t4", 3,
             [_node("1x-t4", 20, 12), _node("1x-a10g", 0, 20)]),
        # one node type, 8 GPUs a node: tensor parallel 8 x pipeline parallel 2
        _row("llama-3.3-70b", "azure-eastus", "llama-3.3-70b|aggregated|8x-a100-40gb*2", 1,
             [_node("8x-a100-40gb", 0, 42, 8), _node("8x-a100-40gb", 42, 38, 8)], 11.8),
        # a data-parallel stage: two nodes on [20, 40)
        _row("qwen3-14b", "gcp-us-central1", "qwen3-14b|aggregated|1x-a100-40gb*3", 2,
             [_node("1x-a100-40gb", 0, 20), _node("1x-a100-40gb", 20, 20, batch=8),
              _node("1x-a100-40gb", 20, 20, batch=8)]),
        # node types with different GPU counts
        _row("qwen3-32b", "gcp-us-central1", "qwen3-32b|aggregated|1x-h100-sxm+4x-a100-40gb",
             1, [_node("1x-h100-sxm", 0, 29), _node("4x-a100-40gb", 29, 35, 4)]),
    ]}


@pytest.fixture()
def instances():
    return {i.model: i for i in planned_instances(make_plan())}


def test_plan_rows_become_instances_in_layer_order(instances):
    llama = instances["llama-3.1-8b"]
    assert [(n.node_type, n.first_layer, n.layers) for n in llama.nodes] == [
        ("1x-a10g", 0, 20), ("1x-t4", 20, 12)]
    assert llama.is_chain and llama.count == 3 and llama.num_layers == 32
    qwen = instances["qwen3-14b"]
    assert not qwen.is_chain
    assert [len(s) for s in qwen.stages()] == [1, 2]
    assert qwen.describe() == "1x-a100-40gb [0,20) -> 1x-a100-40gb+1x-a100-40gb [20,40)"


def test_malformed_plans_are_named():
    plan = make_plan()
    del plan["instances"][1]["placement"][0]["first_layer"]
    with pytest.raises(DeploymentError, match=r"instances\[1\].*is malformed"):
        planned_instances(plan)
    gap = make_plan()
    gap["instances"][0]["placement"][0]["first_layer"] = 21  # [0,20) then [21,33)
    with pytest.raises(DeploymentError, match="do not form one pipeline"):
        planned_instances(gap)
    with pytest.raises(DeploymentError, match="no 'instances'"):
        planned_instances({"scenario": "core"})


def test_approximate_instances_keep_depth_split_and_weights(instances):
    dep = approximate_specs(list(instances.values()), CATALOG, hidden_size=32)
    by_name = {s.name: s for s in dep.specs}
    spec = by_name["aws-us-east-1/llama-3.1-8b|aggregated|1x-a10g+1x-t4"]
    model = spec.pipeline.model
    arch = CATALOG.models["llama-3.1-8b"]
    assert model.num_layers == arch.num_layers and model.vocab_size == arch.vocab_size
    assert model.hidden_size == 32 and model.weights is None
    assert [(s.first_layer, s.end_layer) for s in spec.pipeline.stages] == [(0, 20), (20, 32)]
    assert spec.weight == pytest.approx(2.0 * 3)  # capacity x the plan's count
    qwen = by_name["gcp-us-central1/qwen3-14b|aggregated|1x-a100-40gb*3"]
    assert qwen.pipeline.stages[1].node_weights == (8.0, 8.0)  # identical nodes share evenly
    approx = [n for n in dep.notes if n.startswith("approximate:")]
    assert len(approx) == 4 and "width 32 instead of 4096" in " ".join(approx)
    assert "random weights" in approx[0]

    capped = approximate_specs(list(instances.values()), CATALOG, max_instances=2)
    assert len(capped.specs) == 2 and any("--max-instances 2" in n for n in capped.notes)


def test_an_approximate_instance_serves_exactly_as_split(instances):
    """The stand-in runs: split over the plan's stages it matches its own unsplit model."""
    torch = pytest.importorskip("torch")
    from coral.runtime.config import PipelineSpec
    from coral.runtime.engine import Engine
    from coral.runtime.pipeline import LocalPipeline

    torch.set_num_threads(1)
    spec = approximate_specs([instances["llama-3.1-8b"]], CATALOG, hidden_size=32).specs[0]
    prompt = list(b"hello")

    def run(pipeline):
        return Engine(LocalPipeline(pipeline), max_seq_len=64).generate(prompt, 5)

    assert run(spec.pipeline) == run(PipelineSpec.even(spec.pipeline.model, 1))


def test_vllm_commands_of_a_multi_node_chain(instances):
    launch = vllm_launch(instances["llama-3.3-70b"], CATALOG)
    assert launch.model == "meta-llama/Llama-3.3-70B-Instruct"
    assert (launch.tensor_parallel, launch.pipeline_parallel) == (8, 2)
    assert launch.env == {PP_PARTITION_ENV: "42,38"}
    assert sum(launch.partition) == CATALOG.models["llama-3.3-70b"].num_layers
    head, worker = (shlex.split(c) for c in launch.commands())
    assert head[:4] == ["VLLM_PP_LAYER_PARTITION=42,38", "vllm", "serve",
                        "meta-llama/Llama-3.3-70B-Instruct"]

    def flag(argv, name):
        return argv[argv.index(name) + 1]

    for rank, argv in enumerate((head, worker)):
        assert flag(argv, "--tensor-parallel-size") == "8"
        assert flag(argv, "--pipeline-parallel-size") == "2"
        assert flag(argv, "--nnodes") == "2" and flag(argv, "--node-rank") == str(rank)
        assert flag(argv, "--master-addr") == "$HEAD_IP"
        assert flag(argv, "--served-model-name") == "llama-3.3-70b"
    assert "--headless" not in head and "--headless" in worker
    assert '--master-addr "$HEAD_IP"' in launch.commands()[0]  # left for the shell to expand

    single = vllm_launch(planned_instances({"instances": [
        _row("llama-3.1-8b", "aws-us-east-1", "t", 1, [_node("1x-l40s", 0, 32)])]})[0],
        CATALOG)
    (cmd,) = single.commands()
    assert single.env == {} and "--nnodes" not in cmd and "--pipeline-parallel-size 1" in cmd


def test_vllm_refuses_what_it_cannot_run(instances):
    with pytest.raises(VllmNotServableError, match="data-parallel stage.*cannot run it"):
        vllm_launch(instances["qwen3-14b"], CATALOG)
    with pytest.raises(VllmNotServableError,
                       match=r"1x-h100-sxm \(1 GPU\), 4x-a100-40gb \(4 GPUs\).*one "
                             "tensor-parallel size"):
        vllm_launch(instances["qwen3-32b"], CATALOG)


def test_skypilot_yaml_per_instance(tmp_path, instances):
    chains = [instances["llama-3.1-8b"], instances["llama-3.3-70b"]]
    launches = [vllm_launch(i, CATALOG) for i in chains]
    files = {f.instance: f for f in write_skypilot(chains, launches, CATALOG, tmp_path)}
    assert len({f.path for f in files.values()}) == 2

    # one node type: a plain multi-node task
    big = files["azure-eastus/llama-3.3-70b|aggregated|8x-a100-40gb*2"]
    (task,) = yaml.safe_load_all(big.path.read_text())
    assert not big.job_group and task["num_nodes"] == 2
    res = task["resources"]
    assert res["infra"] == "azure/eastus"
    assert res["accelerators"] == {SKYPILOT_ACCELERATORS["a100-40gb"]: 8}
    assert res["instance_type"] == "Standard_ND96asr_v4" and res["ports"] == 8000
    assert "vllm" in task["setup"]
    run = task["run"]
    assert 'HEAD_IP=$(echo "$SKYPILOT_NODE_IPS" | head -n1)' in run
    assert run.count("VLLM_PP_LAYER_PARTITION=42,38 vllm serve") == 2

    # two node types: a Job Group, one task per node type, head found by hostname
    mixed = files["aws-us-east-1/llama-3.1-8b|aggregated|1x-a10g+1x-t4"]
    header, first, second = yaml.safe_load_all(mixed.path.read_text())
    assert mixed.job_group and header["execution"] == "parallel"
    assert [d["resources"]["accelerators"] for d in (first, second)] == [{"A10G": 1},
                                                                          {"T4": 1}]
    assert first["resources"]["ports"] == 8000 and "ports" not in second["resources"]
    partition = [int(x) for x in
                 first["run"].split("VLLM_PP_LAYER_PARTITION=")[1].split()[0].split(",")]
    assert partition == [20, 12] and sum(partition) == CATALOG.models["llama-3.1-8b"].num_layers
    assert f"HEAD_IP={first['name']}-0.{header['name']}" in second["run"]
    assert "RANK=$(( 1 + SKYPILOT_NODE_RANK ))" in second["run"]
    assert "--node-rank 1" in second["run"] and "--headless" in second["run"]

    script = (tmp_path / "launch.sh").read_text().splitlines()
    assert sum("sky jobs launch" in s for s in script) == 3  # count 3 of the mixed one
    assert sum("sky launch" in s for s in script) == 1


def test_tiny_instance_uses_two_node_types():
    from coral.runtime.config import ModelConfig

    inst = tiny_instance(ModelConfig(num_layers=30), 3)
    assert [(n.node_type, n.layers) for n in inst.nodes] == [
        ("cpu-large", 15), ("cpu-small", 7), ("cpu-small", 8)]
    assert tiny_instance(ModelConfig(num_layers=6), 3).num_layers == 6
    launch = vllm_launch(inst, None, model="/models/x")
    assert launch.partition == (15, 7, 8) and launch.tensor_parallel == 1


# ---------------------------------------------------------------- the command line
runner = CliRunner()


@pytest.fixture()
def plan_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(make_plan()))
    return path


def test_cli_writes_skypilot_files(tmp_path, plan_file):
    out = tmp_path / "sky"
    result = runner.invoke(app, ["serve", str(plan_file), "--provisioner", "skypilot",
                                 "--skip-unservable", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 2 SkyPilot files" in result.output
    assert "left out" in result.output and "data-parallel stage" in result.output
    assert len(list(out.glob("*.yaml"))) == 2 and (out / "launch.sh").is_file()

    refused = runner.invoke(app, ["serve", str(plan_file), "--engine", "vllm",
                                  "--provisioner", "skypilot", "--out", str(out)])
    assert refused.exit_code == 2
    assert "vLLM cannot run 2 of the plan's 4 instances" in refused.output
    assert "--skip-unservable" in refused.output


def test_cli_dry_run_reports_the_approximation(plan_file):
    result = runner.invoke(app, ["serve", str(plan_file), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "approximate: llama-3.3-70b runs its real 80 layers" in result.output
    assert "would start 4 instances, 9 workers" in result.output


@pytest.mark.parametrize("args, message", [
    (["--engine", "torch", "--provisioner", "skypilot"], "torch engine's workers run on this"),
    (["--engine", "vllm"], "needs their GPU nodes"),
])
def test_cli_refuses_combinations_it_cannot_run(plan_file, args, message):
    result = runner.invoke(app, ["serve", str(plan_file), *args])
    assert result.exit_code == 2 and message in result.output


def test_cli_needs_something_to_serve(tmp_path):
    result = runner.invoke(app, ["serve"])
    assert result.exit_code == 2 and "pass --tiny" in result.output
    missing = runner.invoke(app, ["serve", str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
