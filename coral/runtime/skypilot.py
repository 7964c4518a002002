"""The `skypilot` provisioner: one SkyPilot YAML per planned instance, running vLLM.

For each plan row (a template in a region, `count` copies) this writes `NAME.yaml`:

- every node of one type: a task with `num_nodes` = the instance's nodes and `resources`
  (`infra: cloud/region`, `accelerators: {GPU: count}` of the node type, the catalog's
  `instance_type` on that cloud when it has one, the API port on the head). Its `run`
  picks the node's command by `$SKYPILOT_NODE_RANK` (node rank = pipeline stage; SkyPilot
  numbers the nodes, the head first, and lists their IPs in `$SKYPILOT_NODE_IPS`).
- several node types: a SkyPilot Job Group (a multi-document YAML: a header with
  `execution: parallel`, then one task per run of consecutive nodes of one type, in stage
  order). Tasks find the head by its Job Group hostname `TASK-0.GROUP`. Job Groups are
  SkyPilot's (experimental) way of running tasks with different resources together;
  launch them with `sky jobs launch`.

`launch.sh` launches each file `count` times. Nothing here calls SkyPilot: the files are
plain YAML, checked by the tests, and SkyPilot is only needed to launch them.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import yaml

from coral.runtime.deployment import DeploymentError, PlannedInstance
from coral.runtime.vllm import VllmLaunch

#: SkyPilot's accelerator name of each catalog GPU type (`sky show-gpus`). The node type's
#: `instance_type` is pinned as well where the catalog knows it, which settles variants
#: (e.g. H100 NVL on Azure) that share one accelerator name.
SKYPILOT_ACCELERATORS: dict[str, str] = {
    "h100-sxm": "H100", "h100-pcie": "H100", "h100-nvl": "H100", "a100-80gb": "A100-80GB",
    "a100-40gb": "A100", "a40": "A40", "l40s": "L40S", "a10g": "A10G", "l4": "L4",
    "v100": "V100", "t4": "T4",
}
#: Installed on every node before the run (pin a version here to make launches repeatable).
SETUP = "pip install vllm"
#: Disk of every node, GB: room for the model's weights downloaded from Hugging Face.
DEFAULT_DISK_GB = 256


@dataclass(frozen=True)
class SkyPilotFile:
    instance: str
    path: Path
    count: int
    job_group: bool  # launched with `sky jobs launch` rather than `sky launch`


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (the run scripts)."""


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def safe_name(text: str, limit: int = 40) -> str:
    """A cluster/task name SkyPilot accepts: lower-case letters, digits and dashes."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return re.sub(r"-{2,}", "-", name)[:limit].strip("-") or "coral"


def instance_file_name(instance: PlannedInstance) -> str:
    """`MODEL-REGION-HASH`: short enough for a cluster name and a DNS label, unique per plan
    row (the hash is of the row's region/template id)."""
    digest = hashlib.sha1(instance.name.encode()).hexdigest()[:6]
    return f"{safe_name(f'{instance.model}-{instance.region}')}-{digest}"


def _resources(node_type: str, region: str, catalog, port: int | None) -> dict:
    nt = catalog.node_types.get(node_type)
    if nt is None:
        raise DeploymentError(f"node type '{node_type}' is not in the catalog; SkyPilot "
                              "needs its GPUs; to fix: pass the catalog the plan was made "
                              "with (--catalog FILE)")
    reg = catalog.regions.get(region)
    if reg is None:
        raise DeploymentError(f"region '{region}' is not in the catalog")
    accel = SKYPILOT_ACCELERATORS.get(nt.gpu)
    if accel is None:
        raise DeploymentError(f"GPU type '{nt.gpu}' has no SkyPilot accelerator name; add it "
                              "to coral.runtime.skypilot.SKYPILOT_ACCELERATORS")
    cloud_region = region.removeprefix(f"{reg.cloud}-")
    res: dict = {"infra": f"{reg.cloud}/{cloud_region}", "accelerators": {accel: nt.gpu_count}}
    instance_type = nt.instances.get(reg.cloud)
    if instance_type:
        res["instance_type"] = instance_type
    res["disk_size"] = DEFAULT_DISK_GB
    if port is not None:
        res["ports"] = port
    return res


def _run_script(launch: VllmLaunch, ranks: Sequence[int], head: str, base_rank: int) -> str:
    """Shell run by every node of a task: find the head, run this node's command."""
    lines = ["set -euo pipefail", f"HEAD_IP={head}",
             f"RANK=$(( {base_rank} + SKYPILOT_NODE_RANK ))" if base_rank
             else "RANK=$SKYPILOT_NODE_RANK", 'case "$RANK" in']
    for node in launch.nodes:
        if node.rank in ranks:
            lines.append(f"  {node.rank})  # {node.node_type}, layers "
                         f"[{node.first_layer}, {node.end_layer})")
            lines.append(f"    {node.shell(launch.env)} ;;")
    lines += ['  *) echo "unexpected node rank $RANK" >&2; exit 1 ;;', "esac"]
    return "\n".join(lines) + "\n"


def task_documents(instance: PlannedInstance, launch: VllmLaunch, catalog
                   ) -> tuple[list[dict], bool]:
    """The YAML documents of one instance and whether they form a Job Group."""
    name = instance_file_name(instance)
    groups: list[tuple[str, list[int]]] = []  # runs of consecutive nodes of one type
    for node in launch.nodes:
        if groups and groups[-1][0] == node.node_type:
            groups[-1][1].append(node.rank)
        else:
            groups.append((node.node_type, [node.rank]))
    secrets = {"HF_TOKEN": None}  # gated models: sky launch --secret HF_TOKEN
    if len(groups) == 1:
        node_type, ranks = groups[0]
        doc = {"name": name, "num_nodes": len(ranks),
               "resources": _resources(node_type, instance.region, catalog, launch.port),
               "secrets": secrets, "setup": SETUP + "\n",
               "run": _run_script(launch, ranks,
                                  '$(echo "$SKYPILOT_NODE_IPS" | head -n1)', 0)}
        return [doc], False
    tasks = [safe_name(f"stages-{r[0]}-{r[-1]}") for _t, r in groups]
    head = f"{tasks[0]}-0.{name}"
    docs: list[dict] = [{"name": name, "execution": "parallel", "primary_tasks": [tasks[0]]}]
    for task, (node_type, ranks) in zip(tasks, groups):
        docs.append({
            "name": task, "num_nodes": len(ranks),
            "resources": _resources(node_type, instance.region, catalog,
                                    launch.port if ranks[0] == 0 else None),
            "secrets": secrets, "setup": SETUP + "\n",
            "run": _run_script(launch, ranks, head, ranks[0])})
    return docs, True


def write_skypilot(instances: Sequence[PlannedInstance], launches: Sequence[VllmLaunch],
                   catalog, out_dir: str | Path) -> list[SkyPilotFile]:
    """Write one YAML per instance, and `launch.sh`, into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_name = {i.name: i for i in instances}
    files = []
    script = ["#!/usr/bin/env bash", "# Launch every planned instance (count copies of each).",
              "set -euo pipefail", 'cd "$(dirname "$0")"']
    for launch in launches:
        inst = by_name[launch.instance]
        docs, group = task_documents(inst, launch, catalog)
        path = out / f"{docs[0]['name']}.yaml"
        header = (f"# {inst.model} in {inst.region}: {inst.describe()}\n"
                  f"# vLLM: tensor parallel {launch.tensor_parallel}, pipeline parallel "
                  f"{launch.pipeline_parallel}, layers {list(launch.partition)}; the plan runs "
                  f"{inst.count} of these.\n")
        path.write_text(header + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False,
                                               explicit_start=group))
        files.append(SkyPilotFile(inst.name, path, inst.count, group))
        for k in range(inst.count):
            cluster = shlex.quote(f"{docs[0]['name']}-{k}")
            script.append(f"sky jobs launch -y -n {cluster} {shlex.quote(path.name)}" if group
                          else f"sky launch -y -d -c {cluster} {shlex.quote(path.name)}")
    launch_sh = out / "launch.sh"
    launch_sh.write_text("\n".join(script) + "\n")
    launch_sh.chmod(0o755)
    return files
