"""Instances: one complete copy of a model (a pipeline of worker processes plus its engine),
what the plan asks for (`RuntimeInstanceSpec`), how one is started and stopped (`LocalProvisioner`:
worker processes on this machine) and how a planned instance stands (`InstanceStatus`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from coral.errors import CoralError
from coral.runtime.config import ModelConfig, PipelineSpec, StageSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeInstanceSpec:
    """One instance to run: a name (unique in a deployment), its pipeline and its weight."""

    name: str
    pipeline: PipelineSpec
    weight: float = 1.0
    """Capacity weight from the plan: the instance's share of the model's new requests."""
    model: str | None = None
    """Served model name (default: the pipeline's model name)."""
    slots: int = 0
    """Sequences the instance runs at once (the plan's stages x its smallest stage batch);
    the router counts requests beyond them as queued (0: not known, all of them)."""

    def __post_init__(self) -> None:
        if self.weight <= 0:
            raise ValueError(f"instance {self.name}: weight {self.weight} must be positive")

    @property
    def served_name(self) -> str:
        return self.model or self.pipeline.model.name

    @classmethod
    def from_template(cls, name: str, template, model_config, *,
                      served_name: str | None = None) -> "RuntimeInstanceSpec":
        """An instance of a plan's template (`coral.templates.builder.build.Template`): its chain of
        stages, weighted by the template's capacity (requests/s, else its throughput)."""
        weight = (getattr(template, "throughput_rps", None) or
                  getattr(template, "throughput", None) or 1.0)
        return cls(name, pipeline_spec_from_template(template, model_config), float(weight),
                   served_name)


class TemplateNotServableError(CoralError, ValueError):
    """The template's layer ranges cannot be run as pipeline stages here."""


def pipeline_spec_from_template(template, model: ModelConfig) -> PipelineSpec:
    """Stages of a template (`coral.templates.builder.build.Template`) whose nodes form a chain.

    Nodes with the same layer range become the data-parallel nodes of one stage, weighted by the
    flow the template sends into each (by capacity where the template has no edges). Ranges
    must tile the model's layers in order; flow templates whose paths split the layers
    differently are refused (not supported by this runtime yet).
    """
    used = [(i, n) for i, n in enumerate(template.nodes) if n.layers > 0]
    inflow: dict[int, float] = {}
    for _u, v, flow in template.edges:
        inflow[v] = inflow.get(v, 0.0) + flow
    ranges: dict[tuple[int, int], list[float]] = {}
    for i, node in used:
        weight = inflow.get(i) or node.capacity or 1.0
        ranges.setdefault((node.first_layer, node.first_layer + node.layers), []).append(weight)
    stages, expected = [], 0
    for (first, end), weights in sorted(ranges.items()):
        if first != expected:
            raise TemplateNotServableError(
                f"template of {template.model}: layer ranges {sorted(ranges)} do not tile "
                f"[0, {model.num_layers}) as a chain of stages (a range starts at {first}, "
                f"expected {expected}); to fix: serve a chain template")
        stages.append(StageSpec(first, end, tuple(max(w, 1e-9) for w in weights)))
        expected = end
    if expected != model.num_layers:
        raise TemplateNotServableError(
            f"template of {template.model} covers layers [0, {expected}) but the runtime model "
            f"has {model.num_layers}; to fix: build the ModelConfig from the same architecture")
    return PipelineSpec(model, tuple(stages))


class Instance:
    """A running instance: its engine, executor and routing state."""

    def __init__(self, spec: RuntimeInstanceSpec, engine, executor):
        from coral.runtime.backends import EngineBackend

        self.spec = spec
        self.engine = engine
        self.executor = executor
        self.backend = EngineBackend(engine)
        self.state = "ready"  # ready -> active -> draining -> stopped; or -> dead
        self.ready_s = time.monotonic()  # when it started taking requests
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

    def crashed_nodes(self) -> list[str]:
        """Workers that ended on their own (an error exit or a fatal signal), not killed from
        outside: a death that may be put on a request it ran."""
        check = getattr(self.executor, "crashed_nodes", None)
        return [] if check is None else check()

    def kill(self) -> None:
        """End what is left of a failed instance's workers at once (no graceful stop: they
        may be hung, and their requests are already being failed over)."""
        kill = getattr(self.executor, "kill", None)
        if kill is not None:
            kill()

    @property
    def pids(self) -> list[int | None]:
        return list(getattr(self.executor, "pids", []))

    def __repr__(self) -> str:
        return f"Instance({self.name!r}, {self.state}, in_flight={self.in_flight})"


class Provisioner(Protocol):
    def start(self, spec: RuntimeInstanceSpec) -> Instance: ...

    def stop(self, instance: Instance) -> None: ...


class LocalProvisioner:
    """Instances as ZeroMQ worker processes on this machine (`in_process=True`: stages run in
    the caller's process, for quick tests; such instances cannot fail on their own)."""

    def __init__(self, *, device: str = "cpu", in_process: bool = False,
                 start_timeout_s: float = 60.0):
        self.device = device
        self.in_process = in_process
        self.start_timeout_s = start_timeout_s
        self.on_notice: Callable[[str, float], Any] | None = None
        """Where preemption notices go (a `Controller` sets its `notice`)."""

    def preempt(self, instance: Instance, notice_s: float) -> threading.Timer:
        """Play a cloud reclaiming a spot node: deliver a preemption notice for `instance`
        now (to `on_notice`), then kill its workers (SIGKILL) `notice_s` seconds later; an
        in-process instance, which has no process to kill, has its engine stopped then. The
        returned timer is started (cancel it to call the kill off)."""
        if self.on_notice is not None:
            self.on_notice(instance.name, notice_s)
        timer = threading.Timer(notice_s, self._reclaim, args=(instance,))
        timer.daemon = True
        timer.start()
        return timer

    def _reclaim(self, instance: Instance) -> None:
        pids = [p for p in instance.pids if p]
        if not pids:
            instance.stop_once(self)
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.info("instance %s: reclaimed (workers %s killed)", instance.name, pids)

    def start(self, spec: RuntimeInstanceSpec) -> Instance:
        from coral.runtime.batching_engine import BatchingEngine

        if self.in_process:
            from coral.runtime.pipeline import LocalPipeline
            executor = LocalPipeline(spec.pipeline, device=self.device)
        else:
            executor = self._start_workers(spec)
        model = spec.pipeline.model
        engine = BatchingEngine(executor, max_seq_len=model.max_seq_len,
                                eos_token_ids=model.eos_token_ids)
        engine.start()
        return Instance(spec, engine, executor)

    def _start_workers(self, spec: RuntimeInstanceSpec, attempts: int = 3):
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


@dataclass(frozen=True)
class InstanceStatus:
    """Where one planned instance stands, as /health and the router see it."""

    name: str
    model: str
    state: str
    """ready (taking requests), starting (a replacement is starting), backoff (waiting before
    the next restart), failed (given up on after too many consecutive failures)."""
    restarts: int
    """Replacements started for it since it was planned."""
    failures: int
    """Consecutive failures (reset once an instance stays ready for `stable_s`)."""
    eta_s: float | None = None
    """While it is restarting: about how long until it is ready again."""
    error: str | None = None
    """The last failure."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "state": self.state,
                               "restarts": self.restarts, "failures": self.failures}
        if self.eta_s is not None:
            out["eta_s"] = round(self.eta_s, 1)
        if self.error is not None:
            out["error"] = self.error
        return out
