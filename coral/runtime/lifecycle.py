"""Stopping a server cleanly on SIGTERM and SIGINT.

`coral serve` owns worker processes; whatever stops it must stop them. SIGINT already unwinds
Python (KeyboardInterrupt), but SIGTERM's default action ends the process at once, skipping
every `finally`, and uvicorn, which handles both signals while it serves, raises the signal
again once it has shut down. `stop_on_signals()` turns the first SIGTERM or SIGINT into an
exception that unwinds the serving code (so that its cleanup stops the workers) and ends the
block quietly; a second signal while that cleanup runs takes the signal's default action (the
workers then exit on their own: they watch their parent, see `coral.runtime.worker`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Iterator

log = logging.getLogger(__name__)

#: Signals that stop a server.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequested(BaseException):
    """A stop signal arrived (a BaseException, like KeyboardInterrupt, so that no
    `except Exception` in the serving code swallows it)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise `StopRequested` in the main thread (once);
    the block ends without error when that is why it ended. Outside the main thread it does
    nothing (Python delivers signals to the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    stopping = False

    def handler(signum: int, _frame: object) -> None:
        nonlocal stopping
        if stopping:  # asked again while stopping: do what the signal does by default
            signal.signal(signum, signal.SIG_DFL if signum != signal.SIGINT
                          else signal.default_int_handler)
            signal.raise_signal(signum)
            return
        stopping = True
        log.warning("%s: stopping", signal.Signals(signum).name)
        raise StopRequested(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    try:
        yield
    except StopRequested:
        pass
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
