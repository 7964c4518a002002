"""The online allocation problem and its answer, as plain numbers.

The solvers (`solve/ilp.py`, and the exhaustive oracle in `solve/bruteforce.py`) read only an
`AllocationProblem`: no catalog, no perf model, no template library. Turning a scenario and a
template library into one is `scenario/load.py`'s job, so every solver test can be written on a
hand-made instance.

Units
-----
- Demand is in **requests/s** per model, with the mean prompt and output length of a request.
- A template's `capacity` is in its mode's unit: requests/s (`aggregated`), prompt tokens/s
  (`prefill`), output tokens/s (`decode`).
- Prices are $/hour of one running instance; the start-up penalty is a one-off $ figure, the
  price of the hours an instance spends loading weights before it serves
  (`price_usd_per_hour * startup_s / 3600`).

Serving in PD (disaggregated) mode
----------------------------------
A model served by prefill and decode templates pairs them *inside one region*: the requests it
serves in region `r` need `input_tokens` prompt tokens/s of prefill capacity and
`output_tokens` output tokens/s of decode capacity there, each per request/s. So a model's
capacity in requests/s is its aggregated capacity plus, per region,
`min(prefill_capacity_r / input_tokens, decode_capacity_r / output_tokens)`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, Mapping, Sequence

Mode = Literal["aggregated", "prefill", "decode"]
MODES: tuple[Mode, ...] = ("aggregated", "prefill", "decode")

#: Relative gap at which an allocation solve stops: its plan is proven within this share of
#: the best. The one default of every solve (`coral plan --gap`, adapt, the baselines).
DEFAULT_MIP_GAP = 5e-3
#: Wall-clock budget of one allocation solve, all phases together, s (`--time-limit`).
DEFAULT_TIME_LIMIT_S = 10.0

NodeRegion = tuple[str, str]
"""(node type, region)."""
TemplateRegion = tuple[str, str]
"""(template id, region)."""

#: Relative slack with which a model counts as served in full (solver tolerances).
DEMAND_REL_TOL = 1e-6

#: What the allocator maximises when the demand cannot be met in full (`--scarcity`):
#: - `fair`: lexicographic, first the smallest served fraction over models (max-min,
#:   `fair_level`), then the priority-weighted generated tokens/s, then the lowest cost at that;
#: - `goodput`: the most priority-weighted requests/s served, then the lowest cost at that
#:   (a model whose requests take the most GPUs is dropped first, possibly entirely).
Scarcity = Literal["fair", "goodput"]
SCARCITY_OBJECTIVES: tuple[Scarcity, ...] = ("fair", "goodput")
DEFAULT_SCARCITY: Scarcity = "fair"

#: One line per scarcity objective, as `coral plan` and the plan file state it.
SCARCITY_DESCRIPTIONS = {
    "fair": "fair: max-min served fraction, then priority-weighted generated tokens/s, "
            "then cost",
    "goodput": "goodput: priority-weighted requests/s served, then cost",
}


class PlanStatus(str, Enum):
    """How far the allocator got.

    - `OPTIMAL`: every model's demand is met at a cost proven within the gap target.
    - `TIME_LIMIT`: the time limit stopped the search; the plan is the best one found and
      `gap` is its proven gap. Check `AllocationPlan.meets_demand`.
    - `INFEASIBLE`: the demand cannot be met in full with this availability (proven). The plan
      is the scarcity plan: the most priority-weighted goodput, then the lowest cost at it.
    - `FEASIBLE`: every model's demand is met, `gap` is the proven gap, above the target; the
      search ended before the time limit since no method it has could close the rest (see the
      plan's notes).
    """

    OPTIMAL = "optimal"
    TIME_LIMIT = "time_limit"
    INFEASIBLE = "infeasible"
    FEASIBLE = "feasible"

    @property
    def is_ok(self) -> bool:
        return self is PlanStatus.OPTIMAL


@dataclass(frozen=True)
class ModelDemand:
    """What one model must serve."""

    model: str
    requests_per_s: float
    input_tokens: float = 1.0  # mean prompt tokens per request (pairs prefill with decode)
    output_tokens: float = 1.0  # mean output tokens per request
    priority: float = 1.0  # weight of this model's requests/s in goodput under scarcity

    def __post_init__(self) -> None:
        _check_finite(f"demand of {self.model!r}: requests_per_s", self.requests_per_s, 0.0)
        _check_finite(f"demand of {self.model!r}: input_tokens", self.input_tokens, 0.0, True)
        _check_finite(f"demand of {self.model!r}: output_tokens", self.output_tokens, 0.0, True)
        _check_finite(f"demand of {self.model!r}: priority", self.priority, 0.0, True)

    def tokens_per_request(self, mode: Mode) -> float:
        """Capacity units one request/s takes in `mode` (1 for aggregated)."""
        if mode == "prefill":
            return self.input_tokens
        if mode == "decode":
            return self.output_tokens
        return 1.0


@dataclass(frozen=True)
class TemplateColumn:
    """One serving template as the allocator sees it: nodes, capacity, price per region.

    A template can run in a region only when every one of its node types is priced there;
    `price_usd_per_hour` lists exactly those regions.
    """

    id: str
    model: str
    mode: Mode
    node_counts: Mapping[str, int]  # node type -> nodes of that type in one instance
    capacity: float  # requests/s (aggregated), prompt tokens/s (prefill), output tokens/s (decode)
    price_usd_per_hour: Mapping[str, float]  # region -> $/hour of one instance

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"template {self.id!r}: mode {self.mode!r} is not one of {MODES}")
        counts = {str(g): int(n) for g, n in sorted(self.node_counts.items()) if int(n) != 0}
        if not counts or any(n < 0 for n in counts.values()):
            raise ValueError(
                f"template {self.id!r}: node_counts must be positive and non-empty, got "
                f"{dict(self.node_counts)}"
            )
        _check_finite(f"template {self.id!r}: capacity", self.capacity, 0.0, True)
        for region, price in self.price_usd_per_hour.items():
            _check_finite(f"template {self.id!r}: price in {region!r}", price, 0.0, True)
        object.__setattr__(self, "node_counts", counts)
        object.__setattr__(self, "price_usd_per_hour", dict(self.price_usd_per_hour))

    @property
    def num_nodes(self) -> int:
        return sum(self.node_counts.values())


def priced_column(
    id: str,
    model: str,
    mode: Mode,
    node_counts: Mapping[str, int],
    capacity: float,
    node_prices: Mapping[NodeRegion, float],
    regions: Sequence[str],
) -> TemplateColumn:
    """A `TemplateColumn` priced from per-node prices: in each region of `regions` where every
    node type is priced, the sum of its nodes' prices."""
    prices: dict[str, float] = {}
    for region in regions:
        total = 0.0
        for node_type, n in node_counts.items():
            price = node_prices.get((node_type, region))
            if price is None:
                break
            total += n * price
        else:
            prices[region] = total
    return TemplateColumn(id, model, mode, dict(node_counts), capacity, prices)


@dataclass(frozen=True)
class AllocationProblem:
    """Everything the allocator needs: demand, templates, regions, availability, current state.

    `availability[(node type, region)]` is how many nodes of that type the region can give;
    a pair that is missing has none. `current[(template id, region)]` is the deployment running
    now: keeping those instances is free, every instance beyond them pays the start-up penalty.
    """

    demands: tuple[ModelDemand, ...]
    templates: tuple[TemplateColumn, ...]
    regions: tuple[str, ...]
    availability: Mapping[NodeRegion, int]
    current: Mapping[TemplateRegion, int] = field(default_factory=dict)
    startup_s: float = 0.0  # seconds a new instance loads weights before it serves
    time_limit_s: float = DEFAULT_TIME_LIMIT_S  # wall-clock budget of one solve
    mip_gap: float = DEFAULT_MIP_GAP  # relative gap at which a solve counts as optimal
    scarcity: Scarcity = DEFAULT_SCARCITY  # the objective when demand cannot be met

    def __post_init__(self) -> None:
        if self.scarcity not in SCARCITY_OBJECTIVES:
            raise ValueError(f"scarcity must be one of {', '.join(SCARCITY_OBJECTIVES)}, got "
                             f"{self.scarcity!r}")
        object.__setattr__(self, "demands", tuple(self.demands))
        object.__setattr__(self, "templates", tuple(self.templates))
        object.__setattr__(self, "regions", tuple(self.regions))
        _unique("model", [d.model for d in self.demands])
        _unique("template id", [t.id for t in self.templates])
        _unique("region", list(self.regions))
        avail = {}
        for (node_type, region), n in self.availability.items():
            if int(n) != n or n < 0:
                raise ValueError(
                    f"availability of {node_type!r} in {region!r} must be a whole number >= 0, "
                    f"got {n!r}"
                )
            if n:
                avail[(str(node_type), str(region))] = int(n)
        object.__setattr__(self, "availability", avail)
        current = {}
        for (tid, region), n in self.current.items():
            if int(n) != n or n < 0:
                raise ValueError(
                    f"current count of template {tid!r} in {region!r} must be a whole number "
                    f">= 0, got {n!r}"
                )
            if n:
                current[(str(tid), str(region))] = int(n)
        object.__setattr__(self, "current", current)
        _check_finite("startup_s", self.startup_s, 0.0)
        _check_finite("time_limit_s", self.time_limit_s, 0.0, True)
        _check_finite("mip_gap", self.mip_gap, 0.0)

    def demand_of(self, model: str) -> ModelDemand | None:
        for d in self.demands:
            if d.model == model:
                return d
        return None

    def template(self, template_id: str) -> TemplateColumn:
        for t in self.templates:
            if t.id == template_id:
                return t
        raise KeyError(f"no template {template_id!r} in this problem")

    def penalty_usd(self, template: TemplateColumn, region: str) -> float:
        """One-off start-up cost of one new instance of `template` in `region`."""
        return template.price_usd_per_hour[region] * self.startup_s / 3600.0


@dataclass(frozen=True)
class AllocationPlan:
    """A deployment: instances per (template, region), what it costs and what it serves."""

    status: PlanStatus
    instances: Mapping[TemplateRegion, int]  # only non-zero counts
    cost_usd_per_hour: float
    penalty_usd: float  # one-off start-up cost of the instances started
    demand_rps: Mapping[str, float]  # model -> requests/s asked for
    capacity_rps: Mapping[str, float]  # model -> requests/s the plan can serve
    served_rps: Mapping[str, float]  # model -> min(demand, capacity)
    goodput: float  # sum over models of priority * served requests/s
    nodes_used: Mapping[NodeRegion, int]  # (node type, region) -> nodes
    started: Mapping[TemplateRegion, int]  # instances to start, against the current deployment
    stopped: Mapping[TemplateRegion, int]  # instances to stop
    gap: float  # proven relative gap of the cost (inf when nothing was proven)
    solve_s: float
    goodput_gap: float = 0.0  # proven relative gap of the goodput phase (scarcity only)
    notes: tuple[str, ...] = ()
    scarcity: Scarcity = DEFAULT_SCARCITY  # the objective the plan was sought by if short
    tokens_per_s: float = 0.0  # generated tokens/s served: served req/s x output tokens
    #: priority-weighted generated tokens/s: what the fair objective's tokens phase maximises
    priority_tokens_per_s: float = 0.0
    fair_level: float = 1.0  # smallest served fraction (`fair_levels`)
    #: proven relative gap of each scarcity phase, by name, in order (fair: `fairness`,
    #: `tokens`, `cost`; goodput: `goodput`, `cost`); empty when demand is met
    phase_gaps: Mapping[str, float] = field(default_factory=dict)
    phase_s: Mapping[str, float] = field(default_factory=dict)  # seconds of each phase

    @property
    def is_ok(self) -> bool:
        """Demand met in full, at a cost proven within the gap target."""
        return self.status.is_ok

    @property
    def objective(self) -> float:
        return self.cost_usd_per_hour + self.penalty_usd

    @property
    def proof(self) -> str:
        """How the plan was reached, in a few words: its status and proven gaps, e.g.
        "time limit, gap 1.76%" or, under scarcity, "demand short, goodput gap 0.10%, cost
        gap 0.20%" (a gap with nothing proven reads "no bound")."""
        def pct(gap: float) -> str:
            return f"{gap:.2%}" if math.isfinite(gap) else "no bound"

        if self.scarcity == "fair" and self.phase_gaps and not self.meets_demand:
            return "demand short, fair: " + ", ".join(
                f"{name} gap {pct(gap)}" for name, gap in self.phase_gaps.items())
        if self.status is PlanStatus.INFEASIBLE:
            return f"demand short, goodput gap {pct(self.goodput_gap)}, cost gap {pct(self.gap)}"
        return f"{self.status.value.replace('_', ' ')}, gap {pct(self.gap)}"

    @property
    def shortfall_rps(self) -> dict[str, float]:
        """Requests/s of each model's demand the plan does not serve (0 when met)."""
        return {m: max(0.0, d - self.served_rps.get(m, 0.0)) for m, d in self.demand_rps.items()}

    @property
    def served_fraction(self) -> dict[str, float]:
        return {
            m: (self.served_rps.get(m, 0.0) / d if d > 0 else 1.0)
            for m, d in self.demand_rps.items()
        }

    @property
    def min_served_fraction(self) -> float:
        """The smallest share of its demand any model gets (1 when every demand is met)."""
        return min(self.served_fraction.values(), default=1.0)

    @property
    def headroom_rps(self) -> dict[str, float]:
        """Capacity beyond demand per model (negative: shortfall)."""
        return {m: self.capacity_rps.get(m, 0.0) - d for m, d in self.demand_rps.items()}

    @property
    def short_models(self) -> tuple[str, ...]:
        """Models whose demand the plan does not meet, by name."""
        return tuple(
            sorted(
                m
                for m, short in self.shortfall_rps.items()
                if short > DEMAND_REL_TOL * max(1.0, self.demand_rps[m])
            )
        )

    @property
    def meets_demand(self) -> bool:
        return not self.short_models

    @property
    def total_instances(self) -> int:
        return sum(self.instances.values())


def model_capacity_rps(
    problem: AllocationProblem, instances: Mapping[TemplateRegion, int]
) -> dict[str, float]:
    """Requests/s each model can serve with `instances` (PD halves paired per region)."""
    by_id = {t.id: t for t in problem.templates}
    agg: dict[str, float] = {}
    pd: dict[tuple[str, str, str], float] = {}  # (model, mode, region) -> capacity
    for (tid, region), n in instances.items():
        t = by_id[tid]
        if t.mode == "aggregated":
            agg[t.model] = agg.get(t.model, 0.0) + n * t.capacity
        else:
            key = (t.model, t.mode, region)
            pd[key] = pd.get(key, 0.0) + n * t.capacity
    capacity: dict[str, float] = {}
    for d in problem.demands:
        total = agg.get(d.model, 0.0)
        for region in problem.regions:
            prefill = pd.get((d.model, "prefill", region), 0.0)
            decode = pd.get((d.model, "decode", region), 0.0)
            total += min(prefill / d.input_tokens, decode / d.output_tokens)
        capacity[d.model] = total
    return capacity


def make_plan(
    problem: AllocationProblem,
    instances: Mapping[TemplateRegion, int],
    *,
    status: PlanStatus,
    gap: float,
    solve_s: float,
    goodput_gap: float = 0.0,
    notes: Sequence[str] = (),
    phase_gaps: Mapping[str, float] | None = None,
    phase_s: Mapping[str, float] | None = None,
) -> AllocationPlan:
    """Decode instance counts into a plan: cost, penalty, capacity, nodes and the diff.

    Prefill (decode) instances of a model in a region with no decode (prefill) instance of
    it there serve nothing (a request needs both halves in one region) and are left out: a
    solve stopped by its time limit can hold them, and no reader of the plan could route to
    them. Leaving them out only lowers the cost and serves the same.
    """
    by_id = {t.id: t for t in problem.templates}
    counts = {k: int(n) for k, n in sorted(instances.items()) if int(n) > 0}
    halves: dict[tuple[str, str], set[str]] = {}
    for tid, region in counts:
        t = by_id[tid]
        if t.mode in ("prefill", "decode"):
            halves.setdefault((t.model, region), set()).add(t.mode)
    unpaired = {key for key, modes in halves.items() if len(modes) < 2}
    if unpaired:
        counts = {(tid, region): n for (tid, region), n in counts.items()
                  if (by_id[tid].model, region) not in unpaired
                  or by_id[tid].mode not in ("prefill", "decode")}
        notes = (*notes, "left out unpaired prefill/decode halves (they serve nothing): "
                 + ", ".join(f"{m} in {r}" for m, r in sorted(unpaired)))
    cost = 0.0
    penalty = 0.0
    nodes: dict[NodeRegion, int] = {}
    started: dict[TemplateRegion, int] = {}
    for (tid, region), n in counts.items():
        t = by_id[tid]
        cost += n * t.price_usd_per_hour[region]
        new = n - problem.current.get((tid, region), 0)
        if new > 0:
            started[(tid, region)] = new
            penalty += new * problem.penalty_usd(t, region)
        for node_type, k in t.node_counts.items():
            nodes[(node_type, region)] = nodes.get((node_type, region), 0) + k * n
    stopped = {
        key: n - counts.get(key, 0)
        for key, n in sorted(problem.current.items())
        if n > counts.get(key, 0)
    }
    capacity = model_capacity_rps(problem, counts)
    demand = {d.model: d.requests_per_s for d in problem.demands}
    served = {m: min(demand[m], capacity[m]) for m in demand}
    goodput = sum(d.priority * served[d.model] for d in problem.demands)
    levels = fair_levels(problem.demands, served)
    return AllocationPlan(
        status=status,
        instances=counts,
        cost_usd_per_hour=cost,
        penalty_usd=penalty,
        demand_rps=demand,
        capacity_rps=capacity,
        served_rps=served,
        goodput=goodput,
        nodes_used=dict(sorted(nodes.items())),
        started=started,
        stopped=stopped,
        gap=gap,
        solve_s=solve_s,
        goodput_gap=goodput_gap,
        notes=tuple(notes),
        scarcity=problem.scarcity,
        tokens_per_s=sum(d.output_tokens * served[d.model] for d in problem.demands),
        priority_tokens_per_s=sum(d.priority * d.output_tokens * served[d.model]
                                  for d in problem.demands),
        fair_level=min(levels.values(), default=1.0),
        phase_gaps=dict(phase_gaps or {}),
        phase_s=dict(phase_s or {}),
    )


def fair_weights(demands: Sequence[ModelDemand]) -> dict[str, float]:
    """Each model's share of the fair floor: 1 for every model with demand.

    The fair objective raises `t` with every model served at least `weight * t` of its
    demand (`t <= 1`). Priority is kept out of the floor on purpose: a floor in proportion to
    priority would let a model of lower priority fall below what the paper's uniform
    scale-down rule gives every model, so a plan could starve it further than any baseline
    does. Priority acts above the floor instead, in the tokens phase
    (`coral.allocator.scarcity.fair`: the most priority-weighted generated tokens/s with the
    floor held).
    """
    return {d.model: 1.0 for d in demands if d.requests_per_s > 0}


def fair_levels(demands: Sequence[ModelDemand], served_rps: Mapping[str, float]
                ) -> dict[str, float]:
    """Per model with demand, the largest `t <= 1` its served req/s meets as the fair floor
    `weight * t * demand` (`fair_weights`); their minimum is the plan's `fair_level`."""
    weights = fair_weights(demands)
    return {d.model: min(1.0, served_rps.get(d.model, 0.0) / (weights[d.model]
                                                            * d.requests_per_s))
            for d in demands if d.requests_per_s > 0}


def _check_finite(what: str, value: float, low: float, strict: bool = False) -> None:
    ok = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
    )
    if ok:
        ok = value > low if strict else value >= low
    if not ok:
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise ValueError(f"{what} must be a finite number {bound}, got {value!r}")


def _unique(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{kind} {name!r} is listed twice")
        seen.add(name)
