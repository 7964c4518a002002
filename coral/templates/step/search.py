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
  covers `1..M` layers (`step_rows`: rows depend on the workload alone, so a library's
  combinations share them);
* the nodes form the pipeline at `(A, C)` exactly when each type's nodes split into groups,
  with one first and one end stage among all, `S` groups in all, at least one of them with
  `j` dividing `B` (so that `B` is the smallest stage batch), covering at least `L` layers — a
  small max-plus knapsack over the types (`step_cover`);
* feasibility is monotone in `A` and `C`, so the pairs worth having form a staircase, walked
  with bisections (one threshold when there is no `C`).

Above a floor most of a library's work is proving that nothing beats it, so every step is
cut by a bound first, each a true one so that the answer is the exhaustive search's: the
`(S, B)` pairs are tried best bound first; a pair, and a threshold, is dropped when even a
relaxed cover (each type's nodes on their own, `TypeRows.layers_bound`) cannot hold the
layers within the floor's period; and the staircase visits only corners that could still
beat both the best so far and the floor.

`chain` (and vLLM) allows one node per stage, which also makes every node run the one batch
`B`: the same search with groups of one. `step_bound.work_bound` is a true upper bound on the rate of any
such pipeline, for a library's cut before solving.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from coral.catalog.loader import Catalog
from coral.catalog.schema import ModelArch
from coral.perf.step import DEFAULT_MAX_BATCHED_TOKENS
from coral.templates.space.operating_points import DEFAULT_BATCHES, prefill_chunks
from coral.templates.slo import SloSpec
from coral.templates.step.stage_groups import END, FIRST, MID, ONLY
from coral.templates.step.cover import Pair, cover, feasible
from coral.templates.step.rows import TypeRows, step_rows
from coral.templates.types import Mode, NodePlacement, Placement, SolveStatus

__all__ = ["STEP_SEARCH_VERSION", "BELOW_FLOOR_NOTE", "StepPipeline", "StepSearch",
           "solve_step"]

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
class StepPipeline:
    """A pipeline found by the search: stages in order as (node type, count, first layer,
    layers, node batch, node time A, node time C)."""

    rate: float
    stages_s: int
    micro_batch: int
    tpot_s: float | None
    ttft_s: float | None
    stages: tuple[tuple[str, int, int, int, int, float, float], ...]


def _first(lo: int, hi: int, test: Callable[[int], bool], known: bool = False) -> int | None:
    """Smallest i in [lo, hi] with test(i), for a test false then true (None: false at hi;
    `known`: test(hi) is already known true)."""
    if lo > hi or not (known or test(hi)):
        return None
    lo -= 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if test(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _last(lo: int, hi: int, test: Callable[[int], bool]) -> int | None:
    """Largest i in [lo, hi] with test(i), for a test true then false (None: false at lo)."""
    if lo > hi or not test(lo):
        return None
    hi += 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if test(mid):
            lo = mid
        else:
            hi = mid
    return lo


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
        # rows by (node type, group size, role, S, B), one table per workload, shared by
        # every combination of a library
        self.rows = step_rows(perf, catalog, self.L, arch.name, slo, mode, self.grid[-1])
        self._jcaps = [(name, min(cnt, self.max_group))
                       for name, cnt in zip(self.types, self.counts)]

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
        """A busy step per micro-batch (`StepRows.steps`)."""
        return self.rows.steps(S, B)

    def rate_at_unit_period(self, S: int, B: int) -> float:
        """The template's rate (in its unit) when the slowest node's mean time is 1 s."""
        return self.rows.rate_at_unit_period(S, B, self.per_request, self.budget)

    def _resident_tokens(self, S: int, B: int) -> int:
        return self.rows.resident_tokens(S, B)

    def _pair(self, S: int, B: int, types: list[TypeRows]) -> Pair:
        choices = [self.rows.choices(tr, cnt, self.max_group, S, B)
                   for cnt, tr in zip(self.counts, types)]
        room = S - (len(types) - 1)  # groups one type may have: every other holds one
        own = [self.rows.cover_memo(tr, cnt, self.max_group, room)
               for cnt, tr in zip(self.counts, types)]
        return Pair(S, B, types, choices, self.steps(S, B)[2], self.rate_at_unit_period(S, B),
                     own)

    def _feasible(self, P: Pair, A: float, C: float, H: float = math.inf) -> bool:
        return feasible(P, self.L, A, C, H)

    # ---- the search ----

    def best(self, at_least: float = -math.inf) -> StepPipeline | None:
        """The pipeline of the highest rate above `at_least` (None: there is none)."""
        # (S, B) pairs by an upper bound on their rate, best first: some stage holds
        # ceil(L / S) layers, so its node is at least as slow as the fastest such row
        Ss, Bs = tuple(self.stage_counts()), tuple(self.micro_batches())
        bounds = [self.rows.type_bounds(name, jcap, Ss, Bs) for name, jcap in self._jcaps]
        lo_a = np.minimum.reduce([b[1] for b in bounds])
        ok = np.logical_and.reduce([b[0] for b in bounds]) & np.isfinite(lo_a)
        if not ok.any():
            return None
        lo_c = np.minimum.reduce([b[2] for b in bounds])
        f, eff = self.rows.pair_constants(Ss, Bs, self.per_request, self.budget)
        f = f[ok]
        ub = eff[ok] / ((1 - f) * lo_a[ok] + f * lo_c[ok])
        si, bi = np.nonzero(ok)  # Ss and Bs increase: their indices sort as they do
        order = np.lexsort((bi, si, -ub))
        pairs = zip(ub[order].tolist(), si[order].tolist(), bi[order].tolist())
        best: StepPipeline | None = None
        floor = at_least
        for ub, i, j in pairs:
            if ub <= floor * (1 + _RTOL):
                break
            S, B = Ss[i], Bs[j]
            types = [self.rows.type_rows(name, jcap, S, B) for name, jcap in self._jcaps]
            if floor > 0 and not self._may_beat(types, S, B, floor):
                continue
            P = self._pair(S, B, types)
            if floor > 0 and self._tight_bound(P) <= floor * (1 + _RTOL):
                continue  # every type holds a stage: this pair cannot beat the floor
            found = self._best_at(P, floor)
            if found is not None and (best is None or found.rate > best.rate * (1 + _RTOL)):
                best, floor = found, max(floor, found.rate)
        return best

    def _may_beat(self, types: list[TypeRows], S: int, B: int, floor: float) -> bool:
        """Whether the layers the types can cover below the floor's period may reach `L`
        (`_relaxed`): the test `_best_at` starts with, relaxed. A rate above the floor
        needs every node's time (aggregated: its mean step time) below
        `rate_at_unit_period / floor`."""
        G = self.rate_at_unit_period(S, B) / floor
        if self.mode == "aggregated":
            return self._relaxed(self._bounds(types, S, "h"), G)
        return self._relaxed(self._bounds(types, S, "a"), math.nextafter(G, -math.inf))

    def _bounds(self, types: list[TypeRows], S: int, times: str) -> list[tuple[list, list]]:
        """Each type's `TypeRows.layers_bound` in this combination at `S` stages."""
        room = S - (len(types) - 1)
        return [tr.layers_bound(cnt, room, times) for tr, cnt in zip(types, self.counts)]

    def _relaxed(self, bounds: list[tuple[list, list]], T: float) -> bool:
        """Whether the nodes may cover `L` layers with their times within T (`bounds`:
        `_bounds` of those times; False: they cannot)."""
        total = 0
        for values, bound in bounds:
            i = bisect_right(values, T) - 1
            if i < 0 or bound[i] < 1:
                return False
            total += bound[i]
        return total >= self.L

    def _tight_bound(self, P: Pair) -> float:
        """A bound on the rate at (S, B) that counts every type's stage: the slowest node
        is at least as slow as each type's fastest one-layer row and as the fastest row
        holding `ceil(L / S)` layers."""
        A = max(max(tr.one_a for tr in P.types), min(tr.lo_a for tr in P.types))
        C = max(max(tr.one_c for tr in P.types), min(tr.lo_c for tr in P.types))
        if self.mode != "aggregated":
            return P.eff / A
        # a node's mean step time is at most the step's mean period
        H = max(max(tr.one_h for tr in P.types), min(tr.lo_h for tr in P.types))
        return P.eff / max((1 - P.f) * A + P.f * C, H)

    def _best_at(self, P: Pair, floor: float) -> StepPipeline | None:
        """The best pipeline at (S, B) above `floor`: the staircase of (A, C).

        Feasibility grows with both thresholds, so the slowest-node times worth having are
        the corners of a staircase: for each `C`, the least feasible `A`. The walk visits
        the corners in increasing `C` and keeps the first of least mean period `g`; it only
        visits a corner that could still improve on the best so far and beat the floor
        (`useful`), jumping over the others by the least `A` that could."""
        S, f, eff = P.S, P.f, P.eff
        two = self.mode == "aggregated"
        thr = floor * (1 + _RTOL)
        tpot_cap = self.slo.tpot_s / S * (1 + _RTOL)
        G = eff / floor if floor > 0 else math.inf  # a rate above the floor needs g < G
        # the thresholds worth trying: every node time below G (C below G / f), from the
        # least at which the nodes may cover the layers (`_relaxed`) on
        A_vals = np.unique(np.concatenate([tr.values("a") for tr in P.types]))
        if floor > 0:
            A_vals = A_vals[A_vals < G]
        Av = A_vals.tolist()
        a_lo = self._least(P, Av, "a")
        if a_lo is None:
            return None
        if two:
            C_vals = np.unique(np.concatenate([tr.values("c") for tr in P.types]))
            if floor > 0 and f > 0:
                C_vals = C_vals[C_vals < G / f]
            Cv = C_vals.tolist()
            c_lo = self._least(P, Cv, "c")
            if c_lo is None:
                return None
            g_lo = (1 - f) * Av[a_lo] + f * Cv[c_lo]
        else:
            g_lo = Av[a_lo]
        if (g_lo > tpot_cap and self.mode != "prefill") or eff / g_lo <= thr:
            return None  # no period within reach beats the floor and meets the TPOT
        # the first exact test: every time below G, every node's mean below G
        a_top = math.nextafter(G, -math.inf)
        c_top = math.nextafter(G / f, -math.inf) if two and floor > 0 and f > 0 else math.inf
        if not self._feasible(P, a_top, c_top, H=G if two and floor > 0 else math.inf):
            # no pipeline fits below the floor's period (a step lasts at least the slowest
            # node's mean)
            return None
        if not two:
            ai = _first(a_lo, len(Av) - 1, lambda i: self._feasible(P, Av[i], math.inf),
                        known=True)
            assert ai is not None
            best_g, best_ac = Av[ai], (Av[ai], math.inf)
        else:
            best_g, best_ac = self._staircase(P, Av, Cv, a_lo, c_lo, thr, tpot_cap)
        if best_ac is None or best_g > tpot_cap and self.mode != "prefill":
            return None
        rate = eff / best_g
        if rate <= thr:
            return None
        return self._rebuild(P, *best_ac, rate=rate, period=best_g)

    def _least(self, P: Pair, vals: list[float], times: str) -> int | None:
        """Index of the least threshold in `vals` at which the nodes' `times` may cover the
        layers (`_relaxed`): no feasible threshold is below it (None: none is feasible)."""
        bounds = self._bounds(P.types, P.S, times)
        return _first(0, len(vals) - 1, lambda i: self._relaxed(bounds, vals[i]))

    def _staircase(self, P: Pair, Av: list[float], Cv: list[float], a_lo: int, c_lo: int,
                   thr: float, tpot_cap: float) -> tuple[float, tuple[float, float] | None]:
        """(least g, its (A, C)) over the corners that are useful (see `_best_at`); no
        feasible A is below `Av[a_lo]`, nor C below `Cv[c_lo]`."""
        f, eff = P.f, P.eff
        best_g, best_ac = math.inf, None

        def useful(g: float) -> bool:
            return g < best_g and g <= tpot_cap and eff / g > thr

        def feas(A: float, C: float) -> bool:
            return self._feasible(P, A, C)

        A_lo = Av[a_lo]
        cap, ci = len(Av) - 1, c_lo - 1  # corners left have A <= Av[cap] and C > Cv[ci]
        while True:
            # C up to the last where the least A is useful; A up to the last useful there
            chi = _last(ci + 1, len(Cv) - 1, lambda i: useful((1 - f) * A_lo + f * Cv[i]))
            if chi is None:
                break
            C0 = Cv[ci + 1]
            cap = _last(a_lo, cap, lambda i: useful((1 - f) * Av[i] + f * C0))
            assert cap is not None
            A_cap = Av[cap]
            ci = _first(ci + 1, chi, lambda i: feas(A_cap, Cv[i]))
            if ci is None:
                break
            C = Cv[ci]
            hi = _last(a_lo, cap, lambda i: useful((1 - f) * Av[i] + f * C))
            assert hi is not None
            if hi == cap or feas(Av[hi], C):
                ai = _first(a_lo, hi, lambda i: feas(Av[i], C), known=True)
                assert ai is not None
                best_g, best_ac = (1 - f) * Av[ai] + f * C, (Av[ai], C)
                if ai == a_lo:
                    break
                cap = ai - 1
            else:
                cap = hi
        return best_g, best_ac

    def _rebuild(self, P: Pair, A: float, C: float, *, rate: float,
                 period: float) -> StepPipeline:
        S, B = P.S, P.B
        total, tr = cover(P, A, C)
        assert total >= self.L
        groups = []  # (type, j, role, most layers)
        while tr is not None:
            tr, (t, (parts, roles)) = tr
            rows = dict(zip(P.types[t].keys, P.types[t].rows))
            for j, role in zip(parts, roles):
                r = rows[j, role]
                groups.append((t, j, role, r.layers_within(A, C), r))
        order = {FIRST: 0, ONLY: 0, MID: 1, END: 2}
        groups.sort(key=lambda x: (order[x[2]], x[0], x[1]))
        spare = sum(x[3] for x in groups) - self.L
        stages = []
        start = 0
        worst_c = 0.0
        for t, j, role, m, r in groups:
            cut = min(spare, m - 1)
            spare -= cut
            k = m - cut
            stages.append((self.types[t], j, start, k, r.batch, float(r.a[k - 1]),
                           float(r.c[k - 1])))
            worst_c = max(worst_c, float(r.c[k - 1]))
            start += k
        assert start == self.L
        f = P.f
        worst_a = max(st[5] for st in stages)
        if self.mode == "aggregated":
            period = (1 - f) * worst_a + f * worst_c
        else:
            period = worst_a
        rate = P.eff / period
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
    share of the KV cache (0 for a perf model that does not say). Sliding-window layers'
    windows are not counted (the node's sequences are not known here): at most
    `coral.perf.sliding.WINDOW_SEQUENCES` windows, which its KV capacity holds aside."""
    try:
        if arch.expert_weight_format is not None:
            weights = perf.stage_weight_bytes(arch, layers, first_stage=False, last_stage=last,
                                              node=node)
        else:
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
