"""The paper's scarcity rule: a planner that cannot meet demand is judged at the largest
uniform scale of every model's arrival rate that it can meet.

One factor `f` in `(0, 1]` multiplies every model's req/s; the planner is re-run at `f` and
the largest `f` at which its plan meets the scaled demand is found by bisection over the
planner's own planning (any planner: Coral's allocation, a greedy baseline). The answer is
bracketed to `SCALE_TOL` (absolute, on `f`): the factor returned meets demand and
`f + SCALE_TOL` (or a factor at most that) was seen to fall short. Bisection assumes that a
planner meeting demand at `f` also meets it at any smaller factor; that holds for the
allocation ILP (a plan for more demand covers less) and for the greedy baselines up to their
rounding to whole replicas, and where it does not, the factor returned still meets demand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Generic, Sequence, TypeVar

from coral.allocator.problem import AllocationProblem, ModelDemand

#: Absolute tolerance of the bisection on the uniform demand factor.
SCALE_TOL = 1e-3
#: Factors below this are not tried (below the tolerance a factor is as good as 0).
MIN_SCALE = SCALE_TOL

T = TypeVar("T")


@dataclass(frozen=True)
class ScaledRun(Generic[T]):
    """The planner's answer at the largest factor found, and how it was found."""

    factor: float  # in [0, 1]; 1.0: the full demand was met; 0.0: nothing could be met
    result: T  # the planner's answer at `factor` (at the full demand when `factor` is 0)
    upper: float  # the smallest factor seen short of demand (1.0 < upper: never short)
    runs: int  # planner runs, the first (at full demand) included


def largest_scale(attempt: Callable[[float], tuple[bool, T]], *, tol: float = SCALE_TOL,
                  hint: float | None = None) -> ScaledRun[T]:
    """The largest factor `f` in `(0, 1]` at which `attempt(f)` reports demand met, to `tol`.

    `attempt(f)` plans at `f` times every model's demand and returns (met, answer). `hint`:
    a factor likely met (e.g. the smallest served share at full demand), tried first to
    narrow the bracket. Returns factor 0 with the full-demand answer when no factor down to
    `MIN_SCALE` is met.
    """
    if not 0 < tol < 1:
        raise ValueError(f"tol must be in (0, 1), got {tol}")
    met, first = attempt(1.0)
    runs = 1
    if met:
        return ScaledRun(1.0, first, math.inf, runs)
    lo, lo_answer, hi = 0.0, None, 1.0
    if hint is not None and MIN_SCALE <= hint < 1.0:
        ok, answer = attempt(hint)
        runs += 1
        if ok:
            lo, lo_answer = hint, answer
        else:
            hi = hint
    if lo_answer is None:
        # find any factor met, halving from the top of the bracket
        f = hi / 2
        while f >= MIN_SCALE:
            ok, answer = attempt(f)
            runs += 1
            if ok:
                lo, lo_answer = f, answer
                break
            hi, f = f, f / 2
        if lo_answer is None:
            return ScaledRun(0.0, first, hi, runs)
    while hi - lo > tol:
        mid = (lo + hi) / 2
        ok, answer = attempt(mid)
        runs += 1
        if ok:
            lo, lo_answer = mid, answer
        else:
            hi = mid
    return ScaledRun(lo, lo_answer, hi, runs)


def scaled_demands(demands: Sequence[ModelDemand], factor: float) -> tuple[ModelDemand, ...]:
    """`demands` with every model's req/s times `factor` (request shapes unchanged)."""
    return tuple(replace(d, requests_per_s=d.requests_per_s * factor) for d in demands)


def scaled_problem(problem: AllocationProblem, factor: float) -> AllocationProblem:
    """`problem` with every model's demand times `factor`."""
    return replace(problem, demands=scaled_demands(problem.demands, factor))


def goodput_tokens_per_s(served_fraction: dict[str, float],
                         demands: Sequence[ModelDemand]) -> float:
    """Generated tokens/s of the served requests: served req/s times output tokens per
    request, summed over models (`served_fraction` against `demands`' req/s)."""
    return sum(served_fraction.get(d.model, 0.0) * d.requests_per_s * d.output_tokens
               for d in demands)
