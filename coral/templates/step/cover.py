"""Feasibility at thresholds for the step-model search (`placement_step`): do all the nodes of
a combination form `S` stages covering the model's `L` layers with every node's time within
`(A, C)` (and its mean step time within `H`)?

At thresholds each row covers at most `caps` layers (a bisection in its times). A type's nodes
split into groups with roles (`StepRows.choices`); `own` is the most layers they cover per
(groups, flags), and the types combine by a max-plus knapsack over (groups, flags) in which
the flags say the pipeline has one first and one end stage (or one only stage) and some group
whose size divides `B` (`stage_groups`).

`feasible` answers the question alone, fast: it first adds up each type's best (a true upper
bound on the knapsack, which rejects most thresholds tried), then runs the knapsack on
integer states, dropping those that cannot reach `L` even with every later type's best.
`cover` runs the same knapsack with the choices kept, for rebuilding the pipeline found.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any

from coral.templates.step.stage_groups import COMPLETE, F_END, F_FIRST, F_ONLY, F_TIGHT, MERGE
from coral.templates.step.rows import TypeRows

#: Entries kept per (type rows, count, room) before the memo of `own` starts afresh.
_OWN_MEMO_SIZE = 20_000


class Pair:
    """One (stage count S, micro-batch B) of a combination: its node types' rows, the share
    `f` of steps with one prompt more, the rate at a unit period, and what each type covers
    at a set of layer caps (memoised with the type's rows: bisections revisit caps, and
    other combinations hold the same type and count)."""

    __slots__ = ("S", "B", "types", "choices", "f", "eff", "own", "want")

    def __init__(self, S: int, B: int, types: list[TypeRows], choices: list[list],
                 f: float, eff: float, own: list[dict]) -> None:
        self.S, self.B, self.types, self.choices, self.f, self.eff = S, B, types, choices, f, eff
        self.own = own
        self.want = (F_ONLY if S == 1 else F_FIRST | F_END) | F_TIGHT


def caps_at(tr: TypeRows, A: float, C: float, H: float) -> tuple[int, ...]:
    """Most layers each of the type's rows holds with its times within (A, C) and its mean
    within H (`StepRow.layers_within`, inlined: this runs for every threshold tried)."""
    rows = tr.rows
    if H != math.inf:
        return tuple([min(bisect_right(r.a_list, A), bisect_right(r.c_list, C),
                          bisect_right(r.h_list, H)) for r in rows])
    if C == math.inf:  # every c is finite where a is: only a binds
        return tuple([bisect_right(r.a_list, A) for r in rows])
    return tuple([min(bisect_right(r.a_list, A), bisect_right(r.c_list, C)) for r in rows])


def own_at(P: Pair, t: int, caps: tuple[int, ...]) -> tuple:
    """What type `t`'s nodes cover at layer caps `caps`: (most layers per (groups, flags)
    with the choice that gives it; the same as (groups, flags, layers) sorted by groups; as a
    list indexed by `groups * 16 + flags`, -1 where none; the most with room for the other
    types' stages, -1 when none)."""
    memo = P.own[t]
    hit = memo.get(caps)
    if hit is None:
        own: dict[tuple[int, int], tuple[int, Any]] = {}
        for g, flags, idx, choice in P.choices[t]:
            total = 0
            for i in idx:
                m = caps[i]
                if m < 1:
                    total = -1
                    break
                total += m
            if total > 0 and total > own.get((g, flags), (-1, None))[0]:
                own[g, flags] = (total, choice)
        room = P.S - (len(P.types) - 1)
        items = sorted(((g, f, v) for (g, f), (v, _) in own.items()), key=lambda x: x[0])
        table = [-1] * ((P.S + 1) * 16)
        for g, f, v in items:
            table[g * 16 + f] = v
        top = max((v for g, _, v in items if g <= room), default=-1)
        if len(memo) > _OWN_MEMO_SIZE:
            memo.clear()
        hit = memo[caps] = (own, items, table, top)
    return hit


def feasible(P: Pair, L: int, A: float, C: float, H: float = math.inf) -> bool:
    """Whether `S` groups of all the nodes cover `L` layers at thresholds (A, C, H)."""
    S = P.S
    owns = []
    tops = []
    for t, tr in enumerate(P.types):
        hit = own_at(P, t, caps_at(tr, A, C, H))
        if hit[3] < 0:
            return False
        owns.append(hit)
        tops.append(hit[3])
    rest = sum(tops)
    if rest < L:  # each type's best together fall short
        return False
    n = len(owns)
    F = {0: 0}  # groups * 16 + flags -> most layers
    for t in range(n - 1):
        rest -= tops[t]
        need = L - rest  # the later types add at most `rest`
        room = S - (n - 1 - t)  # every later type holds at least one stage
        items = owns[t][1]
        G: dict[int, int] = {}
        for k1, v1 in F.items():
            g1 = k1 >> 4
            merge = MERGE[k1 & 15]
            for g2, f2, v2 in items:
                g = g1 + g2
                if g > room:
                    break
                v = v1 + v2
                if v < need:
                    continue
                f = merge[f2]
                if f < 0:
                    continue
                k = (g << 4) | f
                if v > G.get(k, -1):
                    G[k] = v
        if not G:
            return False
        F = G
    table = owns[-1][2]
    want = P.want
    for k1, v1 in F.items():
        base = (S - (k1 >> 4)) << 4
        if base <= 0:
            continue
        for f2 in COMPLETE[k1 & 15][want]:
            v2 = table[base + f2]
            if v2 >= 0 and v1 + v2 >= L:
                return True
    return False


def cover(P: Pair, A: float, C: float) -> tuple[int, Any]:
    """Most layers `S` groups of all the nodes cover with every time within (A, C), and the
    choices that give it: (the choices before, (type, (group sizes, roles))) nested from the
    last type back, or -1 and None when there is no such pipeline."""
    S = P.S
    want = P.want
    F: dict[tuple[int, int], tuple[int, Any]] = {(0, 0): (0, None)}
    n_types = len(P.types)
    for t, tr in enumerate(P.types):
        own = own_at(P, t, caps_at(tr, A, C, math.inf))[0]
        if t == n_types - 1:  # the last type completes the pipeline: look its part up
            best: tuple[int, Any] = (-1, None)
            for (g1, f1), (v1, tr1) in F.items():
                for f2 in COMPLETE[f1][want]:
                    hit = own.get((S - g1, f2))
                    if hit is not None and v1 + hit[0] > best[0]:
                        best = (v1 + hit[0], (tr1, (t, hit[1])))
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
                    G[g, f] = (v1 + v2, (tr1, (t, tr2)))
        F = G
        if not F:
            return -1, None
    return -1, None
