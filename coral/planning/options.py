"""How a scenario is planned: one frozen options object, passed whole.

`plan_scenario` and `run_timeline` take the same choices (where the template libraries live,
how they are built, the node limit, the allocation's time limit, gap and scarcity
objective), and `plan_scenario` also the plan's promise (`robust`, `spot`). `coral plan`,
`coral adapt`, the evaluation and the re-planner build one `PlanOptions` from their own
inputs and hand it down, so each default lives here (and in the constants it names).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from coral.allocator.problem import (
    DEFAULT_MIP_GAP,
    DEFAULT_SCARCITY,
    DEFAULT_TIME_LIMIT_S,
    Scarcity,
)
from coral.errors import InputError
from coral.planning.libraries import DEFAULT_TEMPLATES_DIR
from coral.templates.builder.build_options import BuildOptions

if TYPE_CHECKING:  # the spot planner loads only when a plan asks for spot
    from coral.allocator.spot.market import SpotOptions


@dataclass(frozen=True)
class PlanOptions:
    """How to plan a scenario (every field has a default)."""

    build: BuildOptions = BuildOptions()
    """How the template libraries are built (engine, workers, placement time limit, ...);
    its engine is the one every instance of the plan is deployable on."""
    out_root: str | Path | None = DEFAULT_TEMPLATES_DIR
    """Root of the template libraries (reused when their inputs match); None: nothing is
    written and every library is solved afresh."""
    nmax: int | None = None
    """Build templates with at most this many nodes (None: the scenario's `n_max`)."""
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    """Time limit of one allocation solve, seconds (mode auto solves each mode within it)."""
    mip_gap: float = DEFAULT_MIP_GAP
    """Relative gap at which an allocation solve stops."""
    scarcity: Scarcity = DEFAULT_SCARCITY
    """What the allocation maximises when demand cannot be met (`AllocationProblem`)."""
    robust: float | str | None = None
    """R of a plan whose demand stays covered with any one GPU type `1 + R` times slower
    than modelled, or "auto" (each GPU type by the perf model's error on it); None: nominal."""
    spot: SpotOptions | None = None
    """Plan on spot and on-demand instances under this chance constraint; None: on demand."""

    def __post_init__(self) -> None:
        if self.nmax is not None and self.nmax < 1:
            raise InputError(f"nmax must be >= 1, got {self.nmax}")
        if self.robust is not None and self.spot is not None:
            raise InputError("--spot and --robust cannot be combined (yet): plan with one of "
                             "them")

    @property
    def engine(self) -> str:
        """The serving engine the plan must be deployable on."""
        return self.build.engine
