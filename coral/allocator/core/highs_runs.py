"""HiGHS runs on the allocation ILP: one MILP run (`run_highs`), its LP relaxation with node
prices and reduced costs (`lp_relaxation`), runs on a neighbourhood of columns
(`run_on_support`), and the column bounds reduced costs allow (`fix_by_reduced_cost`), with
the bound such a restricted run proves for the whole problem (`bound_with_limit`); and the
HiGHS runs that follow branch and price on the cost problem (`highs_after_decomposition`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import highspy
import numpy as np

from coral.allocator.decomposition.branch_price import INTEGRALITY_TOL
from coral.allocator.core.formulation import LpArrays, LpBuilder, Vars
from coral.allocator.decomposition.lagrange import Decomposition
from coral.solvers import quiet_highs, set_threads

INSIDE = 1.0 - 1e-6


#: Share of the time after branch and price that HiGHS may take on the columns the root
#: master's mix and the plan use (a few dozen), before the whole ILP: HiGHS's root on the
#: whole ILP takes seconds, and on that neighbourhood it finds cheaper plans in tenths of a
#: second.
ROOT_NEIGHBOURHOOD_SHARE = 0.5

#: x columns HiGHS's root on an allocation ILP gets through per second, about, and the
#: columns a run is always made on however little time is left (its root on a few thousand
#: columns ends in a fraction of a second). Past them the root does not end in the time left,
#: and HiGHS, which does not stop inside it, overruns its limit: on `advanced` at n_max 6
#: (18,795 columns, 5 s left) by two to three minutes (benchmarks/results/scarcity.md).
ROOT_COLUMNS_PER_S = 1_000.0
ROOT_MIN_COLUMNS = 5_000


def root_fits(columns: int, seconds: float) -> bool:
    """Whether HiGHS's root on `columns` free x columns ends within `seconds`."""
    return columns <= max(ROOT_MIN_COLUMNS, ROOT_COLUMNS_PER_S * seconds)


#: Where HiGHS on the whole ILP would get less than this (seconds), the neighbourhood gets
#: all the time: the whole ILP's presolve and root LP, which HiGHS does not interrupt, would
#: overrun the limit, and it finds no plan in that time.
WHOLE_ILP_MIN_S = 0.5


@dataclass
class HighsRun:
    ok: bool  # a primal solution exists
    infeasible: bool  # proven infeasible
    optimal: bool
    values: np.ndarray | None
    objective: float
    bound: float  # proven dual bound (nan when none)
    gap: float
    detail: str


def run_highs(lp_in: highspy.HighsLp, *, time_limit_s: float, mip_gap: float,
               threads: int | None, cutoff: float = math.inf,
               target: float = -math.inf) -> HighsRun:
    """One HiGHS run (minimising). `cutoff`: only solutions of lower objective are looked
    for (a plan known beforehand); `target`: stop at the first solution this good.

    No start solution is passed: HiGHS 1.16 with presolve on mis-values one (measured on an
    advanced-size scarcity phase 2: a start of cost 5799.46 reported at 5523.21, below the LP
    bound, and "optimal" with that as the dual bound), so neither its objective nor its bound
    could be trusted. A cutoff keeps what a start would prune by."""
    h = quiet_highs()
    h.setOptionValue("time_limit", float(max(time_limit_s, 1e-3)))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    # Feasibility jump costs more than it finds on these covering problems (measured with
    # benchmarks/allocator.py: 0.9 s -> 0.3 s on a core-size problem, same optimum).
    h.setOptionValue("mip_heuristic_run_feasibility_jump", False)
    set_threads(h, threads)
    if math.isfinite(cutoff):
        h.setOptionValue("objective_bound", float(cutoff))
    if math.isfinite(target):
        h.setOptionValue("objective_target", float(target))
    h.passModel(lp_in)
    outcome = h.run()
    status = h.getModelStatus()
    if outcome == highspy.HighsStatus.kError and status == highspy.HighsModelStatus.kNotset:
        raise RuntimeError("HiGHS did not run the allocation MILP (it rejected its options "
                           "or model)")
    info = h.getInfo()
    has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
    infeasible = status in (highspy.HighsModelStatus.kInfeasible,
                            highspy.HighsModelStatus.kUnboundedOrInfeasible)
    values = np.array(h.getSolution().col_value) if has_sol and not infeasible else None
    gap = float(info.mip_gap) if values is not None else math.inf
    if not math.isfinite(gap) or gap < 0:
        gap = 0.0 if status == highspy.HighsModelStatus.kOptimal else math.inf
    bound = float(info.mip_dual_bound)
    return HighsRun(
        ok=values is not None,
        infeasible=infeasible,
        optimal=status == highspy.HighsModelStatus.kOptimal,
        values=values,
        objective=float(info.objective_function_value) if values is not None else math.nan,
        bound=bound if math.isfinite(bound) else math.nan,
        gap=gap,
        detail=h.modelStatusToString(status),
    )


@dataclass
class Relaxation:
    value: float  # the LP's optimum: a bound of the ILP (-inf when HiGHS gave none)
    node_price: np.ndarray  # shadow price of one node per availability row
    x: np.ndarray  # the LP's values of the x columns
    col_value: np.ndarray | None = None  # every column's value (None when not optimal)
    col_dual: np.ndarray | None = None  # every column's reduced cost


def lp_relaxation(arr: "LpArrays", cost: np.ndarray, col_lb: np.ndarray,
                   row_lb: np.ndarray, lp: LpBuilder, n_x: int) -> Relaxation | None:
    """The LP relaxation, minimising `cost`: its bound, where column generation starts, and
    counts to round. None when it is infeasible (proven by HiGHS)."""
    relaxed = arr.highs_lp(cost, col_lb, row_lb, maximise=False)
    relaxed.integrality_ = [highspy.HighsVarType.kContinuous] * len(cost)
    h = quiet_highs()
    h.passModel(relaxed)
    h.run()
    status = h.getModelStatus()
    rows, _, _ = lp.availability_rows
    if status != highspy.HighsModelStatus.kOptimal:
        if status == highspy.HighsModelStatus.kInfeasible:
            return None
        return Relaxation(-math.inf, np.zeros(len(rows)), np.zeros(n_x))
    sol = h.getSolution()
    duals = np.array(sol.row_dual)
    return Relaxation(
        value=float(h.getInfo().objective_function_value),
        node_price=np.maximum(0.0, -duals[rows]),  # a <= row's dual is <= 0 when minimising
        x=np.array(sol.col_value)[:n_x],
        col_value=np.array(sol.col_value),
        col_dual=np.array(sol.col_dual),
    )


def support_of(relaxed: "Relaxation", x: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """The x columns an LP optimum or a plan use, and `extra` ones."""
    support = (relaxed.x > INTEGRALITY_TOL) | (x > 0)
    support[extra] = True
    return support


def run_on_support(arr: "LpArrays", v: Vars, cost: np.ndarray, col_lb: np.ndarray,
                    row_lb: np.ndarray, support: np.ndarray, *, cutoff: float,
                    time_limit_s: float, mip_gap: float, threads: int | None,
                    target: float = -math.inf) -> tuple["HighsRun", np.ndarray | None]:
    """HiGHS with the x columns outside `support` held at their lower bounds (a neighbourhood
    of an LP optimum and a plan, small enough to solve fast); its run and plan, if any."""
    hi = arr.col_ub.astype(float).copy()
    hi[v.x] = np.where(support, hi[v.x], col_lb[v.x])
    run = run_highs(arr.highs_lp(cost, col_lb, row_lb, maximise=False, col_ub=hi),
                     time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads,
                     cutoff=cutoff, target=target)
    return run, plan_of_run(run, v)


def plan_of_run(run: "HighsRun", v: Vars) -> np.ndarray | None:
    return None if not run.ok or run.values is None else np.rint(run.values[v.x]).astype(
        np.int64)


def free_columns(lo: np.ndarray, hi: np.ndarray, v: Vars) -> int:
    return int((hi[v.x] > lo[v.x]).sum())


def fix_by_reduced_cost(arr: "LpArrays", relaxed: Relaxation, col_lb: np.ndarray,
                         limit: float) -> tuple[np.ndarray, np.ndarray]:
    """Column bounds within which lies every solution of objective at most `limit`
    (minimising): moving an integer column off the LP optimum's bound by k costs at least k
    times its reduced cost, on top of the LP's value."""
    assert relaxed.col_value is not None and relaxed.col_dual is not None
    lo, hi = col_lb.astype(float).copy(), arr.col_ub.astype(float).copy()
    slack = limit - relaxed.value
    slack += 1e-9 * max(1.0, abs(limit)) + 1e-9  # the LP's own tolerances
    if slack < 0:
        slack = 0.0
    x, d = relaxed.col_value, relaxed.col_dual
    tol = 1e-7
    at_lo = arr.integer & (np.abs(x - lo) <= tol) & (d > tol)
    at_hi = arr.integer & (np.abs(x - hi) <= tol) & (d < -tol)
    with np.errstate(divide="ignore", invalid="ignore"):
        move = np.floor(slack / np.abs(d) + 1e-6)
    hi[at_lo] = np.minimum(hi[at_lo], lo[at_lo] + move[at_lo])
    lo[at_hi] = np.maximum(lo[at_hi], hi[at_hi] - move[at_hi])
    return lo, hi


def bound_with_limit(run: "HighsRun", limit: float, fallback: float) -> float:
    """The proven bound of a run over columns fixed for `limit`: a plan outside them costs
    more than `limit`, one inside no less than the run's bound (HiGHS's, else `fallback`, a
    bound of the whole problem)."""
    if run.infeasible:
        inside = math.inf
    elif math.isfinite(run.bound):
        inside = max(run.bound, fallback)
    else:
        inside = fallback
    return min(inside, limit)


def highs_after_decomposition(arr: "LpArrays", v: Vars, dec: Decomposition,
                              counts: np.ndarray | None, cost: float, bound: float, *,
                              mip_gap: float, time_limit_s: float, threads: int | None,
                              notes: list[str], neighbourhood: np.ndarray | None = None,
                              min_run_s: float = 0.0) -> tuple[np.ndarray | None, float, float]:
    """HiGHS on the cost ILP after branch and price stopped short of the gap, below its
    plan's cost and stopping at the first plan its bound proves: first on `neighbourhood`
    (x columns, with the plan's; its plans only: a restricted run bounds nothing) for
    `ROOT_NEIGHBOURHOOD_SHARE` of the time, then on the whole ILP while more than `min_run_s`
    is left (the neighbourhood gets all the time where the whole ILP would get less than
    `WHOLE_ILP_MIN_S`). Returns the better plan (counts, cost; None and inf when none was
    found) and the better bound (each holds for every plan; inf when HiGHS proves that none
    meets demand)."""
    end = time.perf_counter() + time_limit_s
    target = bound / (1.0 - mip_gap * INSIDE) if math.isfinite(bound) else -math.inf
    first = neighbourhood is not None and counts is not None
    columns = len(v.x)
    whole_s = (1.0 - ROOT_NEIGHBOURHOOD_SHARE) * time_limit_s if first else time_limit_s
    whole = (not first or whole_s >= WHOLE_ILP_MIN_S) and root_fits(columns, whole_s)

    def take(x: np.ndarray | None) -> None:
        nonlocal counts, cost
        if x is not None and dec.fits(x) and dec.covers(x) and dec.cost(x) < cost:
            counts, cost = x, dec.cost(x)

    if first:
        assert neighbourhood is not None and counts is not None
        support = neighbourhood | (counts > 0)
        run, x = run_on_support(arr, v, arr.cost, arr.col_lb, arr.row_lb, support,
                                cutoff=cost, mip_gap=mip_gap, threads=threads, target=target,
                                time_limit_s=(ROOT_NEIGHBOURHOOD_SHARE if whole else 1.0)
                                * time_limit_s)
        take(x)
        notes.append(f"HiGHS on the root's and the plan's {int(support.sum())} columns: "
                     f"{run.detail}, cost {cost:.6g}")
    if cost <= target or end - time.perf_counter() <= min_run_s:
        return counts, cost, bound  # the bound proves the plan, or no time is left
    if not whole or not root_fits(columns, end - time.perf_counter()):
        notes.append(f"no time for HiGHS on the whole ILP ({columns} columns)")
        return counts, cost, bound
    run = run_highs(arr.highs_lp(arr.cost, arr.col_lb, arr.row_lb, maximise=False),
                     time_limit_s=end - time.perf_counter(), mip_gap=mip_gap,
                     threads=threads, cutoff=cost, target=target)
    take(plan_of_run(run, v))
    if run.infeasible:
        # nothing cheaper than `cost` meets demand: `cost` is optimal, or no plan exists
        bound = cost
    elif math.isfinite(run.bound):
        bound = max(bound, min(run.bound, cost))
    notes.append(f"HiGHS after branch and price: {run.detail}, cost {cost:.6g}, bound "
                 f"{bound:.6g}")
    return counts, cost, bound
