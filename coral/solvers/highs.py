"""A HiGHS instance that prints nothing.

`highspy.Highs()` writes its banner straight to file descriptor 1 when it is constructed,
before any option can be set; that would corrupt `--json` output on stdout. The constructor
runs with fd 1 pointed at /dev/null, then logging is switched off.
"""

from __future__ import annotations

import os
import sys

import highspy


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
