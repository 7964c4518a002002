"""The `skypilot` provisioner: SkyPilot YAML for a plan's instances, running vLLM.

For each aggregated plan row (a template in a region, `count` copies) this writes `NAME.yaml`:

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

Every node starts vLLM with its explicit `--node-rank`, and each task's `run` maps SkyPilot's
node numbering onto those ranks, so pipeline stage R always runs on the node type the plan
chose for it, whatever order the nodes come up in.

The prefill and decode instances of one model in one region (a `PdGroup`) go into one Job
Group, `MODEL-REGION-pd-HASH.yaml`: a CPU task running the prefill/decode proxy (the primary
task, with the public port), and for every copy of every prefill and decode row its tasks as
above. Everything in a Job Group reaches everything else by hostname, which is how the proxy
knows each copy's head, and how the decode instances reach the prefill instances' NIXL side
channel (each node advertises its own address, `NODE_IP`).

`launch.sh` launches each aggregated file `count` times and each prefill/decode group once.
Nothing here calls SkyPilot: the files are plain YAML, checked by the tests, and SkyPilot is
only needed to launch them.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from coral.runtime.deployment import PD_MODES, RuntimeDeploymentError, DeployableInstance
from coral.runtime.vllm import (
    NODE_IP,
    PROXY_SCRIPT,
    PROXY_SOURCE,
    PdGroup,
    VllmLaunch,
    VllmProxy,
    vllm_proxy,
)

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
#: Prefill and decode nodes also need the NIXL library, which vLLM does not depend on.
PD_SETUP = "pip install vllm nixl"
#: The proxy's node fetches the proxy from vLLM's repository at the version `pip` installed,
#: so that it speaks the same KV-transfer protocol as the instances (same pip, same version).
PROXY_SETUP = (
    "pip install vllm\n"
    "VLLM_VERSION=$(python -c \"import importlib.metadata as m; print(m.version('vllm'))\")\n"
    f"curl -fsSL -o {PROXY_SCRIPT} "
    f"https://raw.githubusercontent.com/vllm-project/vllm/v$VLLM_VERSION/{PROXY_SOURCE}\n")
#: The proxy needs no GPU: a few cores for HTTP.
PROXY_CPUS = "4+"
#: Disk of every node, GB: room for the model's weights downloaded from Hugging Face.
DEFAULT_DISK_GB = 256
#: How a node finds the address it advertises to other instances (NIXL side channel).
NODE_IP_SCRIPT = "NODE_IP=$(hostname -I | awk '{print $1}')"
STAGE_ORDER_NOTE = ("each node starts vLLM with an explicit --node-rank: rank R runs pipeline "
                    "stage R on the node type the plan chose, whatever order the nodes start in")


@dataclass(frozen=True)
class SkyPilotFile:
    instance: str
    """The plan row, or for a prefill/decode group the group's name."""
    path: Path
    count: int
    """How many times `launch.sh` launches it."""
    job_group: bool  # launched with `sky jobs launch` rather than `sky launch`
    members: tuple[str, ...] = ()
    """A prefill/decode group's plan rows."""


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


def instance_file_name(instance: DeployableInstance) -> str:
    """`MODEL-REGION-HASH`: short enough for a cluster name and a DNS label, unique per plan
    row (the hash is of the row's region/template id)."""
    digest = hashlib.sha1(instance.name.encode()).hexdigest()[:6]
    return f"{safe_name(f'{instance.model}-{instance.region}')}-{digest}"


def group_file_name(group: PdGroup) -> str:
    """`MODEL-REGION-pd-HASH` for a prefill/decode group (also the Job Group's name)."""
    digest = hashlib.sha1(group.name.encode()).hexdigest()[:6]
    return f"{safe_name(f'{group.model}-{group.region}', 37)}-pd-{digest}"


def _resources(node_type: str, region: str, catalog, port: int | None) -> dict:
    nt = catalog.node_types.get(node_type)
    if nt is None:
        raise RuntimeDeploymentError(f"node type '{node_type}' is not in the catalog; SkyPilot "
                              "needs its GPUs; to fix: pass the catalog the plan was made "
                              "with (--catalog FILE)")
    reg = _region(region, catalog)
    accel = SKYPILOT_ACCELERATORS.get(nt.gpu)
    if accel is None:
        raise RuntimeDeploymentError(f"GPU type '{nt.gpu}' has no SkyPilot accelerator name; add it "
                              "to coral.runtime.skypilot.SKYPILOT_ACCELERATORS")
    res: dict = {"infra": _infra(region, reg), "accelerators": {accel: nt.gpu_count}}
    instance_type = nt.instances.get(reg.cloud)
    if instance_type:
        res["instance_type"] = instance_type
    res["disk_size"] = DEFAULT_DISK_GB
    if port is not None:
        res["ports"] = port
    return res


def _region(region: str, catalog):
    reg = catalog.regions.get(region)
    if reg is None:
        raise RuntimeDeploymentError(f"region '{region}' is not in the catalog")
    return reg


def _infra(region: str, reg) -> str:
    return f"{reg.cloud}/{region.removeprefix(f'{reg.cloud}-')}"


def check_resources(instance: DeployableInstance, launch: VllmLaunch, catalog) -> None:
    """Raise `RuntimeDeploymentError` when SkyPilot could not place an instance's nodes (a node
    type, GPU or region it has no name for)."""
    for node in launch.nodes:
        _resources(node.node_type, instance.region, catalog, None)


def _run_script(launch: VllmLaunch, ranks: Sequence[int], head: str, base_rank: int) -> str:
    """Shell run by every node of a task: find the head, run this node's command."""
    lines = ["set -euo pipefail", f"HEAD_IP={head}"]
    if NODE_IP in launch.env.values():
        lines.append(NODE_IP_SCRIPT)
    lines += [f"RANK=$(( {base_rank} + SKYPILOT_NODE_RANK ))" if base_rank
              else "RANK=$SKYPILOT_NODE_RANK",
              "# explicit node ranks: rank R runs pipeline stage R on the node type below",
              'case "$RANK" in']
    for node in launch.nodes:
        if node.rank in ranks:
            lines.append(f"  {node.rank})  # {node.node_type}, layers "
                         f"[{node.first_layer}, {node.end_layer})")
            lines.append(f"    {node.shell(launch.env)} ;;")
    lines += ['  *) echo "unexpected node rank $RANK" >&2; exit 1 ;;', "esac"]
    return "\n".join(lines) + "\n"


def _runs(launch: VllmLaunch) -> list[tuple[str, list[int]]]:
    """Runs of consecutive nodes of one type, in stage order: (node type, ranks)."""
    groups: list[tuple[str, list[int]]] = []
    for node in launch.nodes:
        if groups and groups[-1][0] == node.node_type:
            groups[-1][1].append(node.rank)
        else:
            groups.append((node.node_type, [node.rank]))
    return groups


def _tasks(instance: DeployableInstance, launch: VllmLaunch, catalog, *, group: str,
           names: Sequence[str], setup: str, port: int | None) -> list[dict]:
    """The tasks of one instance (one per run of a node type) inside Job Group `group`;
    `port` is opened on the head's task."""
    runs = _runs(launch)
    secrets = {"HF_TOKEN": None}  # gated models: sky launch --secret HF_TOKEN
    head = (f"{names[0]}-0.{group}" if len(runs) > 1
            else '$(echo "$SKYPILOT_NODE_IPS" | head -n1)')
    return [{"name": task, "num_nodes": len(ranks),
             "resources": _resources(node_type, instance.region, catalog,
                                     port if ranks[0] == 0 else None),
             "secrets": secrets, "setup": setup + "\n",
             "run": _run_script(launch, ranks, head, ranks[0])}
            for task, (node_type, ranks) in zip(names, runs)]


def _run_names(prefix: str, launch: VllmLaunch) -> list[str]:
    runs = _runs(launch)
    if len(runs) == 1:
        return [prefix]
    return [safe_name(f"{prefix}-stages-{r[0]}-{r[-1]}") for _t, r in runs]


def task_documents(instance: DeployableInstance, launch: VllmLaunch, catalog
                   ) -> tuple[list[dict], bool]:
    """The YAML documents of one aggregated instance and whether they form a Job Group."""
    if launch.mode in PD_MODES:
        raise RuntimeDeploymentError(f"instance {instance.name} is a {launch.mode} instance; it is "
                              "written with its group (pd_group_documents)")
    name = instance_file_name(instance)
    runs = _runs(launch)
    if len(runs) == 1:
        (doc,) = _tasks(instance, launch, catalog, group=name, names=[name], setup=SETUP,
                        port=launch.port)
        return [doc], False
    tasks = _run_names("", launch)
    docs: list[dict] = [{"name": name, "execution": "parallel", "primary_tasks": [tasks[0]]}]
    docs += _tasks(instance, launch, catalog, group=name, names=tasks, setup=SETUP,
                   port=launch.port)
    return docs, True


def _pd_tags(group: PdGroup) -> dict[str, str]:
    """Short task-name tag of each instance of a group: p0, p1, ... then d0, d1, ..."""
    tags = {la.instance: f"p{k}" for k, la in enumerate(group.prefill)}
    tags.update({la.instance: f"d{k}" for k, la in enumerate(group.decode)})
    return tags


def pd_proxy(group: PdGroup, instances: Mapping[str, DeployableInstance]) -> VllmProxy:
    """The group's proxy, addressing every copy's head by its Job Group hostname."""
    name, tags = group_file_name(group), _pd_tags(group)

    def host_of(instance: DeployableInstance, launch: VllmLaunch, copy: int) -> str:
        return f"{_run_names(f'{tags[launch.instance]}-{copy}', launch)[0]}-0.{name}"

    return vllm_proxy(group, instances, host_of=host_of)


def pd_group_documents(group: PdGroup, instances: Mapping[str, DeployableInstance], catalog
                       ) -> list[dict]:
    """One Job Group: the proxy task, then every copy of every prefill and decode instance."""
    name, tags = group_file_name(group), _pd_tags(group)
    proxy = pd_proxy(group, instances)
    reg = _region(group.region, catalog)
    docs: list[dict] = [{"name": name, "execution": "parallel", "primary_tasks": ["proxy"]}]
    docs.append({
        "name": "proxy",
        "resources": {"infra": _infra(group.region, reg), "cpus": PROXY_CPUS,
                      "ports": proxy.port},
        "setup": PROXY_SETUP,
        "run": "set -euo pipefail\n"
               "# each request: one token on a prefill instance, then the answer from a decode "
               "instance\n" + proxy.command() + "\n"})
    for launch in (*group.prefill, *group.decode):
        inst = instances[launch.instance]
        for copy in range(launch.copies(inst)):
            names = _run_names(f"{tags[launch.instance]}-{copy}", launch)
            docs += _tasks(inst, launch, catalog, group=name, names=names, setup=PD_SETUP,
                           port=None)
    return docs


def _header(inst: DeployableInstance, launch: VllmLaunch, role: str = "") -> str:
    return (f"# {role}{inst.model} in {inst.region}: {inst.describe()}\n"
            f"# vLLM: tensor parallel {launch.tensor_parallel}, pipeline parallel "
            f"{launch.pipeline_parallel}, layers {list(launch.partition)}; the plan runs "
            f"{launch.copies(inst)} of these"
            + (f" ({inst.count} instances of {launch.replicas} data-parallel nodes, each node "
               "a vLLM instance of its own)" if launch.replicas > 1 else "") + ".\n")


@dataclass(frozen=True)
class RenderedFile:
    file: SkyPilotFile
    text: str
    launch_lines: tuple[str, ...]


def render_skypilot(instances: Sequence[DeployableInstance], launches: Sequence[VllmLaunch],
                    catalog, out_dir: str | Path, *, groups: Sequence[PdGroup] = ()
                    ) -> tuple[list[RenderedFile], str]:
    """The files `write_skypilot` writes and the text of `launch.sh`, without writing them.

    `launches` are the plan's servable instances; those of prefill/decode instances are
    written with their group, one Job Group per entry of `groups`.
    """
    out = Path(out_dir)
    by_name = {i.name: i for i in instances}
    grouped = {la.instance for g in groups for la in (*g.prefill, *g.decode)}
    files: list[RenderedFile] = []
    for launch in launches:
        if launch.instance in grouped:
            continue
        inst = by_name[launch.instance]
        docs, group = task_documents(inst, launch, catalog)
        path = out / f"{docs[0]['name']}.yaml"
        text = (_header(inst, launch) + f"# Stage order: {STAGE_ORDER_NOTE}.\n"
                + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, explicit_start=group))
        lines = []
        for k in range(launch.copies(inst)):
            cluster = shlex.quote(f"{docs[0]['name']}-{k}")
            lines.append(f"sky jobs launch -y -n {cluster} {shlex.quote(path.name)}" if group
                         else f"sky launch -y -d -c {cluster} {shlex.quote(path.name)}")
        files.append(RenderedFile(SkyPilotFile(inst.name, path, launch.copies(inst), group),
                                  text, tuple(lines)))
    for g in groups:
        docs = pd_group_documents(g, by_name, catalog)
        path = out / f"{docs[0]['name']}.yaml"
        members = tuple(la.instance for la in (*g.prefill, *g.decode))
        header = (f"# {g.model} in {g.region}: prefill/decode instances joined by vLLM's "
                  f"NixlConnector, behind one proxy (vLLM repository: {PROXY_SOURCE}).\n"
                  + "".join(_header(by_name[la.instance], la, f"{la.mode}: ")
                            for la in (*g.prefill, *g.decode))
                  + f"# Stage order: {STAGE_ORDER_NOTE}.\n"
                  "# Decode instances reach the prefill instances' NIXL side channel and KV "
                  "memory over the Job Group's network.\n")
        text = header + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False,
                                      explicit_start=True)
        line = (f"sky jobs launch -y -n {shlex.quote(docs[0]['name'])} "
                f"{shlex.quote(path.name)}")
        files.append(RenderedFile(SkyPilotFile(g.name, path, 1, True, members), text,
                                  (line,)))
    script = ["#!/usr/bin/env bash",
              "# Launch every planned instance (count copies of each; a prefill/decode "
              "group's copies are inside its Job Group).",
              "set -euo pipefail", 'cd "$(dirname "$0")"']
    script += [line for f in files for line in f.launch_lines]
    return files, "\n".join(script) + "\n"


def write_skypilot(instances: Sequence[DeployableInstance], launches: Sequence[VllmLaunch],
                   catalog, out_dir: str | Path, *, groups: Sequence[PdGroup] = ()
                   ) -> list[SkyPilotFile]:
    """Write one YAML per aggregated instance and per prefill/decode group, and
    `launch.sh`, into `out_dir`."""
    files, script = render_skypilot(instances, launches, catalog, out_dir, groups=groups)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in files:
        f.file.path.write_text(f.text)
    launch_sh = out / "launch.sh"
    launch_sh.write_text(script)
    launch_sh.chmod(0o755)
    return [f.file for f in files]
