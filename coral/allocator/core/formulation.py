"""The allocation ILP's formulation: its variables (`add_variables`, see `solve/ilp.py` for what
they stand for), one function per constraint family (`add_*_rows`), the arrays HiGHS is
given (`LpArrays`), and the same problem seen as per-model covers tied by availability
(`decomposition_of`, for `decomposition/lagrange.py` and `decomposition/branch_price.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import highspy
import numpy as np

from coral.allocator.decomposition.lagrange import Decomposition
from coral.allocator.decomposition.pd_cover import AGG, DECODE, PREFILL
from coral.allocator.core.presolve import MODE_AGG, MODE_DECODE, MODE_PREFILL, Columns, Index
from coral.allocator.problem import MODES, AllocationProblem

class LpBuilder:
    """Columns and rows in blocks of numpy arrays, assembled column-wise for HiGHS once."""

    def __init__(self) -> None:
        self.n_col = 0
        self.n_row = 0
        self.col_blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray, bool]] = []
        self.row_blocks: list[tuple[np.ndarray, np.ndarray]] = []
        self.entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.availability_rows: tuple[np.ndarray, np.ndarray, np.ndarray] = (
            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))  # rows, g, r

    def add_cols(self, lb: np.ndarray, ub: np.ndarray, cost: np.ndarray, integer: bool
                 ) -> np.ndarray:
        n = len(lb)
        self.col_blocks.append((np.asarray(lb, float), np.asarray(ub, float),
                                np.asarray(cost, float), integer))
        idx = np.arange(self.n_col, self.n_col + n)
        self.n_col += n
        return idx

    def add_rows(self, lb: np.ndarray, ub: np.ndarray) -> np.ndarray:
        n = len(lb)
        self.row_blocks.append((np.asarray(lb, float), np.asarray(ub, float)))
        idx = np.arange(self.n_row, self.n_row + n)
        self.n_row += n
        return idx

    def add_entries(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> None:
        self.entries.append((np.asarray(rows, np.int64), np.asarray(cols, np.int64),
                             np.asarray(vals, float)))

    def arrays(self) -> "LpArrays":
        def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

        rows = cat([e[0] for e in self.entries], np.int64)
        cols = cat([e[1] for e in self.entries], np.int64)
        vals = cat([e[2] for e in self.entries], float)
        order = np.lexsort((rows, cols))
        start = np.zeros(self.n_col + 1, dtype=np.int32)
        np.cumsum(np.bincount(cols, minlength=self.n_col), out=start[1:])
        return LpArrays(
            col_lb=cat([b[0] for b in self.col_blocks], float),
            col_ub=cat([b[1] for b in self.col_blocks], float),
            cost=cat([b[2] for b in self.col_blocks], float),
            integer=cat([np.full(len(b[0]), b[3]) for b in self.col_blocks], bool),
            row_lb=cat([b[0] for b in self.row_blocks], float),
            row_ub=cat([b[1] for b in self.row_blocks], float),
            start=start,
            index=rows[order].astype(np.int32),
            value=vals[order],
        )

_INF = highspy.kHighsInf


@dataclass
class LpArrays:
    col_lb: np.ndarray
    col_ub: np.ndarray
    cost: np.ndarray
    integer: np.ndarray
    row_lb: np.ndarray
    row_ub: np.ndarray
    start: np.ndarray
    index: np.ndarray
    value: np.ndarray

    def highs_lp(self, cost: np.ndarray, col_lb: np.ndarray, row_lb: np.ndarray,
                 maximise: bool, col_ub: np.ndarray | None = None) -> highspy.HighsLp:
        lp = highspy.HighsLp()
        lp.num_col_ = len(cost)
        lp.num_row_ = len(self.row_lb)
        lp.col_cost_ = cost
        lp.col_lower_ = col_lb
        lp.col_upper_ = self.col_ub if col_ub is None else col_ub
        lp.row_lower_ = row_lb
        lp.row_upper_ = self.row_ub
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = self.start
        lp.a_matrix_.index_ = self.index
        lp.a_matrix_.value_ = self.value
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous
            for b in self.integer
        ]
        lp.sense_ = highspy.ObjSense.kMaximize if maximise else highspy.ObjSense.kMinimize
        return lp


@dataclass
class Vars:
    """Column indices of each variable family and what they stand for."""

    x: np.ndarray  # per kept column
    x_t: np.ndarray
    x_r: np.ndarray
    y: np.ndarray  # start-up variables
    y_of_x: np.ndarray  # position in x of each y
    d: np.ndarray  # PD served requests/s
    d_m: np.ndarray
    d_r: np.ndarray
    s: np.ndarray  # per model in `Index.models`
    price: np.ndarray  # $/hour per x
    penalty: np.ndarray  # $ per new instance per x
    x_ub: np.ndarray  # upper bound per x


def add_variables(lp: LpBuilder, problem: AllocationProblem, ix: Index, cols: Columns
                   ) -> Vars:
    """x (integer), y (start-ups beyond the running ones), d (PD share per region), s (served)."""
    price = ix.price[cols.t, cols.r]
    penalty = price * problem.startup_s / 3600.0
    current = ix.current[cols.t, cols.r]
    # Where nothing runs now, y = x: fold the penalty into x's cost.
    x_cost = price + np.where(current == 0, penalty, 0.0)
    x = lp.add_cols(np.zeros(len(cols.t)), cols.ub, x_cost, integer=True)
    with_y = np.flatnonzero((current > 0) & (penalty > 0) & (cols.ub > current))
    y = lp.add_cols(np.zeros(len(with_y)), (cols.ub - current)[with_y], penalty[with_y],
                    integer=False)
    n_m, n_r = len(ix.models), len(ix.regions)
    half = np.zeros((n_m, len(MODES), n_r), dtype=bool)
    half[ix.t_model[cols.t], ix.t_mode[cols.t], cols.r] = True
    d_m, d_r = np.nonzero(half[:, MODE_PREFILL, :] & half[:, MODE_DECODE, :])
    d = lp.add_cols(np.zeros(len(d_m)), ix.demand[d_m], np.zeros(len(d_m)), integer=False)
    s = lp.add_cols(ix.demand.copy(), ix.demand.copy(), np.zeros(n_m), integer=False)
    return Vars(x=x, x_t=cols.t, x_r=cols.r, y=y, y_of_x=with_y, d=d, d_m=d_m, d_r=d_r, s=s,
                 price=price, penalty=penalty, x_ub=cols.ub)


def add_capacity_rows(lp: LpBuilder, ix: Index, v: Vars) -> int:
    """Served requests/s are within capacity, for every model `m` with demand::

        sum_{t in T_m^agg, r} cap_t x[t,r] + sum_r d[m,r] - s[m] >= 0

    With `s[m]` fixed at the demand this is the demand row of the design; under scarcity it
    bounds what can count as served.
    """
    n_m = len(ix.models)
    rows = lp.add_rows(np.zeros(n_m), np.full(n_m, _INF))
    agg = np.flatnonzero(ix.t_mode[v.x_t] == MODE_AGG)
    lp.add_entries(rows[ix.t_model[v.x_t[agg]]], v.x[agg], ix.cap[v.x_t[agg]])
    lp.add_entries(rows[v.d_m], v.d, np.ones(len(v.d)))
    lp.add_entries(rows, v.s, -np.ones(n_m))
    return n_m


def add_pd_pairing_rows(lp: LpBuilder, ix: Index, v: Vars) -> int:
    """Prefill and decode capacity in one region carry that region's share, for every PD
    model `m` and region `r` where both halves can run::

        sum_{t in T_m^prefill} cap_t x[t,r] - input_tokens_m  d[m,r] >= 0
        sum_{t in T_m^decode}  cap_t x[t,r] - output_tokens_m d[m,r] >= 0
    """
    n_pairs = len(v.d)
    if not n_pairs:
        return 0
    rows = lp.add_rows(np.zeros(2 * n_pairs), np.full(2 * n_pairs, _INF))
    n_r = len(ix.regions)
    row_of = np.full((len(ix.models), 2, n_r), -1, dtype=np.int64)
    row_of[v.d_m, 0, v.d_r] = rows[:n_pairs]
    row_of[v.d_m, 1, v.d_r] = rows[n_pairs:]
    for half, mode in ((0, MODE_PREFILL), (1, MODE_DECODE)):
        sel = np.flatnonzero(ix.t_mode[v.x_t] == mode)
        target = row_of[ix.t_model[v.x_t[sel]], half, v.x_r[sel]]
        assert (target >= 0).all(), "presolve left a PD half without its pair"
        lp.add_entries(target, v.x[sel], ix.cap[v.x_t[sel]])
        lp.add_entries(row_of[v.d_m, half, v.d_r], v.d, -ix.tokens[v.d_m, mode])
    return 2 * n_pairs


def add_availability_rows(lp: LpBuilder, ix: Index, v: Vars) -> int:
    """Nodes used stay within availability, for every node type `g` and region `r` that
    some column uses and whose bound is not implied by the columns' own bounds::

        sum_t nodes[t,g] x[t,r] <= avail[g,r]
    """
    n_g, n_r = ix.avail.shape
    tt, gg = np.nonzero(ix.counts)  # node types of each template
    per_t = np.bincount(tt, minlength=len(ix.templates))
    first = np.concatenate([[0], np.cumsum(per_t)[:-1]])
    reps = per_t[v.x_t]
    col_pos = np.repeat(np.arange(len(v.x)), reps)
    offset = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
    k = np.repeat(first[v.x_t], reps) + offset
    g_of = gg[k]
    r_of = v.x_r[col_pos]
    n_of = ix.counts[v.x_t[col_pos], g_of]
    ub = v.x_ub[col_pos]
    most = np.zeros((n_g, n_r))
    np.add.at(most, (g_of, r_of), n_of * ub)
    binding = most > ix.avail
    row_of = np.full((n_g, n_r), -1, dtype=np.int64)
    gs, rs = np.nonzero(binding)
    rows = lp.add_rows(np.full(len(gs), -_INF), ix.avail[gs, rs].astype(float))
    row_of[gs, rs] = rows
    lp.availability_rows = (rows, gs, rs)
    on = binding[g_of, r_of]
    lp.add_entries(row_of[g_of[on], r_of[on]], v.x[col_pos[on]], n_of[on])
    return len(rows)


def add_startup_rows(lp: LpBuilder, ix: Index, v: Vars) -> int:
    """Instances beyond the running ones are started, for every (t, r) that runs now::

        y[t,r] - x[t,r] >= -current[t,r],   y[t,r] >= 0
    """
    n = len(v.y)
    if not n:
        return 0
    xs = v.y_of_x
    current = ix.current[v.x_t[xs], v.x_r[xs]].astype(float)
    rows = lp.add_rows(-current, np.full(n, _INF))
    lp.add_entries(rows, v.y, np.ones(n))
    lp.add_entries(rows, v.x[xs], -np.ones(n))
    return n


def add_plan_rows(lp: LpBuilder, ix: Index, v: Vars) -> dict[str, int]:
    """The rows every allocation ILP has (demand cover, PD pairing, availability, start-ups),
    by family with their counts; solvers add their own after them."""
    return {
        "capacity": add_capacity_rows(lp, ix, v),
        "pd_pairing": add_pd_pairing_rows(lp, ix, v),
        "availability": add_availability_rows(lp, ix, v),
        "startup": add_startup_rows(lp, ix, v),
    }


def add_goodput_floor_row(lp: LpBuilder, ix: Index, v: Vars) -> int:
    """Scarcity phase 2 keeps phase 1's goodput (the bound is set per phase)::

        sum_m w_m s[m] >= G1 (1 - 1e-9)
    """
    rows = lp.add_rows(np.array([-_INF]), np.array([_INF]))
    lp.add_entries(np.full(len(v.s), rows[0]), v.s, ix.priority)
    return 1


def decomposition_of(ix: Index, v: Vars, lp: LpBuilder) -> Decomposition:
    """The problem as `lagrange.Decomposition`: the x columns and the availability rows the
    ILP kept (those some combination of columns within their bounds could overdraw)."""
    _, gs, rs = lp.availability_rows
    row_of = np.full(ix.avail.shape, -1, dtype=np.int64)
    row_of[gs, rs] = np.arange(len(gs))
    need = ix.counts[v.x_t]  # (columns, node types)
    usage = np.zeros((len(v.x), len(gs)))
    for g in np.flatnonzero(need.any(axis=0)):
        on = (need[:, g] > 0) & (row_of[g, v.x_r] >= 0)
        usage[on, row_of[g, v.x_r[on]]] = need[on, g]
    mode = ix.t_mode[v.x_t]
    model = ix.t_model[v.x_t]
    # PD halves in requests/s (tokens/s over tokens per request), as aggregated capacity
    per_request = np.where(mode == MODE_AGG, 1.0, ix.tokens[model, mode])
    half = np.select([mode == MODE_PREFILL, mode == MODE_DECODE], [PREFILL, DECODE], AGG)
    return Decomposition(
        demand=ix.demand.copy(),
        priority=ix.priority.copy(),
        col_model=model,
        col_cap=ix.cap[v.x_t] / per_request,
        col_price=v.price,
        col_penalty=v.penalty,
        col_current=ix.current[v.x_t, v.x_r],
        col_ub=v.x_ub.astype(np.int64),
        usage=usage,
        avail=ix.avail[gs, rs].astype(float),
        col_half=half.astype(np.int64),
        col_region=v.x_r.astype(np.int64),
    )


def capacity_bound_short(ix: Index, v: Vars) -> bool:
    """True when some model's demand exceeds what all its columns at their bounds could serve,
    each model on its own (a quick, sure sign of scarcity)."""
    n_m, n_r = len(ix.models), len(ix.regions)
    cap = ix.cap[v.x_t] * v.x_ub
    by_mode = np.zeros((n_m, len(MODES), n_r))
    np.add.at(by_mode, (ix.t_model[v.x_t], ix.t_mode[v.x_t], v.x_r), cap)
    paired = np.minimum(by_mode[:, MODE_PREFILL, :] / ix.tokens[:, MODE_PREFILL, None],
                        by_mode[:, MODE_DECODE, :] / ix.tokens[:, MODE_DECODE, None])
    most = by_mode[:, MODE_AGG, :].sum(axis=1) + paired.sum(axis=1)
    return bool((most < ix.demand * (1.0 - 1e-9)).any())
