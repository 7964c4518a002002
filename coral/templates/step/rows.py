"""The rows of the step-model search (`placement_step`), shared by a library's combinations.

A row is one (node type, group size `j`, role) at one (stage count `S`, micro-batch `B`): the
node's time by layer count in a step of `k` prompts (`a`) and of `k + 1` (`c`), through
`coral.perf.step.node_seconds`, infinite past what its KV room holds or what meets the SLO.
A row depends on the workload (SLO, mode, the batch grid's top), never on the rest of the
combination, and a library's tens of thousands of combinations draw their stages from a few
node types; so the rows, each type's rows at `(S, B)` with the least time they allow at a
layer count (`TypeRows`, what the search orders its `(S, B)` pairs by), and the ways a
type's nodes split into groups (`choices`) are built once per workload (`StepRows`) and kept
with the model's node costs (`node_cost_memo`).
"""

from __future__ import annotations

import math
import weakref
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coral.catalog.loader import Catalog
from coral.perf.step import (
    busy_rps,
    busy_steps,
    micro_batch,
    node_costs,
    node_part,
    node_part_seconds,
)
from coral.templates.slo import SloSpec
from coral.templates.step.stage_groups import (
    END,
    F_TIGHT,
    FIRST,
    MID,
    ONLY,
    partitions,
    role_choices,
)
from coral.templates.types import Mode

_RTOL = 1e-9


@dataclass(frozen=True)
class StepRow:
    """(node type, group size, role) at one (S, B): per layer count, the node's time in a
    step of `k` prompts (`a`) and of `k + 1` (`c`), nondecreasing, inf past what fits."""

    batch: int  # sequences (prefill: prompt tokens) each node runs per iteration
    a: np.ndarray  # (L,)
    c: np.ndarray  # (L,)
    a_list: tuple[float, ...] = ()  # the finite prefix of `a` (for bisection)
    c_list: tuple[float, ...] = ()
    h_list: tuple[float, ...] = ()  # (1 - f) a + f c: a step's mean time, were it the slowest

    def layers_within(self, A: float, C: float, H: float = math.inf) -> int:
        """Most layers with both times within (A, C) (and the mean within H)."""
        m = min(bisect_right(self.a_list, A), bisect_right(self.c_list, C))
        return m if H == math.inf else min(m, bisect_right(self.h_list, H))


@dataclass(frozen=True)
class TypeRows:
    """One node type's rows at (S, B) for groups of up to `jcap` nodes, and the least time a
    node of them takes in a stage of `k + 1` layers (`k = ceil(L / S) - 1`: some stage of
    the pipeline holds that many) and in a stage of one layer (every type holds a stage)."""

    keys: tuple[tuple[int, int], ...]  # (group size, role) of each row
    rows: tuple[StepRow, ...]
    lo_a: float  # least a[k] over the rows
    lo_c: float  # least c[k]
    one_a: float  # least a[0]
    one_c: float  # least c[0]
    lo_h: float  # least h[k] (a step's mean time, were the node the slowest; inf: none)
    one_h: float  # least h[0]
    #: `StepRows.choices` by (node count, largest group), and `StepRows.cover_memo`
    choice_memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def layers_bound(self, count: int, room: int, times: str) -> tuple[list[float], list[int]]:
        """At most how many layers `count` nodes of the type cover in at most `room` groups
        when every node's `times` (`a`, `c`, or `h`, its mean step time) are within a
        threshold, as a step function: (the thresholds at which it steps up, sorted; the
        bound from each on; 0 below the first). A group of `j` nodes holds at most `cap_j`
        layers (the most over its rows), so `count` nodes hold at most `count cap_j / j`
        for the best `j`, and `room` groups `room` times the most of one. A cheap
        necessary test, before the exact cover (`step_cover`)."""
        key = ("bound", times, count, room)
        hit = self.choice_memo.get(key)
        if hit is None:
            values, by_j = self._cap_steps(times)
            per_node = np.max([count * caps // j for j, caps in enumerate(by_j, start=1)],
                              axis=0)
            per_group = min(room, count) * np.max(by_j, axis=0)
            hit = self.choice_memo[key] = (values.tolist(),
                                           np.minimum(per_node, per_group).tolist())
        return hit

    def values(self, times: str) -> np.ndarray:
        """Every finite `times` (`a`, `c` or `h`) of the rows, sorted, once each: where a
        row's layer cap steps up."""
        return self._cap_steps(times)[0]

    def _cap_steps(self, times: str) -> tuple[np.ndarray, np.ndarray]:
        """(`values`; per group size j, the most layers a row of j nodes holds at each)."""
        hit = self.choice_memo.get(("steps", times))
        if hit is None:
            lists = [getattr(r, f"{times}_list") for r in self.rows]
            values = np.unique(np.concatenate([np.asarray(x) for x in lists]))
            jmax = max(j for j, _ in self.keys)
            by_j = np.zeros((jmax, len(values)), dtype=np.int64)
            for (j, _), x in zip(self.keys, lists):
                caps = np.searchsorted(np.asarray(x), values, side="right")
                np.maximum(by_j[j - 1], caps, out=by_j[j - 1])
            hit = self.choice_memo["steps", times] = (values, by_j)
        return hit


# ---------------------------------------------------------------------------------------------
# Per-model node costs, memoised per perf model and catalog
# ---------------------------------------------------------------------------------------------

_COSTS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def node_cost_memo(perf: Any, catalog: Catalog, model: str) -> dict:
    """The node costs of `model` (`coral.perf.step.node_costs`) and what the search derives from
    them, memoised per perf model and catalog."""
    per_perf = _COSTS.setdefault(perf, {})
    hit = per_perf.get((id(catalog), model))
    if hit is None:
        iteration, kv_tokens, send = node_costs(model, perf, catalog)
        hit = per_perf[(id(catalog), model)] = {"fns": (iteration, kv_tokens, send),
                                                "workloads": {}, "kv": {}, "bounds": {}}
    return hit


def _prefix_max(raw: tuple[float, np.ndarray, float, float], k: int, top: int) -> float:
    """The most of a row's first k + 1 times (k < top), from `StepRows._raw`: the line up
    to `top - 1` layers and the time on `top` at the end. A line is monotone (rounding
    keeps it so), so its most is at one end."""
    t1, line, slope, end = raw
    if top == 1:
        return t1
    if k < top - 1:
        return float(line[k]) if slope >= 0 else float(line[0])
    return max(float(line[top - 2]) if slope >= 0 else float(line[0]), end)


def step_rows(perf: Any, catalog: Catalog, num_layers: int, model: str, slo: SloSpec,
              mode: Mode, top_batch: int) -> "StepRows":
    """The rows of `model` for one workload, memoised with its node costs."""
    memo = node_cost_memo(perf, catalog, model)
    key = (slo, mode, top_batch)
    hit = memo["workloads"].get(key)
    if hit is None:
        hit = memo["workloads"][key] = StepRows(memo, num_layers, slo, mode, top_batch)
    return hit


class StepRows:
    """Rows, per-type summaries and group choices of one (model, SLO, mode, batch top)."""

    def __init__(self, memo: dict, num_layers: int, slo: SloSpec, mode: Mode,
                 top_batch: int) -> None:
        self.iteration, self.kv_tokens, self.send = memo["fns"]
        self._kv: dict[tuple, tuple] = memo["kv"]
        self.L, self.slo, self.mode, self.top_batch = num_layers, slo, mode, top_batch
        self._rows: dict[tuple, StepRow | None] = {}
        self._types: dict[tuple, TypeRows | None] = {}
        self._steps: dict[tuple[int, int], tuple] = {}
        self._eff: dict[tuple, float] = {}
        self._lines: dict[tuple, tuple[float, np.ndarray, float]] = {}
        self._heads: dict[tuple, tuple[float, float] | None] = {}
        self._bounds: dict[tuple, tuple] = {}
        self._consts: dict[tuple, tuple] = {}

    # ---- what a busy step carries ----

    def steps(self, S: int, B: int) -> tuple[tuple[int, int, int], tuple[int, int, int] | None,
                                              float]:
        """A busy step as `coral.perf.step.busy_steps` has it, per micro-batch: (the step of
        `k` prompts, the step of `k + 1` or None, the share `f` of the latter)."""
        hit = self._steps.get((S, B))
        if hit is not None:
            return hit
        steps = busy_steps(self.mode, S, S * B, self.slo.input_tokens, self.slo.output_tokens)
        shapes = []
        for _, (p, b, c, m) in steps:
            assert m == S  # micro-batches hold a prompt's tokens (prefill) or a sequence
            shapes.append(micro_batch(p, b, c, m))
        if len(steps) == 1:
            hit = (shapes[0], None, 0.0)
        else:
            hit = (shapes[0], shapes[1], steps[1][0])
        self._steps[S, B] = hit
        return hit

    def rate_at_unit_period(self, S: int, B: int, per_request: float, budget: int) -> float:
        """The template's rate (in its unit) when the slowest node's mean time is 1 s: the
        rate is this over that time (`coral.perf.step.busy_rps`, a step being S of them)."""
        key = (S, B, per_request, budget)
        hit = self._eff.get(key)
        if hit is None:
            hit = self._eff[key] = busy_rps(self.mode, S * B, float(S), self.slo.input_tokens,
                                            self.slo.output_tokens, budget) * per_request
        return hit

    def resident_tokens(self, S: int, B: int) -> int:
        """KV tokens the instance holds busy: `S B` sequences of up to `I + O` tokens (a
        prefill instance: its `S B` prompt tokens)."""
        if self.mode == "prefill":
            return S * B
        return S * B * (self.slo.input_tokens + self.slo.output_tokens)

    # ---- rows ----

    def row(self, name: str, j: int, role: int, S: int, B: int) -> StepRow | None:
        bn = -(-B // j)
        if bn > self.top_batch:
            return None
        key = (name, j, role, S, B)
        if key in self._rows:
            return self._rows[key]
        sa, sc, f = self.steps(S, B)
        first, last = role in (FIRST, ONLY), role in (END, ONLY)
        share = 1.0 / j
        need = self.resident_tokens(S, B) * share
        tpot = self.slo.tpot_s / S * (1 + _RTOL)
        ttft = self.slo.ttft_s / S * (1 + _RTOL)
        # the most layers whose KV room holds the node's share (the room shrinks as layers grow)
        top = self._kv_top(name, first, last, need)
        a = self._times(name, share, first, last, sa, top)
        c = self._times(name, share, first, last, sc, top) if sc is not None else a
        # A <= TPOT / S always (TPOT >= S A); C <= TTFT / S (a prompt's step), and for
        # decode and prefill A is the only time
        ok = a <= (ttft if self.mode == "prefill" else tpot)
        if self.mode == "aggregated":
            ok &= c <= ttft
        ok = np.cumprod(ok).astype(bool)  # usable counts are a prefix
        a = np.where(ok, a, math.inf)
        c = np.where(ok, c, math.inf)
        out = None
        if math.isfinite(a[0]):
            a = np.maximum.accumulate(a)  # usable counts are a prefix; keep it monotone
            c = np.maximum.accumulate(c)
            fin = int(np.isfinite(a).sum())
            h = (1 - f) * a[:fin] + f * c[:fin]
            out = StepRow(bn, a, c, tuple(a[:fin].tolist()), tuple(c[:fin].tolist()),
                          tuple(np.maximum.accumulate(h).tolist()))
        self._rows[key] = out
        return out

    def _times(self, name: str, share: float, first: bool, last: bool,
               shape: tuple[int, int, int], top: int) -> np.ndarray:
        """(L,): the node's time in a step of micro-batch `shape` for 1..L layers (inf past
        `top`). `node_seconds` is affine in the layers for the perf model (each layer the
        same, extras and the send apart), so three calls give the row; a perf model that is
        not affine (checked at `top`) gets every count computed. The node's part of the
        micro-batch (`node_part`) is what the times depend on, and many (group size, S, B)
        share one, so its line is kept (`_line`)."""
        out = np.full(self.L, math.inf)
        if top < 1:
            return out
        part = (name, first, last, *node_part(share, *shape))
        t1, line, _ = self._line(part)
        if top == 1:
            out[0] = t1
            return out
        end = self._part_seconds(part, top)
        if abs(line[top - 1] - end) <= 1e-12 * max(abs(end), 1e-30):
            out[:top] = line[:top]
            out[top - 1] = end
        else:
            out[:top] = [self._part_seconds(part, x) for x in range(1, top + 1)]
        return out

    def _part_seconds(self, part: tuple, layers: int) -> float:
        """A node part's time on `layers` layers (`node_part_seconds`)."""
        name, first, last, pn, bn, cn = part
        return node_part_seconds(self.iteration, self.send, name, layers, first, last, pn,
                                 bn, cn)[0]

    def _line(self, part: tuple) -> tuple[float, np.ndarray, float]:
        """(time on one layer, (L,) the line through one and two layers at 1..L, its
        slope)."""
        hit = self._lines.get(part)
        if hit is None:
            t1 = self._part_seconds(part, 1)
            slope = self._part_seconds(part, 2) - t1 if self.L > 1 else 0.0
            hit = self._lines[part] = (t1, t1 + slope * np.arange(self.L), slope)
        return hit

    # ---- one entry of a row, without the row ----

    def row_at(self, name: str, j: int, role: int, S: int, B: int, k: int
               ) -> tuple[float, float] | None:
        """`row(name, j, role, S, B)`'s (a[k], c[k]), None where the row is None: the same
        figures, from the row's line (`_line`), its KV room and its SLO caps alone, so that
        ordering a combination's (S, B) pairs builds no row it does not search. A row that
        is not affine in the layers is built whole."""
        key = (name, j, role, S, B)
        if key in self._rows:
            r = self._rows[key]
            return None if r is None else (float(r.a[k]), float(r.c[k]))
        if -(-B // j) > self.top_batch:
            return None
        sa, sc, _ = self.steps(S, B)
        first, last = role in (FIRST, ONLY), role in (END, ONLY)
        share = 1.0 / j
        need = self.resident_tokens(S, B) * share
        top = self._kv_top(name, first, last, need)
        if top < 1:
            return None
        ra = self._raw(name, share, first, last, sa, top)
        rc = self._raw(name, share, first, last, sc, top) if sc is not None else ra
        if ra is None or rc is None:  # not affine: the row itself
            r = self.row(name, j, role, S, B)
            return None if r is None else (float(r.a[k]), float(r.c[k]))
        tpot = self.slo.tpot_s / S * (1 + _RTOL)
        ttft = self.slo.ttft_s / S * (1 + _RTOL)
        cap = ttft if self.mode == "prefill" else tpot
        two = self.mode == "aggregated"
        # the row exists when one layer meets the caps; a[k] is the most of its first k + 1
        # times, finite when every one of them meets the caps (`row`'s usable prefix)
        if not (ra[0] <= cap and (not two or rc[0] <= ttft)):
            return None
        if k >= top:
            return math.inf, math.inf
        a, c = _prefix_max(ra, k, top), _prefix_max(rc, k, top)
        if a <= cap and (not two or c <= ttft):
            return a, c
        return math.inf, math.inf

    def _raw(self, name: str, share: float, first: bool, last: bool,
             shape: tuple[int, int, int], top: int) -> tuple[float, np.ndarray, float, float] | None:
        """`_times` before the row's cuts, as (time on one layer, line, slope, time on
        `top` layers), None when the times are not affine (`_times` computes each)."""
        part = (name, first, last, *node_part(share, *shape))
        t1, line, slope = self._line(part)
        if top == 1:
            return t1, line, slope, t1
        end = self._part_seconds(part, top)
        if abs(line[top - 1] - end) <= 1e-12 * max(abs(end), 1e-30):
            return t1, line, slope, end
        return None

    def _kv_top(self, name: str, first: bool, last: bool, need: float) -> int:
        """The most layers (from one up) whose KV room each holds `need` tokens: the room
        shrinks as the layers grow, so a bisection finds it (a room that does not shrink
        is scanned)."""
        key = (name, first, last)
        hit = self._kv.get(key)
        if hit is None:
            rooms = [int(self.kv_tokens(name, k, first, last)) for k in range(1, self.L + 1)]
            shrinks = all(x >= y for x, y in zip(rooms, rooms[1:]))
            hit = self._kv[key] = ([-x for x in rooms] if shrinks else None, rooms)
        negated, rooms = hit
        if negated is not None:
            return bisect_right(negated, -need)
        return next((k for k, room in enumerate(rooms) if room < need), self.L)

    def type_rows(self, name: str, jcap: int, S: int, B: int) -> TypeRows | None:
        """`name`'s rows at (S, B) for groups of 1..`jcap` nodes (None: it has none, so no
        pipeline at (S, B) holds that type)."""
        key = (name, jcap, S, B)
        if key in self._types:
            return self._types[key]
        keys, rows = [], []
        for j in range(1, jcap + 1):
            for role in ((ONLY,) if S == 1 else (MID, FIRST, END)):
                r = self.row(name, j, role, S, B)
                if r is not None:
                    keys.append((j, role))
                    rows.append(r)
        out = None
        if rows:
            k = -(-self.L // S) - 1
            out = TypeRows(tuple(keys), tuple(rows),
                           lo_a=min(float(r.a[k]) for r in rows),
                           lo_c=min(float(r.c[k]) for r in rows),
                           one_a=min(float(r.a[0]) for r in rows),
                           one_c=min(float(r.c[0]) for r in rows),
                           lo_h=min((r.h_list[k] for r in rows if k < len(r.h_list)),
                                    default=math.inf),
                           one_h=min(r.h_list[0] for r in rows))
        self._types[key] = out
        return out

    def type_head(self, name: str, jcap: int, S: int, B: int) -> tuple[float, float] | None:
        """`type_rows(name, jcap, S, B)`'s (lo_a, lo_c), None where it is None, from the
        rows' entries (`row_at`) when the rows are not built."""
        key = (name, jcap, S, B)
        tr = self._types.get(key, False)
        if tr is not False:
            return None if tr is None else (tr.lo_a, tr.lo_c)
        hit = self._heads.get(key, False)
        if hit is False:
            # the groups of jcap - 1 nodes and fewer, and those of jcap
            hit = self.type_head(name, jcap - 1, S, B) if jcap > 1 else None
            k = -(-self.L // S) - 1
            for role in ((ONLY,) if S == 1 else (MID, FIRST, END)):
                at = self.row_at(name, jcap, role, S, B, k)
                if at is not None:
                    hit = at if hit is None else (min(hit[0], at[0]), min(hit[1], at[1]))
            self._heads[key] = hit
        return hit

    def type_bounds(self, name: str, jcap: int, Ss: tuple[int, ...], Bs: tuple[int, ...]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per stage count of `Ss` and micro-batch of `Bs`: whether `name` has rows there,
        and its `lo_a` and `lo_c` (`type_head`; inf where it has none), as (S, B) arrays
        for a combination to take the least over its types at once."""
        key = (name, jcap, Ss, Bs)
        hit = self._bounds.get(key)
        if hit is None:
            heads = [[self.type_head(name, jcap, S, B) for B in Bs] for S in Ss]
            hit = self._bounds[key] = (
                np.array([[h is not None for h in row] for row in heads], dtype=bool),
                np.array([[math.inf if h is None else h[0] for h in row] for row in heads]),
                np.array([[math.inf if h is None else h[1] for h in row] for row in heads]))
        return hit

    def pair_constants(self, Ss: tuple[int, ...], Bs: tuple[int, ...], per_request: float,
                       budget: int) -> tuple[np.ndarray, np.ndarray]:
        """Per (S, B) of `Ss` x `Bs`: the share `f` of steps with a prompt more, and the rate
        at a unit period (`rate_at_unit_period`)."""
        key = (Ss, Bs, per_request, budget)
        hit = self._consts.get(key)
        if hit is None:
            hit = self._consts[key] = (
                np.array([[self.steps(S, B)[2] for B in Bs] for S in Ss]),
                np.array([[self.rate_at_unit_period(S, B, per_request, budget) for B in Bs]
                          for S in Ss]))
        return hit

    @staticmethod
    def cover_memo(tr: TypeRows, count: int, max_group: int, room: int) -> dict:
        """Where the search keeps what `count` nodes of the type cover at given layer caps
        with at most `room` groups (the same type and count recur across combinations)."""
        key = ("cover", count, max_group, room)
        hit = tr.choice_memo.get(key)
        if hit is None:
            hit = tr.choice_memo[key] = {}
        return hit

    def choices(self, tr: TypeRows, count: int, max_group: int, S: int, B: int
                ) -> list[tuple[int, int, tuple, tuple]]:
        """Ways to split a type's `count` nodes into at most `S` groups with roles, as
        (groups, flags, index into `tr.keys` of each group's row, (group sizes, roles)); a
        way needing a row that the type lacks is left out. `tr` is the type's rows at
        (S, B), which holds them."""
        ck = (count, max_group)
        hit = tr.choice_memo.get(ck)
        if hit is None:
            where = {k: i for i, k in enumerate(tr.keys)}
            hit = []
            for parts in partitions(count, max_group):
                if len(parts) > S:
                    continue
                tight = F_TIGHT if any(B % j == 0 for j in parts) else 0
                for flags, roles in role_choices(parts):
                    idx = tuple(where.get((j, role), -1) for j, role in zip(parts, roles))
                    if -1 not in idx:
                        hit.append((len(parts), flags | tight, idx, (parts, roles)))
            tr.choice_memo[ck] = hit
        return hit
