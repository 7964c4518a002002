"""Serving engines as restrictions of the template space (docs/design.md, "Two stages":
serving engines).

* `coral`: Coral's own runtime runs every instance shape — a pipeline of stages, each stage
  one or more identical nodes on one layer range — so nothing is restricted.
* `vllm`: vLLM's pipeline parallelism runs one node per stage (topology `chain`), the same
  tensor-parallel size (GPUs per node) on every node of a pipeline, any GPU type per stage,
  and data parallelism only as separate instances. It runs one `max-num-seqs` (one prompt
  token budget) for the whole instance and sizes every worker's KV cache by the smallest one,
  so a pipeline's concurrency is the minimum over its stages: a vLLM template runs one common
  operating-point batch on every node.

A vLLM template is found by the step-model search (`placement_step`) with one node per stage,
which makes every node run the one micro-batch: exact for the restricted space under the step
model the instance runs by.

Prefill/decode pairs may differ in TP and GPU type between their prefill and their decode
instance (the KV connector moves the cache); each half is its own template, so the rule above
applies to each half alone.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Iterable, Literal

from coral.catalog.loader import Catalog
from coral.errors import InputError
from coral.templates.types import Topology

Engine = Literal["coral", "vllm"]
ENGINES: tuple[str, ...] = ("coral", "vllm")
DEFAULT_ENGINE: Engine = "coral"

#: Version of the rules a restricted engine's libraries were built under (in their digest):
#: 2 adds single-node decode instances; 3 searches under the step model (`placement_step`).
ENGINE_RULES_VERSION = 3


def max_nodes(engine: str, mode: str) -> int | None:
    """Most nodes one instance of `engine` may have in `mode` (None: no limit of its own).

    vLLM's NixlConnector runs no pipeline parallelism on the decode side (its
    `kv_connector/v1/nixl` worker refuses a decode instance with pipeline-parallel size > 1),
    so a vLLM decode instance is one node; prefill instances may be pipelines."""
    return 1 if check_engine(engine) == "vllm" and mode == "decode" else None


def check_engine(engine: str) -> Engine:
    value = engine.value if isinstance(engine, Enum) else engine
    if value not in ENGINES:
        raise InputError(f"unknown engine {value!r}; choose one of {', '.join(ENGINES)}")
    return value  # type: ignore[return-value]


def engine_topology(engine: str, topology: str | None = None) -> Topology:
    """The topology templates for `engine` are solved in: `topology` (default `flow`) for
    Coral; `chain` for vLLM, which runs nothing else (asking it for another is an error)."""
    engine = check_engine(engine)
    if engine == "vllm":
        if topology not in (None, "chain"):
            raise InputError(f"engine vllm runs one node per pipeline stage (topology chain); "
                             f"topology {topology!r} is not deployable on it")
        return "chain"
    return (topology or "flow")  # type: ignore[return-value]


def same_gpu_count(catalog: Catalog, combo: Iterable[str]) -> bool:
    """Whether every node type of `combo` has the same number of GPUs (vLLM runs one tensor
    parallel size over a whole pipeline)."""
    return len({catalog.node_type(n).gpu_count for n in combo}) <= 1


def deployable_combo(engine: str, catalog: Catalog, combo: Iterable[str],
                     mode: str | None = None) -> bool:
    """Whether `engine` can run a template on `combo` at all (before placement); with
    `mode`, also within the engine's node limit of that mode (`max_nodes`)."""
    if check_engine(engine) == "coral":
        return True
    names = list(combo)
    limit = max_nodes(engine, mode) if mode is not None else None
    return same_gpu_count(catalog, names) and (limit is None or len(names) <= limit)


def engine_violations(engine: str, template: Any, catalog: Catalog) -> list[str]:
    """Why one instance of `template` is not deployable on `engine`, in words (empty: it is).
    `template` is a `coral.templates.builder.build.Template` that is one pipeline."""
    if check_engine(engine) == "coral":
        return []
    out: list[str] = []
    try:
        shape = template.shape
    except ValueError as exc:
        return [f"not one pipeline ({exc})"]
    if not shape.is_chain:
        out.append("a stage has several nodes (vLLM runs data parallelism only as separate "
                   "instances)")
    gpus = sorted({catalog.node_type(s.node_type).gpu_count for s in shape.stages})
    if len(gpus) > 1:
        out.append(f"nodes with different GPU counts {gpus} (vLLM runs one TP size per pipeline)")
    limit = max_nodes(engine, getattr(template, "mode", ""))
    if limit is not None and shape.num_nodes > limit:
        out.append(f"a {template.mode} instance of {shape.num_nodes} nodes (vLLM's KV connector "
                   f"runs no pipeline parallelism on the decode side)")
    batches = sorted({s.batch for s in shape.stages})
    if len(batches) > 1:
        out.append(f"stages at different batches {batches} (vLLM runs one max-num-seqs per "
                   "instance)")
    return out


__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "Engine",
    "check_engine",
    "deployable_combo",
    "engine_topology",
    "engine_violations",
    "ENGINE_RULES_VERSION",
    "max_nodes",
    "same_gpu_count",
]
