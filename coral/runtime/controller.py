"""The controller: several instances per model behind the gateway, failure handling, and live
reconfiguration.

An *instance* is one complete copy of a model (a pipeline of worker processes plus its engine).
Each served model has a `ModelRouter` (the gateway's backend for that name) that spreads requests
over the model's instances by smooth weighted round robin on their capacity weights, skipping an
instance whose in-flight count is far above the others'. A request whose instance fails before it
produced a token is sent again to another instance of the same model; one that already produced
tokens ends with `RetriableBackendError` (the gateway reruns non-streamed requests itself and
sends streamed ones a clean, retriable OpenAI-style error).

The `Controller` starts instances through a provisioner (`LocalProvisioner`: worker processes on
this machine), watches their heartbeats, and moves from one list of instances to another without
dropping requests: start the new instances, wait until they are ready, shift traffic to them,
drain the old ones (they finish what they accepted) and stop them.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Protocol, Sequence

from coral.runtime.backends import BackendError, RetriableBackendError
from coral.runtime.config import PipelineSpec
from coral.runtime.messages import SamplingParams

log = logging.getLogger(__name__)

#: How often the controller checks its instances' health.
MONITOR_S = 0.2
#: Longest wait for an old instance to finish its accepted requests before it is stopped.
DRAIN_TIMEOUT_S = 120.0
#: Attempts of one request over distinct instances before it fails.
MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class InstanceSpec:
    """One instance to run: a name (unique in a deployment), its pipeline and its weight."""

    name: str
    pipeline: PipelineSpec
    weight: float = 1.0
    """Capacity weight from the plan: the instance's share of the model's new requests."""
    model: str | None = None
    """Served model name (default: the pipeline's model name)."""

    def __post_init__(self) -> None:
        if self.weight <= 0:
            raise ValueError(f"instance {self.name}: weight {self.weight} must be positive")

    @property
    def served_name(self) -> str:
        return self.model or self.pipeline.model.name

    @classmethod
    def from_template(cls, name: str, template, model_config, *,
                      served_name: str | None = None) -> "InstanceSpec":
        """An instance of a plan's template (`coral.templates.build.Template`): its chain of
        stages, weighted by the template's capacity (requests/s, else its throughput)."""
        from coral.runtime.deploy import pipeline_spec_from_template

        weight = (getattr(template, "throughput_rps", None) or
                  getattr(template, "throughput", None) or 1.0)
        return cls(name, pipeline_spec_from_template(template, model_config), float(weight),
                   served_name)


class Instance:
    """A running instance: its engine, executor and routing state."""

    def __init__(self, spec: InstanceSpec, engine, executor):
        from coral.runtime.backends import EngineBackend

        self.spec = spec
        self.engine = engine
        self.executor = executor
        self.backend = EngineBackend(engine)
        self.state = "ready"  # ready -> active -> draining -> stopped; or -> dead
        self.in_flight = 0  # requests the router sent here that have not ended (router lock)
        self.served = 0
        self._stop_lock = threading.Lock()
        self._stopped = False

    def stop_once(self, provisioner: "Provisioner") -> None:
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        provisioner.stop(self)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def max_context_tokens(self) -> int:
        return self.engine.max_seq_len

    def failed_nodes(self, heartbeat_timeout_s: float | None = None) -> list[str]:
        """Workers that exited or stopped sending heartbeats."""
        check = getattr(self.executor, "failed_nodes", None)
        if check is None:
            return []
        return check() if heartbeat_timeout_s is None else check(heartbeat_timeout_s)

    @property
    def pids(self) -> list[int | None]:
        return list(getattr(self.executor, "pids", []))

    def __repr__(self) -> str:
        return f"Instance({self.name!r}, {self.state}, in_flight={self.in_flight})"


class Provisioner(Protocol):
    def start(self, spec: InstanceSpec) -> Instance: ...

    def stop(self, instance: Instance) -> None: ...


class LocalProvisioner:
    """Instances as ZeroMQ worker processes on this machine (`in_process=True`: stages run in
    the caller's process, for quick tests; such instances cannot fail on their own)."""

    def __init__(self, *, device: str = "cpu", in_process: bool = False,
                 start_timeout_s: float = 60.0):
        self.device = device
        self.in_process = in_process
        self.start_timeout_s = start_timeout_s

    def start(self, spec: InstanceSpec) -> Instance:
        from coral.runtime.engine import Engine

        if self.in_process:
            from coral.runtime.pipeline import LocalPipeline
            executor = LocalPipeline(spec.pipeline, device=self.device)
        else:
            executor = self._start_workers(spec)
        model = spec.pipeline.model
        engine = Engine(executor, max_seq_len=model.max_seq_len,
                        eos_token_ids=model.eos_token_ids)
        engine.start()
        return Instance(spec, engine, executor)

    def _start_workers(self, spec: InstanceSpec, attempts: int = 3):
        import zmq

        from coral.runtime.worker import WorkerLostError, ZmqPipeline

        for attempt in range(attempts):
            # ports are picked free then bound; another process may take one in between
            try:
                return ZmqPipeline(spec.pipeline, device=self.device,
                                   start_timeout_s=self.start_timeout_s)
            except (WorkerLostError, zmq.ZMQError) as exc:
                if attempt == attempts - 1:
                    raise
                log.warning("instance %s: start failed (%s); retrying", spec.name, exc)
        raise AssertionError("unreachable")

    def stop(self, instance: Instance) -> None:
        instance.engine.stop()  # fails requests still queued, then closes the workers


# ---------------------------------------------------------------- routing
class ModelRouter:
    """The gateway's backend for one served model: picks an instance per request.

    Smooth (interleaved) weighted round robin over the active instances: each pick adds every
    eligible instance's weight to its credit, takes the instance with the most credit and
    subtracts the total weight from it. An instance is not eligible while its in-flight count is
    more than `load_slack` above, and more than twice, the least loaded instance's.
    """

    def __init__(self, name: str, *, load_slack: int = 4, max_attempts: int = MAX_ATTEMPTS):
        self.name = name
        self.load_slack = load_slack
        self.max_attempts = max_attempts
        self._lock = threading.Lock()
        self._instances: list[Instance] = []  # active ones take new requests
        self._credit: dict[str, float] = {}
        self.retries = 0  # requests sent again to another instance
        self.retriable_errors = 0  # requests ended with RetriableBackendError

    # ---- membership (controller) ----
    def set_active(self, instances: Sequence[Instance]) -> None:
        with self._lock:
            self._instances = list(instances)
            self._credit = {i.name: self._credit.get(i.name, 0.0) for i in self._instances}

    def remove(self, instance: Instance) -> None:
        with self._lock:
            self._instances = [i for i in self._instances if i is not instance]
            self._credit.pop(instance.name, None)

    @property
    def instances(self) -> list[Instance]:
        with self._lock:
            return list(self._instances)

    @property
    def max_context_tokens(self) -> int:
        insts = self.instances
        return min((i.max_context_tokens for i in insts), default=0)

    # ---- choice ----
    def pick(self, exclude: Sequence[Instance] = ()) -> Instance:
        """Choose an instance and count the request as in flight there."""
        with self._lock:
            live = [i for i in self._instances if i.state == "active" and i not in exclude]
            if not live:
                raise BackendError(f"no live instance of model '{self.name}'")
            least = min(i.in_flight for i in live)
            eligible = [i for i in live
                        if i.in_flight - least <= max(self.load_slack, least)]
            total = sum(i.spec.weight for i in eligible)
            for i in eligible:
                self._credit[i.name] = self._credit.get(i.name, 0.0) + i.spec.weight
            chosen = max(eligible, key=lambda i: self._credit[i.name])
            self._credit[chosen.name] -= total
            chosen.in_flight += 1
            return chosen

    def _done(self, instance: Instance) -> None:
        with self._lock:
            instance.in_flight -= 1
            instance.served += 1

    # ---- Backend ----
    async def generate(self, prompt_ids: list[int], max_tokens: int,
                       sampling: SamplingParams) -> AsyncIterator[int]:
        tried: list[Instance] = []
        while True:
            instance = self.pick(exclude=tried)
            tried.append(instance)
            produced = 0
            try:
                async for token in instance.backend.generate(prompt_ids, max_tokens, sampling):
                    produced += 1
                    yield token
                return
            except BackendError as exc:
                log.warning("model %s: instance %s failed a request: %s", self.name,
                            instance.name, exc)
                if produced:
                    self.retriable_errors += 1
                    raise RetriableBackendError(
                        f"instance {instance.name} of model '{self.name}' failed after "
                        f"{produced} tokens ({exc})") from exc
                if len(tried) >= self.max_attempts:
                    raise
                self.retries += 1  # nothing was produced: restart from the prompt elsewhere
            finally:
                self._done(instance)


# ---------------------------------------------------------------- controller
@dataclass
class ReconfigureReport:
    started: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    drain_s: float = 0.0
    drained_requests: int = 0
    """Requests in flight on the old instances when traffic moved off them."""


class Controller:
    """Deploys instances, watches them, and reconfigures them live.

    `models` is the mapping to pass to `create_app`: it is updated in place, so the gateway sees
    models that a reconfiguration adds.
    """

    def __init__(self, provisioner: str | Provisioner = "local", *,
                 monitor_s: float = MONITOR_S, drain_timeout_s: float = DRAIN_TIMEOUT_S,
                 load_slack: int = 4, heartbeat_timeout_s: float | None = None):
        """`heartbeat_timeout_s`: a worker silent this long makes its instance dead (default:
        the executor's own timeout)."""
        if provisioner == "local":
            provisioner = LocalProvisioner()
        elif isinstance(provisioner, str):
            raise ValueError(f"unknown provisioner '{provisioner}' (known: local)")
        self.provisioner = provisioner
        self.drain_timeout_s = drain_timeout_s
        self.load_slack = load_slack
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.models: dict[str, ModelRouter] = {}
        self._instances: dict[str, Instance] = {}
        self._lock = threading.RLock()  # one reconfiguration at a time
        self.dead: list[str] = []
        self._closing = threading.Event()
        self._monitor = threading.Thread(target=self._watch, args=(monitor_s,),
                                         name="coral-controller", daemon=True)
        self._monitor.start()

    @property
    def instances(self) -> dict[str, Instance]:
        return dict(self._instances)

    def deploy(self, specs: Sequence[InstanceSpec]) -> ReconfigureReport:
        return self.reconfigure(specs)

    def reconfigure(self, specs: Sequence[InstanceSpec], *,
                    on_ready: Callable[[], None] | None = None) -> ReconfigureReport:
        """Move to `specs` without dropping requests. Instances whose name and pipeline are
        unchanged are kept (their weight is updated); the others are started, or drained and
        stopped. If a new instance fails to start, the ones started are stopped and the old
        configuration stays. `on_ready` is called once the new instances are up, before traffic
        moves to them."""
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"instance names must be unique: {names}")
        report = ReconfigureReport()
        with self._lock:
            current = self._instances
            keep = {s.name: s for s in specs if s.name in current
                    and current[s.name].spec.pipeline == specs[names.index(s.name)].pipeline
                    and current[s.name].spec.served_name == s.served_name
                    and current[s.name].state == "active"}
            to_start = [s for s in specs if s.name not in keep]
            old = [i for n, i in current.items() if n not in keep]
            started = self._start_all(to_start)
            if on_ready is not None:
                on_ready()
            for name, spec in keep.items():
                current[name].spec = spec  # new weight
            new_set = {**{n: current[n] for n in keep}, **{i.name: i for i in started}}
            # shift traffic: new instances active, old ones draining (finish what they took)
            by_model: dict[str, list[Instance]] = {}
            for inst in new_set.values():
                inst.state = "active"
                by_model.setdefault(inst.spec.served_name, []).append(inst)
            for inst in old:
                if inst.state != "dead":
                    inst.state = "draining"
            for model, insts in by_model.items():
                router = self.models.get(model)
                if router is None:
                    router = ModelRouter(model, load_slack=self.load_slack)
                router.set_active(insts)
                self.models[model] = router
            self._instances = new_set
            report.started = [i.name for i in started]
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

    def _start_all(self, specs: Sequence[InstanceSpec]) -> list[Instance]:
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

    # ---- health ----
    def _watch(self, period_s: float) -> None:
        while not self._closing.wait(period_s):
            for inst in list(self._instances.values()):
                if inst.state not in ("active", "draining"):
                    continue
                try:
                    failed = inst.failed_nodes(self.heartbeat_timeout_s)
                except Exception:  # noqa: BLE001
                    log.exception("health check of %s failed", inst.name)
                    continue
                if failed:
                    self.mark_dead(inst, f"worker(s) {', '.join(failed)} lost")

    def mark_dead(self, inst: Instance, why: str) -> None:
        """Take a failed instance out of routing and stop it; its requests fail over."""
        if inst.state in ("dead", "stopped"):
            return
        log.warning("instance %s is dead: %s", inst.name, why)
        inst.state = "dead"
        self.dead.append(inst.name)
        router = self.models.get(inst.spec.served_name)
        if router is not None:
            router.remove(inst)
        inst.stop_once(self.provisioner)  # ends its queued and running requests with an error

    def close(self) -> None:
        self._closing.set()
        self._monitor.join(timeout=5)
        with self._lock:
            for inst in list(self._instances.values()):
                if inst.state != "dead":
                    inst.state = "stopped"
                inst.stop_once(self.provisioner)
            self._instances = {}

    def __enter__(self) -> "Controller":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
