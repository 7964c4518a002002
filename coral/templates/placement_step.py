"""The best pipeline over every node of a combination, under the step model it runs by.

A running instance (`coral.perf.step`) is a pipeline of `S` stages, stage `s` being `j_s`
identical nodes on one layer range. Busy, it runs `S` micro-batches of `B` sequences (`B`, the
smallest stage batch `j_s x b_s`; a node takes `ceil(B / j_s)` of them); a step moves every
micro-batch one token on and lasts `S x` the slowest node's time (its iteration and
activation send), `coral.perf.step.saturation`. An aggregated step also carries whole prompts,
`S B / O` of them on average: a share `f` of steps carries `k + 1` prompts and the rest `k`,
so with `A` (`C`) the slowest node's time in a step of `k` (`k + 1`) prompts

    TPOT = S ((1 - f) A + f C),   TTFT ~ S C (the step a prompt rides in),
    rate = min(B, budget O / ((I + O) S)) / (O ((1 - f) A + f C))  requests/s

(decode: no prompts, `A` alone, tokens/s `B / A`; prefill: `B` prompt tokens per
micro-batch, tokens/s `B / A`, TTFT `S A`). Every node's time is `coral.perf.step.node_seconds`
— the very function the simulator steps — and its KV room must hold its share of the `S B`
resident sequences' contexts (`kv_tokens`, as the simulator admits them).

The search maximises that rate exactly over stage counts `S`, micro-batches `B` from
`{j x b : j <= nodes, b in the batch grid}` (a node runs `ceil(B / j) <= max(grid)`), groupings
of the nodes into stages of one type, and layer splits:

* for fixed `(S, B)` every (node type, group size `j`, role) has one row of times by layer
  count (roles: first stage — the input embedding —, end stage — the LM head, no send —,
  both, or a middle one); the time grows with the layers, so at thresholds `(A, C)` a row
  covers `1..M` layers;
* the nodes form the pipeline at `(A, C)` exactly when each type's nodes split into groups,
  with one first and one end stage among all, `S` groups in all, at least one of them with
  `j` dividing `B` (so that `B` is the smallest stage batch), covering at least `L` layers — a
  small max-plus knapsack over the types;
* feasibility is monotone in `A` and `C`, so the pairs worth having form a staircase, walked
  with bisections (one threshold when there is no `C`).

`chain` (and vLLM) allows one node per stage, which also makes every node run the one batch
`B`: the same search with groups of one. `step_bound.work_bound` is a true upper bound on the rate of any
such pipeline, for a library's cut before solving.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from coral.catalog.loader import Catalog
from coral.catalog.schema import ModelArch
from coral.perf.step import (
    DEFAULT_MAX_BATCHED_TOKENS,
    busy_rps,
    busy_steps,
    micro_batch,
    node_costs,
    node_seconds,
)
from coral.templates.operating_points import DEFAULT_BATCHES, prefill_chunks
from coral.templates.slo import SloSpec
from coral.templates.stage_groups import (
    COMPLETE,
    END,
    F_END,
    F_FIRST,
    F_ONLY,
    F_TIGHT,
    FIRST,
    MERGE,
    MID,
    ONLY,
    partitions,
    role_choices,
)
from coral.templates.types import Mode, NodePlacement, Placement, SolveStatus

#: Version of the search's model; part of a template library's identity.
STEP_SEARCH_VERSION = "2"
#: What `Placement.notes` says when a library asks for a pipeline over every node above a
#: floor (its parts' best) and there is none.
BELOW_FLOOR_NOTE = "no pipeline over all nodes beats the floor"
#: What a step-model placement's notes start with.
STEP_NOTE = "step model"
METHOD = "step-dp"

_RTOL = 1e-9
_SOURCE, _SINK = -1, -2

@dataclass(frozen=True)
class _Row:
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
class StepPipeline:
    """A pipeline found by the search: stages in order as (node type, count, first layer,
    layers, node batch, node time A, node time C)."""

    rate: float
    stages_s: int
    micro_batch: int
    tpot_s: float | None
    ttft_s: float | None
    stages: tuple[tuple[str, int, int, int, int, float, float], ...]


# ---------------------------------------------------------------------------------------------
# Per-model node costs, memoised per catalog (a library's combinations share a few node types)
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
                                                "rows": {}, "kv": {}, "bounds": {}}
    return hit


class StepSearch:
    """The exact step-model search for one (model, combination, SLO, mode)."""

    def __init__(self, perf: Any, catalog: Catalog, arch: ModelArch, combo: Sequence[str],
                 slo: SloSpec, mode: Mode, *, max_group: int | None = None,
                 batches: Sequence[int] = DEFAULT_BATCHES,
                 max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS) -> None:
        self.perf, self.catalog, self.arch, self.slo, self.mode = perf, catalog, arch, slo, mode
        self.types = sorted(set(combo))
        self.counts = [list(combo).count(x) for x in self.types]
        self.n = len(combo)
        self.L = arch.num_layers
        self.max_group = self.n if max_group is None else max(1, int(max_group))
        self.grid = tuple(sorted(prefill_chunks(slo) if mode == "prefill" else batches))
        # template units per request: output tokens (decode), prompt tokens (prefill), 1
        self.per_request = {"decode": slo.output_tokens, "prefill": slo.input_tokens}.get(
            mode, 1)
        self.budget = int(max_batched_tokens)
        memo = node_cost_memo(perf, catalog, arch.name)
        self.iteration, self.kv_tokens, self.send = memo["fns"]
        # rows by (node type, group size, role, S, B), one table per workload (hashing the
        # SLO once per search, not once per lookup)
        self._rows = memo["rows"].setdefault((slo, mode, self.grid[-1]), {})
        self._kv = memo["kv"]
        self._choice_memo: dict[tuple, list] = {}
        self._own_memo: dict[tuple, dict] = {}

    # ---- stage counts, micro-batches, what a step carries ----

    def stage_counts(self) -> list[int]:
        lo = sum(-(-c // self.max_group) for c in self.counts)
        return list(range(lo, min(self.n, self.L) + 1))

    def micro_batches(self) -> list[int]:
        jmax = min(self.max_group, max(self.counts))
        out = {j * b for j in range(1, jmax + 1) for b in self.grid}
        if self.mode == "prefill":  # a micro-batch holds at least one prompt
            out = {B for B in out if B >= self.slo.input_tokens}
        return sorted(out)

    def steps(self, S: int, B: int) -> tuple[tuple[int, int, int], tuple[int, int, int] | None,
                                              float]:
        """A busy step as `coral.perf.step.busy_steps` has it, per micro-batch: (the step of
        `k` prompts, the step of `k + 1` or None, the share `f` of the latter)."""
        steps = busy_steps(self.mode, S, S * B, self.slo.input_tokens, self.slo.output_tokens)
        shapes = []
        for _, (p, b, c, m) in steps:
            assert m == S  # micro-batches hold a prompt's tokens (prefill) or a sequence
            shapes.append(micro_batch(p, b, c, m))
        if len(steps) == 1:
            return shapes[0], None, 0.0
        return shapes[0], shapes[1], steps[1][0]

    def rate_at_unit_period(self, S: int, B: int) -> float:
        """The template's rate (in its unit) when the slowest node's mean time is 1 s: the
        rate is this over that time (`coral.perf.step.busy_rps`, a step being S of them)."""
        return busy_rps(self.mode, S * B, float(S), self.slo.input_tokens,
                        self.slo.output_tokens, self.budget) * self.per_request

    def _resident_tokens(self, S: int, B: int) -> int:
        """KV tokens the instance holds busy: `S B` sequences of up to `I + O` tokens (a
        prefill instance: its `S B` prompt tokens)."""
        if self.mode == "prefill":
            return S * B
        return S * B * (self.slo.input_tokens + self.slo.output_tokens)

    # ---- rows ----

    def row(self, t: int, j: int, role: int, S: int, B: int) -> _Row | None:
        name = self.types[t]
        bn = -(-B // j)
        if bn > self.grid[-1]:
            return None
        key = (name, j, role, S, B)
        if key in self._rows:
            return self._rows[key]
        sa, sc, f = self.steps(S, B)
        first, last = role in (FIRST, ONLY), role in (END, ONLY)
        share = 1.0 / j
        need = self._resident_tokens(S, B) * share
        tpot = self.slo.tpot_s / S * (1 + _RTOL)
        ttft = self.slo.ttft_s / S * (1 + _RTOL)
        # the most layers whose KV room holds the node's share (the room shrinks as layers grow)
        top = 0
        while top < self.L and self._kv_room(name, top + 1, first, last) >= need:
            top += 1
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
            out = _Row(bn, a, c, tuple(a[:fin].tolist()), tuple(c[:fin].tolist()),
                       tuple(np.maximum.accumulate(h).tolist()))
        self._rows[key] = out
        return out

    def _times(self, name: str, share: float, first: bool, last: bool,
               shape: tuple[int, int, int], top: int) -> np.ndarray:
        """(L,): the node's time in a step of micro-batch `shape` for 1..L layers (inf past
        `top`). `node_seconds` is affine in the layers for the perf model (each layer the
        same, extras and the send apart), so three calls give the row; a perf model that is
        not affine (checked at `top`) gets every count computed."""
        out = np.full(self.L, math.inf)
        if top < 1:
            return out

        def t(layers: int) -> float:
            return node_seconds(self.iteration, self.send, name, layers, share, first, last,
                                *shape)[0]

        t1 = t(1)
        if top == 1:
            out[0] = t1
            return out
        slope = t(2) - t1
        line = t1 + slope * np.arange(top)
        end = t(top)
        if abs(line[-1] - end) <= 1e-12 * max(abs(end), 1e-30):
            out[:top] = line
            out[top - 1] = end
        else:
            out[:top] = [t(x) for x in range(1, top + 1)]
        return out

    def _kv_room(self, name: str, layers: int, first: bool, last: bool) -> int:
        key = (name, layers, first, last)
        hit = self._kv.get(key)
        if hit is None:
            hit = self._kv[key] = int(self.kv_tokens(name, layers, first, last))
        return hit

    def _type_rows(self, S: int, B: int) -> list[dict[tuple[int, int], _Row]]:
        out = []
        for t, cnt in enumerate(self.counts):
            rows = {}
            for j in range(1, min(cnt, self.max_group) + 1):
                for role in ((ONLY,) if S == 1 else (MID, FIRST, END)):
                    r = self.row(t, j, role, S, B)
                    if r is not None:
                        rows[j, role] = r
            out.append(rows)
        return out

    # ---- feasibility at thresholds ----

    def _choices(self, t: int, keys: tuple, S: int, B: int) -> list[tuple[int, int, tuple]]:
        """Ways to split type `t`'s nodes into at most `S` groups with roles, as (groups,
        flags, indices into `keys` of each group's row; -1: no such row)."""
        ck = (t, keys, S, B)
        hit = self._choice_memo.get(ck)
        if hit is None:
            where = {k: i for i, k in enumerate(keys)}
            hit = []
            for parts in partitions(self.counts[t], self.max_group):
                if len(parts) > S:
                    continue
                tight = F_TIGHT if any(B % j == 0 for j in parts) else 0
                for flags, roles in role_choices(parts):
                    idx = tuple(where.get((j, role), -1) for j, role in zip(parts, roles))
                    if -1 not in idx:
                        hit.append((len(parts), flags | tight, idx, (parts, roles)))
            self._choice_memo[ck] = hit
        return hit

    def _own(self, t: int, keys: tuple, caps: tuple, S: int, B: int) -> dict:
        """Best layers per (groups, flags) type `t`'s nodes cover at layer caps `caps`."""
        ok = (t, keys, caps, S, B)
        own = self._own_memo.get(ok)
        if own is None:
            own = {}
            for g, flags, idx, tr in self._choices(t, keys, S, B):
                total = 0
                for i in idx:
                    m = caps[i]
                    if m < 1:
                        total = -1
                        break
                    total += m
                if total > 0 and total > own.get((g, flags), (-1, None))[0]:
                    own[g, flags] = (total, tr)
            if len(self._own_memo) > 200_000:
                self._own_memo.clear()
            self._own_memo[ok] = own
        return own

    def _cover(self, rows, S: int, B: int, A: float, C: float, trace: bool = False,
               H: float = math.inf):
        """Most layers `S` groups of all the nodes cover with every time within (A, C) (and
        every node's mean step time within H)."""
        want = (F_ONLY if S == 1 else F_FIRST | F_END) | F_TIGHT
        F: dict[tuple[int, int], tuple[int, Any]] = {(0, 0): (0, None)}
        n_types = len(self.counts)
        for t in range(n_types):
            items = rows[t]
            keys = tuple(items)
            caps = tuple(r.layers_within(A, C, H) for r in items.values())
            own = self._own(t, keys, caps, S, B)
            if t == n_types - 1:  # the last type completes the pipeline: look its part up
                best: tuple[int, Any] = (-1, None)
                for (g1, f1), (v1, tr1) in F.items():
                    for f2 in COMPLETE[f1][want]:
                        hit = own.get((S - g1, f2))
                        if hit is not None and v1 + hit[0] > best[0]:
                            best = (v1 + hit[0], (tr1, (t, hit[1])) if trace else None)
                return best
            room = S - (n_types - 1 - t)  # every later type holds at least one stage
            G: dict[tuple[int, int], tuple[int, Any]] = {}
            for (g1, f1), (v1, tr1) in F.items():
                for (g2, f2), (v2, tr2) in own.items():
                    g = g1 + g2
                    if g > room:
                        continue
                    f = MERGE[f1][f2]
                    if f < 0:
                        continue
                    if v1 + v2 > G.get((g, f), (-1, None))[0]:
                        G[g, f] = (v1 + v2, (tr1, (t, tr2)) if trace else None)
            F = G
            if not F:
                return -1, None
        return -1, None

    def _feasible(self, rows, S, B, A, C) -> bool:
        return self._cover(rows, S, B, A, C)[0] >= self.L

    # ---- the search ----

    def best(self, at_least: float = -math.inf) -> StepPipeline | None:
        """The pipeline of the highest rate above `at_least` (None: there is none)."""
        pairs = []
        for S in self.stage_counts():
            for B in self.micro_batches():
                rows = self._type_rows(S, B)
                if any(not r for r in rows):
                    continue
                k = -(-self.L // S) - 1  # some stage holds at least ceil(L / S) layers
                lo_a = min(r.a[k] for tr in rows for r in tr.values())
                lo_c = min(r.c[k] for tr in rows for r in tr.values())
                if not math.isfinite(lo_a):
                    continue
                f = self.steps(S, B)[2]
                g_lo = (1 - f) * lo_a + f * lo_c
                pairs.append((self.rate_at_unit_period(S, B) / g_lo, S, B, rows))
        pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
        best: StepPipeline | None = None
        floor = at_least
        for ub, S, B, rows in pairs:
            if ub <= floor * (1 + _RTOL):
                break
            found = self._best_at(rows, S, B, floor)
            if found is not None and (best is None or found.rate > best.rate * (1 + _RTOL)):
                best, floor = found, max(floor, found.rate)
        return best

    def _best_at(self, rows, S: int, B: int, floor: float) -> StepPipeline | None:
        """The best pipeline at (S, B) above `floor`: the staircase of (A, C)."""
        f = self.steps(S, B)[2]
        eff = self.rate_at_unit_period(S, B)
        two = self.mode == "aggregated"
        A_vals = np.unique(np.concatenate([r.a[np.isfinite(r.a)] for tr in rows
                                           for r in tr.values()]))
        C_vals = (np.unique(np.concatenate([r.c[np.isfinite(r.c)] for tr in rows
                                            for r in tr.values()])) if two
                  else np.array([math.inf]))
        tpot_cap = self.slo.tpot_s / S * (1 + _RTOL)
        if floor > 0:
            # a rate above the floor needs g < G, so A < G and (C >= A) f C < G
            G = eff / floor
            A_vals = A_vals[A_vals < G]
            if two and f > 0:
                C_vals = C_vals[C_vals < G / f]
            if A_vals.size == 0 or C_vals.size == 0:
                return None

        def g(A: float, C: float) -> float:
            return (1 - f) * A + f * C if two else A

        def first_true(vals: np.ndarray, lo: int, test) -> int | None:
            """Smallest index i >= lo with test(vals[i]) (monotone), or None."""
            hi = len(vals) - 1
            if lo > hi or not test(vals[hi]):
                return None
            lo -= 1
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if test(vals[mid]):
                    hi = mid
                else:
                    lo = mid
            return hi

        feas = lambda A, C: self._feasible(rows, S, B, A, C)  # noqa: E731
        A_top = float(A_vals[-1])
        if two and floor > 0 and self._cover(rows, S, B, A_top, float(C_vals[-1]),
                                             H=eff / floor)[0] < self.L:
            # a step lasts at least the slowest node's mean, so none beats the floor
            return None
        ci = first_true(C_vals, 0, lambda C: feas(A_top, C))
        best_g, best_ac = math.inf, None
        while ci is not None:
            C = float(C_vals[ci])
            g_lo = f * C + (1 - f) * float(A_vals[0]) if two else float(A_vals[0])
            if g_lo >= best_g or (floor > 0 and eff / g_lo <= floor * (1 + _RTOL)):
                break  # C only grows along the staircase
            ai = first_true(A_vals, 0, lambda A: feas(A, C))
            assert ai is not None
            A = float(A_vals[ai])
            if g(A, C) < best_g:
                best_g, best_ac = g(A, C), (A, C)
            if not two or ai == 0:
                break
            A_next = float(A_vals[ai - 1])
            ci = first_true(C_vals, ci + 1, lambda C: feas(A_next, C))
        if best_ac is None or best_g > tpot_cap and self.mode != "prefill":
            return None
        rate = eff / best_g
        if rate <= floor * (1 + _RTOL):
            return None
        return self._rebuild(rows, S, B, *best_ac, rate=rate, period=best_g)

    def _rebuild(self, rows, S: int, B: int, A: float, C: float, *, rate: float,
                 period: float) -> StepPipeline:
        total, tr = self._cover(rows, S, B, A, C, trace=True)
        assert total >= self.L
        groups = []  # (type, j, role, most layers)
        while tr is not None:
            tr, (t, (parts, roles)) = tr
            for j, role in zip(parts, roles):
                r = rows[t][j, role]
                groups.append((t, j, role, r.layers_within(A, C)))
        order = {FIRST: 0, ONLY: 0, MID: 1, END: 2}
        groups.sort(key=lambda x: (order[x[2]], x[0], x[1]))
        spare = sum(x[3] for x in groups) - self.L
        stages = []
        start = 0
        worst_c = 0.0
        for t, j, role, m in groups:
            cut = min(spare, m - 1)
            spare -= cut
            k = m - cut
            r = rows[t][j, role]
            stages.append((self.types[t], j, start, k, r.batch, float(r.a[k - 1]),
                           float(r.c[k - 1])))
            worst_c = max(worst_c, float(r.c[k - 1]))
            start += k
        assert start == self.L
        f = self.steps(S, B)[2]
        worst_a = max(st[5] for st in stages)
        if self.mode == "aggregated":
            period = (1 - f) * worst_a + f * worst_c
        else:
            period = worst_a
        rate = self.rate_at_unit_period(S, B) / period
        tpot = S * period if self.mode != "prefill" else None
        if self.mode == "decode":
            ttft = None
        elif self.mode == "prefill":
            ttft = S * period
        else:
            ttft = S * worst_c
        return StepPipeline(rate=rate, stages_s=S, micro_batch=B, tpot_s=tpot, ttft_s=ttft,
                            stages=tuple(stages))

    # ---- the answer as a placement ----

    def placement(self, found: StepPipeline, *, solve_s: float) -> Placement:
        nodes: list[NodePlacement] = []
        groups: list[list[int]] = []
        S = found.stages_s
        for name, j, first, k, batch, ta, tc in found.stages:
            need = self._resident_tokens(S, found.micro_batch) / j
            mem = _memory_bytes(self.perf, self.arch, name, k, first + k == self.L, need)
            idx = []
            for _ in range(j):
                idx.append(len(nodes))
                nodes.append(NodePlacement(
                    node_type=name, first_layer=first, layers=k, batch=batch, tp_degree=0,
                    capacity=found.rate / j, step_s=0.0 if self.mode == "prefill" else ta,
                    prefill_s=ta if self.mode == "prefill" else (
                        0.0 if self.mode == "decode" else tc),
                    mem_bytes=mem))
            groups.append(idx)
        T = found.rate
        edges = [(_SOURCE, i, T / len(groups[0])) for i in groups[0]]
        for ga, gb in zip(groups, groups[1:]):
            edges += [(x, y, T / (len(ga) * len(gb))) for x in ga for y in gb]
        edges += [(i, _SINK, T / len(groups[-1])) for i in groups[-1]]
        return Placement(throughput=T, nodes=tuple(nodes), edges=tuple(edges),
                         status=SolveStatus.OPTIMAL, gap=0.0, solve_s=solve_s, method=METHOD,
                         notes=(f"{STEP_NOTE}: {S} stage(s), micro-batch {found.micro_batch}",),
                         tpot_s=found.tpot_s, ttft_s=found.ttft_s)


def _memory_bytes(perf: Any, arch: ModelArch, node: str, layers: int, last: bool,
                  kv_tokens: float) -> float:
    """A node's weights (without the input embedding, which the template adds) and its
    share of the KV cache (0 for a perf model that does not say)."""
    try:
        weights = perf.stage_weight_bytes(arch, layers, first_stage=False, last_stage=last)
        return float(weights + kv_tokens * perf.kv_bytes_per_token(arch, node, layers))
    except AttributeError:
        return 0.0


def solve_step(perf: Any, catalog: Catalog, arch: ModelArch, combo: Sequence[str],
               slo: SloSpec, mode: Mode, *, max_group: int | None = None,
               floor: float | None = None,
               batches: Sequence[int] = DEFAULT_BATCHES) -> Placement:
    """The best pipeline over every node of `combo` under the step model (above `floor`)."""
    t0 = time.perf_counter()
    search = StepSearch(perf, catalog, arch, combo, slo, mode, max_group=max_group,
                        batches=batches)
    at_least = floor if floor is not None and floor > 0 else -math.inf
    found = search.best(at_least)
    wall = time.perf_counter() - t0
    if found is None:
        if floor is not None:  # proven: no pipeline over every node beats the floor
            return Placement(throughput=0.0, nodes=(), edges=(), status=SolveStatus.OPTIMAL,
                             gap=0.0, solve_s=wall, method=METHOD,
                             notes=(f"{BELOW_FLOOR_NOTE} {floor:.6g}",))
        return Placement(throughput=0.0, nodes=(), edges=(), status=SolveStatus.INFEASIBLE,
                         gap=0.0, solve_s=wall, method=METHOD,
                         notes=("no pipeline over all nodes meets memory and the SLO under "
                                "the step model",))
    return search.placement(found, solve_s=wall)
