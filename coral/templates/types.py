"""Data passed between the template stages: problem, operating points, solved template.

The placement solver reads only a `PlacementProblem` (numbers, no catalog, no perf model),
so it can be tested against the exhaustive oracle on hand-made instances. The physics that
turns (model, node type, layers, batch) into times and capacities lives in
`space/operating_points.py`; persistence in `library/store.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

Mode = Literal["aggregated", "prefill", "decode"]
"""`aggregated`: capacity in requests/s of the model's workload mix, TPOT and TTFT bound.
`prefill` / `decode`: the two halves of a PD-disaggregated deployment — prefill templates
have capacity in prompt tokens/s under TTFT, decode templates output tokens/s under TPOT."""

Topology = Literal["flow", "chain", "dag"]
"""How the nodes of a template may be wired (data + pipeline parallel).

- `flow` (default): one or more replicas, each a pipeline of stages, each stage a data-parallel
  group of identical nodes holding the same layer range at the same operating point; solved
  exactly by the staged dynamic programme. This is what the runtime serves.
- `chain`: one node per stage, a plain pipeline (what vLLM's pipeline parallelism runs).
- `dag`: any DAG of contiguous layer ranges (Helix-style max flow with per-path latency), a
  superset of `flow`, solved by the placement MILP; slow, for comparison and small cases.
"""


class SolveStatus(str, Enum):
    OPTIMAL = "optimal"
    TIME_LIMIT = "time_limit"  # best found, with a proven gap
    INFEASIBLE = "infeasible"  # no placement meets memory and SLO

    @property
    def is_ok(self) -> bool:
        return self is SolveStatus.OPTIMAL


@dataclass(frozen=True)
class OperatingPoint:
    """One choice for one node: how many layers it holds, at which batch, in which role.

    `step_s` is what the node adds to a token's path latency (TPOT side) per iteration,
    including sending its activations on when it is not the last stage; `prefill_s` what it
    adds to the time to first token. `capacity` is in the mode's unit per second.
    """

    layers: int
    batch: int
    is_last: bool
    step_s: float
    prefill_s: float
    capacity: float
    mem_bytes: float


@dataclass(frozen=True)
class NodeSpec:
    """One node of a combination, with every operating point it may take."""

    node_type: str
    mem_bytes: float
    nic_bytes_per_s: float
    options: tuple[OperatingPoint, ...]


@dataclass(frozen=True)
class PlacementProblem:
    """Everything the placement solver needs, as plain numbers."""

    num_layers: int
    nodes: tuple[NodeSpec, ...]
    tpot_s: float | None  # bound on every path's summed step_s (None: unbounded)
    ttft_s: float | None  # bound on every path's summed prefill_s (None: unbounded)
    first_stage_extra_bytes: float  # memory the node holding layer 0 needs (embeddings)
    edge_bytes_per_unit: float  # bytes crossing a stage boundary per unit of flow
    topology: Topology = "flow"


@dataclass(frozen=True)
class NodePlacement:
    node_type: str
    first_layer: int
    layers: int
    batch: int
    tp_degree: int
    capacity: float
    step_s: float
    prefill_s: float
    mem_bytes: float


@dataclass(frozen=True)
class Placement:
    """A solved placement: per node its choice, and the flow on every edge.

    Edge endpoints are node indices, with -1 for the source and -2 for the sink.
    """

    throughput: float
    nodes: tuple[NodePlacement, ...]
    edges: tuple[tuple[int, int, float], ...]
    status: SolveStatus
    gap: float
    solve_s: float
    method: str = "ilp"
    notes: tuple[str, ...] = field(default=())
    #: TPOT / TTFT of a busy instance when the solver modelled them (the step-model search:
    #: stages x the slowest stage); None: the longest path's sums (the flow model)
    tpot_s: float | None = None
    ttft_s: float | None = None

    @property
    def path_step_s(self) -> float:
        """Largest summed step time over source→sink paths that carry flow."""
        return _longest_path(self, "step_s")

    @property
    def path_prefill_s(self) -> float:
        return _longest_path(self, "prefill_s")

    @property
    def predicted_tpot_s(self) -> float:
        return self.path_step_s if self.tpot_s is None else self.tpot_s

    @property
    def predicted_ttft_s(self) -> float:
        return self.path_prefill_s if self.ttft_s is None else self.ttft_s


def upper_bound_of(throughput: float, status: SolveStatus, gap: float) -> float:
    """Proven bound on the optimum from a solve's incumbent and relative gap.

    `throughput / (1 - gap)` is at least `throughput * (1 + gap)`, so it is a bound whichever
    of the two usual gap definitions (relative to the bound or to the incumbent) was used.
    """
    if status is SolveStatus.OPTIMAL:
        return throughput
    if status is SolveStatus.INFEASIBLE:
        return 0.0
    if not math.isfinite(gap) or gap >= 1.0:
        return math.inf
    return throughput / (1.0 - max(gap, 0.0))


SOURCE, SINK = -1, -2


def _longest_path(p: Placement, attr: str) -> float:
    succ: dict[int, list[int]] = {}
    for u, v, f in p.edges:
        if f > 1e-9:
            succ.setdefault(u, []).append(v)
    memo: dict[int, float] = {}

    def longest(u: int) -> float:
        if u == SINK:
            return 0.0
        if u not in memo:
            own = 0.0 if u == SOURCE else getattr(p.nodes[u], attr)
            memo[u] = own + max((longest(v) for v in succ.get(u, [])), default=float("-inf"))
        return memo[u]

    value = longest(SOURCE)
    return 0.0 if value == float("-inf") else value
