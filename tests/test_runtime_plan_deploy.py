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
    RuntimeDeploymentError,
    approximate_specs,
    planned_instances,
    read_instances,
)
from coral.runtime.tiny import tiny_instance
from coral.runtime.skypilot import SKYPILOT_ACCELERATORS, group_file_name, write_skypilot
from coral.runtime.vllm import (
    KV_TRANSFER_CONFIG,
    PP_PARTITION_ENV,
    PROXY_SOURCE,
    VllmNotServableError,
    vllm_launch,
    vllm_plan,
    vllm_proxy,
)

CATALOG = default_catalog()


def _stage(node_type: str, first: int, layers: int, count: int = 1, tp: int = 1,
           batch: int = 8) -> dict:
    return {"node_type": node_type, "count": count, "first_layer": first, "layers": layers,
            "batch": batch, "tp_degree": tp}


def _node(node_type: str, first: int, layers: int, tp: int = 1, batch: int = 8) -> dict:
    """One node of the per-node `placement` form of plan files written before `stages`."""
    return {"node_type": node_type, "first_layer": first, "layers": layers, "batch": batch,
            "tp_degree": tp}


def _row(model: str, region: str, tid: str, count: int, stages: list[dict],
         capacity_rps: float = 2.0, mode: str = "aggregated") -> dict:
    nodes: dict[str, int] = {}
    for st in stages:
        nodes[st["node_type"]] = nodes.get(st["node_type"], 0) + st["count"]
    return {"region": region, "template_id": tid, "model": model, "mode": mode,
            "count": count, "nodes": nodes, "stages": stages, "capacity": capacity_rps,
            "unit": "req/s", "capacity_rps": capacity_rps, "usd_per_hour": 3.0,
            "usd_per_hour_total": 3.0 * count, "started": count}


def _placement_row(model: str, region: str, tid: str, count: int, placement: list[dict],
                   capacity_rps: float = 2.0) -> dict:
    row = _row(model, region, tid, count, [], capacity_rps)
    del row["stages"]
    row["placement"] = placement
    return row


def make_plan() -> dict:
    """A plan as `coral plan --out` writes it (`stages`), with one row in the older
    `placement` form (nodes in node order, not layer order) that must still be read."""
    return {"scenario": "core", "level": None, "instances": [
        # mixed node types, same GPU count: a chain vLLM can run (as a Job Group)
        _placement_row("llama-3.1-8b", "aws-us-east-1", "llama-3.1-8b|aggregated|1x-a10g+1x-t4",
                       3, [_node("1x-t4", 20, 12), _node("1x-a10g", 0, 20)]),
        # one node type, 8 GPUs a node: tensor parallel 8 x pipeline parallel 2
        _row("llama-3.3-70b", "azure-eastus", "llama-3.3-70b|aggregated|8x-a100-40gb*2", 1,
             [_stage("8x-a100-40gb", 0, 42, tp=8), _stage("8x-a100-40gb", 42, 38, tp=8)],
             11.8),
        # a data-parallel stage: two nodes on [20, 40)
        _row("qwen3-14b", "gcp-us-central1", "qwen3-14b|aggregated|1x-a100-40gb*3", 2,
             [_stage("1x-a100-40gb", 0, 20), _stage("1x-a100-40gb", 20, 20, count=2)]),
        # node types with different GPU counts
        _row("qwen3-32b", "gcp-us-central1", "qwen3-32b|aggregated|1x-h100-sxm+4x-a100-40gb",
             1, [_stage("1x-h100-sxm", 0, 29), _stage("4x-a100-40gb", 29, 35, tp=4)]),
    ]}


GCP = "gcp-us-central1"


def pd_rows() -> list[dict]:
    """Prefill/decode rows: llama-3.1-8b in gcp-us-central1 has prefill instances on L4s
    (one node, a two-node pipeline, and a one-stage data-parallel pair) and decode
    instances on A100s with another tensor-parallel size; qwen3-14b's only decode instance
    is a two-stage pipeline, which vLLM's NixlConnector cannot decode on, so its prefill
    instance has no partner."""
    t = "llama-3.1-8b|{}|{}"
    return [
        _row("llama-3.1-8b", GCP, t.format("prefill", "1x-l4"), 2,
             [_stage("1x-l4", 0, 32)], 4.0, "prefill"),
        _row("llama-3.1-8b", GCP, t.format("prefill", "1x-l4*2"), 1,
             [_stage("1x-l4", 0, 16), _stage("1x-l4", 16, 16)], 2.0, "prefill"),
        _row("llama-3.1-8b", GCP, t.format("prefill", "1x-l4*2dp"), 1,
             [_stage("1x-l4", 0, 32, count=2)], 8.0, "prefill"),
        _row("llama-3.1-8b", GCP, t.format("decode", "2x-a100-40gb"), 2,
             [_stage("2x-a100-40gb", 0, 32, tp=2, batch=64)], 8.0, "decode"),
        _row("llama-3.1-8b", GCP, t.format("decode", "1x-a100-80gb"), 1,
             [_stage("1x-a100-80gb", 0, 32, batch=64)], 8.0, "decode"),
        _row("qwen3-14b", GCP, "qwen3-14b|prefill|1x-a100-40gb", 1,
             [_stage("1x-a100-40gb", 0, 40)], 3.0, "prefill"),
        _row("qwen3-14b", GCP, "qwen3-14b|decode|1x-l4*2", 1,
             [_stage("1x-l4", 0, 20), _stage("1x-l4", 20, 20)], 3.0, "decode"),
    ]


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


def test_stages_and_placement_rows_read_alike(instances):
    """The older per-node `placement` form and `stages` give the same instance."""
    placed = instances["llama-3.1-8b"]
    staged = planned_instances({"instances": [_row(
        "llama-3.1-8b", "aws-us-east-1", "llama-3.1-8b|aggregated|1x-a10g+1x-t4", 3,
        [_stage("1x-a10g", 0, 20), _stage("1x-t4", 20, 12)])]})[0]
    assert staged == placed


def test_malformed_plans_are_named():
    plan = make_plan()
    del plan["instances"][1]["stages"][0]["first_layer"]
    with pytest.raises(RuntimeDeploymentError,
                       match=r"instances\[1\].*field 'stages\[0\]\.first_layer': missing"):
        planned_instances(plan)
    gap = make_plan()
    gap["instances"][0]["placement"][0]["first_layer"] = 21  # [0,20) then [21,33)
    with pytest.raises(RuntimeDeploymentError, match="do not form one pipeline"):
        planned_instances(gap)
    with pytest.raises(RuntimeDeploymentError, match="no 'instances'"):
        planned_instances({"scenario": "core"})


def test_bad_rows_are_refused_not_fatal():
    """`read_instances` refuses the rows the parser cannot read, keeps the others."""
    plan = make_plan()
    plan["instances"][1]["stages"][1]["first_layer"] = 40  # [0,42) then [40,78)
    plan["instances"].append({"region": "aws-us-east-1", "template_id": "junk", "count": 1})
    plan["instances"].append("not a row")
    rows = read_instances(plan)
    assert rows.total == 6 and len(rows.instances) == 3
    assert [r.instance for r in rows.refused] == [
        "azure-eastus/llama-3.3-70b|aggregated|8x-a100-40gb*2", "aws-us-east-1/junk",
        "instances[5]"]
    assert "do not form one pipeline" in rows.refused[0].reason
    assert "neither 'stages' nor the older 'placement'" in rows.refused[1].reason
    assert "field 'model': missing" in rows.refused[1].reason
    assert "field '(row)': must be an object" in rows.refused[2].reason
    with pytest.raises(RuntimeDeploymentError, match="runs no instance"):
        read_instances({"instances": []})


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
    from coral.runtime.batching_engine import BatchingEngine
    from coral.runtime.pipeline import LocalPipeline

    torch.set_num_threads(1)
    spec = approximate_specs([instances["llama-3.1-8b"]], CATALOG, hidden_size=32).specs[0]
    prompt = list(b"hello")

    def run(pipeline):
        return BatchingEngine(LocalPipeline(pipeline), max_seq_len=64).generate(prompt, 5)

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
        _row("llama-3.1-8b", "aws-us-east-1", "t", 1, [_stage("1x-l40s", 0, 32)])]})[0],
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


def test_approximate_deployment_refuses_what_torch_cannot_run():
    rows = read_instances({"instances": make_plan()["instances"] + pd_rows()})
    dep = approximate_specs(rows.instances, CATALOG, hidden_size=32)
    refused = {r.instance: r.reason for r in dep.refused}
    assert len(refused) == len(pd_rows()) and dep.servable == len(dep.specs) == 4
    assert all("torch engine serves aggregated instances only" in r for r in refused.values())
    assert not set(refused) & {s.name for s in dep.specs}


# ---------------------------------------------------------------- prefill/decode on vLLM
def flag(argv, name):
    return argv[argv.index(name) + 1]


@pytest.fixture()
def pd_instances():
    return {i.name: i for i in planned_instances({"instances": pd_rows()})}


def _pd(instances, mode, what, model="llama-3.1-8b"):
    return instances[f"{GCP}/{model}|{mode}|{what}"]


def test_vllm_prefill_and_decode_run_with_the_nixl_connector(pd_instances):
    prefill = vllm_launch(_pd(pd_instances, "prefill", "1x-l4"), CATALOG)
    decode = vllm_launch(_pd(pd_instances, "decode", "2x-a100-40gb"), CATALOG)
    assert (prefill.mode, decode.mode) == ("prefill", "decode")
    # prefill and decode differ in GPU type and tensor-parallel size
    assert (prefill.tensor_parallel, decode.tensor_parallel) == (1, 2)
    for launch in (prefill, decode):
        (cmd,) = launch.commands()
        argv = shlex.split(cmd)
        assert json.loads(flag(argv, "--kv-transfer-config")) == KV_TRANSFER_CONFIG == {
            "kv_connector": "NixlConnector", "kv_role": "kv_both"}
        assert launch.env == {"VLLM_NIXL_SIDE_CHANNEL_HOST": "$NODE_IP",
                              "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"}
        assert 'VLLM_NIXL_SIDE_CHANNEL_HOST="$NODE_IP"' in cmd  # left for the shell
        assert flag(argv, "--served-model-name") == "llama-3.1-8b"

    # a prefill pipeline keeps its explicit ranks and layer split
    chain = vllm_launch(_pd(pd_instances, "prefill", "1x-l4*2"), CATALOG)
    assert chain.env[PP_PARTITION_ENV] == "16,16"
    for rank, cmd in enumerate(chain.commands()):
        argv = shlex.split(cmd)
        assert flag(argv, "--node-rank") == str(rank) and "--kv-transfer-config" in argv
    # a one-stage data-parallel pair runs as two one-node instances
    pair = vllm_launch(_pd(pd_instances, "prefill", "1x-l4*2dp"), CATALOG)
    assert pair.replicas == 2 and pair.pipeline_parallel == 1 and len(pair.nodes) == 1
    # the NixlConnector decodes on one pipeline stage only
    with pytest.raises(VllmNotServableError, match="decode instance of 2 pipeline stages"):
        vllm_launch(_pd(pd_instances, "decode", "1x-l4*2", "qwen3-14b"), CATALOG)


def test_vllm_plan_pairs_prefill_and_decode_behind_a_proxy(pd_instances):
    plan = vllm_plan(list(pd_instances.values()), CATALOG)
    refused = {r.instance: r.reason for r in plan.refused}
    assert set(refused) == {f"{GCP}/qwen3-14b|decode|1x-l4*2",
                            f"{GCP}/qwen3-14b|prefill|1x-a100-40gb"}
    assert "no servable decode instance of qwen3-14b" in refused[
        f"{GCP}/qwen3-14b|prefill|1x-a100-40gb"]
    assert "qwen3-14b|decode|1x-l4*2 refused" in refused[f"{GCP}/qwen3-14b|prefill|1x-a100-40gb"]
    assert not set(refused) & {la.instance for la in plan.launches}  # no launch when refused
    (group,) = plan.groups
    assert (group.model, group.region) == ("llama-3.1-8b", GCP)
    assert len(group.prefill) == 3 and len(group.decode) == 2

    proxy = vllm_proxy(group, pd_instances)
    # every copy: 2 + 1 + 2 replicas of prefill, 2 + 1 of decode
    assert len(proxy.prefill) == 5 and len(proxy.decode) == 3
    argv = proxy.argv()
    assert argv[:2] == ["python", "toy_proxy_server.py"] and flag(argv, "--host") == "0.0.0.0"
    assert PROXY_SOURCE == "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"

    def listed(name, until):
        return argv[argv.index(name) + 1:argv.index(until) if until else None]

    p_hosts = listed("--prefiller-hosts", "--prefiller-ports")
    p_ports = listed("--prefiller-ports", "--decoder-hosts")
    d_hosts = listed("--decoder-hosts", "--decoder-ports")
    d_ports = listed("--decoder-ports", None)
    assert len(p_hosts) == len(p_ports) and len(d_hosts) == len(d_ports)
    # round robin in proportion to capacity: 1x-l4 copies 4 req/s, the pipeline 2, each
    # data-parallel replica 8 / 2 = 4; so the pipeline is listed once, the others twice
    weights = {(t.instance.split("|")[-1], t.copy): t.weight for t in proxy.prefill}
    assert weights == {("1x-l4", 0): 2, ("1x-l4", 1): 2, ("1x-l4*2", 0): 1,
                       ("1x-l4*2dp", 0): 2, ("1x-l4*2dp", 1): 2}
    assert len(p_hosts) == 9 and len(set(p_hosts)) == 5
    assert len(d_hosts) == 3 and set(d_ports) == {"8000"}


def test_skypilot_job_group_per_prefill_decode_pair(tmp_path, pd_instances):
    plan = vllm_plan(list(pd_instances.values()), CATALOG)
    files = write_skypilot(list(pd_instances.values()), plan.launches, CATALOG, tmp_path,
                           groups=plan.groups)
    (group_file,) = files
    (group,) = plan.groups
    assert group_file.job_group and group_file.path.name == f"{group_file_name(group)}.yaml"
    assert set(group_file.members) == {la.instance for la in plan.launches}
    text = group_file.path.read_text()
    assert "NixlConnector" in text and PROXY_SOURCE in text and "Stage order" in text
    header, proxy, *tasks = yaml.safe_load_all(text)
    name = header["name"]
    assert header["execution"] == "parallel" and header["primary_tasks"] == ["proxy"]
    assert proxy["resources"]["ports"] == 8000 and "accelerators" not in proxy["resources"]
    assert "toy_proxy_server.py" in proxy["setup"] and "$VLLM_VERSION" in proxy["setup"]
    # one task per copy (the prefill pipeline is one type: one two-node task)
    by_name = {t["name"]: t for t in tasks}
    assert len(tasks) == 2 + 1 + 2 + 2 + 1
    assert by_name["p1-0"]["num_nodes"] == 2 and "--node-rank 1" in by_name["p1-0"]["run"]
    assert by_name["d0-1"]["resources"]["accelerators"] == {"A100": 2}
    assert by_name["d1-0"]["resources"]["accelerators"] == {"A100-80GB": 1}
    for task in tasks:
        assert "nixl" in task["setup"] and "NODE_IP=$(hostname -I" in task["run"]
        assert "--kv-transfer-config" in task["run"] and "ports" not in task["resources"]
    # the proxy reaches every copy's head by its Job Group hostname
    argv = shlex.split(proxy["run"].splitlines()[-1])
    hosts = set(argv[argv.index("--prefiller-hosts") + 1:argv.index("--prefiller-ports")])
    hosts |= set(argv[argv.index("--decoder-hosts") + 1:argv.index("--decoder-ports")])
    assert hosts == {f"{t}-0.{name}" for t in by_name}
    script = (tmp_path / "launch.sh").read_text()
    assert script.count("sky jobs launch") == 1 and "sky launch " not in script


def test_tiny_instance_uses_two_node_types():
    from coral.runtime.config import ModelConfig

    inst = tiny_instance(ModelConfig(num_layers=30), 3)
    assert [(n.node_type, n.layers) for n in inst.nodes] == [
        ("cpu-large", 15), ("cpu-small", 7), ("cpu-small", 8)]
    assert tiny_instance(ModelConfig(num_layers=6), 3).num_layers == 6
    # the runtime pipeline keeps each stage's node type (its measured step times carry it)
    assert [st.node_type for st in inst.pipeline(ModelConfig(num_layers=30)).stages] == [
        "cpu-large", "cpu-small", "cpu-small"]
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


@pytest.fixture()
def mixed_plan_file(tmp_path):
    """make_plan's rows, the prefill/decode rows, and a row the parser refuses."""
    plan = make_plan()
    plan["instances"] += pd_rows()
    bad = _row("llama-3.1-8b", "aws-us-east-1", "llama-3.1-8b|aggregated|bad", 1,
               [_stage("1x-l4", 0, 20), _stage("1x-l4", 21, 11)])
    plan["instances"].append(bad)
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(plan))
    return path


BAD = "aws-us-east-1/llama-3.1-8b|aggregated|bad"
DATA_PARALLEL = "gcp-us-central1/qwen3-14b|aggregated|1x-a100-40gb*3"
GPU_MIX = "gcp-us-central1/qwen3-32b|aggregated|1x-h100-sxm+4x-a100-40gb"


def _json(result) -> dict:
    """The one JSON object on stdout (human text went to stderr)."""
    return json.loads(result.stdout)


def test_cli_json_dry_run_torch_local(mixed_plan_file):
    result = runner.invoke(app, ["serve", str(mixed_plan_file), "--dry-run", "--json",
                                 "--skip-unservable"])
    assert result.exit_code == 0, result.output
    out = _json(result)
    assert (out["engine"], out["provisioner"], out["dry_run"]) == ("torch", "local", True)
    refused = {r["instance"]: r["reason"] for r in out["refused"]}
    assert out["instances"] == 12 and out["servable"] == 4 and len(refused) == 8
    assert "do not form one pipeline" in refused[BAD]
    assert all("aggregated instances only" in refused[f"{GCP}/{r['template_id']}"]
               for r in pd_rows())
    names = [i["instance"] for i in out["servable_instances"]]
    assert len(names) == 4 and not set(names) & set(refused)
    assert out["workers"] == 9 and "approximate:" in result.stderr


def test_cli_json_dry_run_vllm_skypilot(tmp_path, mixed_plan_file):
    folder = tmp_path / "sky"
    result = runner.invoke(app, ["serve", str(mixed_plan_file), "--provisioner", "skypilot",
                                 "--dry-run", "--json", "--skip-unservable",
                                 "--out", str(folder)])
    assert result.exit_code == 0, result.output
    out = _json(result)
    assert (out["engine"], out["provisioner"]) == ("vllm", "skypilot")
    refused = {r["instance"]: r["reason"] for r in out["refused"]}
    assert set(refused) == {BAD, DATA_PARALLEL, GPU_MIX, f"{GCP}/qwen3-14b|decode|1x-l4*2",
                            f"{GCP}/qwen3-14b|prefill|1x-a100-40gb"}
    assert out["instances"] == 12 and out["servable"] == 7
    assert "data-parallel stage" in refused[DATA_PARALLEL]
    assert "one tensor-parallel size" in refused[GPU_MIX]
    launched = {i["instance"]: i for i in out["servable_instances"]}
    assert len(launched) == 7 and not set(launched) & set(refused)
    assert "--node-rank" in out["stage_order"]
    decode = launched[f"{GCP}/llama-3.1-8b|decode|2x-a100-40gb"]
    assert decode["mode"] == "decode" and decode["tensor_parallel"] == 2
    assert "--kv-transfer-config" in decode["nodes"][0]["command"]
    (proxy,) = out["proxies"]
    assert proxy["model"] == "llama-3.1-8b" and proxy["region"] == GCP
    assert proxy["command"].startswith("python toy_proxy_server.py")
    files = out["skypilot"]["files"]
    assert len(files) == 3 and sum(f["job_group"] for f in files) == 2
    members = {m for f in files for m in f["members"]}
    assert members == set(launched)  # a file for every launch, none for a refused row
    assert not folder.exists()  # a dry run writes nothing


def test_cli_refuses_a_plan_naming_every_refused_row(tmp_path, mixed_plan_file):
    folder = tmp_path / "sky"
    result = runner.invoke(app, ["serve", str(mixed_plan_file), "--provisioner", "skypilot",
                                 "--json", "--out", str(folder)])
    assert result.exit_code == 2 and not folder.exists()
    out = _json(result)
    assert "vLLM cannot run 5 of the plan's 12 instances" in out["error"]
    assert "--skip-unservable" in result.stderr
    for name in (BAD, DATA_PARALLEL, GPU_MIX):
        assert name in out["error"] and name in result.stderr
    torch = runner.invoke(app, ["serve", str(mixed_plan_file), "--dry-run"])
    assert torch.exit_code == 2
    assert "the torch engine cannot run 8 of the plan's 12 instances" in torch.stderr
    assert BAD in torch.stderr and f"{GCP}/qwen3-14b|decode|1x-l4*2" in torch.stderr


def test_cli_torch_leaves_out_prefill_decode_rows(tmp_path):
    """As the torch engine always has: its prefill/decode rows are listed as refused, and
    do not refuse the plan."""
    plan = make_plan()
    plan["instances"] += pd_rows()
    path = tmp_path / "pd.json"
    path.write_text(json.dumps(plan))
    result = runner.invoke(app, ["serve", str(path), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    out = _json(result)
    assert out["instances"] == 11 and out["servable"] == 4 and len(out["refused"]) == 7
    assert "left out" in result.stderr and "error" not in out


def test_cli_writes_the_servable_instances_only(tmp_path, mixed_plan_file):
    folder = tmp_path / "sky"
    result = runner.invoke(app, ["serve", str(mixed_plan_file), "--provisioner", "skypilot",
                                 "--skip-unservable", "--out", str(folder)])
    assert result.exit_code == 0, result.output
    assert "wrote 3 SkyPilot files" in result.stdout
    texts = "".join(f.read_text() for f in folder.glob("*.yaml"))
    assert "qwen3-14b" not in texts and "qwen3-32b" not in texts  # refused rows
    assert "toy_proxy_server.py" in texts and texts.count("--kv-transfer-config") >= 8


def test_cli_refuses_a_plan_with_nothing_servable(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"scenario": "core", "instances": [
        _row("qwen3-14b", GCP, "qwen3-14b|prefill|1x-a100-40gb", 1,
             [_stage("1x-a100-40gb", 0, 40)], 3.0, "prefill"),
        {"region": GCP, "template_id": "junk", "model": "qwen3-14b", "count": 1}]}))
    for args in ([], ["--engine", "vllm", "--provisioner", "skypilot"]):
        result = runner.invoke(app, ["serve", str(path), "--dry-run", "--skip-unservable",
                                     "--json", *args])
        assert result.exit_code == 2
        out = _json(result)
        assert out["servable"] == 0 and len(out["refused"]) == 2
        assert "can run none of the plan's 2 instances" in out["error"]
