"""The best pipeline over *every* node of a combination, solved without fixing a stage order.

A library build asks one question per combination: is there one pipeline of data-parallel
stages over all of its nodes that beats the floor, and which is the best? `_ChainDP` answers
it exactly with a DP over (used-count vector, last stage kind, layer boundary); this module
answers the same question much faster by noticing that, in that DP, a stage's position only
matters through

* its role — the first stage starts at layer 0 (its point must fit with the input
  embedding), the end stage holds the last layer (a last-stage point), every other stage
  sits strictly inside; and
* the NIC limit of the link between two consecutive stages.

When no link can be the bottleneck (every link limit is at least the throughput asked for),
a pipeline is therefore just a *multiset* of stages — one first, one end, any number of
middle ones (or one stage holding everything) — whose layers add up to `L` and whose
latencies add up to at most the SLO. Feasibility at a threshold `theta` is then a knapsack:
per node type, the least latency to cover `l` layers with all of its nodes split into groups
(and whether those include the first / end stage), combined over node types by min-plus
convolution. That is a few min-plus products per node type instead of a DP over every
sub-multiset and ordered pair of stage kinds.

Exactness. The multiset feasibility test is a relaxation of the ordered one for every
`theta` (drop the link constraints) and equal to it when `theta` is at most the smallest link
limit between any two of the combination's node types. The search below finds `theta_u`,
the largest stage capacity at which the relaxation is feasible. If `theta_u` is at most that
smallest link limit, `theta_u` is the exact optimum (feasible for the ordered problem; any
higher value is infeasible for the relaxation, hence for the ordered problem); otherwise,
and whenever both TPOT and TTFT bind (some point's prefill time, scaled by TTFT, exceeds its
step time scaled by TPOT — never so in the built-in catalog; the knapsack keeps one
latency), the ordered DP is run. tests/test_templates_staged.py checks the two against each other and
against brute force.

Speed. The threshold search gallops up from the floor (the answer is nearly always a few
capacities above it, and for most combinations the first test already fails). A node type's
tables depend on the threshold only through which of its stage capacities reach it (its
"threshold class"), so they are kept per class — within one search, and across searches
(a library solves thousands of combinations built from a few dozen node specs, whose floors
often fall between the same two capacities); products of the first types are kept within a
search. The per-type role tables hang off `node_memo`'s per-node memo. All of this only
reuses what the same inputs computed before.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from coral.templates.node_memo import shared_memo
from coral.templates.placement_chain import Chain, _ChainDP
from coral.templates.placement_ilp import LATENCY_RTOL, NodeOptions, Prepared, edge_limit

_BOUND = 1.0 + LATENCY_RTOL  # latencies are scaled by their SLO (as in placement_chain)
#: Slack on the latency pruning of partial products (pruning must never cut what the final
#: sum, added in another order, would keep).
_PRUNE_SLACK = 1e-12


# --------------------------------------------------------------------------------------------
# Stage tables: per role and layer count, the node's points by capacity
# --------------------------------------------------------------------------------------------

#: Role / flag slots of a (4, L + 1) table: 0 no first or end stage among the stages it
#: stands for (a middle stage), 1 the first stage, 2 the end stage, 3 both (as a stage:
#: the only one, which never combines with another).
_MID, _FIRST, _END, _BOTH = 0, 1, 2, 3


@dataclass(frozen=True)
class RoleTables:
    """The points of one node type by role and layer count, for threshold queries.

    Slot `r` of the first axis is a role (mid, first, end, only); row `k` lists that role's
    points holding `k` layers by decreasing capacity (`cap`, padded with -inf). `best[r, k,
    w]` is the least latency among the first `w` of them (`best[r, k, 0]` = inf) and `rank[r,
    k, w]` that point's rank in the node's `NodeOptions` (-1 for none). So the least latency
    of a `k`-layer stage of `j` such nodes with capacity >= theta is `best[r, k, #{w: j *
    cap[r, k, w] >= theta}]` — the very products the ordered DP compares with theta.
    """

    cap: np.ndarray  # (4, L + 1, W)
    best: np.ndarray  # (4, L + 1, W + 1)
    rank: np.ndarray  # (4, L + 1, W + 1), int64
    caps: np.ndarray  # every capacity of the node's points (any role)
    max_cap: float
    cache: dict[tuple[str, int], np.ndarray] = field(default_factory=dict, compare=False)

    def stage_counts(self, theta: float, J: int) -> np.ndarray:
        """(J, 4, L + 1): how many points of each (role, layer count) reach theta in a stage
        of j = 1..J such nodes (they are the first ones of their row)."""
        cap = self.cap[None] * np.arange(1, J + 1)[:, None, None, None]  # j * cap
        return np.count_nonzero(cap >= theta, axis=3)

    def threshold_class(self, theta: float, J: int) -> int:
        """How many distinct stage capacities (of up to J nodes) lie below theta: thresholds
        with the same class have the same `stage_counts`."""
        vals = self.cache.get(("classes", J))
        if vals is None:
            vals = np.unique(np.concatenate([self.stage_capacities(j) for j in range(1, J + 1)]))
            self.cache["classes", J] = vals
        return int(np.searchsorted(vals, theta, side="left"))

    def stage_tables(self, counts: np.ndarray) -> np.ndarray:
        """(J, 4, L + 1): least latency of those stages (`counts` from `stage_counts`), inf
        where no point reaches the threshold."""
        R, K, W1 = self.best.shape
        return self.best.reshape(-1)[_row_base(R, K, W1) + counts]

    def point(self, theta: float, j: int, role: int, k: int) -> int:
        cnt = int(np.count_nonzero(self.cap[role, k] * j >= theta))
        return int(self.rank[role, k, cnt])

    def stage_capacities(self, j: int) -> np.ndarray:
        """The distinct capacities of `j`-node stages of this type, ascending."""
        vals = self.cache.get(("caps", j))
        if vals is None:
            vals = self.cache["caps", j] = np.unique(self.caps * j)
        return vals


_ROW_BASE: dict[tuple[int, int, int], np.ndarray] = {}


def _row_base(R: int, K: int, W1: int) -> np.ndarray:
    """Flat offsets of the rows of an (R, K, W1) array."""
    base = _ROW_BASE.get((R, K, W1))
    if base is None:
        base = _ROW_BASE[R, K, W1] = (np.arange(R * K) * W1).reshape(R, K)
    return base


def _role_masks(u: NodeOptions) -> list[np.ndarray]:
    """Which points can play which role, in slot order (as in `_ChainDP`)."""
    lo, hi = u.lo, u.hi
    return [
        (~u.last) & (hi >= 1),  # mid: starts somewhere in [1, L - 1 - k]
        (~u.last) & (lo == 0),  # first: starts at 0 (fits with the embedding)
        u.last & (lo >= 1),  # end: starts at L - k >= 1
        u.last & (lo == 0),  # only: the whole model from layer 0
    ]


def build_role_tables(u: NodeOptions, metric: np.ndarray, L: int) -> RoleTables:
    """The role tables of node options `u` with scaled latency `metric` per point."""
    rows = [np.flatnonzero(m) for m in _role_masks(u)]
    width = max((int(np.bincount(u.k[r], minlength=L + 1).max()) for r in rows if len(r)),
                default=0)
    cap = np.full((4, L + 1, width), -np.inf)
    lat = np.full((4, L + 1, width), np.inf)
    rk = np.full((4, L + 1, width), -1, dtype=np.int64)
    for role, r in enumerate(rows):
        if not len(r):
            continue
        # by (k, capacity descending, latency, rank)
        r = r[np.lexsort((r, metric[r], -u.cap[r], u.k[r]))]
        ks = u.k[r]
        col = np.arange(len(r)) - np.searchsorted(ks, ks, side="left")
        cap[role, ks, col] = u.cap[r]
        lat[role, ks, col] = metric[r]
        rk[role, ks, col] = r
    best = np.full((4, L + 1, width + 1), np.inf)
    rank = np.full((4, L + 1, width + 1), -1, dtype=np.int64)
    if width:
        run = np.minimum.accumulate(lat, axis=2)
        best[:, :, 1:] = run
        # the column at which each running minimum was reached
        at = np.zeros(lat.shape, dtype=np.int64)
        for w in range(1, width):
            at[:, :, w] = np.where(lat[:, :, w] < run[:, :, w - 1], w, at[:, :, w - 1])
        rank[:, :, 1:] = np.where(np.isfinite(run), np.take_along_axis(rk, at, axis=2), -1)
    return RoleTables(cap, best, rank, u.cap.copy(), float(u.cap.max()) if len(u) else 0.0)


# --------------------------------------------------------------------------------------------
# The multiset knapsack
# --------------------------------------------------------------------------------------------

#: Slot pairs (a, b) that combine, and the slot they make (a first / end stage at most once).
_PAIRS = ((0, 0, 0), (0, 1, 1), (1, 0, 1), (0, 2, 2), (2, 0, 2),
          (0, 3, 3), (3, 0, 3), (1, 2, 3), (2, 1, 3))


def _pairs_by_rows() -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray, tuple[int, ...]]]:
    """For the bitmasks of the non-empty slots of two tables: the pairs that can combine."""
    out = {}
    for ma in range(16):
        for mb in range(16):
            act = [p for p in _PAIRS if ma >> p[0] & 1 and mb >> p[1] & 1]
            out[ma, mb] = (np.array([p[0] for p in act], dtype=np.intp),
                           np.array([p[1] for p in act], dtype=np.intp),
                           tuple(p[2] for p in act))
    return out


_PAIRS_BY_ROWS = _pairs_by_rows()
_SLOT_BITS = np.array([1, 2, 4, 8])


class _Table:
    """A (4, L + 1) latency table over flag slots and layer counts, stored behind L columns
    of inf (so that shifted views never leave the buffer), with its support: the bitmask
    of slots holding an entry within the bound and the range [lo, hi) of such columns.
    Entries past the bound are inf."""

    __slots__ = ("padded", "rows", "lo", "hi")

    def __init__(self, padded: np.ndarray, rows: int, lo: int, hi: int) -> None:
        self.padded, self.rows, self.lo, self.hi = padded, rows, lo, hi

    def values(self, L: int) -> np.ndarray:
        return self.padded[:, L:]


def _supports(fin: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For boolean tables (..., 4, C): slot bitmasks, first and one-past-last column with a
    True (0, 0 where none)."""
    rows = fin.any(axis=-1) @ _SLOT_BITS
    cols = fin.any(axis=-2)
    width = cols.shape[-1]
    lo = cols.argmax(axis=-1)
    hi = width - cols[..., ::-1].argmax(axis=-1)
    return rows, np.where(rows > 0, lo, 0), np.where(rows > 0, hi, 0)


class _Products:
    """Min-plus products of latency tables over layer counts, by flag slot."""

    def __init__(self, L: int) -> None:
        self.L = L
        unit = np.full((4, 2 * L + 1), np.inf)
        unit[0, L] = 0.0  # nothing yet: no layers, no latency
        self.unit = _Table(unit, 1, 0, 1)

    def tables(self, T: np.ndarray) -> list[_Table | None]:
        """Tables from a (J, 4, L + 1) array of latencies (entries past the bound dropped)."""
        L = self.L
        fin = T <= _BOUND
        T[~fin] = np.inf
        rows, lo, hi = _supports(fin)
        padded = np.full((len(T), 4, 2 * L + 1), np.inf)
        padded[:, :, L:] = T
        return [_Table(padded[j], int(rows[j]), int(lo[j]), int(hi[j])) if rows[j] else None
                for j in range(len(T))]

    def __call__(self, A: _Table, B: _Table, lo: int = 0, hi: int | None = None,
                 cut: float = _BOUND) -> _Table | None:
        """out[s, c] = min over pairs (a, b) -> s and x of A[a, x] + B[b, c - x] for columns
        c in [lo, hi) (inf elsewhere) and entries at most `cut`; None when nothing is left."""
        L = self.L
        hi = L + 1 if hi is None else hi
        if A is self.unit:
            pa, pb, ps = _PAIRS_BY_ROWS[1, B.rows]
            lo, hi = max(lo, B.lo), min(hi, B.hi)
            if lo >= hi:
                return None
            R = B.padded[pb, L + lo:L + hi]  # a copy (fancy index)
        else:
            pa, pb, ps = _PAIRS_BY_ROWS[A.rows, B.rows]
            lo, hi = max(lo, A.lo + B.lo), min(hi, A.hi - 1 + B.hi)
            if not len(ps) or lo >= hi:
                return None
            # only columns x of A that meet some column of B inside [lo, hi)
            alo, ahi = max(A.lo, lo - B.hi + 1), min(A.hi, hi - B.lo)
            Bp = np.take(B.padded, pb, axis=0)  # rows of the pairs, contiguous
            st0, st1 = Bp.strides
            # V[p, x', c'] = B[pb, (lo + c') - (alo + x')]: a shifted (Toeplitz) view, no copy
            V = np.ndarray((len(pb), ahi - alo, hi - lo), dtype=Bp.dtype, buffer=Bp,
                           offset=(L + lo - alo) * st1, strides=(st0, -st1, st1))
            R = (A.padded[pa, L + alo:L + ahi][:, :, None] + V).min(axis=1)
        fin = R <= cut
        if not fin.any():
            return None
        R[~fin] = np.inf
        padded = np.full((4, 2 * L + 1), np.inf)
        for n, slot in enumerate(ps):
            dst = padded[slot, L + lo:L + hi]
            np.minimum(dst, R[n], out=dst)
        cols = fin.any(axis=0)
        first = int(cols.argmax())
        last = len(cols) - int(cols[::-1].argmax())
        rows_fin = fin.any(axis=1)
        rows = 0
        for n, slot in enumerate(ps):
            if rows_fin[n]:
                rows |= 1 << slot
        return _Table(padded, rows, lo + first, lo + last)

    def minimum(self, A: _Table | None, B: _Table | None) -> _Table | None:
        if A is None:
            return B
        if B is None:
            return A
        return _Table(np.minimum(A.padded, B.padded), A.rows | B.rows, min(A.lo, B.lo),
                      max(A.hi, B.hi))

    def argmin(self, A: _Table, B: _Table, s: int, c: int) -> tuple[float, int, int, int]:
        """(value, a, b, x) of the best pair (a, b) -> s and split x of column c."""
        L = self.L
        best = (math.inf, -1, -1, -1)
        xs = np.arange(c + 1)
        for a, b, out in _PAIRS:
            if out != s or not (A.rows >> a & 1 and B.rows >> b & 1):
                continue
            vals = A.padded[a, L + xs] + B.padded[b, L + c - xs]
            x = int(np.argmin(vals))
            if vals[x] < best[0]:
                best = (float(vals[x]), a, b, x)
        return best


#: Knapsack tables of all of a node type's nodes at a threshold class, shared across searches:
#: (id of the role tables, nodes, largest group, class) -> (role tables, only, table, least).
#: Least recently used first; a table is 4 x (2L + 1) floats, so this stays in the tens of MB.
_SHARED_TYPE_TABLES: "OrderedDict[tuple[int, int, int, int], tuple]" = OrderedDict()
_SHARED_TYPE_TABLES_SIZE = 8192


@dataclass(frozen=True)
class _TypeTables:
    """One node type's tables at one set of point counts (a threshold)."""

    serial: int  # identifies it in the prefix cache
    only: bool  # one stage of all of the type's nodes can hold the whole model
    stages: list[_Table | None] | None  # [j] -> stage table of j nodes (slots 0-2)
    knapsack: list[_Table | None] | None  # [m] -> stages using exactly m of the nodes
    full: _Table | None  # knapsack[n]: all of them
    least: float  # least latency in `full`


@dataclass
class _Trace:
    """What one feasibility run computed, kept to rebuild the pipeline it found."""

    per_type: list[_TypeTables]
    prefix: list[_Table]  # [types combined] -> table
    only: bool  # one stage holds the whole model


class StagedPipelines:
    """Feasibility and search over pipelines that use every node, as multisets of stages.

    `types[t]` are the role tables of node type `t`, `counts[t]` its number of nodes; a stage
    of type `t` has 1..counts[t] nodes (`groups=False`: exactly 1).
    """

    def __init__(self, L: int, types: Sequence[RoleTables], counts: Sequence[int],
                 groups: bool) -> None:
        self.L = L
        self.types = list(types)
        self.counts = list(counts)
        self.groups = groups
        self.prod = _Products(L)
        # Successive thresholds of one search mostly move past a few points of one type, so
        # a type's tables are kept by its point counts and a product of types by theirs.
        self._type_cache: list[dict[int, _TypeTables]] = [{} for _ in self.types]
        self._prefix_cache: dict[tuple, _Table | None] = {}
        self._serial = 0

    def sizes(self, t: int) -> range:
        return range(1, self.counts[t] + 1) if self.groups else range(1, 2)

    def candidates(self, at_least: float) -> np.ndarray:
        """Stage capacities (j x a point's capacity) above `at_least`, at most the bound every
        pipeline over all nodes obeys (a type's nodes carry all of the flow), ascending."""
        ub = min(rt.max_cap * n for rt, n in zip(self.types, self.counts))
        parts = []
        for t, rt in enumerate(self.types):
            for j in self.sizes(t):
                vals = rt.stage_capacities(j)
                lo = np.searchsorted(vals, at_least, side="right")
                hi = np.searchsorted(vals, ub, side="right")
                if lo < hi:
                    parts.append(vals[lo:hi])
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0)

    def feasible(self, theta: float, *, trace: bool = False) -> bool | _Trace | None:
        """Is there a pipeline over all nodes whose every stage has capacity >= theta within
        the latency bound (links ignored)? With `trace`, what it took to find one (or None).

        Per type the knapsack table of all its nodes, then the types combined in order; the
        product of a prefix with type `t` is only computed on the layer counts the types
        after it can still complete to `L` (between the least and the most they cover), and
        entries that the least latency of the types after it would push past the bound are
        dropped — neither changes whether column `L` of the last product is feasible.
        """
        L, prod = self.L, self.prod
        G = len(self.types)
        fail = None if trace else False
        per_type: list[_TypeTables] = []
        for t, rt in enumerate(self.types):
            J = self.sizes(t)[-1]
            cls = rt.threshold_class(theta, J)
            tt = self._type_cache[t].get(cls)
            if tt is None or (trace and tt.knapsack is None):
                tt = self._type_cache[t][cls] = self._type_tables(t, theta, cls, trace)
            if tt.only and G == 1 and J == self.counts[0]:
                # one stage of every node holds the whole model
                return _Trace([], [], True) if trace else True
            if tt.full is None:
                return fail
            per_type.append(tt)
        cover_lo = [tt.full.lo for tt in per_type]
        cover_hi = [tt.full.hi - 1 for tt in per_type]
        least = [tt.least for tt in per_type]
        if sum(cover_lo) > L or sum(cover_hi) < L or sum(least) > _BOUND:
            return fail
        Z = prod.unit
        prefix = [Z]
        key: tuple = ()
        done_lo = done_hi = 0
        for t in range(G - 1):
            done_lo += cover_lo[t]
            done_hi += cover_hi[t]
            rest_lo, rest_hi = sum(cover_lo[t + 1:]), sum(cover_hi[t + 1:])
            lo, hi = max(done_lo, L - rest_hi), min(done_hi, L - rest_lo)
            # entries the types after t cannot complete within the bound are dropped (with a
            # hair of slack: this only prunes, the last test below decides)
            cut = _BOUND - sum(least[t + 1:]) + _PRUNE_SLACK
            key = key + (per_type[t].serial, lo, hi, cut)
            if key in self._prefix_cache:
                Z = self._prefix_cache[key]
            else:
                Z = self._prefix_cache[key] = prod(Z, per_type[t].full, lo, hi + 1, cut)
            if Z is None:
                return fail
            prefix.append(Z)
        value, *_ = prod.argmin(Z, per_type[-1].full, 3, L)
        if value > _BOUND:
            return fail
        return _Trace(per_type, prefix, False) if trace else True

    def _type_tables(self, t: int, theta: float, cls: int, full_detail: bool) -> _TypeTables:
        """The stage and knapsack tables of type `t` at threshold class `cls` (of `theta`).

        What feasibility needs (the knapsack table of all the type's nodes) is shared with
        other searches through `_SHARED_TYPE_TABLES`: combinations of one library share node
        types, and their floors often fall between the same two capacities of a type. The
        rest (to rebuild a pipeline) is computed when `full_detail` asks for it.
        """
        L, prod = self.L, self.prod
        rt, n, J = self.types[t], self.counts[t], self.sizes(t)[-1]
        key = (id(rt), n, J, cls)
        self._serial += 1
        hit = _SHARED_TYPE_TABLES.get(key)
        if hit is not None and hit[0] is rt and not full_detail:
            _SHARED_TYPE_TABLES.move_to_end(key)
            _, only, full, least = hit
            return _TypeTables(self._serial, only, None, None, full, least)
        S = rt.stage_tables(rt.stage_counts(theta, J))
        only = bool(S[J - 1, _BOTH, L] <= _BOUND) and J == n
        S[:, _BOTH] = np.inf  # the only stage never combines with another
        stages: list[_Table | None] = [None] + prod.tables(S)
        H = self._knapsack(stages, n, self.sizes(t))
        full = H[-1]
        least = float(full.values(L).min()) if full is not None else math.inf
        _SHARED_TYPE_TABLES[key] = (rt, only, full, least)
        if len(_SHARED_TYPE_TABLES) > _SHARED_TYPE_TABLES_SIZE:
            _SHARED_TYPE_TABLES.popitem(last=False)
        return _TypeTables(self._serial, only, stages, H, full, least)

    def _knapsack(self, stages: list[_Table | None], n: int, sizes: range
                  ) -> list[_Table | None]:
        """H[m]: least latency per flag slot and layer count of stages using exactly m of the
        type's n nodes (m = 0..n)."""
        prod = self.prod
        H: list[_Table | None] = [prod.unit]
        for m in range(1, n + 1):
            row = None
            for j in sizes:
                if j > m:
                    break
                A, B = H[m - j], stages[j]
                if A is None or B is None:
                    continue
                C = B if A is prod.unit else prod(A, B)
                row = prod.minimum(row, C)
            H.append(row)
        return H

    def largest(self, at_least: float) -> float | None:
        """The largest stage capacity above `at_least` at which the relaxation is feasible
        (None if none is).

        Feasibility falls as the threshold rises, so this is a search over the sorted
        candidates; it gallops up from the lowest (1st, 2nd, 4th, 8th, ... candidate) and
        then halves the last gap. A library asks with `at_least` = the floor, and the answer
        is nearly always a few candidates above it (or none: one test), which galloping
        reaches in about twice the logarithm of that distance instead of the logarithm of
        all the candidates.
        """
        cands = self.candidates(at_least)
        if not len(cands) or not self.feasible(float(cands[0])):
            return None
        lo, step = 0, 1  # cands[lo] is feasible
        hi = len(cands) - 1  # the answer is at most cands[hi]
        while lo < hi:
            probe = min(lo + step, hi)
            if self.feasible(float(cands[probe])):
                lo, step = probe, 2 * step
            else:
                hi = probe - 1
                break
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.feasible(float(cands[mid])):
                lo = mid
            else:
                hi = mid - 1
        return float(cands[lo])

    def rebuild(self, theta: float) -> list[tuple[int, int, int, int]]:
        """The stages (type, group size, role slot, layers) of a pipeline feasible at theta,
        in pipeline order (first, middle ones, end; or the only one)."""
        tr = self.feasible(theta, trace=True)
        assert isinstance(tr, _Trace), "staged search: the rebuilt threshold is infeasible"
        L = self.L
        if tr.only:
            return [(0, self.counts[0], _BOTH, L)]
        picked: list[tuple[int, int, int, int]] = []
        slot, left = 3, L
        for t in range(len(self.types) - 1, -1, -1):
            _, a, b, x = self.prod.argmin(tr.prefix[t], tr.per_type[t].full, slot, left)
            assert a >= 0, "staged search: no predecessor while rebuilding"
            picked.extend(self._rebuild_type(t, tr, b, left - x))
            slot, left = a, x
        assert left == 0 and slot == 0, "staged search: layers left over while rebuilding"
        order = {_FIRST: 0, _MID: 1, _END: 2}
        return sorted(picked, key=lambda s: order[s[2]])

    def _rebuild_type(self, t: int, tr: _Trace, slot: int, layers: int
                      ) -> list[tuple[int, int, int, int]]:
        H, stages = tr.per_type[t].knapsack, tr.per_type[t].stages
        out = []
        m = self.counts[t]
        while m > 0:
            best = (math.inf, -1, -1, -1, -1)
            for j in self.sizes(t):
                if j > m:
                    break
                A, B = H[m - j], stages[j]
                if A is None or B is None:
                    continue
                val, a, b, x = self.prod.argmin(A, B, slot, layers)
                if val < best[0]:
                    best = (val, j, a, b, x)
            assert best[1] > 0, "staged search: no stage while rebuilding"
            _, j, a, b, x = best
            out.append((t, j, b, layers - x))
            m -= j
            slot, layers = a, x
        assert layers == 0 and slot == 0, "staged search: a type's layers do not add up"
        return out


# --------------------------------------------------------------------------------------------
# Front door
# --------------------------------------------------------------------------------------------


def best_full_pipeline(prep: Prepared, *, groups: bool = True,
                       at_least: float = -math.inf) -> Chain | None:
    """The best pipeline over every node of `prep` (data-parallel stages of identical nodes
    when `groups`, one node per stage otherwise) with throughput above `at_least`, or None.

    The same answer as `best_chain(prep, require_all=True, groups=groups, at_least=...)`
    (the throughput exactly; the stages may differ where several pipelines tie).
    """
    if not prep.groups or any(u is None for u in prep.usable):
        return None
    P = prep.problem
    L = P.num_layers
    use_x, use_y = P.tpot_s is not None, P.ttft_s is not None
    members = [list(g) for g in prep.groups]
    types = [prep.usable[g[0]] for g in members]
    if use_x and use_y and not all(_prefill_within_step(prep, g[0]) for g in members):
        # both latencies bind: the knapsack keeps one, so the ordered DP's Pareto search
        return _ChainDP(prep, prep.active, True, groups).best(at_least)
    metric = "step" if use_x else ("pre" if use_y else "none")
    tables = [_tables(prep, g[0], metric) for g in members]
    counts = [len(g) for g in members]
    search = StagedPipelines(L, tables, counts, groups)
    theta = search.largest(at_least)
    if theta is None:
        return None
    lim = np.array([[edge_limit(P, a[0], b[0]) for b in members] for a in members])
    if theta > float(lim.min()):
        # a link may be the bottleneck: the stage order matters
        return _ChainDP(prep, prep.active, True, groups).best(at_least)
    stages = []
    used = [0] * len(members)
    thr = math.inf
    prev = None
    start = 0
    for t, j, role, k in search.rebuild(theta):
        rank = tables[t].point(theta, j, role, k)
        u = types[t]
        assert rank >= 0 and int(u.k[rank]) == k, "staged search: no point for a stage"
        grp = tuple(members[t][used[t]:used[t] + j])
        used[t] += j
        stages.append((grp, int(u.opt[rank]), start))
        start += k
        thr = min(thr, float(u.cap[rank] * j))
        if prev is not None:
            pt, pj = prev
            thr = min(thr, float(lim[pt, t] * pj * j))
        prev = (t, j)
    assert start == L and used == counts, "staged search: the pipeline does not cover it all"
    return Chain(throughput=thr, stages=tuple(stages))


def _prefill_within_step(prep: Prepared, i: int) -> bool:
    """Is every point's prefill time (scaled by TTFT) at most its step time (scaled by TPOT)?
    Then a path within TPOT is within TTFT, and one latency suffices (as in `_ChainDP`)."""
    P = prep.problem
    u = prep.usable[i]
    assert u is not None and P.tpot_s is not None and P.ttft_s is not None
    memo = shared_memo(prep, i)
    if memo is not None and "pre<=step" in memo.flags:
        return memo.flags["pre<=step"]
    ok = bool(np.all(u.pre / P.ttft_s <= u.step / P.tpot_s))
    if memo is not None:
        memo.flags["pre<=step"] = ok
    return ok


def _tables(prep: Prepared, i: int, metric: str) -> RoleTables:
    """Role tables of node `i` (memoised with the node when `prep` came from the memo)."""
    P = prep.problem
    u = prep.usable[i]
    assert u is not None
    memo = shared_memo(prep, i)
    if memo is not None and metric in memo.tables:
        return memo.tables[metric]
    if metric == "step":
        x = u.step / P.tpot_s
    elif metric == "pre":
        x = u.pre / P.ttft_s
    else:
        x = np.zeros(len(u))
    rt = build_role_tables(u, x, P.num_layers)
    if memo is not None:
        memo.tables[metric] = rt
    return rt
