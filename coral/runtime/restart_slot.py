"""One planned instance over its restarts: which `Instance` runs it now, its consecutive
failures, when it may start again, and the state `/health` reports for it.

Its own module because the restart policy (exponential backoff, giving up after a number of
consecutive failures) is one rule the controller applies to every slot; the controller
(`coral.runtime.controller`) decides when an instance failed and starts the replacements.
"""

from __future__ import annotations

import logging
import threading
import time

from coral.runtime.instance import Instance, InstanceStatus, RuntimeInstanceSpec

log = logging.getLogger(__name__)


def restart_delay_s(streak: int, base_s: float, max_s: float) -> float:
    """Delay before the restart that follows the `streak`-th consecutive failure: none after
    the first, `base_s` after the second, doubled for every further one up to `max_s`."""
    if streak <= 1:
        return 0.0
    return min(base_s * 2 ** (streak - 2), max_s)


class RestartSlot:
    """One planned instance across the `Instance` objects that run it over time (a
    replacement is a new object under the same name). Guarded by the controller's state lock."""

    def __init__(self, spec: RuntimeInstanceSpec, instance: Instance | None = None):
        self.spec = spec
        self.instance = instance
        self.streak = 0  # consecutive failures
        self.restarts = 0
        self.next_start_s = 0.0  # monotonic time of the next restart
        self.starting_since: float | None = None
        self.start_s = 0.0  # how long the last successful start took
        self.failed: str | None = None
        self.error: str | None = None
        self.thread: threading.Thread | None = None

    def status(self, now: float) -> InstanceStatus:
        inst = self.instance
        eta = None
        if self.failed is not None:
            state = "failed"
        elif self.starting_since is not None:
            state = "starting"
            eta = max(1.0, self.start_s - (now - self.starting_since))
        elif inst is not None and inst.state == "active":
            state = "ready"
        else:
            state = "backoff"
            eta = max(0.0, self.next_start_s - now) + max(1.0, self.start_s)
        return InstanceStatus(self.spec.name, self.spec.served_name, state, self.restarts,
                              self.streak, eta, self.failed or self.error)

    def fail(self, why: str, *, max_restarts: int, backoff_s: float,
             backoff_max_s: float) -> None:
        """Count one failure of the slot's instance: schedule its restart, or give up on it
        after more than `max_restarts` in a row."""
        self.streak += 1
        self.error = why
        if self.streak > max_restarts:
            self.failed = (f"gave up after {self.streak} consecutive failures "
                           f"(the last: {why})")
            log.error("instance %s: %s; it stays down until the next reconfiguration",
                      self.spec.name, self.failed)
        else:
            delay = restart_delay_s(self.streak, backoff_s, backoff_max_s)
            self.next_start_s = time.monotonic() + delay
            log.warning("instance %s: %s; restarting it in %.1f s (failure %d of at most %d)",
                        self.spec.name, why, delay, self.streak, max_restarts)
