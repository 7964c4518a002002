"""The controller: several instances per model behind the gateway, failure handling, and live
reconfiguration.

The `Controller` holds the plan (the instances that should run) as its desired state and
reconciles toward it. It watches every instance's workers (exit or silence); a failed instance
is taken out of routing, what is left of it is killed, and a replacement is started through
the provisioner (`LocalProvisioner`: worker processes on this machine), under the same name.
Consecutive failures of one instance (a failed start, or a death before it stayed ready for
`stable_s`) back off exponentially; after `max_restarts` of them the instance is reported
`failed` and left alone until the next reconfiguration (`coral.runtime.restart_slot`). Each served model's requests go
through its `GatewayModelRouter` (`coral.runtime.model_router`), which routes to ready instances
only and lets a request wait for a replacement rather than fail.

Moving from one plan to another drops no request: start the new instances, wait until they are
ready, shift traffic to them, drain the old ones (they finish what they accepted) and stop them.

A preemption notice (`notice(name, notice_s)`: a spot node of the instance is reclaimed in
`notice_s` seconds; the provisioner delivers it, see `LocalProvisioner.preempt`) is acted on at
once: the instance leaves routing, so its model's other instances take the new requests; its
slot starts a replacement (the same plan row, under the same name) as a lost instance's does,
without counting a failure; the noticed instance finishes what it runs and is stopped as soon
as it is idle, or when its nodes go (the kill) or the notice runs out, whichever comes first.
Requests it still holds then fail over as a lost instance's do: run again from the prompt on
another instance when none of their text has reached the client, else ended with a retriable
error.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

from coral.runtime.instance import (  # noqa: F401 - re-exported: the controller's vocabulary
    Instance,
    RuntimeInstanceSpec,
    InstanceStatus,
    LocalProvisioner,
    Provisioner,
)
from coral.runtime.model_router import (  # noqa: F401 - re-exported
    MAX_ATTEMPTS,
    UNAVAILABLE_WAIT_S,
    GatewayModelRouter,
)
from coral.runtime.restart_slot import RestartSlot

log = logging.getLogger(__name__)

#: How often the controller checks its instances' health and reconciles them with the plan.
MONITOR_S = 0.2
#: Longest wait for an old instance to finish its accepted requests before it is stopped.
DRAIN_TIMEOUT_S = 120.0
#: Delay before the second consecutive restart of an instance; doubled for every further
#: failure up to RESTART_BACKOFF_MAX_S. The first restart after a failure is immediate.
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_MAX_S = 15.0
#: Consecutive failures of one instance after which it is reported failed, not restarted.
MAX_RESTARTS = 10
#: An instance ready this long has recovered: its count of consecutive failures resets.
STABLE_S = 10.0
#: How long close() waits for restarts in progress (they stop what they started themselves).
CLOSE_JOIN_S = 10.0


@dataclass
class ReconfigureReport:
    started: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    drain_s: float = 0.0
    drained_requests: int = 0
    """Requests in flight on the old instances when traffic moved off them."""


@dataclass
class PreemptionRecord:
    """One preemption notice the controller acted on."""

    instance: str
    notice_s: float
    in_flight: int
    """Requests in flight on the instance when the notice came."""
    noticed_at: float = field(default_factory=time.monotonic)
    stopped_at: float | None = None
    how: str = ""
    """`drained` (idle before its nodes went), `killed` (its nodes went first) or `deadline`
    (the notice ran out)."""


class Controller:
    """Deploys instances, keeps them running as planned, and reconfigures them live.

    `models` is the mapping to pass to `create_app`: it is updated in place, so the gateway sees
    models that a reconfiguration adds.
    """

    def __init__(self, provisioner: str | Provisioner = "local", *,
                 monitor_s: float = MONITOR_S, drain_timeout_s: float = DRAIN_TIMEOUT_S,
                 load_slack: int = 4, heartbeat_timeout_s: float | None = None,
                 max_restarts: int = MAX_RESTARTS, restart_backoff_s: float = RESTART_BACKOFF_S,
                 restart_backoff_max_s: float = RESTART_BACKOFF_MAX_S,
                 stable_s: float = STABLE_S, wait_s: float = UNAVAILABLE_WAIT_S):
        """`heartbeat_timeout_s`: a worker silent this long makes its instance dead (default:
        the executor's own timeout). `max_restarts`: consecutive failures of one instance
        after which it is reported failed; `restart_backoff_s` .. `restart_backoff_max_s`: the
        exponential delay between them; `stable_s`: how long a replacement must stay ready for
        its failures to be forgotten. `wait_s`: longest a request waits for a ready instance."""
        if provisioner == "local":
            provisioner = LocalProvisioner()
        elif isinstance(provisioner, str):
            raise ValueError(f"unknown provisioner '{provisioner}' (known: local)")
        if max_restarts < 0:
            raise ValueError(f"max_restarts ({max_restarts}) must be at least 0")
        self.provisioner = provisioner
        self.drain_timeout_s = drain_timeout_s
        self.load_slack = load_slack
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.max_restarts = max_restarts
        self.restart_backoff_s = restart_backoff_s
        self.restart_backoff_max_s = restart_backoff_max_s
        self.stable_s = stable_s
        self.wait_s = wait_s
        self.models: dict[str, GatewayModelRouter] = {}
        self._instances: dict[str, Instance] = {}  # the current object of every slot
        self._slots: dict[str, RestartSlot] = {}  # the desired state: one per planned instance
        self._lock = threading.RLock()  # one reconfiguration at a time
        self._state = threading.RLock()  # instances, slots and routers' membership
        self.dead: list[str] = []  # names of instances found dead, in order
        self.preemptions: list[PreemptionRecord] = []
        self._noticed: list[tuple[Instance, PreemptionRecord]] = []  # not stopped yet
        self._disposing: list[threading.Thread] = []  # killing what is left of dead ones
        self._closing = threading.Event()
        if hasattr(provisioner, "on_notice"):  # the provisioner delivers notices here
            provisioner.on_notice = self.notice
        self._monitor = threading.Thread(target=self._watch, args=(monitor_s,),
                                         name="coral-controller", daemon=True)
        self._monitor.start()

    @property
    def instances(self) -> dict[str, Instance]:
        with self._state:
            return dict(self._instances)

    def status(self) -> list[InstanceStatus]:
        """Every planned instance's state."""
        now = time.monotonic()
        with self._state:
            return [slot.status(now) for slot in self._slots.values()]

    def _model_status(self, model: str) -> list[InstanceStatus]:
        return [s for s in self.status() if s.model == model]

    def deploy(self, specs: Sequence[RuntimeInstanceSpec]) -> ReconfigureReport:
        return self.reconfigure(specs)

    def reconfigure(self, specs: Sequence[RuntimeInstanceSpec], *,
                    on_ready: Callable[[], None] | None = None) -> ReconfigureReport:
        """Move to `specs` without dropping requests. Instances whose name and pipeline are
        unchanged and that are ready are kept (their weight is updated); the others are
        started, or drained and stopped. If a new instance fails to start, the ones started
        are stopped and the old configuration stays. `on_ready` is called once the new
        instances are up, before traffic moves to them."""
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"instance names must be unique: {names}")
        report = ReconfigureReport()
        with self._lock:
            with self._state:
                current = dict(self._instances)
            keep = {s.name for s in specs if s.name in current
                    and current[s.name].spec.pipeline == s.pipeline
                    and current[s.name].spec.served_name == s.served_name
                    and current[s.name].state == "active"}
            started = {i.name: i for i in self._start_all([s for s in specs
                                                           if s.name not in keep])}
            if on_ready is not None:
                on_ready()
            now = time.monotonic()
            with self._state:
                slots: dict[str, RestartSlot] = {}
                for spec in specs:
                    if spec.name in keep:  # its slot goes on (a restart in flight counts)
                        slot = self._slots[spec.name]
                        slot.spec = spec
                        if slot.instance is not None:
                            slot.instance.spec = spec  # new weight
                    else:
                        slot = RestartSlot(spec, started[spec.name])
                        slot.instance.state, slot.instance.ready_s = "active", now
                    slots[spec.name] = slot
                # everything not kept drains: instances of names that leave the plan or are
                # replaced, including ones a restart brought back during the start above
                old = [i for n, i in self._instances.items() if n not in keep]
                for inst in old:
                    if inst.state == "active":
                        inst.state = "draining"
                self._slots = slots
                self._instances = {n: s.instance for n, s in slots.items()
                                   if s.instance is not None}
                by_model: dict[str, list[RuntimeInstanceSpec]] = {}
                for spec in specs:
                    by_model.setdefault(spec.served_name, []).append(spec)
                for model, model_specs in by_model.items():
                    router = self.models.get(model)
                    if router is None:
                        router = GatewayModelRouter(model, load_slack=self.load_slack,
                                                    wait_s=self.wait_s)
                        router.status_of = lambda m=model: self._model_status(m)
                    router.set_active([slots[s.name].instance for s in model_specs
                                       if slots[s.name].instance is not None
                                       and slots[s.name].instance.state == "active"])
                    router.plan(model_specs)
                    self.models[model] = router
            report.started = sorted(started)
            report.kept = sorted(keep)
            report.drained_requests = sum(i.in_flight for i in old)
            t0 = time.perf_counter()
            self._drain_and_stop(old)
            report.drain_s = time.perf_counter() - t0
            report.stopped = [i.name for i in old]
            for model in [m for m in self.models if m not in by_model]:
                del self.models[model]  # no instance serves it any more
        log.info("reconfigured: started %s, kept %s, stopped %s (drained in %.2f s)",
                 report.started, report.kept, report.stopped, report.drain_s)
        return report

    def _start_all(self, specs: Sequence[RuntimeInstanceSpec]) -> list[Instance]:
        if not specs:
            return []
        with ThreadPoolExecutor(len(specs)) as pool:
            futures = [pool.submit(self.provisioner.start, s) for s in specs]
            started, error = [], None
            for f in futures:
                try:
                    started.append(f.result())
                except Exception as exc:  # noqa: BLE001 - reported below
                    error = error or exc
        if error is not None:
            for inst in started:
                self.provisioner.stop(inst)
            raise RuntimeError(f"reconfiguration aborted: an instance failed to start: {error}"
                               ) from error
        return started

    def _drain_and_stop(self, old: Sequence[Instance]) -> None:
        deadline = time.time() + self.drain_timeout_s
        while any(i.in_flight for i in old) and time.time() < deadline:
            time.sleep(0.02)
        for inst in old:
            if inst.in_flight:
                log.warning("instance %s still has %d requests after %s s; stopping it",
                            inst.name, inst.in_flight, self.drain_timeout_s)
            self._stop(inst)

    def _stop(self, inst: Instance) -> None:
        if inst.state != "dead":
            inst.state = "stopped"
        inst.stop_once(self.provisioner)
        for router in list(self.models.values()):
            router.remove(inst)

    # ---- preemption ----
    def notice(self, name: str, notice_s: float) -> PreemptionRecord:
        """A preemption notice for instance `name`: its nodes go in `notice_s` seconds (see
        the module). Raises KeyError for a name that is not a ready planned instance."""
        with self._state:
            slot = self._slots.get(name)
            inst = slot.instance if slot is not None else None
            if inst is None or inst.state != "active":
                raise KeyError(f"no ready instance named {name!r} to take a notice")
            inst.state = "draining"
            record = PreemptionRecord(name, float(notice_s), inst.in_flight)
            self.preemptions.append(record)
            self._noticed.append((inst, record))
            # the slot starts its replacement at the next reconciliation (not a failure)
            slot.instance, slot.next_start_s = None, 0.0
            self._instances.pop(name, None)
            router = self.models.get(inst.spec.served_name)
        if router is not None:
            router.remove(inst)
        log.warning("instance %s: preemption notice, its nodes go in %.1f s; draining it and "
                    "starting its replacement", name, notice_s)
        return record

    def _reap_noticed(self) -> None:
        """Stop noticed instances that are idle, whose nodes went, or whose notice ran out."""
        now = time.monotonic()
        with self._state:
            noticed = list(self._noticed)
        for inst, record in noticed:
            try:
                gone = bool(inst.failed_nodes(self.heartbeat_timeout_s))
            except Exception:  # noqa: BLE001 - a failing check counts as gone
                gone = True
            how = ("killed" if gone else "drained" if inst.in_flight == 0
                   else "deadline" if now >= record.noticed_at + record.notice_s else "")
            if not how:
                continue
            with self._state:
                self._noticed = [(i, r) for i, r in self._noticed if i is not inst]
            record.how, record.stopped_at = how, now
            inst.state = "stopped"
            if gone:
                inst.kill()
            # ends what it still holds: the router reruns or fails those requests over
            threading.Thread(target=inst.stop_once, args=(self.provisioner,),
                             name=f"coral-reap-{inst.name}", daemon=True).start()
            log.warning("instance %s: preempted instance stopped (%s)", inst.name, how)

    # ---- reconciliation ----
    def _watch(self, period_s: float) -> None:
        while not self._closing.wait(period_s):
            try:
                self._reconcile()
            except Exception:  # noqa: BLE001 - the watch must go on
                log.exception("reconciliation failed")

    def _reconcile(self) -> None:
        """One pass: find failed instances, stop noticed ones that are done, forget old
        failures of stable ones, start the replacements that are due."""
        self._reap_noticed()
        for inst in list(self.instances.values()):
            if inst.state != "active":
                continue
            try:
                failed = inst.failed_nodes(self.heartbeat_timeout_s)
            except Exception:  # noqa: BLE001
                log.exception("health check of %s failed", inst.name)
                continue
            if failed:
                self._lost(inst, f"worker(s) {', '.join(failed)} lost", workers=len(failed))
        now = time.monotonic()
        with self._state:
            for slot in self._slots.values():
                inst = slot.instance
                if inst is not None and inst.state == "active":
                    if slot.streak and now - inst.ready_s >= self.stable_s:
                        slot.streak, slot.error = 0, None
                    continue
                if (slot.failed or slot.starting_since is not None or self._closing.is_set()
                        or now < slot.next_start_s):
                    continue
                slot.starting_since = now
                slot.thread = threading.Thread(target=self._restart, args=(slot,),
                                               name=f"coral-restart-{slot.spec.name}",
                                               daemon=True)
                slot.thread.start()

    def _failure(self, slot: RestartSlot, why: str) -> None:
        """Count one failure of the slot's instance (state lock held)."""
        slot.fail(why, max_restarts=self.max_restarts, backoff_s=self.restart_backoff_s,
                  backoff_max_s=self.restart_backoff_max_s)

    def _lost(self, inst: Instance, why: str, *, workers: int = 0) -> None:
        """Take a failed instance out of routing, count the failure and kill what is left of
        it (in the background: a hung worker takes a moment to kill)."""
        router = self.models.get(inst.spec.served_name)
        try:
            crashed = bool(inst.crashed_nodes())
        except Exception:  # noqa: BLE001 - unknown: not blamed on a request
            crashed = False
        # a crash of workers running a request that was on an earlier crash is that
        # request's (it is refused from now on), not the instance's: it counts once
        blamed = (router.blame(inst, crashed=crashed)
                  if router is not None and inst.state == "active" else False)
        with self._state:
            if inst.state in ("dead", "stopped"):
                return
            log.warning("instance %s is dead: %s", inst.name, why)
            inst.state = "dead"
            self.dead.append(inst.name)
            slot = self._slots.get(inst.name)
            if slot is not None and slot.instance is inst:
                if blamed:
                    slot.error = f"{why} (put on a request that crashed workers before)"
                    slot.next_start_s = time.monotonic()
                else:
                    self._failure(slot, why)
        if router is not None:
            router.remove(inst)
            router.count("instance_deaths")
            router.count("worker_deaths", workers)

        def dispose() -> None:
            inst.kill()
            inst.stop_once(self.provisioner)  # ends its queued and running requests

        thread = threading.Thread(target=dispose, name=f"coral-dispose-{inst.name}",
                                  daemon=True)
        with self._state:
            self._disposing = [t for t in self._disposing if t.is_alive()] + [thread]
        thread.start()

    def _restart(self, slot: RestartSlot) -> None:
        t0 = time.monotonic()
        name = slot.spec.name
        router = self.models.get(slot.spec.served_name)
        try:
            inst = self.provisioner.start(slot.spec)
        except Exception as exc:  # noqa: BLE001 - counted as a failure of the instance
            with self._state:
                slot.starting_since = None
                if self._slots.get(name) is slot and not self._closing.is_set():
                    self._failure(slot, f"restart failed: {exc}")
            if router is not None:
                router.count("restart_failures")
            return
        with self._state:
            slot.starting_since = None
            keep = not self._closing.is_set() and self._slots.get(name) is slot
            if keep:
                inst.state, inst.ready_s = "active", time.monotonic()
                slot.instance, slot.start_s = inst, inst.ready_s - t0
                slot.restarts += 1
                self._instances[name] = inst
                router = self.models.get(slot.spec.served_name)
                if router is not None:
                    router.add(inst)
                    router.count("restarts")
        if keep:
            log.warning("instance %s is back after %.1f s (restart %d)", name,
                        time.monotonic() - t0, slot.restarts)
        else:  # closed or re-planned meanwhile: what it started is not wanted
            inst.stop_once(self.provisioner)

    def close(self) -> None:
        self._closing.set()
        self._monitor.join(timeout=5)
        with self._lock, self._state:
            instances = list(self._instances.values()) + [i for i, _ in self._noticed]
            self._noticed = []
            threads = [s.thread for s in self._slots.values() if s.thread is not None]
            threads += self._disposing
            self._instances = {}
        for inst in instances:
            if inst.state != "dead":
                inst.state = "stopped"
            inst.stop_once(self.provisioner)
        deadline = time.monotonic() + CLOSE_JOIN_S
        for thread in threads:  # a restart that ends now stops its own instance
            if thread is None or not thread.is_alive():
                continue
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "Controller":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
