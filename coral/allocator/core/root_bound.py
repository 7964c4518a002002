"""HiGHS's bound on a whole allocation ILP, from a child process killed at a deadline.

On `advanced` at n_max 6 (18,795 columns) a fair phase has no time for HiGHS on every column
in this process: HiGHS does not stop inside its root, so such a run overruns the phase by
seconds to minutes (`highs_runs.root_fits`). Yet its root's cut rounds raise the bound well
above the LP's within one to two seconds on many of those phases (measured on pickled
`advanced` phases: a tokens phase's gap against the LP 3.94 %, against the root's bound 2.75 %
after 2.0 s; a cost phase's 2.46 % and 1.77 % after 1.5 s; benchmarks/results/scarcity.md,
"Fair phases on `advanced`: neighbourhoods by model, HiGHS's root bound from a child
process"). `RootBound` runs that HiGHS in a child process on
one thread, beside this process's own searches, and reads each dual bound the run reaches
(HiGHS's MIP callback, one line on the child's stdout each); `stop` kills the child, so the
bound is what the run proved by then and the caller's time limit holds.

The child is a fresh interpreter (`python -m coral.allocator.core.root_bound FILE`), not a
fork: HiGHS's task scheduler threads do not survive a fork. It imports the ILP's arrays
(`formulation.LpArrays`), numpy and highspy, nothing of planning.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import highspy
import numpy as np

from coral.allocator.core.formulation import LpArrays
from coral.solvers import quiet_highs, set_threads

#: Seconds the child may run past the time it was given before it stops by itself, should
#: nobody kill it (its parent gone): HiGHS checks its time limit only between its steps.
GRACE_S = 1.0

_PREFIX = "bound "


class RootBound:
    """HiGHS on the ILP `arr` (minimising `objective` with column lower bounds `col_lb` and
    row lower bounds `row_lb`), looking only for solutions below `cutoff`, in a child
    process. `bound()` is the best lower bound the child has proven so far on every solution
    below `cutoff` (-inf before its first); `stop()` ends it and returns that bound."""

    def __init__(self, arr: LpArrays, objective: np.ndarray, col_lb: np.ndarray,
                 row_lb: np.ndarray, *, cutoff: float, mip_gap: float,
                 time_limit_s: float) -> None:
        self._bound = -math.inf
        self._lock = threading.Lock()
        self._dir = tempfile.TemporaryDirectory(prefix="coral-root-bound-")
        path = Path(self._dir.name) / "ilp.npz"
        np.savez(path, **{**vars(arr), "cost": objective, "col_lb": col_lb, "row_lb": row_lb},
                 options=np.array([cutoff, mip_gap, max(time_limit_s, 0.0) + GRACE_S]))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "coral.allocator.core.root_bound", str(path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if not line.startswith(_PREFIX):
                continue
            try:
                value = float(line[len(_PREFIX):])
            except ValueError:
                continue
            if math.isfinite(value) or value == math.inf:
                with self._lock:
                    self._bound = max(self._bound, value)

    def bound(self) -> float:
        with self._lock:
            return self._bound

    def stop(self) -> float:
        """Kill the child (if it still runs) and return its bound."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._reader.join(timeout=1.0)
        self._dir.cleanup()
        return self.bound()


def _run(path: str) -> None:
    """The child: HiGHS on the ILP in `path`, each better dual bound printed as it comes."""
    data = np.load(path)
    cutoff, mip_gap, time_limit_s = (float(v) for v in data["options"])
    arr = LpArrays(**{name: data[name] for name in LpArrays.__dataclass_fields__})
    lp = arr.highs_lp(arr.cost, arr.col_lb, arr.row_lb, maximise=False)
    h = quiet_highs()
    set_threads(h, 1)
    h.setOptionValue("time_limit", time_limit_s)
    h.setOptionValue("mip_rel_gap", mip_gap)
    h.setOptionValue("mip_heuristic_run_feasibility_jump", False)
    if math.isfinite(cutoff):
        h.setOptionValue("objective_bound", cutoff)
    h.passModel(lp)
    best = [-math.inf]

    def report(value: float) -> None:
        if value > best[0]:
            best[0] = value
            print(f"{_PREFIX}{value!r}", flush=True)

    def callback(kind, message, data_out, data_in, user_data) -> None:
        if math.isfinite(data_out.mip_dual_bound):
            report(float(data_out.mip_dual_bound))

    h.setCallback(callback, None)
    h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        report(cutoff)  # no solution below the cutoff
    elif math.isfinite(h.getInfo().mip_dual_bound):
        report(float(h.getInfo().mip_dual_bound))


if __name__ == "__main__":
    try:
        _run(sys.argv[1])
    except BrokenPipeError:  # the parent stopped reading: it is gone
        pass
