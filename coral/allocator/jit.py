"""Compiling the allocator's hot loops with numba, cached across runs."""

from __future__ import annotations

import logging
from typing import Any, Callable

import numba

log = logging.getLogger(__name__)
_warned_no_cache = False


def jit(signature: Any = None) -> Any:
    """`numba.njit`, compiled once and then loaded from `__pycache__` (or numba's user-wide
    cache when the package directory is read-only); division by zero gives inf or nan, as in
    numpy (the callers never divide by zero). Helpers carry their signature, so that each is
    compiled once (not again for every literal argument it is called with).

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
