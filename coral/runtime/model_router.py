"""Routing one served model's requests over its ready instances.

`GatewayModelRouter` is the gateway's backend for one model name. It spreads requests over the
model's ready instances by `coral.routing.SwrrRouter` (the router the simulator runs too):
smooth weighted round robin on their capacity weights, skipping instances that are not
routable (not active, or draining) and those holding far more requests than their share. A request whose instance fails before
it produced a token is sent again to another ready instance, or waits (at most `wait_s`) for
one to be ready again; one that already produced tokens ends with `RetriableBackendError`.
While the model has no ready instance, requests end with `ModelUnavailableError` (HTTP 503 with
Retry-After), never with a client error. Its counters and health feed /metrics and /health.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import threading
import time
from collections import OrderedDict
from typing import Any, AsyncIterator, Callable, Sequence

from coral.routing import LOAD_SLACK, SwrrRouter
from coral.runtime.backends import (
    BackendError,
    ModelUnavailableError,
    PoisonRequestError,
    RequestFailedError,
    RetriableBackendError,
)
from coral.runtime.instance import Instance, RuntimeInstanceSpec, InstanceStatus
from coral.runtime.messages import SamplingParams

log = logging.getLogger(__name__)

#: Instances one request may fail on before it produced a token, before it is given up on.
MAX_ATTEMPTS = 4
#: Longest a request waits for a ready instance of its model (while one is being restarted)
#: before it is answered 503; a replacement usually comes well within it.
UNAVAILABLE_WAIT_S = 30.0
#: How often a waiting request looks for a ready instance again.
WAIT_POLL_S = 0.05
#: How long an instance that failed a request is avoided by it while the instance stays
#: ready: long enough for the controller to find a lost worker (then a replacement comes);
#: after that the failure was the request's bad luck, not the instance's, and it may go back.
AVOID_S = 1.0
#: Retry-After suggested when nothing better is known (no start has been timed yet).
DEFAULT_RETRY_AFTER_S = 5
#: Retry-After of a model whose every instance was given up on (it needs an operator).
FAILED_RETRY_AFTER_S = 60
#: A request on (or just failed by) this many instances whose workers crashed is taken for
#: their cause: it is not run again, and a crash it is part of after its first is not
#: counted as the instance's failure.
POISON_CRASHES = 2
#: Requests whose crashes are remembered (the oldest are forgotten first).
CRASH_MEMORY = 4096


def request_key(prompt_ids: Sequence[int], sampling: SamplingParams) -> str:
    """What identifies a request when it is sent again: its prompt and how it samples. Not
    its seed (drawn afresh for a request sent without one) nor its length: a client that
    resends a request changes neither the prompt nor the sampling."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr((sampling.temperature, sampling.top_p)).encode())
    digest.update(b"|" + ",".join(map(str, prompt_ids)).encode())
    return digest.hexdigest()


class GatewayModelRouter:
    """The gateway's backend for one served model: picks a ready instance per request.

    Smooth (interleaved) weighted round robin over the member instances, with the skip rules
    of `coral.routing`: an instance takes new requests only while its state is `active` and
    it is not marked draining (`drain`), and not while it holds more than `load_slack`
    requests above, and more than twice, its fair count at the least loaded instance's load
    per unit weight. Credits are kept per instance name, so they survive membership changes.

    The model's context length is the plan's (`plan()`), not the live instances': a model
    whose instances are all down still has its context, and its requests are told to come back
    later (503), not that they are too long.
    """

    def __init__(self, name: str, *, load_slack: int = LOAD_SLACK,
                 max_attempts: int = MAX_ATTEMPTS,
                 wait_s: float = UNAVAILABLE_WAIT_S):
        self.name = name
        self.load_slack = load_slack
        self.max_attempts = max_attempts
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._instances: list[Instance] = []  # active ones take new requests
        self._credit: dict[str, float] = {}  # of instances when `_rr` was built
        self._rr: SwrrRouter | None = None  # over `_instances`; None: to be rebuilt
        self._draining: set[str] = set()  # instance names marked not routable
        self._planned = 0
        self._context_tokens: int | None = None
        self.status_of: Callable[[], list[InstanceStatus]] | None = None
        """The controller's view of the model's planned instances (None: no controller, so
        nothing will come back once the instances are gone)."""
        self.retries = 0  # requests sent again to another instance before their first token
        self.retriable_errors = 0  # requests ended with RetriableBackendError
        self.unavailable = 0  # requests answered ModelUnavailableError
        self.worker_deaths = 0
        self.instance_deaths = 0
        self.restarts = 0
        self.restart_failures = 0
        self.poison_requests = 0  # requests refused as the cause of worker crashes
        self._down_since: float | None = None
        self._down_total_s = 0.0
        # requests in flight on each instance object, or failed by it (until its fate is
        # known): keys of `request_key`; a replacement is another object under the same name
        self._on: dict[int, dict[str, int]] = {}
        self._crashes: OrderedDict[str, int] = OrderedDict()  # request key -> crashes seen

    # ---- membership (controller) ----
    def plan(self, specs: Sequence[RuntimeInstanceSpec]) -> None:
        """The model's planned instances: how many should be ready, and their context."""
        with self._lock:
            self._planned = len(specs)
            self._context_tokens = min((s.pipeline.model.max_seq_len for s in specs),
                                       default=None)
            self._note_availability()

    def set_active(self, instances: Sequence[Instance]) -> None:
        with self._lock:
            credit = self._credits_now()
            self._instances = list(instances)
            self._credit = {i.name: credit.get(i.name, 0.0) for i in self._instances}
            self._rr = None
            self._note_availability()

    def add(self, instance: Instance) -> None:
        """A (replacement) instance is ready: it takes requests from now on."""
        with self._lock:
            self._credit = self._credits_now()
            self._instances = [i for i in self._instances if i.name != instance.name]
            self._instances.append(instance)
            self._credit.setdefault(instance.name, 0.0)
            self._rr = None
            self._note_availability()

    def remove(self, instance: Instance) -> None:
        with self._lock:
            if instance not in self._instances:
                return
            self._credit = self._credits_now()
            self._instances = [i for i in self._instances if i is not instance]
            self._credit.pop(instance.name, None)
            self._on.pop(id(instance), None)
            self._draining.discard(instance.name)
            self._rr = None
            self._note_availability()

    def drain(self, instance: Instance | str, draining: bool = True) -> None:
        """Mark an instance not routable (`draining=True`: after a preemption notice or before
        it is stopped) or routable again: it keeps its requests in flight and its place, and
        takes no new request while marked. An instance whose state is not `active` is not
        routable either."""
        name = instance if isinstance(instance, str) else instance.name
        with self._lock:
            if draining:
                self._draining.add(name)
            else:
                self._draining.discard(name)

    def routable(self, instance: Instance) -> bool:
        """Whether `instance` takes new requests now."""
        return instance.state == "active" and instance.name not in self._draining

    def _credits_now(self) -> dict[str, float]:
        """Each member's credit now (router lock held)."""
        if self._rr is None:
            return dict(self._credit)
        return {i.name: c for i, c in zip(self._instances, self._rr.credits())}

    def _note_availability(self) -> None:
        """Track the time without a ready instance (router lock held)."""
        now = time.monotonic()
        down = self._planned > 0 and not self._instances
        if down and self._down_since is None:
            self._down_since = now
        elif not down and self._down_since is not None:
            self._down_total_s += now - self._down_since
            self._down_since = None

    def count(self, what: str, n: int = 1) -> None:
        """Add to one of the failure counters (`worker_deaths`, `restarts`, ...)."""
        with self._lock:
            setattr(self, what, getattr(self, what) + n)

    @property
    def instances(self) -> list[Instance]:
        with self._lock:
            return list(self._instances)

    @property
    def max_context_tokens(self) -> int:
        if self._context_tokens is not None:
            return self._context_tokens
        return min((i.max_context_tokens for i in self.instances), default=0)

    # ---- poison requests ----
    def _track(self, instance: Instance, key: str, n: int) -> None:
        with self._lock:
            held = self._on.setdefault(id(instance), {})
            held[key] = held.get(key, 0) + n
            if held[key] <= 0:
                del held[key]

    def _poisoned(self, key: str) -> int:
        with self._lock:
            crashes = self._crashes.get(key, 0)
            return crashes if crashes >= POISON_CRASHES else 0

    def blame(self, instance: Instance, *, crashed: bool) -> bool:
        """An instance was lost (the controller calls this): when its workers crashed on
        their own, the crash counts against each request it held or had just failed. Returns
        whether one of them was on an earlier crash too: the crash is then put on that
        request, which is refused from now on, and the caller does not count it as the
        instance's failure."""
        with self._lock:
            held = self._on.pop(id(instance), {})
            if not crashed:
                return False
            blamed = False
            for key in held:
                crashes = self._crashes.pop(key, 0) + 1
                self._crashes[key] = crashes
                blamed |= crashes >= POISON_CRASHES
            while len(self._crashes) > CRASH_MEMORY:
                self._crashes.popitem(last=False)
        if blamed:
            log.error("model %s: instance %s crashed running a request that was on an earlier "
                      "crash too; that request is refused from now on", self.name,
                      instance.name)
        return blamed

    def _refuse(self, crashes: int) -> PoisonRequestError:
        self.count("poison_requests")
        return PoisonRequestError(f"this request was being run each of the {crashes} times "
                                  f"workers of model '{self.name}' crashed")

    # ---- health ----
    def unavailable_s(self) -> float:
        """Seconds so far during which the model had no ready instance."""
        with self._lock:
            ongoing = time.monotonic() - self._down_since if self._down_since else 0.0
            return self._down_total_s + ongoing

    def statuses(self) -> list[InstanceStatus]:
        if self.status_of is not None:
            return self.status_of()
        return [InstanceStatus(i.name, self.name, "ready", 0, 0) for i in self.instances]

    def health(self) -> dict[str, Any]:
        """`ready` (every planned instance ready), `degraded` (some), `unavailable` (none)."""
        ready = len(self.instances)
        planned = max(self._planned, ready)
        status = ("unavailable" if ready == 0 else "ready" if ready >= planned else "degraded")
        return {"status": status, "ready_instances": ready, "planned_instances": planned,
                "instances": [s.to_dict() for s in self.statuses()]}

    def runtime_stats(self) -> dict[str, float]:
        """Counters for /metrics."""
        with self._lock:
            counters = {k: getattr(self, k) for k in (
                "worker_deaths", "instance_deaths", "restarts", "restart_failures", "retries",
                "retriable_errors", "unavailable", "poison_requests")}
            ready = len(self._instances)
        return {**counters, "ready_instances": ready, "planned_instances": self._planned,
                "unavailable_s": self.unavailable_s()}

    def step_stats(self) -> list:
        """Measured per-stage step times of the running instances (`StepRow`s), for /metrics."""
        with self._lock:
            instances = list(self._instances)
        rows = []
        for inst in instances:
            times = getattr(inst.executor, "step_times", None)
            if times is not None:
                rows.extend(times.rows())
        return rows

    def _recovering(self) -> bool:
        """Whether an instance may become ready (none is, yet): some planned instance is not
        given up on. Without a controller nothing restarts."""
        return self.status_of is not None and any(
            s.state != "failed" for s in self.status_of())

    def _unavailable(self, why: str) -> ModelUnavailableError:
        statuses = self.statuses()
        etas = [s.eta_s for s in statuses if s.eta_s is not None]
        if statuses and all(s.state == "failed" for s in statuses):
            retry_after = FAILED_RETRY_AFTER_S
        else:
            retry_after = math.ceil(min(etas)) if etas else DEFAULT_RETRY_AFTER_S
        self.count("unavailable")
        return ModelUnavailableError(why, retry_after_s=retry_after)

    # ---- choice ----
    def _pick(self, exclude: Sequence[Instance] = ()) -> Instance | None:
        with self._lock:
            instances = self._instances
            if not instances:
                return None
            rr = self._rr
            weights = [i.spec.weight for i in instances]
            slots = [i.spec.slots for i in instances]
            if rr is None or rr.weights != weights or rr.slots != slots:  # members changed
                credit = self._credits_now()
                rr = self._rr = SwrrRouter(weights, load_slack=self.load_slack,
                                           credits=[credit.get(i.name, 0.0)
                                                    for i in instances],
                                           slots=slots)
            for k, inst in enumerate(instances):
                rr.set_routable(k, self.routable(inst))
                rr.in_flight[k] = inst.in_flight
            k = rr.pick(exclude=[k for k, i in enumerate(instances) if i in exclude]
                        if exclude else ())
            if k is None:
                return None
            chosen = instances[k]
            chosen.in_flight += 1
            return chosen

    def pick(self, exclude: Sequence[Instance] = ()) -> Instance:
        """Choose an instance and count the request as in flight there."""
        chosen = self._pick(exclude)
        if chosen is None:
            raise BackendError(f"no ready instance of model '{self.name}'")
        return chosen

    def _done(self, instance: Instance) -> None:
        with self._lock:
            instance.in_flight -= 1
            instance.served += 1

    # ---- Backend ----
    async def generate(self, prompt_ids: list[int], max_tokens: int,
                       sampling: SamplingParams) -> AsyncIterator[int]:
        deadline = time.monotonic() + self.wait_s
        failed: list[Instance] = []  # instances that failed this request
        failed_at = 0.0
        key = request_key(prompt_ids, sampling)
        while True:
            crashes = self._poisoned(key)
            if crashes:
                raise self._refuse(crashes)
            avoid = (failed if time.monotonic() - failed_at < AVOID_S
                     else [i for i in failed if i.state != "active"])
            instance = self._pick(exclude=avoid)
            if instance is None:
                # Nothing ready now: wait for a replacement while one may come (bounded).
                if time.monotonic() < deadline and self._recovering():
                    await asyncio.sleep(WAIT_POLL_S)
                    continue
                raise self._unavailable(
                    f"model '{self.name}' is temporarily unavailable: no ready instance"
                    + (f" after {self.wait_s:g} s" if self._recovering() else ""))
            produced = 0
            self._track(instance, key, 1)
            kept = False  # whether the instance's fate may still be put on this request
            try:
                async for token in instance.backend.generate(prompt_ids, max_tokens, sampling):
                    produced += 1
                    yield token
                return
            except RequestFailedError:
                raise  # its own failure: it would fail the same way anywhere
            except BackendError as exc:
                log.warning("model %s: instance %s failed a request: %s", self.name,
                            instance.name, exc)
                kept = instance.state in ("active", "dead")
                if produced:
                    self.count("retriable_errors")
                    raise RetriableBackendError(
                        f"instance {instance.name} of model '{self.name}' failed after "
                        f"{produced} tokens ({exc})") from exc
                failed.append(instance)
                failed_at = time.monotonic()
                if len(failed) >= self.max_attempts:
                    raise self._unavailable(
                        f"model '{self.name}' is temporarily unavailable: the request "
                        f"failed on {len(failed)} attempts ({exc})") from exc
                self.count("retries")  # nothing was produced: restart from the prompt
            finally:
                if not kept:
                    self._track(instance, key, -1)
                self._done(instance)
