"""Neighbourhoods of a fair phase's plan by pairs of models, for problems too large for one
HiGHS run on every column (`fair._phase`).

Above the fairness floor, the tokens and cost phases trade nodes between the models held at
their floor and the models served beyond it; a plan found near the LP keeps floors with
instances that take the nodes a model above its floor could use best. HiGHS on two models'
columns, every other column held at the plan's counts, re-packs those two models exactly;
its root ends quickly on a few thousand columns, where its root on every column of
`advanced` at n_max 6 does not end within a phase
(benchmarks/results/scarcity.md, "Presolve dominance on arrays; neighbourhoods by pairs of
models").
"""

from __future__ import annotations

import numpy as np

from coral.allocator.core.formulation import LpArrays, Vars
from coral.allocator.core.highs_runs import HighsRun, plan_of_run, run_highs
from coral.allocator.decomposition.lagrange import Decomposition

#: A model counts as above its floor when it serves this relative amount more than the floor.
ABOVE_FLOOR_REL = 1e-6


def model_pairs(dec: Decomposition, x: np.ndarray, floor: np.ndarray) -> list[np.ndarray]:
    """Masks of the x columns of two models each: every pair once, first those that join a
    model above its floor (served over `floor`, requests/s per model) with one held at it,
    the first of those the models most above their floor."""
    served = dec.served(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        surplus = np.where(floor > 0, served / floor, np.inf)
    above = surplus > 1.0 + ABOVE_FLOOR_REL
    order = np.argsort(-surplus, kind="stable")
    pairs = [(int(a), int(b)) for i, a in enumerate(order) for b in order[i + 1:]]
    pairs.sort(key=lambda p: 0 if above[p[0]] != above[p[1]] else 1)  # stable: order kept
    return [np.isin(dec.col_model, p) for p in pairs]


def run_around(arr: LpArrays, v: Vars, objective: np.ndarray, col_lb: np.ndarray,
               row_lb: np.ndarray, x: np.ndarray, free: np.ndarray, *, cutoff: float,
               target: float, time_limit_s: float, mip_gap: float, threads: int | None
               ) -> tuple[HighsRun, np.ndarray | None]:
    """HiGHS with the x columns outside `free` held at the plan `x`'s counts; its run and
    plan, if any (only plans below `cutoff` are looked for)."""
    lo = col_lb.astype(float).copy()
    hi = arr.col_ub.astype(float).copy()
    lo[v.x] = np.where(free, col_lb[v.x], x)
    hi[v.x] = np.where(free, hi[v.x], x)
    run = run_highs(arr.highs_lp(objective, lo, row_lb, maximise=False, col_ub=hi),
                    time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads,
                    cutoff=cutoff, target=target)
    return run, plan_of_run(run, v)
