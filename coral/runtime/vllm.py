"""The `vllm` engine: `vllm serve` command lines for a plan's instances, and running them.

vLLM runs an instance as tensor parallelism inside each node (`--tensor-parallel-size` = the
node type's GPUs) and pipeline parallelism across nodes (`--pipeline-parallel-size` = nodes),
with the plan's layer split given explicitly by `VLLM_PP_LAYER_PARTITION` (comma-separated
layer counts, stage by stage; they sum to the model's layers). Nodes join over vLLM's
multi-node multiprocessing backend: every node runs `vllm serve` with `--nnodes N
--node-rank R --master-addr HEAD`, the head (rank 0) serves the API and the others run
`--headless`. With the tensor-parallel size equal to a node's GPUs, node rank R holds pipeline
stage R; the rank is given explicitly to every node rather than left to the order in which
nodes come up, so the explicit partition puts each layer range on the node type the plan
chose.

Prefill/decode rows run as separate vLLM instances joined by vLLM's NixlConnector (KV caches
move from the prefill instance to the decode instance over NIXL): each runs `vllm serve` with
`--kv-transfer-config {"kv_connector":"NixlConnector","kv_role":"kv_both"}` and advertises its
own address for the NIXL handshake (`VLLM_NIXL_SIDE_CHANNEL_HOST`, port
`VLLM_NIXL_SIDE_CHANNEL_PORT`). A proxy in front of every (model, region) pair of prefill and
decode instances sends each request to a prefill instance (one output token, asking it to
keep the KV cache for a remote decode), then hands the returned `kv_transfer_params` to a
decode instance, which pulls the cache and streams the answer. The proxy is the one vLLM's
NixlConnector guide points to, `tests/v1/kv_connector/nixl_integration/toy_proxy_server.py` in
vLLM's repository (it is not in the wheel). Prefill and decode instances may differ in GPU
type and tensor-parallel size (the connector maps heads between TP sizes).

Checked against vLLM's `docs/features/nixl_connector_usage.md` (flags, side-channel
variables, proxy and its `--prefiller-hosts/--prefiller-ports/--decoder-hosts/--decoder-ports`
arguments), `docs/features/nixl_connector_compatibility.md`, and the source of vLLM 0.34.0:
`vllm/config/kv_transfer.py` (the config's fields),
`vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py` (a pipeline-parallel
prefill instance is read rank by rank; "Decode-side PP is unsupported") and `pull_scheduler.py`
(the prefill instance sends its pipeline size to the decode instance). The proxy under
`examples/online_serving/disaggregated_serving/` (`disagg_proxy_demo.py`) does not pass
`kv_transfer_params`, which the NixlConnector needs, so it is not used.

A one-stage instance of `k` identical nodes (a data-parallel stage holding every layer) runs as
`k` separate vLLM instances of one node each (`replicas`): that is how vLLM runs data
parallelism. What vLLM cannot run is refused with the reason: a data-parallel stage inside a
longer pipeline (two nodes on the same layers: vLLM has one pipeline per instance), node
types with different GPU counts in one instance (vLLM uses one tensor-parallel size for every
stage), a decode instance of more than one pipeline stage (the NixlConnector does not support
it), and a prefill or decode instance without a servable partner of the same model in the
same region.

Running an instance on this machine, and routing Coral's gateway to it, is
`coral.runtime.vllm_local`.
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from coral.runtime.deployment import PD_MODES, RuntimeDeploymentError, DeployableInstance, Refusal

log = logging.getLogger(__name__)

#: Environment variable through which vLLM takes an explicit pipeline layer partition.
PP_PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"
DEFAULT_PORT = 8000

#: `--kv-transfer-config` of prefill and decode instances. The NixlConnector does not tell
#: the roles apart (the proxy decides which instance prefills), so both take `kv_both`.
KV_TRANSFER_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
#: Where a node's NIXL handshake listens; the address is the node's own (`$NODE_IP`, set by
#: whatever starts the node), which the decode instance learns from the prefill instance.
NIXL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
NIXL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
NIXL_SIDE_CHANNEL_PORT = 5600
NODE_IP = "$NODE_IP"
#: The prefill/decode proxy: its path in vLLM's repository, and the file name it runs as.
PROXY_SOURCE = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"
PROXY_SCRIPT = "toy_proxy_server.py"
#: The proxy sends requests round robin over its list of instances; an instance is listed
#: up to this many times, in proportion to its planned capacity, so that faster instances
#: get a larger share.
MAX_PROXY_WEIGHT = 8


class VllmNotServableError(RuntimeDeploymentError):
    """vLLM cannot run this instance as planned."""


def _shell_word(word: str) -> str:
    """A word left for the shell to expand (`$HEAD_IP`) in double quotes, others quoted."""
    return f'"{word}"' if word.startswith("$") else shlex.quote(word)


@dataclass(frozen=True)
class VllmNode:
    """What one node of an instance runs."""

    rank: int
    """Node rank = pipeline stage (0 is the head, which serves the API)."""
    node_type: str
    first_layer: int
    end_layer: int
    argv: tuple[str, ...]
    """`vllm serve ...`; a word starting with `$` is a shell variable (e.g. `$HEAD_IP`)."""

    def shell(self, env: Mapping[str, str]) -> str:
        """The node's command as one shell line, environment first."""
        words = [f"{k}={_shell_word(v)}" for k, v in env.items()]
        words += [_shell_word(w) for w in self.argv]
        return " ".join(words)


@dataclass(frozen=True)
class VllmLaunch:
    """One instance as vLLM runs it: a command per node, the same environment on each."""

    instance: str
    model: str
    """What `vllm serve` loads: a Hugging Face id (from the catalog) or a local folder."""
    served_name: str
    tensor_parallel: int
    partition: tuple[int, ...]
    """Layers per pipeline stage, in order."""
    nodes: tuple[VllmNode, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    port: int = DEFAULT_PORT
    mode: str = "aggregated"
    """`prefill` and `decode` instances run with the KV connector, behind a proxy."""
    replicas: int = 1
    """vLLM instances per planned instance: the nodes of a one-stage data-parallel
    instance each run the model alone."""

    @property
    def pipeline_parallel(self) -> int:
        return len(self.partition)

    def copies(self, instance: DeployableInstance) -> int:
        """How many of these the plan runs: its instances times the replicas of each."""
        return instance.count * self.replicas

    def commands(self) -> list[str]:
        """Every node's shell line, head first."""
        return [n.shell(self.env) for n in self.nodes]

    def single_machine_argv(self, extra: Sequence[str] = ()) -> list[str]:
        """All stages on one machine (tensor x pipeline parallel GPUs, or CPU cores): the
        head's command without the multi-node flags."""
        return [*serve_argv(self.model, self.served_name, self.tensor_parallel,
                            self.pipeline_parallel, self.port), *extra]

    def to_dict(self) -> dict:
        return {"hf_model": self.model, "served_name": self.served_name,
                "replicas": self.replicas,
                "tensor_parallel": self.tensor_parallel,
                "pipeline_parallel": self.pipeline_parallel, "partition": list(self.partition),
                "env": dict(self.env),
                "nodes": [{"rank": n.rank, "node_type": n.node_type,
                           "first_layer": n.first_layer, "end_layer": n.end_layer,
                           "command": n.shell(self.env)} for n in self.nodes]}


def serve_argv(model: str, served_name: str, tp: int, pp: int, port: int) -> list[str]:
    return ["vllm", "serve", model, "--served-model-name", served_name,
            "--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp),
            "--port", str(port)]


def vllm_launch(instance: DeployableInstance, catalog=None, *, model: str | None = None,
                master_addr: str = "$HEAD_IP", port: int = DEFAULT_PORT,
                extra_args: Sequence[str] = ()) -> VllmLaunch:
    """The `vllm serve` commands of an instance (aggregated, prefill or decode).

    `model` overrides what vLLM loads (default: the catalog's Hugging Face id of the
    instance's model); `catalog` gives the node types' GPU counts (nodes of unknown types
    use their planned tensor-parallel degree). Raises `VllmNotServableError` with the reason
    for instances vLLM cannot run.
    """
    if instance.mode != "aggregated" and instance.mode not in PD_MODES:
        raise VllmNotServableError(
            f"instance {instance.name} ({instance.model}) has an unknown mode "
            f"'{instance.mode}'; expected aggregated, prefill or decode")
    # the torch engine runs aggregated instances only
    torch = " or serve it with --engine torch" if instance.mode == "aggregated" else ""
    stages = instance.stages()
    replicas = 1
    if len(stages) == 1 and len(stages[0]) > 1:  # identical nodes, each holding every layer
        replicas, stages = len(stages[0]), (stages[0][:1],)
    wide = [s for s in stages if len(s) > 1]
    if wide:
        s = wide[0]
        raise VllmNotServableError(
            f"instance {instance.name} ({instance.model}: {instance.describe()}) has a "
            f"data-parallel stage ({len(s)} nodes on layers [{s[0].first_layer}, "
            f"{s[0].end_layer})); vLLM runs one pipeline per instance and cannot run it. "
            "To fix: re-plan with chain templates (`coral templates build --topology chain`)"
            f"{torch}")
    nodes = [s[0] for s in stages]
    gpus = {n.node_type: _gpus_per_node(n, catalog) for n in nodes}
    if len(set(gpus.values())) > 1:
        mix = ", ".join(f"{t} ({g} GPU{'s' if g > 1 else ''})" for t, g in gpus.items())
        raise VllmNotServableError(
            f"instance {instance.name} ({instance.model}) mixes node types with different "
            f"GPU counts: {mix}; vLLM uses one tensor-parallel size for every pipeline stage. "
            f"To fix: re-plan with node types of equal GPU count{torch}")
    pp = len(nodes)
    if instance.mode == "decode" and pp > 1:
        raise VllmNotServableError(
            f"instance {instance.name} ({instance.model}: {instance.describe()}) is a decode "
            f"instance of {pp} pipeline stages; vLLM's NixlConnector does not support "
            "pipeline parallelism on the decode side. To fix: re-plan with decode templates "
            "of one pipeline stage")
    tp = next(iter(gpus.values()))
    if model is None:
        arch = catalog.models.get(instance.model) if catalog is not None else None
        if arch is None:
            raise VllmNotServableError(
                f"model '{instance.model}' is not in the catalog, so its Hugging Face id is "
                "unknown; to fix: pass the catalog the plan was made with (--catalog FILE)")
        model = arch.hf_id
    partition = tuple(n.layers for n in nodes)
    assert sum(partition) == instance.num_layers, "stages tile the model's layers"
    env = {PP_PARTITION_ENV: ",".join(map(str, partition))} if pp > 1 else {}
    base = serve_argv(model, instance.model, tp, pp, port)
    if instance.mode in PD_MODES:
        env.update({NIXL_HOST_ENV: NODE_IP, NIXL_PORT_ENV: str(NIXL_SIDE_CHANNEL_PORT)})
        base += ["--kv-transfer-config", json.dumps(KV_TRANSFER_CONFIG, separators=(",", ":"))]
    out = []
    for rank, n in enumerate(nodes):
        argv = list(base)
        if pp > 1:
            argv += ["--distributed-executor-backend", "mp", "--nnodes", str(pp),
                     "--node-rank", str(rank), "--master-addr", master_addr]
            if rank > 0:
                argv.append("--headless")
        argv += list(extra_args)
        out.append(VllmNode(rank, n.node_type, n.first_layer, n.end_layer, tuple(argv)))
    return VllmLaunch(instance.name, model, instance.model, tp, partition, tuple(out), env,
                      port, instance.mode, replicas)


def _gpus_per_node(node, catalog) -> int:
    if catalog is not None and node.node_type in catalog.node_types:
        return int(catalog.node_types[node.node_type].gpu_count)
    return max(1, node.tp_degree)


# ---------------------------------------------------------------- a plan on vLLM
@dataclass(frozen=True)
class PdGroup:
    """The prefill and decode instances of one model in one region, behind one proxy."""

    model: str
    region: str
    prefill: tuple[VllmLaunch, ...]
    decode: tuple[VllmLaunch, ...]

    @property
    def name(self) -> str:
        return f"{self.region}/{self.model}/pd"


@dataclass(frozen=True)
class VllmPlan:
    """A plan's instances as vLLM runs them: a launch per servable row, the prefill/decode
    groups among them, and the rows refused with the reason."""

    launches: tuple[VllmLaunch, ...]
    groups: tuple[PdGroup, ...]
    refused: tuple[Refusal, ...]


def vllm_plan(instances: Sequence[DeployableInstance], catalog, *,
              check: Callable[[DeployableInstance, VllmLaunch], None] | None = None,
              **kwargs) -> VllmPlan:
    """Launch every instance vLLM can run; pair prefill and decode instances.

    `check(instance, launch)` may refuse a launch further (raising `RuntimeDeploymentError`), e.g.
    a provisioner that cannot place its node types. Pairing comes last: a prefill (decode)
    instance whose model has no servable decode (prefill) instance in its region cannot
    serve a request, so it is refused too.
    """
    launches: list[VllmLaunch] = []
    refused: list[Refusal] = []
    for inst in instances:
        try:
            launch = vllm_launch(inst, catalog, **kwargs)
            if check is not None:
                check(inst, launch)
        except RuntimeDeploymentError as exc:
            refused.append(Refusal(inst.name, str(exc)))
            continue
        launches.append(launch)
    by_name = {i.name: i for i in instances}

    def side(name: str) -> tuple[str, str, str]:
        inst = by_name[name]
        return inst.model, inst.region, inst.mode

    sides: dict[tuple[str, str], dict[str, list[VllmLaunch]]] = {}
    for launch in launches:
        model, region, mode = side(launch.instance)
        if mode in PD_MODES:
            sides.setdefault((model, region), {m: [] for m in PD_MODES})[mode].append(launch)
    groups: list[PdGroup] = []
    unpaired: set[str] = set()
    for (model, region), group in sides.items():
        if group["prefill"] and group["decode"]:
            groups.append(PdGroup(model, region, tuple(group["prefill"]),
                                  tuple(group["decode"])))
            continue
        mode, other = ("prefill", "decode") if group["prefill"] else ("decode", "prefill")
        lost = [r.instance for r in refused if side(r.instance) == (model, region, other)]
        why = f" ({', '.join(lost)} refused)" if lost else ""
        for launch in group[mode]:
            unpaired.add(launch.instance)
            refused.append(Refusal(launch.instance, (
                f"instance {launch.instance} ({model}) is a {mode} instance with no servable "
                f"{other} instance of {model} in {region} to pair with{why}; prefill and "
                "decode instances serve only in pairs")))
    kept = tuple(la for la in launches if la.instance not in unpaired)
    return VllmPlan(kept, tuple(groups), tuple(refused))


@dataclass(frozen=True)
class ProxyTarget:
    """One running copy of a prefill or decode instance, as the proxy reaches it."""

    instance: str
    copy: int
    host: str
    port: int
    weight: int
    """How many times the proxy lists it (its share of the round robin)."""

    def to_dict(self) -> dict:
        return {"instance": self.instance, "copy": self.copy, "host": self.host,
                "port": self.port, "weight": self.weight}


@dataclass(frozen=True)
class VllmProxy:
    """The prefill/decode proxy of one group: every copy of its instances, by address."""

    group: str
    model: str
    region: str
    prefill: tuple[ProxyTarget, ...]
    decode: tuple[ProxyTarget, ...]
    port: int = DEFAULT_PORT

    def argv(self) -> list[str]:
        """`python toy_proxy_server.py ...`: each copy listed `weight` times, interleaved."""
        p, d = _round_robin(self.prefill), _round_robin(self.decode)
        return ["python", PROXY_SCRIPT, "--host", "0.0.0.0", "--port", str(self.port),
                "--prefiller-hosts", *[t.host for t in p],
                "--prefiller-ports", *[str(t.port) for t in p],
                "--decoder-hosts", *[t.host for t in d],
                "--decoder-ports", *[str(t.port) for t in d]]

    def command(self) -> str:
        return " ".join(_shell_word(w) for w in self.argv())

    def to_dict(self) -> dict:
        return {"group": self.group, "model": self.model, "region": self.region,
                "port": self.port, "source": f"vLLM repository: {PROXY_SOURCE}",
                "prefill": [t.to_dict() for t in self.prefill],
                "decode": [t.to_dict() for t in self.decode], "command": self.command()}


def placeholder_host(instance: DeployableInstance, launch: VllmLaunch, copy: int) -> str:
    """A shell variable naming a copy's head, for deployments that learn addresses late."""
    del launch
    tag = "".join(c if c.isalnum() else "_" for c in instance.name).upper()
    return f"$HOST_{tag}_{copy}"


def vllm_proxy(group: PdGroup, instances: Mapping[str, DeployableInstance], *,
               host_of: Callable[[DeployableInstance, VllmLaunch, int], str] = placeholder_host,
               port: int = DEFAULT_PORT) -> VllmProxy:
    """The proxy of a group; `host_of(instance, launch, copy)` is a copy's head address."""

    def targets(launches: Sequence[VllmLaunch]) -> tuple[ProxyTarget, ...]:
        def rate(la: VllmLaunch) -> float:  # requests/s of one copy
            return instances[la.instance].capacity_rps / la.replicas

        least = min(rate(la) for la in launches)
        out = []
        for la in launches:
            inst = instances[la.instance]
            weight = max(1, min(MAX_PROXY_WEIGHT, round(rate(la) / least)))
            out += [ProxyTarget(inst.name, k, host_of(inst, la, k), la.port, weight)
                    for k in range(la.copies(inst))]
        return tuple(out)

    return VllmProxy(group.name, group.model, group.region, targets(group.prefill),
                     targets(group.decode), port)


def _round_robin(targets: Sequence[ProxyTarget]) -> list[ProxyTarget]:
    """Each target `weight` times, in rounds, so that repeats are spread over the cycle."""
    out = []
    for r in range(max((t.weight for t in targets), default=0)):
        out += [t for t in targets if t.weight > r]
    return out
