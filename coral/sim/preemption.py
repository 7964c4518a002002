"""Node preemptions of a plan's spot instances during a simulation (`coral simulate
--preemptions`): the notice, the kill, the fail-over of in-flight requests, and the re-plan
that starts replacements.

The preemption model
    A spot node belongs to the pool (node type, region). The catalog's
    `preemption_rate_per_hour(node_type, region)` is a node's hazard (preemptions per
    node-hour). Each pool has events as a Poisson process at that rate: with `share` 1 (the
    default) an event reclaims *every* spot node of the pool, so each node is reclaimed at
    the catalog's rate and the nodes of a pool go together. This is the planner's model (a pool is lost as a whole or not at all; see
    `coral.allocator.spot*`), so a plan's chance constraint and this simulation judge the same
    risk. `share` f < 1 weakens the correlation at the same per-node rate: events come at
    rate / f and each reclaims each spot node of the pool with probability f. A spot
    instance (a plan row with `"market": "spot"`; rows without it are on demand) is
    reclaimed when any of its spot nodes is. Each pool draws its events from its own stream
    (seeded by the seed and the pool's name), so a run is deterministic for a seed and one
    pool's events do not depend on which other pools exist.

What an event does (the runtime's controller does the same, `coral.runtime.controller`)
    1. Notice (at the event): every reclaimed instance leaves routing; the requests queued
       there that have produced no token move to the model's other instances (`rerouted`);
       the ones it runs go on until the kill. Starting instances that are reclaimed are
       cancelled at once.
    2. Re-plan (at the event): the `Replanner` gets the deployment that survives (running and
       starting instances, by (template id, region)) and returns the plan to move to, as the
       adaptation loop re-plans (`coral.planning.preemption_replan`: the allocator with the
       start-up penalty, keeping survivors free). Rows it adds are started and serve after
       `startup_s`, costing from when they are asked for; instances it drops go on serving
       until then (make before break, as the controller reconfigures), and then drain (out
       of routing, they finish what they run, and cost until they have).
    3. Kill (`preemption_notice_s(region)` later): a request whose text has not started is
       run again from its prompt on another instance of its model (`retried`); one whose
       first token was sent fails (`failed`, status "failed": the client got a broken
       stream, which it may resend). While a model has no ready instance its new requests
       are rejected and its retries fail, as the gateway answers 503 then.

Cost is every instance's price over the time it was held (from 0 or from its request, to its
kill, the end of its drain, or the horizon), clipped to the simulated horizon.
"""

from __future__ import annotations

import time
import zlib
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from coral.errors import CoralError
from coral.sim import pd
from coral.plans.file import PlanRow
from coral.sim.deployment import InstanceSpec, instances_from_rows
from coral.sim.event_loop import Simulator
from coral.sim.results import SimResult
from coral.sim.model_router import SimModelRouter
from coral.sim.scheduler import Seq, SimInstance
from coral.templates.slo import SloSpec

#: (template id, region): what the allocator counts instances by.
Key = tuple[str, str]
SPOT = "spot"
ON_DEMAND = "on_demand"
#: Seconds a new instance loads before it serves when the plan does not say (the scenario
#: default, `coral.allocator.scenario.load`).
DEFAULT_STARTUP_S = 300.0


class PreemptionError(CoralError, ValueError):
    """Preemptions cannot be simulated as asked."""


class PreemptionRates(Protocol):
    """Where the figures come from (the catalog's spot figures)."""

    def preemption_rate_per_hour(self, node_type: str, region: str) -> float: ...

    def preemption_notice_s(self, region: str) -> float: ...


def check_rates(catalog: Any) -> PreemptionRates:
    """`catalog` if it carries preemption figures, else `PreemptionError` saying so."""
    if not (callable(getattr(catalog, "preemption_rate_per_hour", None))
            and callable(getattr(catalog, "preemption_notice_s", None))):
        raise PreemptionError("this catalog has no preemption figures "
                              "(preemption_rate_per_hour, preemption_notice_s); to fix: use a "
                              "catalog with spot data")
    return catalog


def row_market(row: PlanRow) -> str:
    """A row's market: `spot` or `on_demand` (missing: on demand)."""
    if row.market not in (SPOT, ON_DEMAND):
        raise PreemptionError(f"instance {row.template_id!r}: market must be 'spot' or "
                              f"'on_demand', got {row.market!r}")
    return row.market


def row_pools(row: PlanRow) -> frozenset[tuple[str, str]]:
    """The pools (node type, region) of a row's nodes."""
    return frozenset((g, row.region) for g in row.node_counts)


def pool_rng(seed: int, pool: tuple[str, str]) -> np.random.Generator:
    """The pool's own random stream."""
    return np.random.default_rng([seed, zlib.crc32(f"{pool[0]}@{pool[1]}".encode())])


def draw_pool_events(rate_per_hour: float, horizon_s: float, rng: np.random.Generator,
                     share: float = 1.0) -> list[float]:
    """Event times in [0, horizon_s) of a Poisson process at `rate_per_hour / share`."""
    if not rate_per_hour > 0 or not horizon_s > 0:
        return []
    rate_s = rate_per_hour / share / 3600.0
    times, t = [], 0.0
    while True:
        t += float(rng.exponential(1.0 / rate_s))
        if t >= horizon_s:
            return times
        times.append(t)


class Replanner(Protocol):
    """The plan to move to after a preemption, given the surviving deployment."""

    def __call__(self, running: Mapping[Key, int], t: float) -> Sequence[PlanRow]: ...


@dataclass
class KeepPlan:
    """Re-plans to the original plan: every lost instance is replaced like for like."""

    rows: Sequence[PlanRow]

    def __call__(self, running: Mapping[Key, int], t: float) -> Sequence[PlanRow]:
        return self.rows


@dataclass(frozen=True)
class PreemptionConfig:
    seed: int = 0
    """Seed of every pool's events."""
    share: float = 1.0
    """Share of a pool's spot nodes one event reclaims (1: all of them; see the module)."""
    startup_s: float = DEFAULT_STARTUP_S
    """Seconds from asking for a replacement to its serving."""
    horizon_s: float | None = None
    """Events are drawn in [0, horizon); cost is counted to it (None: the last arrival)."""

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise PreemptionError(f"share must be in (0, 1], got {self.share}")
        if self.startup_s < 0:
            raise PreemptionError(f"startup_s must be >= 0, got {self.startup_s}")


class _Sink(deque):
    """The queue of a killed instance: whatever reaches it (a KV cache still in flight to a
    decode instance) fails."""

    def __init__(self, run: "PreemptionRun"):
        super().__init__()
        self.run = run

    def append(self, s: Seq) -> None:  # type: ignore[override]
        self.run.fail(s)

    appendleft = append


@dataclass
class Life:
    """One instance over its life: starting, serving, retiring (a re-plan dropped it: it
    serves until the replacements do), draining, doomed (noticed), dead or cancelled."""

    inst: SimInstance
    key: Key
    market: str
    pools: frozenset[tuple[str, str]]
    start_s: float
    state: str = "serving"
    end_s: float | None = None
    held: list[Seq] = field(default_factory=list)  # a draining instance's last requests


class PreemptionRun:
    """Attaches preemptions to a `Simulator` built from `rows` (instance names as
    `instances_from_plan` gives them): `install()` before `sim.run`, `report()` after."""

    def __init__(self, sim: Simulator, rows: Sequence[PlanRow], slos: Mapping[str, SloSpec],
                 rates: PreemptionRates, replanner: Replanner,
                 config: PreemptionConfig = PreemptionConfig(),
                 on_event: Callable[[str], None] | None = None):
        self.sim, self.slos, self.rates = sim, slos, rates
        self.replanner, self.cfg, self.on_event = replanner, config, on_event
        by_name = {i.spec.name: i for i in sim.instances}
        self.lives: list[Life] = []
        for row in rows:
            key, market = (row.template_id, row.region), row_market(row)
            pools = row_pools(row) if market == SPOT else frozenset()
            for k in range(row.count):
                inst = by_name.get(f"{row.name}#{k}")
                if inst is None:
                    raise PreemptionError(f"the simulator has no instance {k} of row "
                                          f"{key[0]!r} in {key[1]!r}")
                self.lives.append(Life(inst, key, market, pools, 0.0))
        self.life_of = {id(lf.inst): lf for lf in self.lives}
        self.counts: Counter[str] = Counter()
        self.replan_s: list[float] = []
        self._serial = 0

    # ---- setup ----

    def pools(self, extra: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
        """Pools whose events are drawn: those of the plan's spot rows, and `extra`."""
        return sorted({p for lf in self.lives for p in lf.pools} | set(extra))

    def install(self, horizon_s: float, extra_pools: Sequence[tuple[str, str]] = ()) -> None:
        """Draw every pool's events in [0, horizon_s) and put them on the simulator's clock."""
        self.horizon_s = self.cfg.horizon_s if self.cfg.horizon_s is not None else horizon_s
        self.events: list[tuple[float, tuple[str, str]]] = []
        for pool in self.pools(extra_pools):
            rng = pool_rng(self.cfg.seed, pool)
            rate = float(self.rates.preemption_rate_per_hour(*pool))
            for t in draw_pool_events(rate, self.horizon_s, rng, self.cfg.share):
                self.events.append((t, pool))
                self.sim.at(t, lambda now, pool=pool, rng=rng: self._event(now, pool, rng))
        self.events.sort()

    def preempt_at(self, t: float, pool: tuple[str, str]) -> None:
        """One more event in `pool` at `t` (beside the drawn ones: for a chosen scenario)."""
        rng = pool_rng(self.cfg.seed + 1, pool)
        self.sim.at(t, lambda now: self._event(now, pool, rng))

    # ---- routing ----

    def reroute(self) -> None:
        """Rebuild every router over the serving instances (a prefill instance only while
        its region has a serving decode instance of its model, a decode instance only while
        its model has a prefill instance), keeping their load counts."""
        live = [lf.inst for lf in self.lives if lf.state in ("serving", "retiring")]
        decode_at = {(i.spec.model, i.spec.region) for i in live if i.spec.role == "decode"}
        live = [i for i in live if i.spec.role != "prefill"
                or (i.spec.model, i.spec.region) in decode_at]
        fed = {i.spec.model for i in live if i.spec.role == "prefill"}
        live = [i for i in live if i.spec.role != "decode" or i.spec.model in fed]
        by_model: dict[str, list[SimInstance]] = {}
        for i in live:
            if i.spec.role != "decode":
                by_model.setdefault(i.spec.model, []).append(i)
        routers = {m: SimModelRouter(v) for m, v in by_model.items()}
        decode_routers = pd.wire(live, routers, self.sim.catalog) if fed else {}
        for r in (*routers.values(), *decode_routers.values()):
            r.inflight[:] = [len(i.waiting) + len(i.running) for i in r.insts]
            r.backlog[:] = [getattr(i, "held", 0) for i in r.insts]
        self.sim.routers.clear()
        self.sim.routers.update(routers)
        self.sim.decode_routers = decode_routers

    def send(self, s: Seq, t: float) -> bool:
        """Route `s` (no token of it sent yet) afresh, from its prompt; False (and `s`
        failed) when its model has no serving instance."""
        router = self.sim.routers.get(s.req.model)
        inst = router.pick() if router is not None else None
        if router is None or inst is None:
            self.fail(s)
            return False
        pd.release(s)
        s.target, s.ctx, s.generated, s.off, s.fin = s.req.prompt_tokens, 0, 0, -1, -1
        s.decode_instance, s.transfer_s = "", None
        s.instance = inst.spec.name
        router.inflight[inst.slot] += 1
        inst.enqueue(s, t)
        return True

    def fail(self, s: Seq) -> None:
        if s.status == "unfinished":
            s.status = "failed"  # type: ignore[assignment]

    def _move_queue(self, inst: SimInstance, t: float) -> None:
        """Send the requests queued at `inst` that have no token yet to other instances."""
        keep: list[Seq] = []
        moving: list[Seq] = []
        for s in inst.waiting:
            (moving if s.first_token_s is None and s.generated == 0 else keep).append(s)
        if not moving:
            return
        inst.waiting.clear()
        inst.waiting.extend(keep)
        for s in moving:
            if self.send(s, t):
                self.counts["rerouted"] += 1

    # ---- events ----

    def _say(self, text: str) -> None:
        if self.on_event is not None:
            self.on_event(text)

    def _event(self, t: float, pool: tuple[str, str], rng: np.random.Generator) -> None:
        """A preemption event in `pool` at `t`: notice, re-plan (see the module)."""
        self.counts["events_drawn"] += 1
        hit = []
        for lf in self.lives:
            if pool not in lf.pools or lf.state not in ("serving", "starting", "retiring",
                                                        "draining"):
                continue
            if self.cfg.share < 1:
                nodes = sum(g == pool[0] for g in lf.inst.spec.node_types)
                if not (rng.random(max(nodes, 1)) < self.cfg.share).any():
                    continue
            hit.append(lf)
        if not hit:
            return
        self.counts["events"] += 1
        notice_s = float(self.rates.preemption_notice_s(pool[1]))
        for lf in hit:
            self.counts["instances_reclaimed"] += 1
            if lf.state == "starting":
                lf.state, lf.end_s = "cancelled", t
                continue
            was_routed = lf.state in ("serving", "retiring")
            lf.state = "doomed"
            if was_routed:
                self.reroute()
                self._move_queue(lf.inst, t)
            self.sim.at(t + notice_s, lambda now, lf=lf: self._kill(now, lf))
        self._say(f"{t:,.0f} s: {pool[0]} in {pool[1]} reclaimed {len(hit)} instance(s), "
                  f"notice {notice_s:g} s")
        self._replan(t)

    def _kill(self, t: float, lf: Life) -> None:
        """The reclaimed instance's nodes go: fail over what it still holds."""
        inst = lf.inst
        lf.state, lf.end_s = "dead", t
        held = [s for s in (*inst.waiting, *inst.running) if s.status == "unfinished"]
        inst.waiting = _Sink(self)
        inst.running, inst.prefilling = {}, {}
        inst.fin, inst.fin_clocks = {}, []
        inst.n_decode = inst.ctx_base = inst.kv_used = 0
        inst.step, inst.step_end = None, -1.0
        for s in held:
            if s.first_token_s is None and s.generated == 0:
                self.counts["retried"] += 1
                self.send(s, t)
            else:
                self.fail(s)

    def _ready(self, t: float, lf: Life) -> None:
        if lf.state == "starting":
            lf.state = "serving"
            self.reroute()

    def _replan(self, t: float) -> None:
        """Move to the replanner's plan from the surviving deployment (see the module)."""
        alive = [lf for lf in self.lives if lf.state in ("serving", "starting")]
        running = Counter(lf.key for lf in alive)
        t0 = time.process_time()
        rows = self.replanner(dict(running), t)
        self.replan_s.append(time.process_time() - t0)
        self.counts["replans"] += 1
        target: Counter[Key] = Counter()
        row_of: dict[Key, PlanRow] = {}
        for row in rows:
            key = (row.template_id, row.region)
            target[key] += row.count
            row_of[key] = row
        started = stopped = 0
        for key, want in sorted(target.items()):
            for _ in range(want - running.get(key, 0)):
                self._start(row_of[key], t)
                started += 1
        for key, have in sorted(running.items()):
            extra = have - target.get(key, 0)
            # cancel starting instances first, then retire the newest serving ones
            for lf in sorted((lf for lf in alive if lf.key == key),
                             key=lambda lf: (lf.state != "starting", -lf.start_s))[:extra]:
                stopped += 1
                if lf.state == "starting":
                    lf.state, lf.end_s = "cancelled", t
                else:  # make before break: it serves until the new instances do
                    lf.state = "retiring"
                    self.sim.at(t + self.cfg.startup_s, lambda now, lf=lf: self._drain(now, lf))
        self.counts["replacements_started"] += started
        self.counts["instances_stopped"] += stopped
        if started or stopped:
            self._say(f"{t:,.0f} s: re-plan started {started}, stopped {stopped}")

    def _drain(self, t: float, lf: Life) -> None:
        """A retired instance leaves routing and finishes what it runs."""
        if lf.state != "retiring":
            return
        lf.state = "draining"
        self.reroute()
        self._move_queue(lf.inst, t)
        lf.held = [s for s in (*lf.inst.waiting, *lf.inst.running)]
        lf.end_s = t

    def _start(self, row: PlanRow, t: float) -> None:
        self._serial += 1
        spec = instances_from_rows([replace(row, count=1)], self.slos)[0]
        spec = replace(spec, name=f"{row.name}#r{self._serial}")
        inst = self.sim.add_instance(spec)
        market = row_market(row)
        lf = Life(inst, (row.template_id, row.region), market,
                  row_pools(row) if market == SPOT else frozenset(), t, state="starting")
        self.lives.append(lf)
        self.life_of[id(inst)] = lf
        self.sim.at(t + self.cfg.startup_s, lambda now, lf=lf: self._ready(now, lf))

    # ---- results ----

    def held_until(self, lf: Life, horizon: float) -> float:
        """When `lf`'s instance stops costing (clipped to `horizon`)."""
        if lf.state == "draining":  # until its last request ends
            ends = [s.end_s if s.end_s is not None else horizon for s in lf.held]
            return min(max([lf.end_s or 0.0, *ends]), horizon)
        return min(lf.end_s if lf.end_s is not None else horizon, horizon)

    def report(self, result: SimResult) -> dict[str, Any]:
        """The run's preemption figures and its cost over the horizon."""
        horizon = self.horizon_s
        cost = sum(lf.inst.spec.usd_per_hour * max(0.0, self.held_until(lf, horizon)
                                                  - min(lf.start_s, horizon)) / 3600.0
                   for lf in self.lives)
        planned = sum(lf.inst.spec.usd_per_hour for lf in self.lives if lf.start_s == 0.0)
        statuses = Counter(r.status for r in result.requests)
        spot = [lf for lf in self.lives if lf.start_s == 0.0 and lf.market == SPOT]
        return {
            "seed": self.cfg.seed,
            "share": self.cfg.share,
            "horizon_s": horizon,
            "startup_s": self.cfg.startup_s,
            "pools": len(self.pools()),
            "spot_instances": len(spot),
            "events_drawn": len(self.events),
            "events": self.counts["events"],
            "instances_reclaimed": self.counts["instances_reclaimed"],
            "replans": self.counts["replans"],
            "replan_cpu_s": sum(self.replan_s),
            "replacements_started": self.counts["replacements_started"],
            "instances_stopped": self.counts["instances_stopped"],
            "requests_rerouted": self.counts["rerouted"],
            "requests_retried": self.counts["retried"],
            "requests_failed": statuses.get("failed", 0),
            "requests_rejected": statuses.get("rejected", 0),
            "planned_cost_per_hour": planned,
            "cost_usd": cost,
            "cost_per_hour": cost / (horizon / 3600.0) if horizon > 0 else None,
        }
