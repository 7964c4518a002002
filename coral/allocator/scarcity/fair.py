"""The fair scarcity objective (`AllocationProblem.scarcity == "fair"`, the default): when the
demand cannot be met in full, three phases on the allocation ILP's rows, each a lexicographic
step with its own proven gap:

A. **fairness**: maximise `t`, the smallest served fraction, with rows
   `s[m] - weight_m demand_m t >= 0` (`problem.fair_weights`: 1 for every model, so no
   model's floor depends on its priority) and `t` in `[0, 1]`;
B. **tokens**: maximise priority-weighted generated tokens/s
   `sum_m priority_m output_tokens_m s[m]` with `t` held at phase A's level (`FAIR_REL_TOL`
   below it, for solver rounding): what is left above the floor goes first to the models
   whose tokens are worth most (with equal priorities, the plain tokens/s);
C. **cost**: the cheapest plan at phase B's value (`TOKENS_REL_TOL` below it) with the
   floor of A still held.

So no model is starved while another is served in full, as the goodput objective does with
the model whose requests take the most GPUs. Phase A is the paper's uniform scale-down rule
made exact (with equal priorities, the largest uniform factor the availability meets), and B
and C spend what is left on the most tokens at the least cost.

Each phase (`_phase`) starts from the previous phase's plan (phase A from the best plan
given, e.g. a baseline's), bounds itself by its LP relaxation, and calls HiGHS only for the
gap those leave: first on the columns the LP and the plan use, stopping at the first plan the
LP bound proves, then on the columns reduced costs leave (`fix_by_reduced_cost`), as
`scarcity.scarcity_bounded` does for the goodput objective. Where those are too many for
HiGHS's root to end in the phase's time (`WHOLE_RUN_COLUMNS_PER_S`: `advanced` at n_max 6),
that last run is replaced by runs on growing neighbourhoods of the LP, each model's columns of
least reduced cost (`NEIGHBOURHOODS`), which find plans where the whole run found none and
overran the limit, and in the tokens and cost phases by HiGHS on two models' columns at a
time, the others held at the plan (`fair_pairs`): above the floor those phases trade nodes
between models, and a plan found near the LP keeps the floors with nodes a model above its
floor could use better.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import highspy
import numpy as np

from coral.allocator.decomposition.branch_price import relative_gap
from coral.allocator.core.formulation import LpArrays, LpBuilder, Vars
from coral.allocator.scarcity.fair_pairs import model_pairs, run_around
from coral.allocator.scarcity.fair_search import level_bound, level_fill, rounded, tokens_fill
from coral.allocator.core.relax_fix import COLUMNS_PER_MODEL, near_columns
from coral.allocator.core.root_bound import RootBound
from coral.allocator.core.highs_runs import (
    INSIDE,
    ROOT_COLUMNS_PER_S,
    ROOT_MIN_COLUMNS,
    Relaxation,
    bound_with_limit,
    fix_by_reduced_cost,
    free_columns,
    lp_relaxation,
    plan_of_run,
    run_highs,
    run_on_support,
    support_of,
)
from coral.allocator.decomposition.lagrange import Decomposition
from coral.allocator.core.presolve import MODE_DECODE, Index
from coral.allocator.problem import AllocationProblem, fair_weights

#: Phase B and C keep the fairness level `t` within this relative distance of phase A's.
FAIR_REL_TOL = 1e-6

#: Phase C keeps generated tokens/s within this relative distance of phase B's.
TOKENS_REL_TOL = 1e-9

#: Share of the time left that phase A, then phase B, may take (phase C gets the rest).
PHASE_SHARES = (0.4, 0.5, 1.0)

#: Least time given to a phase even when the budget is spent (seconds).
MIN_PHASE_S = 0.05

#: Share of the solve's time limit the phases leave unused at its end: HiGHS's last runs
#: overrun their own limits by their set-up, which they cannot stop in (more so while the
#: root bound's child shares the cores), and the plan is built after them. On `advanced` at
#: n_max 6 that comes to 0.04-0.08 s past a 10 s limit (benchmarks/results/scarcity.md,
#: "What HiGHS proves of each fair phase in two minutes", last paragraph).
END_RESERVE_SHARE = 0.01

#: Share of a phase's time HiGHS may take on the columns the LP and the plan so far use,
#: before the run on every column reduced costs leave (which brings the bound).
SUPPORT_SHARE = 0.4

#: Share of a phase's time its bound beyond the LP's (`tighten`) may take.
TIGHTEN_SHARE = 0.25

#: x columns HiGHS's root gets through per second of a phase, about: the run on the columns
#: reduced costs leave is made only where its free columns fit the time left at this rate
#: (else the neighbourhoods of `NEIGHBOURHOODS` get its time). On `advanced` at n_max 6
#: nearly every column is free, that run's root does not end within a phase, so it returns
#: no plan and no bound and overruns its limit (HiGHS does not stop inside the root),
#: leaving the cost phase nothing; on the small problems it is what finds the phase's plans
#: and bound (benchmarks/results/scarcity.md, "Per phase at the paper's scale").
WHOLE_RUN_COLUMNS_PER_S = ROOT_COLUMNS_PER_S

#: Free columns the run on the columns reduced costs leave is always made on, however little
#: time is left: its root on a few thousand columns ends in a fraction of a second.
WHOLE_RUN_MIN_COLUMNS = ROOT_MIN_COLUMNS

#: Where that run does not fit, HiGHS runs instead on the LP's and the plan's columns and
#: each model's this many columns of least reduced cost (`relax_fix.near_columns`), each run
#: stopping at the first plan the LP bound proves, the first for half the phase's time left,
#: the last for the rest, each only while its columns fit the time left at
#: `WHOLE_RUN_COLUMNS_PER_S`. Per model rather than the least reduced costs of all columns:
#: those crowd into a few models' columns, and the plans a phase needs re-pack every model
#: (the benchmark's five `advanced` `limited` draws, each solved alone: a higher level on
#: every one; benchmarks/results/scarcity.md, "Fair phases on `advanced`: neighbourhoods by
#: model, HiGHS's root bound from a child process").
NEIGHBOURHOODS = (30, COLUMNS_PER_MODEL)

#: Share of a phase's time left that one run on a pair of models may take.
PAIR_TIME_SHARE = 1.0 / 3.0

PHASES = ("fairness", "tokens", "cost")

_INF = highspy.kHighsInf


@dataclass
class FairRows:
    """The fair objective's column and rows in the ILP (`add_fair_rows`)."""
    t: int  # column of the fairness level t in [0, 1]
    tokens_row: int  # row sum_m priority_m output_tokens_m s[m] (lower bound set per phase)
    weight: np.ndarray  # (models,) priority over the top priority
    token_value: np.ndarray  # (models,) priority x output tokens per request


def add_fair_rows(lp: LpBuilder, problem: AllocationProblem, ix: Index, v: Vars) -> FairRows:
    """Add `t` and the rows of the fair objective::

        s[m] - weight_m demand_m t >= 0          for every model m
        sum_m priority_m output_tokens_m s[m]  >= T_B       (phase C; free until then)
    """
    weights = fair_weights(problem.demands)
    weight = np.array([weights[m] for m in ix.models])
    token_value = ix.tokens[:, MODE_DECODE] * ix.priority
    n_m = len(ix.models)
    t = int(lp.add_cols(np.zeros(1), np.ones(1), np.zeros(1), integer=False)[0])
    rows = lp.add_rows(np.zeros(n_m), np.full(n_m, _INF))
    lp.add_entries(rows, v.s, np.ones(n_m))
    lp.add_entries(rows, np.full(n_m, t), -weight * ix.demand)
    tokens_row = int(lp.add_rows(np.array([-_INF]), np.array([_INF]))[0])
    lp.add_entries(np.full(n_m, tokens_row), v.s, token_value)
    return FairRows(t=t, tokens_row=tokens_row, weight=weight, token_value=token_value)


@dataclass
class FairOutcome:
    """The plan of the three phases, with what each proved."""
    x: np.ndarray
    level: float
    tokens: float
    cost: float
    gaps: dict[str, float] = field(default_factory=dict)  # by phase, in `PHASES` order
    seconds: dict[str, float] = field(default_factory=dict)


def fair_level(dec: Decomposition, fr: FairRows, x: np.ndarray) -> float:
    """The largest t <= 1 the plan `x` meets as every model's floor."""
    served = dec.served(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        levels = served / (fr.weight * dec.demand)
    return float(min(1.0, levels.min())) if len(levels) else 1.0


def scarcity_fair(problem: AllocationProblem, dec: Decomposition, arr: LpArrays,
                  lp: LpBuilder, v: Vars, fr: FairRows, col_lb: np.ndarray, *, t0: float,
                  notes: list[str], threads: int | None,
                  seeds: tuple[np.ndarray, ...] = (), pd_covers: bool = False) -> FairOutcome:
    """The three fair phases from the best of `seeds` (counts of the x columns; an empty
    plan when none fits). `col_lb` has every `s[m]` free from 0; `pd_covers`: PD models'
    covers are small enough to solve exactly many times (for the level's bound)."""
    gap = problem.mip_gap
    n_x = len(v.x)
    fitting = [s for s in seeds if dec.fits(s)] or [np.zeros(n_x, dtype=np.int64)]

    def tokens_of(x: np.ndarray) -> float:
        return float(fr.token_value @ dec.served(x))

    def key(x: np.ndarray) -> tuple[float, float, float]:
        return (-fair_level(dec, fr, x), -tokens_of(x), dec.cost(x))

    x = min(fitting, key=key)
    out = FairOutcome(x, fair_level(dec, fr, x), tokens_of(x), dec.cost(x))
    row_lb = arr.row_lb.copy()
    lb = col_lb.copy()

    def deadline(share: float) -> float:
        now = time.perf_counter()
        end = t0 + problem.time_limit_s * (1.0 - END_RESERVE_SHARE)
        return now + max(share * (end - now), MIN_PHASE_S)

    # ---- A: the largest fairness level t (minimising -t)
    start = time.perf_counter()
    objective = np.zeros(lp.n_col)
    objective[fr.t] = -1.0

    def fill_level(relaxed: Relaxation, y: np.ndarray) -> list[np.ndarray]:
        return [level_fill(dec, fr.weight, base, relaxed.node_price)
                for base in (y, rounded(dec, relaxed.x))]

    def covers_bound(relaxed: Relaxation, value: float, end: float) -> float:
        return -level_bound(dec, fr.weight, relaxed.node_price, -value, -relaxed.value,
                            deadline=end, pd_covers=pd_covers)

    x, value, bound = _phase(
        "fairness", arr, lp, v, dec, objective, lb, row_lb, x0=out.x, heuristic=fill_level,
        tighten=covers_bound,
        value_of=lambda y: -fair_level(dec, fr, y), fits=dec.fits,
        deadline=deadline(PHASE_SHARES[0]), gap=gap, threads=threads, notes=notes)
    out.gaps["fairness"] = relative_gap(value, bound)
    out.seconds["fairness"] = time.perf_counter() - start
    level = -value
    lb[fr.t] = level * (1.0 - FAIR_REL_TOL)

    def pairs(y: np.ndarray) -> list[np.ndarray]:
        return model_pairs(dec, y, fr.weight * dec.demand * lb[fr.t])

    def keeps_level(y: np.ndarray) -> bool:
        return dec.fits(y) and fair_level(dec, fr, y) >= lb[fr.t] * (1.0 - 1e-9) - 1e-12

    # ---- B: the most generated tokens/s at that level
    start = time.perf_counter()
    objective = np.zeros(lp.n_col)
    objective[v.s] = -fr.token_value
    def fill_tokens(relaxed: Relaxation, y: np.ndarray) -> list[np.ndarray]:
        floor = level_fill(dec, fr.weight, rounded(dec, relaxed.x), relaxed.node_price,
                           top=lb[fr.t])
        return [tokens_fill(dec, fr.token_value, base, relaxed.node_price)
                for base in (y, floor)]

    x, value, bound = _phase(
        "tokens", arr, lp, v, dec, objective, lb, row_lb, x0=x, heuristic=fill_tokens,
        value_of=lambda y: -tokens_of(y),
        fits=keeps_level, deadline=deadline(PHASE_SHARES[1]), gap=gap, threads=threads,
        notes=notes, pairs=pairs)
    out.gaps["tokens"] = relative_gap(value, bound)
    out.seconds["tokens"] = time.perf_counter() - start
    tokens = -value
    row_lb[fr.tokens_row] = tokens * (1.0 - TOKENS_REL_TOL)

    def keeps_tokens(y: np.ndarray) -> bool:
        return keeps_level(y) and tokens_of(y) >= row_lb[fr.tokens_row] - 1e-9 * max(
            1.0, tokens)

    # ---- C: the cheapest plan at those tokens/s
    start = time.perf_counter()
    x, value, bound = _phase(
        "cost", arr, lp, v, dec, arr.cost, lb, row_lb, x0=x, value_of=dec.cost,
        fits=keeps_tokens, deadline=deadline(PHASE_SHARES[2]), gap=gap, threads=threads,
        notes=notes, pairs=pairs)
    out.gaps["cost"] = relative_gap(value, bound)
    out.seconds["cost"] = time.perf_counter() - start
    out.x, out.level, out.tokens, out.cost = x, fair_level(dec, fr, x), tokens_of(x), dec.cost(x)
    notes.append("fair scarcity: " + ", ".join(
        f"{name} {out.seconds[name]:.2f} s gap {out.gaps[name]:.3%}" for name in PHASES))
    return out


def _phase(name: str, arr: LpArrays, lp: LpBuilder, v: Vars, dec: Decomposition,
           objective: np.ndarray, col_lb: np.ndarray, row_lb: np.ndarray, *, x0: np.ndarray,
           value_of: Callable[[np.ndarray], float], fits: Callable[[np.ndarray], bool],
           deadline: float, gap: float, threads: int | None, notes: list[str],
           heuristic: Callable[[Relaxation, np.ndarray], list[np.ndarray]] | None = None,
           tighten: Callable[[Relaxation, float, float], float] | None = None,
           pairs: Callable[[np.ndarray], list[np.ndarray]] | None = None
           ) -> tuple[np.ndarray, float, float]:
    """One phase, minimising `objective` from the plan `x0` (which keeps every floor set
    so far): the LP bound, then HiGHS near the LP and the plan, then HiGHS on the columns
    reduced costs leave, each only while the gap is open. `value_of` is the phase's value
    of a plan, `fits` whether a plan keeps availability and the floors. Returns (plan, its
    value, a bound proven for every plan keeping the floors)."""
    x, value = x0, value_of(x0)
    relaxed = lp_relaxation(arr, objective, col_lb, row_lb, lp, len(v.x))
    bound = -math.inf if relaxed is None else relaxed.value
    how = "the plan so far, LP bound"

    def target() -> float:
        # the value the bound proves within the gap (minimising, either sign)
        return bound + gap * INSIDE * abs(bound) if math.isfinite(bound) else -math.inf

    def take(y: np.ndarray | None) -> bool:
        nonlocal x, value
        if y is not None and fits(y) and value_of(y) < value:
            x, value = y, value_of(y)
            return True
        return False

    if heuristic is not None and relaxed is not None and relative_gap(value, bound) > gap:
        for y in heuristic(relaxed, x):
            if take(y):
                how = "heuristic plan, LP bound"
    if tighten is not None and relaxed is not None and relative_gap(value, bound) > gap:
        bound = max(bound, tighten(relaxed, value, time.perf_counter() + TIGHTEN_SHARE * (
            deadline - time.perf_counter())))
        how += ", covers' bound"

    def root_fits(columns: int, at_least: int = 0) -> bool:
        """HiGHS's root on `columns` free columns ends in the phase's time left."""
        return columns <= max(at_least,
                              WHOLE_RUN_COLUMNS_PER_S * (deadline - time.perf_counter()))

    def whole_fits(free: int) -> bool:
        return root_fits(free, WHOLE_RUN_MIN_COLUMNS)

    whole = whole_fits(len(v.x))
    child: RootBound | None = None
    if relaxed is not None and relaxed.col_value is not None \
            and relative_gap(value, bound) > gap and not whole:
        # no time for HiGHS on every column here: its root's bound from a child process
        child = RootBound(arr, objective, col_lb, row_lb, cutoff=value, mip_gap=gap,
                          time_limit_s=deadline - time.perf_counter())
    raised = False  # the child's bound is above the LP's

    def proven() -> bool:
        """The gap closed, the bound first raised to the child's where that is higher (no
        plan below the child's cutoff, this phase's first plan, is under its bound)."""
        nonlocal bound, raised
        if child is not None and min(child.bound(), value) > bound:
            bound, raised = min(child.bound(), value), True
        return relative_gap(value, bound) <= gap

    try:
        if relaxed is not None and relaxed.col_value is not None and not proven():
            run, y = run_on_support(
                arr, v, objective, col_lb, row_lb,
                support_of(relaxed, x, np.zeros(0, dtype=np.int64)), cutoff=value,
                target=target(), mip_gap=gap, threads=threads,
                time_limit_s=SUPPORT_SHARE * (deadline - time.perf_counter()))
            if take(y):
                how = f"HiGHS on the LP's and the plan's columns ({run.detail}), LP bound"
            sizes = NEIGHBOURHOODS if relaxed.col_dual is not None and not whole else ()
            for i, per_model in enumerate(sizes):
                if proven():
                    break
                support = near_columns(dec, relaxed, v, x, per_model=per_model)
                if not root_fits(int(support.sum())):
                    break  # its root would overrun the phase
                run, y = run_on_support(
                    arr, v, objective, col_lb, row_lb, support, cutoff=value,
                    target=target(), mip_gap=gap, threads=threads,
                    time_limit_s=(0.5 if i + 1 < len(sizes) else 1.0)
                    * (deadline - time.perf_counter()))
                if take(y):
                    how = (f"HiGHS on the LP's and the plan's columns and each model's "
                           f"{per_model} of least reduced cost ({run.detail}), LP bound")
            if not whole and pairs is not None:
                # what the run on every column would have had: pairs of models re-packed
                better = _pair_runs(arr, v, objective, col_lb, row_lb, pairs, take,
                                    lambda: x, lambda: value, proven, target=target,
                                    deadline=deadline, gap=gap, threads=threads)
                if better:
                    how += f"; {better} better plans by HiGHS on pairs of models"
    finally:
        if child is not None:
            child.stop()
    proven()
    if raised:
        how += "; bound of HiGHS's root on every column (child process)"
    if relaxed is not None and relaxed.col_value is not None \
            and relative_gap(value, bound) > gap:
        limit = min(value - gap * INSIDE * abs(value), value - 1e-9 * max(1.0, abs(value)))
        lo, hi = fix_by_reduced_cost(arr, relaxed, col_lb, limit)
        free = free_columns(lo, hi, v)
        if whole_fits(free):
            run = run_highs(arr.highs_lp(objective, lo, row_lb, maximise=False, col_ub=hi),
                            time_limit_s=deadline - time.perf_counter(), mip_gap=gap,
                            threads=threads, cutoff=value, target=target())
            take(plan_of_run(run, v))
            bound = bound_with_limit(run, limit, bound)
            how = f"HiGHS on {free} of {len(v.x)} columns ({run.detail})"
        else:
            how += f"; no time for HiGHS on {free} of {len(v.x)} columns"
    notes.append(f"fair phase {name}: {abs(value):.6g}, bound {abs(bound):.6g} ({how})")
    return x, value, bound


def _pair_runs(arr: LpArrays, v: Vars, objective: np.ndarray, col_lb: np.ndarray,
               row_lb: np.ndarray, pairs: Callable[[np.ndarray], list[np.ndarray]],
               take: Callable[[np.ndarray | None], bool], plan: Callable[[], np.ndarray],
               value: Callable[[], float], proven: Callable[[], bool], *,
               target: Callable[[], float], deadline: float, gap: float,
               threads: int | None) -> int:
    """HiGHS on two models' columns at a time, the others held at the plan's counts
    (`fair_pairs`), round after round while one finds a better plan, until the gap is
    proven or the phase's time is spent. Returns how many better plans were taken."""
    better, found = 0, True
    while found and not proven():
        found = False
        for free in pairs(plan()):
            left = deadline - time.perf_counter()
            if proven() or left < MIN_PHASE_S:
                return better
            _, y = run_around(arr, v, objective, col_lb, row_lb, plan(), free,
                              cutoff=value(), target=target(),
                              time_limit_s=PAIR_TIME_SHARE * left, mip_gap=gap,
                              threads=threads)
            if take(y):
                better += 1
                found = True
    return better
