"""How template libraries are built: one frozen options object, passed whole.

A library's identity (model, SLO, serving mode, `nmax`, `rho`, node types, regions) comes
from the scenario or the command that asks for it; everything else about building it, from
the engine whose shapes it holds to how many processes solve it, is a `BuildOptions`. The
planner, the CLI and the evaluation make one and hand it down unchanged to `build_library`
and its workers, so each default lives here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from coral.catalog.loader import Catalog
from coral.errors import InputError
from coral.templates.space.engines import DEFAULT_ENGINE, check_engine
from coral.templates.space.operating_points import DEFAULT_BATCHES, PerfLike, check_batches
from coral.templates.builder.solve import DEFAULT_TIME_LIMIT_S, Solver
from coral.templates.types import Topology


@dataclass(frozen=True)
class BuildOptions:
    """How to build a template library (every field has a default)."""

    engine: str = DEFAULT_ENGINE
    """Serving engine whose shapes the library holds (`coral.templates.space.engines.ENGINES`)."""
    topology: Topology | None = None
    """Placement topology; None: the engine's (`engine_topology`: flow, or chain for vllm)."""
    batches: tuple[int, ...] = DEFAULT_BATCHES
    """Decode batch sizes the operating points are tabulated at."""
    workers: int | None = 1
    """Local processes that solve combinations (None: one per CPU)."""
    ray_address: str | None = None
    """Solve on the Ray cluster at this address instead of local processes."""
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    """Time limit of one combination's placement solve, seconds."""
    method: str = "auto"
    """Placement solver method (`coral.templates.builder.solve.build_template`)."""
    bound_skip: bool = True
    """Skip a combination whose throughput bound cannot beat its parts (lossless)."""
    solver: Solver | None = None
    """A custom placement solver (tests and studies); None: the step-model MILP."""
    perf_factory: Callable[[Catalog], PerfLike] | None = None
    """How each worker process builds its perf model (None: `PerfModel(catalog)`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine", check_engine(self.engine))
        object.__setattr__(self, "batches", check_batches(self.batches))
        if self.workers is not None and self.workers < 1:
            raise InputError(f"workers must be >= 1, got {self.workers}")
        if not self.time_limit_s > 0:
            raise InputError(f"time limit must be > 0 s, got {self.time_limit_s}")
