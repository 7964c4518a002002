"""Operating points: what one node of a combination can do, as plain numbers for the solver.

For a (model, node type, SLO/workload, mode) this turns the performance model into the
options a node may take — `(layers k, batch b, last stage or not)` with the time it adds to a
token's path, its capacity and its memory — and packs them into a `NodeSpec`. A template
library solves thousands of combinations that share a handful of node types, so every table
is computed once per (model, node type, workload, mode) and the per-combination part (the
memory of resident sequences depends on the number of nodes) once per node count: this module
is the hot path of library building and is memoised throughout.

Per mode, with mean prompt `I` and output `O` tokens, hidden state `h` bytes per token, NIC
`nic` bytes/s and `NET_LATENCY_S` per hop (`send(x) = x * h / nic + NET_LATENCY_S`, only when
the node is not the last stage, which hands its activations on):

aggregated (capacity: requests/s of the workload mix)
    Steady state of continuous batching with chunked prefill: `b` decoding sequences with total
    context `C = b (I + O/2)` plus the prompt share `P = ceil(b I / O)` tokens per iteration
    (every request's `I` prompt tokens spread over its `O` decode iterations).
    `t = iteration(k, P, b, C)`; capacity `b / (t O)`; `step_s = t + send(P + b)` (the mixed
    iteration hands on the hidden states of all its tokens); `prefill_s =
    iteration(k, I, b, C) + send(I)` (a new prompt whole, alongside the decode batch).
decode (capacity: output tokens/s)
    `t = iteration(k, 0, b, C)`; capacity `b / t`; `step_s = t + send(b)`; `prefill_s = 0`.
prefill (capacity: prompt tokens/s)
    "batch" is the chunk of prompt tokens per iteration, `T` in `I x PREFILL_CHUNK_MULTIPLES`
    (at most `MAX_PREFILL_CHUNK_TOKENS`, and at least `I`). `t = iteration(k, T, 0, 0)`, costed
    as ONE sequence of `T` tokens (conservative: attention over `T` rather than over `T / I`
    prompts of `I`); capacity `T / t`; `prefill_s = t + send(T)`; `step_s = 0`.

Memory of an option: `k` layers of weights (every expert of an MoE), the KV cache of the
sequences resident on the node, and on the last stage the final norm and LM head. Resident
sequences follow Little's law: a node runs `b` sequences per iteration, and a sequence comes
back to it once per path latency, which is at most the TPOT target (the SLO) and at most
`n` iterations (the pipeline depth of an `n`-node combination), so
`resident = b * min(ceil(tpot_s / t), n)` sequences of `I + O` tokens each (their largest
context). For prefill the same rule with TTFT gives `T * min(ceil(ttft_s / t), n)` tokens.
This is an approximation (mean shapes, a sequence's whole context reserved from its start).
Options whose memory exceeds the node's memory less `MEMORY_RESERVE_FRACTION` are dropped,
as are options that alone exceed the TPOT or TTFT target (no path through them can meet it)
and options dominated by another with the same layers and role (no more capacity, no less
time or memory) — all lossless for the placement. The input embedding is
`first_stage_extra_bytes` (the solver adds it to the node holding layer 0); a tied model on
one node is charged its embedding matrix twice (conservative).
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Protocol, Sequence

import numpy as np

from coral.catalog.loader import Catalog
from coral.catalog.schema import ModelArch, NodeType
from coral.perf.step import NET_LATENCY_S
from coral.templates.space.grid import (
    DEFAULT_BATCHES,
    check_batches,
    check_mode,
    check_topology,
    prefill_chunks,
)
from coral.templates.slo import SloSpec
from coral.templates.space.stage_bytes import (
    edge_bytes_per_unit,
    input_embedding_bytes,
    lm_head_bytes,
)
from coral.templates.types import Mode, NodeSpec, OperatingPoint, PlacementProblem, Topology

try:  # the perf model's reserve, so the two agree on what "fits" means
    from coral.perf.model import MEMORY_RESERVE_FRACTION
except ImportError:  # pragma: no cover - perf model not installed
    MEMORY_RESERVE_FRACTION = 0.10

#: Version of the formulas above; part of a template library's identity, so that a library
#: built with other formulas is rebuilt rather than resumed. Bump on any change of meaning.
OPERATING_POINTS_VERSION = "1"


class PerfLike(Protocol):
    """What the operating points need from a performance model (see coral.perf.model)."""

    def iteration_seconds(
        self,
        model: Any,
        node: Any,
        layers: int,
        prefill_tokens: int = 0,
        decode_batch: int = 0,
        context_tokens: int = 0,
        *,
        first_stage: bool = False,
        last_stage: bool = False,
    ) -> float: ...


@dataclass(frozen=True)
class TimeTable:
    """Iteration times of one (model, node type, workload, mode) over every option.

    Arrays have shape (layers, batches, 2); the last axis is is_last (0: no, 1: yes).
    """

    model: str
    node_type: str
    mode: Mode
    batches: tuple[int, ...]
    t: np.ndarray  # iteration seconds at the operating point
    prefill_t: np.ndarray  # aggregated: the iteration that takes in a whole prompt; else == t
    build_s: float


@dataclass
class TableStats:
    """Where the time of building option tables went (measured, for the benchmark)."""

    time_tables: int = 0
    time_table_s: float = 0.0
    perf_calls: int = 0
    node_specs: int = 0
    node_spec_s: float = 0.0


@dataclass(frozen=True)
class NodeBound:
    """True upper bounds on what one node can contribute to a combination's throughput."""

    max_capacity: float  # max capacity over its options
    max_layer_capacity: float  # max over options of layers * capacity


class OperatingPointTables:
    """Memoised option tables for one catalog and performance model.

    `node_spec(model, node, slo, mode, n)` is the `NodeSpec` of one node of an `n`-node
    combination; `problem(...)` the whole `PlacementProblem` of a combination.
    """

    def __init__(
        self,
        perf: PerfLike,
        catalog: Catalog,
        *,
        batches: Sequence[int] = DEFAULT_BATCHES,
        memory_reserve: float = MEMORY_RESERVE_FRACTION,
        net_latency_s: float = NET_LATENCY_S,
    ):
        if not 0.0 <= memory_reserve < 1.0:
            raise ValueError(f"memory_reserve must be in [0, 1), got {memory_reserve}")
        self.perf = perf
        self.catalog = catalog
        self.batches = check_batches(batches)
        self.memory_reserve = float(memory_reserve)
        self.net_latency_s = float(net_latency_s)
        self.stats = TableStats()
        self._times: dict[tuple, TimeTable] = {}
        self._specs: dict[tuple, tuple[NodeSpec, NodeBound]] = {}

    # ---- lookups ----

    def _arch(self, model: str | ModelArch) -> ModelArch:
        return self.catalog.model(model) if isinstance(model, str) else model

    def _node(self, node: str | NodeType) -> NodeType:
        return self.catalog.node_type(node) if isinstance(node, str) else node

    def usable_bytes(self, node: str | NodeType) -> float:
        return self.catalog.node_memory_bytes(self._node(node)) * (1.0 - self.memory_reserve)

    def kv_bytes_per_token_per_layer(self, arch: ModelArch, node: NodeType) -> float:
        """KV bytes per token per layer on the whole node (KV heads replicated under wide TP)."""
        fn = getattr(self.perf, "kv_bytes_per_token", None)
        if fn is not None:
            return float(fn(arch, node, 1))
        return float(arch.kv_bytes_per_token_per_layer)

    def weight_bytes_per_layer(self, arch: ModelArch, node: NodeType) -> float:
        """One layer's weights as the node's GPU type holds them (4-bit experts where the
        serving engine runs them, `coral.perf.precision`), else as the checkpoint stores them."""
        fn = getattr(self.perf, "stage_weight_bytes", None)
        if fn is not None and arch.expert_weight_format is not None:
            return float(fn(arch, 1, node=node))
        return float(arch.weight_bytes_per_layer)

    def window_bytes_per_layer(self, arch: ModelArch, node: NodeType) -> float:
        """KV bytes of one sequence's full windows per layer of the model's mix (0 without
        sliding-window layers, or for a perf model that does not say)."""
        fn = getattr(self.perf, "window_kv_bytes", None)
        return float(fn(arch, node, 1)) if fn is not None and arch.sliding_window else 0.0

    def batch_grid(self, slo: SloSpec, mode: Mode) -> tuple[int, ...]:
        return prefill_chunks(slo) if mode == "prefill" else self.batches

    # ---- per (model, node, workload, mode): iteration times ----

    def time_table(
        self, model: str | ModelArch, node: str | NodeType, slo: SloSpec, mode: Mode
    ) -> TimeTable:
        arch, node_t = self._arch(model), self._node(node)
        key = (arch.name, node_t.name, slo.input_tokens, slo.output_tokens, mode)
        table = self._times.get(key)
        if table is not None:
            return table
        start = time.perf_counter()
        grid = self.batch_grid(slo, mode)
        L, nb = arch.num_layers, len(grid)
        t = np.empty((L, nb, 2))
        pre = np.empty((L, nb, 2))
        it = self.perf.iteration_seconds
        I, O = slo.input_tokens, slo.output_tokens
        calls = 0
        for j, b in enumerate(grid):
            if mode == "aggregated":
                shape = (math.ceil(b * I / O), b, int(round(b * (I + O / 2))))
                pshape = (I, b, shape[2])
            elif mode == "decode":
                shape = (0, b, int(round(b * (I + O / 2))))
                pshape = None
            else:
                shape = (b, 0, 0)
                pshape = None
            for k in range(1, L + 1):
                for last in (0, 1):
                    t[k - 1, j, last] = it(arch, node_t, k, *shape, last_stage=bool(last))
                    calls += 1
                    if pshape is not None:
                        pre[k - 1, j, last] = it(arch, node_t, k, *pshape, last_stage=bool(last))
                        calls += 1
        if mode != "aggregated":
            pre = t
        elapsed = time.perf_counter() - start
        table = TimeTable(arch.name, node_t.name, mode, grid, t, pre, elapsed)
        self._times[key] = table
        self.stats.time_tables += 1
        self.stats.time_table_s += elapsed
        self.stats.perf_calls += calls
        return table

    # ---- per (model, node, workload, mode, n): the node's options ----

    def node_spec(
        self,
        model: str | ModelArch,
        node: str | NodeType,
        slo: SloSpec,
        mode: Mode,
        n_nodes: int,
    ) -> NodeSpec:
        return self._spec_and_bound(model, node, slo, mode, n_nodes)[0]

    def node_bound(
        self,
        model: str | ModelArch,
        node: str | NodeType,
        slo: SloSpec,
        mode: Mode,
        n_nodes: int,
    ) -> NodeBound:
        return self._spec_and_bound(model, node, slo, mode, n_nodes)[1]

    def _spec_and_bound(
        self,
        model: str | ModelArch,
        node: str | NodeType,
        slo: SloSpec,
        mode: Mode,
        n_nodes: int,
    ) -> tuple[NodeSpec, NodeBound]:
        if n_nodes < 1:
            raise ValueError(f"n_nodes must be >= 1, got {n_nodes}")
        arch, node_t = self._arch(model), self._node(node)
        key = (arch.name, node_t.name, slo, mode, n_nodes)
        hit = self._specs.get(key)
        if hit is not None:
            return hit
        table = self.time_table(arch, node_t, slo, mode)
        start = time.perf_counter()
        hit = self._build_spec(arch, node_t, slo, mode, n_nodes, table)
        self._specs[key] = hit
        self.stats.node_specs += 1
        self.stats.node_spec_s += time.perf_counter() - start
        return hit

    def _build_spec(
        self,
        arch: ModelArch,
        node_t: NodeType,
        slo: SloSpec,
        mode: Mode,
        n: int,
        table: TimeTable,
    ) -> tuple[NodeSpec, NodeBound]:
        I, O = slo.input_tokens, slo.output_tokens
        L = arch.num_layers
        grid = np.asarray(table.batches, dtype=float)  # (nb,)
        layers = np.arange(1, L + 1, dtype=float)[:, None, None]  # (L,1,1)
        b = grid[None, :, None]  # (1,nb,1)
        not_last = np.array([1.0, 0.0])[None, None, :]  # (1,1,2)
        nic = node_t.nic_gbps * 1e9 / 8.0
        hb = float(arch.activation_bytes_per_token)
        lat = self.net_latency_s
        t, pre_t = table.t, table.prefill_t

        if mode == "aggregated":
            p_share = np.ceil(grid * I / O)[None, :, None]
            step = t + not_last * ((p_share + b) * hb / nic + lat)
            prefill = pre_t + not_last * (I * hb / nic + lat)
            capacity = b / (t * O)
            bound_s = slo.tpot_s
            tokens_per_seq = I + O
        elif mode == "decode":
            step = t + not_last * (b * hb / nic + lat)
            prefill = np.zeros_like(t)
            capacity = b / t
            bound_s = slo.tpot_s
            tokens_per_seq = I + O
        else:
            step = np.zeros_like(t)
            prefill = t + not_last * (b * hb / nic + lat)
            capacity = b / t
            bound_s = slo.ttft_s
            tokens_per_seq = 1  # "batch" already counts tokens

        # Little's law, path latency bounded by the SLO and by the pipeline depth.
        rounds = np.minimum(np.ceil(bound_s / t), float(n))
        kv = self.kv_bytes_per_token_per_layer(arch, node_t)
        is_last = 1.0 - not_last
        mem = (
            layers * self.weight_bytes_per_layer(arch, node_t)
            + b * rounds * tokens_per_seq * layers * kv
            + is_last * lm_head_bytes(arch)
        )
        window = self.window_bytes_per_layer(arch, node_t)
        if window:  # sliding layers keep one window per sequence (prefill: per prompt)
            sequences = b * rounds if mode != "prefill" else np.ceil(b * rounds / I)
            mem = mem + sequences * layers * window
        mem = np.broadcast_to(mem, t.shape)

        ok = mem <= self.usable_bytes(node_t)
        if mode in ("aggregated", "decode"):
            ok &= step <= slo.tpot_s
        if mode in ("aggregated", "prefill"):
            ok &= prefill <= slo.ttft_s
        ok &= _pareto_mask(capacity, step, prefill, mem)

        ks, js, ls = np.nonzero(ok)
        options = tuple(
            OperatingPoint(
                layers=int(k + 1),
                batch=int(table.batches[j]),
                is_last=bool(last),
                step_s=float(step[k, j, last]),
                prefill_s=float(prefill[k, j, last]),
                capacity=float(capacity[k, j, last]),
                mem_bytes=float(mem[k, j, last]),
            )
            for k, j, last in zip(ks.tolist(), js.tolist(), ls.tolist())
        )
        if options:
            caps = np.broadcast_to(capacity, t.shape)[ok]
            work = (np.broadcast_to(layers, t.shape) * np.broadcast_to(capacity, t.shape))[ok]
            bound = NodeBound(float(caps.max()), float(work.max()))
        else:
            bound = NodeBound(0.0, 0.0)
        spec = NodeSpec(
            node_type=node_t.name,
            mem_bytes=self.usable_bytes(node_t),
            nic_bytes_per_s=nic,
            options=options,
        )
        return spec, bound

    # ---- whole combinations ----

    def problem(
        self,
        model: str | ModelArch,
        combo: Sequence[str],
        slo: SloSpec,
        mode: Mode,
        topology: Topology = "flow",
    ) -> PlacementProblem:
        """The placement problem of a combination."""
        arch = self._arch(model)
        n = len(combo)
        if n == 0:
            raise ValueError("a combination needs at least one node")
        nodes = tuple(self.node_spec(arch, name, slo, mode, n) for name in combo)
        return PlacementProblem(
            num_layers=arch.num_layers,
            nodes=nodes,
            tpot_s=slo.tpot_s if mode in ("aggregated", "decode") else None,
            ttft_s=slo.ttft_s if mode in ("aggregated", "prefill") else None,
            first_stage_extra_bytes=input_embedding_bytes(arch),
            edge_bytes_per_unit=edge_bytes_per_unit(arch, slo, mode),
            topology=topology,
        )

    def throughput_bound(
        self, model: str | ModelArch, combo: Sequence[str], slo: SloSpec, mode: Mode
    ) -> float:
        """A TRUE upper bound on the combination's throughput (any topology).

        Every unit of flow passes through each of the L layers exactly once, on a node holding
        it at flow <= its capacity, so `L * F <= sum_i k_i cap_i <= sum_i max(k * cap)`; and all
        flow leaves the source through nodes, so `F <= sum_i max cap`.
        """
        arch = self._arch(model)
        n = len(combo)
        bounds = [self.node_bound(arch, name, slo, mode, n) for name in combo]
        by_capacity = sum(b.max_capacity for b in bounds)
        by_work = sum(b.max_layer_capacity for b in bounds) / arch.num_layers
        return min(by_capacity, by_work)

    def useful_node_types(
        self, model: str | ModelArch, node_types: Iterable[str], slo: SloSpec, mode: Mode
    ) -> tuple[list[str], list[str]]:
        """(node types with at least one option, node types with none).

        A node type without an option even in a 1-node combination (where the fewest
        sequences are resident) can hold no layer in any combination: lossless to drop.
        """
        useful, useless = [], []
        for name in node_types:
            (useful if self.node_spec(model, name, slo, mode, 1).options else useless).append(name)
        return useful, useless


def _pareto_mask(
    capacity: np.ndarray, step: np.ndarray, prefill: np.ndarray, mem: np.ndarray
) -> np.ndarray:
    """False where another batch of the same (layers, role) is at least as good in every
    respect (capacity >=, step/prefill/memory <=) and strictly better in one, or identical and
    earlier."""
    shape = np.broadcast_shapes(capacity.shape, step.shape, prefill.shape, mem.shape)
    cap, st, pf, me = (np.broadcast_to(a, shape) for a in (capacity, step, prefill, mem))
    # pairwise over the batch axis (axis 1): [..., i, j] compares option j against option i
    ci, cj = cap[:, :, None, :], cap[:, None, :, :]
    si, sj = st[:, :, None, :], st[:, None, :, :]
    pi, pj = pf[:, :, None, :], pf[:, None, :, :]
    mi, mj = me[:, :, None, :], me[:, None, :, :]
    weakly = (cj >= ci) & (sj <= si) & (pj <= pi) & (mj <= mi)
    strictly = (cj > ci) | (sj < si) | (pj < pi) | (mj < mi)
    nb = shape[1]
    earlier = np.tri(nb, nb, -1, dtype=bool)[None, :, :, None]  # [i, j]: j < i
    dominated = weakly & (strictly | earlier)
    return ~dominated.any(axis=2)


_SHARED: "weakref.WeakKeyDictionary[Any, dict[tuple, OperatingPointTables]]" = (
    weakref.WeakKeyDictionary()
)


def shared_tables(
    perf: PerfLike, catalog: Catalog, batches: Sequence[int] = DEFAULT_BATCHES
) -> OperatingPointTables:
    """One `OperatingPointTables` per (perf model, catalog, batch set), kept while perf lives."""
    key = (id(catalog), check_batches(batches))
    try:
        per_perf = _SHARED.setdefault(perf, {})
    except TypeError:  # not weak-referenceable: no sharing
        return OperatingPointTables(perf, catalog, batches=batches)
    tables = per_perf.get(key)
    if tables is None or tables.catalog is not catalog:
        tables = OperatingPointTables(perf, catalog, batches=batches)
        per_perf[key] = tables
    return tables


__all__ = [
    "DEFAULT_BATCHES",
    "check_batches",
    "check_mode",
    "check_topology",
    "MEMORY_RESERVE_FRACTION",
    "NET_LATENCY_S",
    "NodeBound",
    "OperatingPointTables",
    "TimeTable",
    "edge_bytes_per_unit",
    "input_embedding_bytes",
    "prefill_chunks",
    "shared_tables",
]
