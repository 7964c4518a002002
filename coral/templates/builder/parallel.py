"""Run placement solves in parallel: in-process, on local processes, or on a Ray cluster.

`build_library` hands one wave (all combinations of one size) at a time to a backend and
consumes the outcomes as they arrive, in any order; the next wave starts once a wave is done,
so that dominance pruning always sees every smaller combination.

- `SerialBackend` (`workers=1`): solves in the calling process with its perf model.
- `ProcessBackend` (`workers=N`): a `concurrent.futures.ProcessPoolExecutor`; each worker
  builds its own perf model and operating-point tables once (pool initializer) and keeps them
  for every combination it is given; combinations go out in chunks to amortise the hand-over.
- `RayBackend` (`ray_address=...`): one Ray actor per CPU of the cluster (or `workers`), each
  holding its perf model and tables; Ray is imported only when asked for and is not a
  required dependency (`pip install coral-serving[ray]`).

`ProgressBar` is a rich progress bar (done/total, combinations per second, elapsed, ETA).
"""

from __future__ import annotations

import math
import os
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from coral.catalog.loader import Catalog
from coral.errors import InputError
from coral.templates.builder.build_options import BuildOptions
from coral.templates.builder.solve import Outcome, Solver, Task, solve_task
from coral.errors import CoralError
from coral.templates.space.operating_points import OperatingPointTables, PerfLike, shared_tables
from coral.templates.slo import SloSpec
from coral.templates.types import Mode, Topology

RAY_INSTALL_HINT = "pip install coral-serving[ray]"


class MissingDependencyError(CoralError, RuntimeError):
    """An optional dependency was asked for and is not installed (the message says how to
    install it)."""


def default_perf_factory(catalog: Catalog) -> PerfLike:
    """The project's performance model for `catalog`."""
    from coral.perf.model import PerfModel

    return PerfModel(catalog)


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to solve any combination of one library build (picklable)."""

    catalog: Catalog
    perf_factory: Callable[[Catalog], PerfLike] | None
    model: str
    slo: SloSpec
    mode: Mode
    topology: Topology
    batches: tuple[int, ...]
    time_limit_s: float
    method: str
    bound_skip: bool
    solver: Solver | None = None
    engine: str = "coral"


class _WorkerState:
    def __init__(self, spec: WorkerSpec, perf: PerfLike | None = None):
        self.spec = spec
        self.perf = perf if perf is not None else (spec.perf_factory or default_perf_factory)(
            spec.catalog
        )
        self.tables: OperatingPointTables = shared_tables(self.perf, spec.catalog, spec.batches)
        self.arch = spec.catalog.model(spec.model)

    def solve(self, tasks: Sequence[Task]) -> list[Outcome]:
        s = self.spec
        return [
            solve_task(
                t, model=self.arch, slo=s.slo, mode=s.mode, topology=s.topology, perf=self.perf,
                catalog=s.catalog, tables=self.tables, time_limit_s=s.time_limit_s,
                method=s.method, bound_skip=s.bound_skip, solver=s.solver, engine=s.engine,
            )
            for t in tasks
        ]


_STATE: _WorkerState | None = None


def _init_worker(spec: WorkerSpec) -> None:
    global _STATE
    # a worker never writes results to stdout; send anything a native library prints there
    # (e.g. a solver banner) to stderr so that the parent's `--json` output stays clean
    try:
        sys.stdout.flush()
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # pragma: no cover - no real file descriptors
        pass
    _STATE = _WorkerState(spec)


def _solve_chunk(tasks: Sequence[Task]) -> list[Outcome]:
    assert _STATE is not None, "worker not initialised"
    return _STATE.solve(tasks)


def _ready(_: int = 0) -> int:
    return os.getpid()


def chunked(tasks: Sequence[Task], workers: int, max_chunk: int = 16) -> list[list[Task]]:
    """Split a wave in chunks: large enough to amortise the hand-over, small enough that
    every worker gets several (load balance) and progress is reported often."""
    if not tasks:
        return []
    size = max(1, min(max_chunk, math.ceil(len(tasks) / (4 * max(workers, 1)))))
    return [list(tasks[i:i + size]) for i in range(0, len(tasks), size)]


class SerialBackend:
    """Solve in the calling process."""

    def __init__(self, spec: WorkerSpec, perf: PerfLike):
        self.state = _WorkerState(spec, perf)
        self.workers = 1

    def run(self, tasks: Sequence[Task]) -> Iterator[Outcome]:
        for task in tasks:
            yield from self.state.solve([task])

    def close(self) -> None:
        pass


class ProcessBackend:
    """A local process pool; results stream back as chunks finish."""

    def __init__(self, spec: WorkerSpec, workers: int):
        import multiprocessing as mp

        self.workers = workers
        methods = mp.get_all_start_methods()
        ctx = mp.get_context("fork" if "fork" in methods else "spawn")
        self.pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(spec,)
        )
        # start every worker now (before any progress-bar thread exists)
        list(self.pool.map(_ready, range(workers)))

    def run(self, tasks: Sequence[Task]) -> Iterator[Outcome]:
        chunks = chunked(tasks, self.workers)
        # keep a bounded number of chunks in flight so results stream back in order of work
        in_flight: set[Future[list[Outcome]]] = set()
        it = iter(chunks)
        limit = 2 * self.workers
        for chunk in it:
            in_flight.add(self.pool.submit(_solve_chunk, chunk))
            if len(in_flight) >= limit:
                break
        while in_flight:
            done, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
            for fut in done:
                yield from fut.result()
                nxt = next(it, None)
                if nxt is not None:
                    in_flight.add(self.pool.submit(_solve_chunk, nxt))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class RayBackend:
    """Ray actors, each holding its own perf model and operating-point tables."""

    def __init__(self, spec: WorkerSpec, address: str, workers: int | None):
        try:
            import ray  # noqa: F401
        except ImportError:
            raise MissingDependencyError(
                f"the Ray backend needs Ray, which is not installed: {RAY_INSTALL_HINT}"
            ) from None
        import ray

        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        if workers is None:
            workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.workers = workers

        @ray.remote(num_cpus=1)
        class _Actor:  # pragma: no cover - runs on the cluster
            def __init__(self, spec: WorkerSpec):
                self.state = _WorkerState(spec)

            def solve(self, tasks: Sequence[Task]) -> list[Outcome]:
                return self.state.solve(tasks)

        spec_ref = ray.put(spec)
        self.actors = [_Actor.remote(spec_ref) for _ in range(workers)]

    def run(self, tasks: Sequence[Task]) -> Iterator[Outcome]:
        ray = self.ray
        chunks = chunked(tasks, self.workers)
        free = list(self.actors)
        pending: dict[Any, Any] = {}
        it = iter(chunks)
        while True:
            while free:
                chunk = next(it, None)
                if chunk is None:
                    break
                actor = free.pop()
                pending[actor.solve.remote(chunk)] = actor
            if not pending:
                return
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                free.append(pending.pop(ref))
                yield from ray.get(ref)

    def close(self) -> None:
        for actor in getattr(self, "actors", []):
            try:
                self.ray.kill(actor)
            except Exception:  # pragma: no cover - best effort
                pass


def make_backend(
    options: BuildOptions,
    *,
    catalog: Catalog,
    perf: PerfLike,
    model: str,
    slo: SloSpec,
    mode: Mode,
    topology: Topology,
) -> SerialBackend | ProcessBackend | RayBackend:
    """The backend for `options.workers` (None: one per CPU) / `options.ray_address`;
    `topology` is the one the build resolved from the options' engine."""
    spec = WorkerSpec(
        catalog=catalog, perf_factory=options.perf_factory, model=model, slo=slo, mode=mode,
        topology=topology, batches=options.batches, time_limit_s=options.time_limit_s,
        method=options.method, bound_skip=options.bound_skip, solver=options.solver,
        engine=options.engine,
    )
    workers, ray_address = options.workers, options.ray_address
    if ray_address:
        return RayBackend(spec, ray_address, workers)
    if workers is None:
        workers = os.cpu_count() or 1
    if workers < 1:
        raise InputError(f"workers must be >= 1, got {workers}")
    if workers == 1:
        return SerialBackend(spec, perf)
    return ProcessBackend(spec, workers)


class ProgressBar:
    """A rich progress bar on stderr (combinations done/total, rate, elapsed, ETA)."""

    def __init__(self, *, enabled: bool, total: int, description: str):
        self.enabled = enabled and total > 0
        self.total = total
        self.description = description
        self._progress = None
        self._task = None

    def __enter__(self) -> "ProgressBar":
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total, rate="")
        return self

    def advance(self, n: int = 1) -> None:
        if self._progress is not None:
            task = self._progress.tasks[0]
            speed = task.speed
            rate = f"{speed:.1f} combos/s" if speed else ""
            self._progress.update(self._task, advance=n, rate=rate)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
