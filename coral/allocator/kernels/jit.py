"""Compiling the allocator's hot loops with numba, once per install, never inside a solve.

Every kernel carries its signatures (`jit("...")`), so numba compiles it when its module is
imported, not on its first call, and then refuses to compile again: a call whose argument
types are not one of those signatures converts them (an int where a float is declared) or
fails, but never compiles a new specialisation in the middle of a solve. The machine code is
cached on disk (in `NUMBA_CACHE_DIR` when it is set and writable, else in `__pycache__` beside
the source, else, for a read-only install, in numba's user-wide cache, `~/.cache/numba`; with
none writable, in memory for the process), so only the first import after an install or a
change of the kernels' source compiles (17 s on a shared 2-core machine: the
knapsack's kernels 11 s, the PD cover's 6 s); later processes load it in 0.5 s.

`warm_up()` does that import and says how long it took; `solve_allocation` and the CLI call
it before a solve's clock starts (`decomposition/knapsack.py` and `decomposition/pd_cover.py`
import the kernels on first use, which would be inside it), so that the compilation never
counts against a time limit: a fresh install's first `coral plan core --nmax 3` used to end at
its time limit with a 3.5 % gap and a dearer plan where a warm run proved 0.5 %; now both
prove the same plan.

Why this and not the alternatives (measured in `benchmarks/results/allocator.md`, "Cold start
of the allocator"): compiling lazily on first call is what put the compilation inside the clock;
warming up by calling the kernels on dummy data would compile only the argument types the
dummies happen to have, where explicit signatures pin every specialisation the solve uses
and make any other a loud error; numba's ahead-of-time compiler (`numba.pycc`) is deprecated
and needs a C toolchain at install time; and the kernels replaced array code that spent a
solve's time in per-operation overhead, so dropping the JIT would make every solve slower to
save one compilation per install."""

from __future__ import annotations

import importlib
import logging
import sys
import time
from typing import Any, Callable

import numba
from numba.core import event

log = logging.getLogger(__name__)
_warned_no_cache = False

#: The modules of compiled kernels; `warm_up` imports them.
KERNEL_MODULES = ("coral.allocator.kernels.arrays", "coral.allocator.kernels.knapsack_kernel",
                  "coral.allocator.kernels.knapsack_programme",
                  "coral.allocator.kernels.pd_cover_kernel")


def jit(signature: Any = None) -> Any:
    """`numba.njit`, compiled once and then loaded from `__pycache__` (or numba's user-wide
    cache when the package directory is read-only); division by zero gives inf or nan, as in
    numpy (the callers never divide by zero).

    `signature` is one signature or a list of them: each is compiled when the function is
    defined (at import) and no other ever is (see the module's docstring). A signature of
    argument types only, "(float64[::1], int64)", leaves the return type to numba.

    Where numba finds no writable cache directory at all (a read-only install and no writable
    home), the functions are compiled in memory on each start instead of failing the import;
    `NUMBA_CACHE_DIR` names a directory to cache in."""
    if callable(signature):
        return jit()(signature)

    def compile_(func: Callable[..., Any]) -> Any:
        global _warned_no_cache
        args = () if signature is None else (signature,)
        try:
            return numba.njit(*args, cache=True, error_model="numpy")(func)
        except RuntimeError as exc:
            if "cannot cache" not in str(exc):
                raise
            if not _warned_no_cache:
                log.warning("no writable cache directory for the allocator's compiled code "
                            "(%s); compiling it on every start (set NUMBA_CACHE_DIR to cache "
                            "it)", exc)
                _warned_no_cache = True
            return numba.njit(*args, cache=False, error_model="numpy")(func)

    return compile_


class _Compiles(event.Listener):
    """Counts numba's compilations (not loads from the cache) while installed."""

    def __init__(self) -> None:
        self.count = 0

    def on_start(self, event: event.Event) -> None:
        self.count += 1

    def on_end(self, event: event.Event) -> None:
        pass


def warm_up(on_message: Callable[[str], None] | None = None) -> float:
    """Import the allocator's kernels, so that they are compiled (first import after an
    install) or loaded from the cache before any solve's clock starts. Returns the seconds it
    took (0 when they were already imported).

    When it compiled, says so at info level and to `on_message` (the CLI's stderr): the time
    is not part of any solve's, and a user should see where it went."""
    missing = [name for name in KERNEL_MODULES if name not in sys.modules]
    if not missing:
        return 0.0
    compiles = _Compiles()
    t0 = time.perf_counter()
    with event.install_listener("numba:compile", compiles):
        for name in missing:
            importlib.import_module(name)
    took = time.perf_counter() - t0
    if compiles.count:
        msg = (f"compiled the allocator's kernels in {took:.1f} s (once per install; later "
               "runs load them from numba's cache)")
        log.info(msg)
        if on_message is not None:
            on_message(msg)
    else:
        log.debug("loaded the allocator's compiled kernels in %.2f s", took)
    return took


def dispatchers() -> dict[str, Any]:
    """Every compiled function of the kernel modules, by `module.name` (imports them)."""
    from numba.core.registry import CPUDispatcher

    out = {}
    for name in KERNEL_MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if isinstance(value, CPUDispatcher):
                out[f"{name}.{attr}"] = value
    return out
