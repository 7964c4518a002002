"""No compilation inside a solve: the allocator's kernels are compiled (or loaded from numba's
cache) when their modules are imported, with the signatures the solves use, and numba may not
compile any other (`coral/allocator/kernels/jit.py`). Deterministic: numba's compile events and the
dispatchers' signatures are counted, no clock is read."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from typing import Any, Callable, Iterator

import pytest
from numba.core import event
from test_allocator_pd_decomposition import pd_problem
from test_allocator_support import column, random_problem

from coral.allocator.problem import AllocationProblem, ModelDemand
from coral.allocator.kernels import jit
from coral.allocator.solve.ilp import solve_allocation

#: The kernels `decomposition/knapsack.py` and `decomposition/pd_cover.py` call (the others are
#: called from these).
ENTRY_POINTS = (
    "coral.allocator.kernels.knapsack_kernel.start",
    "coral.allocator.kernels.knapsack_kernel.fix",
    "coral.allocator.kernels.knapsack_programme.programme",
    "coral.allocator.kernels.pd_cover_kernel.frontier",
    "coral.allocator.kernels.pd_cover_kernel.combine",
    "coral.allocator.kernels.pd_cover_kernel.finish",
)


def test_every_kernel_is_compiled_when_imported_and_compiles_no_other() -> None:
    jit.warm_up()
    kernels = jit.dispatchers()
    assert set(ENTRY_POINTS) <= set(kernels)
    for name, disp in kernels.items():
        assert disp.signatures, f"{name} is compiled on its first call, not at import"
        with pytest.raises(RuntimeError, match="compilation disabled"):
            disp.compile("(float32,)")


def mixed_problem(seed: int) -> AllocationProblem:
    """One model served both ways, aggregated and prefill/decode in two regions: three groups
    of the PD cover, the case that sums frontiers (`combine`)."""
    rng = random.Random(seed)
    regions = ("r1", "r2")
    templates = []
    for i, (mode, unit) in enumerate((("aggregated", 1.2), ("aggregated", 1.2),
                                      ("prefill", 2000.0), ("decode", 150.0),
                                      ("prefill", 2000.0), ("decode", 150.0))):
        nodes = {rng.choice(("g1", "g2", "g3")): rng.choice((1, 2))}
        n = sum(nodes.values())
        prices = {r: round(rng.uniform(0.5, 4.0) * n, 2) for r in regions}
        templates.append(column(f"t{i}", "m", nodes, round(unit * n * rng.uniform(0.7, 1.3), 2),
                                prices, mode))
    availability = {(g, r): rng.randint(2, 9) for g in ("g1", "g2", "g3") for r in regions}
    demand = ModelDemand("m", round(rng.uniform(2.0, 6.0), 3), input_tokens=1000.0,
                         output_tokens=100.0)
    return AllocationProblem(demands=(demand,), templates=tuple(templates), regions=regions,
                             availability=availability, current={}, startup_s=0.0,
                             time_limit_s=20.0, mip_gap=0.0)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Counts the calls of each entry point (the callers look them up on the module at each
    call), so that the test below is known to have run every one of them."""
    import importlib

    counts = dict.fromkeys(ENTRY_POINTS, 0)
    for name in ENTRY_POINTS:
        module_name, attr = name.rsplit(".", 1)
        module = importlib.import_module(module_name)
        disp = getattr(module, attr)

        def counted(*args: Any, _disp: Callable[..., Any] = disp, _name: str = name) -> Any:
            counts[_name] += 1
            return _disp(*args)

        monkeypatch.setattr(module, attr, counted)
    yield counts


def test_a_solve_compiles_nothing(calls: dict[str, int]) -> None:
    """Solves of every kind the kernels serve (aggregated, PD and mixed models, cost and
    scarcity phases, with and without a running deployment) after `warm_up`: numba compiles nothing
    and every kernel keeps the signatures it was imported with."""
    assert jit.warm_up() == 0.0  # imported by the fixture already: nothing left to do
    kernels = jit.dispatchers()
    before = {name: list(d.signatures) for name, d in kernels.items()}
    misses = {name: sum(d.stats.cache_misses.values()) for name, d in kernels.items()}
    problems = [random_problem(seed) for seed in range(4)]
    problems += [random_problem(seed, pd=True, with_current=True, startup_s=600.0)
                 for seed in range(4)]
    problems += [pd_problem(seed, mip_gap=0.0) for seed in range(3)]
    problems += [pd_problem(seed, mip_gap=0.005, nodes_per_type=(0, 2)) for seed in range(3)]
    problems += [mixed_problem(seed) for seed in range(2)]
    with event.install_recorder("numba:compile") as compiled:
        for problem in problems:
            solve_allocation(problem)
    assert not compiled.buffer, [ev.data["dispatcher"].py_func.__qualname__
                                 for _, ev in compiled.buffer if ev.is_start]
    assert {name: list(d.signatures) for name, d in kernels.items()} == before
    assert {name: sum(d.stats.cache_misses.values()) for name, d in kernels.items()} == misses
    assert all(calls.values()), calls  # every kernel ran, so none could have compiled


def test_a_read_only_install_compiles_once_into_the_user_cache(tmp_path) -> None:
    """A package directory that cannot be written (numba skips the cache beside the source)
    caches in the user's cache directory: the first process compiles and says so, the next
    loads and says nothing."""
    code = ("import logging, sys\n"
            "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
            "from coral.allocator.kernels.jit import warm_up\n"
            "warm_up()\n")
    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "UserWideCacheLocator",
           "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("NUMBA_CACHE_DIR", None)
    outs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=900) for _ in range(2)]
    for out in outs:
        assert out.returncode == 0, out.stderr
    assert "compiled the allocator's kernels" in outs[0].stdout
    assert "compiled" not in outs[1].stdout
    assert list((tmp_path / "numba").rglob("*.nbi"))
