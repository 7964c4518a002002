"""Relax-and-fix by model: a plan near an LP optimum for allocation ILPs too large for HiGHS's
own search in the time limit (`advanced` at n_max 6: 47,000 columns in mixed mode).

One model at a time, its columns near the LP optimum integer and every other model's
continuous, HiGHS solves the ILP (small: one model's integer columns, the rest an LP); that
model's counts are then fixed and the next model goes. The models whose LP fractions cost the
most to round up go first, while the others can still move around them; the last ones fill
what is left. Rounding the LP down and repairing each model's rest in turn
(`plan_search.round_and_repair`) fails on such problems where availability binds (the nodes a
model's rest needs are gone), and HiGHS on a neighbourhood of the LP finds plans only slowly,
since each model's choice of instances there is left to its branching over every model at once.

The plan it returns meets every row of the ILP (each step keeps the fixed counts and an LP
solution of the rest feasible), so the caller only compares its objective.
"""

from __future__ import annotations

import math
import time

import highspy
import numpy as np

from coral.allocator.core.formulation import LpArrays, Vars
from coral.allocator.core.highs_runs import HighsRun, Relaxation, run_highs
from coral.allocator.decomposition.branch_price import INTEGRALITY_TOL
from coral.allocator.decomposition.lagrange import Decomposition

#: Columns of least reduced cost each model may use besides those of the LP optimum and the
#: plan given: enough for the integer choices near the LP, few enough that each model's step
#: takes tenths of a second.
COLUMNS_PER_MODEL = 150

#: Relative gap at which one model's step stops: its objective is the whole problem's (the
#: fixed models, this one, the others' LP), so this is a share of the plan's cost.
STEP_GAP = 1e-3


def rounding_order(dec: Decomposition, x_lp: np.ndarray) -> np.ndarray:
    """Models by what rounding their LP counts up would cost (price times the fraction
    missing to the next instance), most first: the lumpiest choices are made while the
    other models can still move around them."""
    up = np.ceil(x_lp - INTEGRALITY_TOL) - x_lp
    up = np.where(up > INTEGRALITY_TOL, up, 0.0)
    cost = np.bincount(dec.col_model, weights=up * dec.col_price, minlength=dec.n_models)
    models = np.unique(dec.col_model)
    return models[np.argsort(-cost[models], kind="stable")]


def near_columns(dec: Decomposition, relaxed: Relaxation, v: Vars, plan: np.ndarray | None,
                 per_model: int = COLUMNS_PER_MODEL) -> np.ndarray:
    """The x columns the LP optimum or `plan` use, and each model's `per_model` columns of
    least reduced cost."""
    near = relaxed.x > INTEGRALITY_TOL
    if plan is not None:
        near |= plan > 0
    if relaxed.col_dual is None:
        return np.ones(len(v.x), dtype=bool)
    reduced = relaxed.col_dual[v.x]
    for m in np.unique(dec.col_model):
        own = np.flatnonzero(dec.col_model == m)
        near[own[np.argsort(reduced[own], kind="stable")[:per_model]]] = True
    return near


def relax_and_fix(arr: LpArrays, v: Vars, dec: Decomposition, relaxed: Relaxation, *,
                  objective: np.ndarray, col_lb: np.ndarray, row_lb: np.ndarray,
                  deadline: float, threads: int | None, cutoff: float = math.inf,
                  plan: np.ndarray | None = None) -> np.ndarray | None:
    """Counts per x column of a plan of objective below `cutoff` (minimising `objective`
    over the ILP `arr` with bounds `col_lb` and row bounds `row_lb`), made model by model
    (module docstring); None when a step finds no plan in its share of the time to
    `deadline`, or proves none below `cutoff` (each step's objective bounds the final one:
    fixing later models only raises it). `plan`'s columns are kept among those it may use.
    Where the models fixed leave the next one no integer cover, the last ones fixed are
    freed one by one and solved together with the models left."""
    near = near_columns(dec, relaxed, v, plan)
    lo = col_lb.astype(float).copy()
    hi = arr.col_ub.astype(float).copy()
    hi[v.x] = np.where(near, hi[v.x], lo[v.x])
    x = np.rint(lo[v.x]).astype(np.int64)
    order = rounding_order(dec, relaxed.x)
    lo0, hi0 = lo.copy(), hi.copy()
    k = 0
    while k < len(order):
        left = deadline - time.perf_counter()
        own = dec.col_model == order[k]
        # the first models' steps are the hardest (most of the problem still free)
        run = _step(arr, v, objective, lo, hi, row_lb, own & near, cutoff=cutoff,
                    time_limit_s=left * min(1.0, 2.0 / (len(order) - k + 1)),
                    threads=threads)
        j = k
        while run is None and j > 0 and time.perf_counter() < deadline:
            # the models fixed so far leave this one no integer cover: the last one fixed is
            # freed again and solved together with the models left
            j -= 1
            own = np.isin(dec.col_model, order[j:])
            lo[v.x[own]], hi[v.x[own]] = lo0[v.x[own]], hi0[v.x[own]]
            run = _step(arr, v, objective, lo, hi, row_lb, own & near, cutoff=cutoff,
                        time_limit_s=deadline - time.perf_counter(), threads=threads)
            k = len(order) - 1
        if run is None:
            return None
        counts = np.rint(run.values[v.x]).astype(np.int64)
        x[own] = counts[own]
        lo[v.x[own]] = counts[own]
        hi[v.x[own]] = counts[own]
        k += 1
    return x


def _step(arr: LpArrays, v: Vars, objective: np.ndarray, lo: np.ndarray, hi: np.ndarray,
          row_lb: np.ndarray, integer_x: np.ndarray, *, cutoff: float, time_limit_s: float,
          threads: int | None) -> HighsRun | None:
    """HiGHS with the x columns `integer_x` integer and every other column continuous; its
    run where it found a solution of objective below `cutoff`, else None."""
    if time_limit_s <= 0:
        return None
    model = arr.highs_lp(objective, lo, row_lb, maximise=False, col_ub=hi)
    integer = np.zeros(len(objective), dtype=bool)
    integer[v.x[integer_x]] = True
    model.integrality_ = [highspy.HighsVarType.kInteger if b
                          else highspy.HighsVarType.kContinuous for b in integer]
    run = run_highs(model, time_limit_s=time_limit_s, mip_gap=STEP_GAP, threads=threads,
                    cutoff=cutoff)
    # HiGHS may hand back a solution at or above its objective bound: the cutoff is checked
    if not run.ok or run.values is None or not run.objective < cutoff:
        return None
    return run
