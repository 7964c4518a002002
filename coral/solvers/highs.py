"""A HiGHS instance that prints nothing, and its thread count.

`highspy.Highs()` writes its banner straight to file descriptor 1 when it is constructed,
before any option can be set; that would corrupt `--json` output on stdout. The constructor
runs with fd 1 pointed at /dev/null, then logging is switched off.

HiGHS runs every solve of a process on one global task scheduler, started by the first run
with that run's thread count; a later run asking for another count fails at once
(`HighsStatus.kError`, model status "Not Set") instead of solving. `set_threads` restarts the
scheduler when the count asked for changes.
"""

from __future__ import annotations

import os
import sys
import threading

import highspy

_scheduler_lock = threading.Lock()
_scheduler_threads: int | None = None  # the count the last `set_threads` started it with


def quiet_highs() -> highspy.Highs:
    """A new `highspy.Highs` with its banner swallowed and output off."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no real stdout (embedded interpreters)
        h = highspy.Highs()
    else:
        try:
            with open(os.devnull, "wb") as null:
                os.dup2(null.fileno(), 1)
                h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    h.setOptionValue("output_flag", False)
    return h


def set_threads(h: highspy.Highs, threads: int | None) -> None:
    """Run `h` on `threads` threads (None: leave HiGHS's default), restarting HiGHS's global
    scheduler when it was started with another count (see the module docstring)."""
    global _scheduler_threads
    if threads is None:
        return
    threads = int(threads)
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    with _scheduler_lock:
        if _scheduler_threads != threads:
            highspy.Highs.resetGlobalScheduler(True)
            _scheduler_threads = threads
    h.setOptionValue("threads", threads)
