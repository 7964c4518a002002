"""Templates that others dominate (`dominated_templates`), for presolve.

The rule is one dynamic programme per (model, mode): the most capacity a collection of templates
fits in each node multiset. On n_max-6 libraries a group holds up to ~15,000 multisets of up to
6 nodes and ~60,000 sub-multisets, so the programme runs on arrays: every multiset is an integer
code (its sorted node types as digits), the sub-multisets of all multisets that share one shape
(the counts of their node types) come from one table, and each size of multiset is one
vectorised step. Ties break as a scan of the sub-multisets in `itertools.product` order would
(`_dominated_by_parts_scalar`, kept for multisets too large for the codes), so the collections
reported, not only the templates, do not depend on the route taken.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator, Sequence

import numpy as np

from coral.allocator.problem import TemplateColumn

Multiset = tuple[tuple[str, int], ...]
"""A node multiset as sorted (node type, count) pairs."""

#: Codes are int64: a group's multisets take the array route while (node types + 1) ** nodes
#: stays below this, and their shapes' codes ((nodes + 1) ** nodes) too.
_CODE_LIMIT = 2 ** 62


def _multiset(t: TemplateColumn) -> Multiset:
    return tuple(sorted(t.node_counts.items()))


def dominated_templates(templates: Sequence[TemplateColumn]) -> dict[str, tuple[str, ...]]:
    """Templates that others dominate: template id -> ids of a collection that dominates it.

    A collection of templates (repeats allowed) dominates template `t` when all serve the same
    model in the same mode, their nodes together form a sub-multiset of `t`'s nodes, their
    capacities sum to at least `t`'s and their prices to at most `t`'s in every region `t` runs
    in (always so when prices are sums of node prices). The collection then needs no more of
    any node type, costs no more, and its start-up penalty (proportional to price) is no
    larger: replacing each `t` by it keeps a plan feasible and costs no more, so dropping `t`
    loses nothing — as long as `t` is not running now (see `presolve_columns`).

    This covers one template on a sub-multiset of the nodes (the library's own rule) and also
    a multi-node template that does no better than data parallelism over its parts, e.g.
    `2x(1x-l4)` at exactly twice one `1x-l4` replica. Of identical templates the one of highest
    capacity, then first by id, is kept. Of a multiset's proper sub-collections, the one of
    most capacity is tested (the first in `itertools.product` order of its first part, among
    equals).

    Price per unit of capacity is *not* a dominance rule: with whole instances the cheaper
    per-unit template can overshoot demand.
    """
    out: dict[str, tuple[str, ...]] = {}
    groups: dict[tuple[str, str], list[TemplateColumn]] = {}
    for t in templates:
        groups.setdefault((t.model, t.mode), []).append(t)
    for group in groups.values():
        first: dict[Multiset, TemplateColumn] = {}
        for t in sorted(group, key=lambda t: (-t.capacity, t.id)):
            key = _multiset(t)
            if key not in first:
                first[key] = t
            elif _no_dearer(t, [first[key]]):
                out[t.id] = (first[key].id,)
        if _fits_codes(first):
            out.update(_dominated_by_parts(first))
        else:
            out.update(_dominated_by_parts_scalar(first))
    return out


def _no_dearer(t: TemplateColumn, parts: Sequence[TemplateColumn]) -> bool:
    """The parts together cost no more than `t` in every region `t` is priced in. Always true
    when prices are sums of node prices; checked because a column's prices may be anything."""
    for region, usd in t.price_usd_per_hour.items():
        total = sum(p.price_usd_per_hour.get(region, math.inf) for p in parts)
        if total > usd * (1.0 + 1e-12):
            return False
    return True


def _fits_codes(first: dict[Multiset, TemplateColumn]) -> bool:
    """The group's multisets and shapes have int64 codes (`_CODE_LIMIT`): always so at the
    libraries' n_max, not for templates of dozens of nodes."""
    types = {g for key in first for g, _ in key}
    nodes = max((sum(n for _, n in key) for key in first), default=0)
    return (len(types) + 1) ** nodes < _CODE_LIMIT and (nodes + 1) ** nodes < _CODE_LIMIT


# ---------------------------------------------------------------------------------- arrays


class _Shapes:
    """Sub-multisets by shape: for the run counts `shape` (nodes per distinct type, in type
    order), every sub-shape in `itertools.product` order and, per run, the code multiplier
    that places that run's nodes after the runs before it."""

    def __init__(self, base: int) -> None:
        self.base = base
        self._cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def table(self, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sub-shapes (S, m), multipliers of the sub-multisets (S, m), of their complements
        (S, m)); S = prod(shape + 1), the first row empty and the last the whole."""
        hit = self._cache.get(shape)
        if hit is None:
            subs = np.array(list(itertools.product(*[range(n + 1) for n in shape])),
                            dtype=np.int64).reshape(-1, len(shape))
            hit = (subs, self._multipliers(subs), self._multipliers(np.array(shape) - subs))
            self._cache[shape] = hit
        return hit

    def _multipliers(self, subs: np.ndarray) -> np.ndarray:
        powers = np.cumsum(np.concatenate([[0], self.base ** np.arange(subs.sum(axis=1).max(
            initial=0), dtype=np.int64)]))  # powers[j] = B^0 + ... + B^(j-1)
        start = np.cumsum(subs, axis=1) - subs
        return powers[start + subs] - powers[start]


def _codes_of(types: np.ndarray, counts: np.ndarray, base: int) -> np.ndarray:
    """Codes of multisets given as runs (type index from 1, count; padded with zeros)."""
    nodes = counts.sum(axis=1).max(initial=0)
    powers = np.cumsum(np.concatenate([[0], base ** np.arange(nodes, dtype=np.int64)]))
    start = np.cumsum(counts, axis=1) - counts
    return ((powers[start + counts] - powers[start]) * types).sum(axis=1)


def _runs_of(codes: np.ndarray, base: int, nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Runs (type index, count; padded with zeros) of multisets given by their codes."""
    digits = (codes[:, None] // base ** np.arange(nodes, dtype=np.int64)) % base
    starts = digits != 0
    starts[:, 1:] &= digits[:, 1:] != digits[:, :-1]
    run = np.cumsum(starts, axis=1) - 1
    types = np.zeros_like(digits)
    counts = np.zeros_like(digits)
    rows, cols = np.nonzero(digits)
    types[rows, run[rows, cols]] = digits[rows, cols]
    np.add.at(counts, (rows, run[rows, cols]), 1)
    return types, counts


def _dominated_by_parts(first: dict[Multiset, TemplateColumn]) -> dict[str, tuple[str, ...]]:
    """`_dominated_by_parts_scalar` on arrays: the same collections for the same templates."""
    keys = list(first)
    names = sorted({g for key in keys for g, _ in key})
    index = {g: i + 1 for i, g in enumerate(names)}
    base = len(names) + 1
    regions = sorted({r for t in first.values() for r in t.price_usd_per_hour})
    r_of = {r: i for i, r in enumerate(regions)}
    nodes = max(sum(n for _, n in key) for key in keys)
    k_types = np.zeros((len(keys), nodes), dtype=np.int64)
    k_counts = np.zeros((len(keys), nodes), dtype=np.int64)
    k_cap = np.zeros(len(keys))
    price = np.full((len(keys) + 1, len(regions)), math.inf)  # the last row: no part
    price[-1] = 0.0
    for i, (key, t) in enumerate(first.items()):
        for j, (g, n) in enumerate(key):
            k_types[i, j], k_counts[i, j] = index[g], n
        k_cap[i] = t.capacity
        for r, usd in t.price_usd_per_hour.items():
            price[i, r_of[r]] = usd
    k_codes = _codes_of(k_types, k_counts, base)
    order = np.argsort(k_codes)
    k_sorted = k_codes[order]
    shapes = _Shapes(base)

    # every sub-multiset of a template's multiset: the programme's states
    found = [k_codes]
    for rows, shape in _by_shape(k_counts):
        subs, mult, _ = shapes.table(shape)
        found.append((k_types[rows, :len(shape)] @ mult.T).ravel())
    d_codes = np.unique(np.concatenate(found))
    d_codes = d_codes[d_codes != 0]
    d_types, d_counts = _runs_of(d_codes, base, nodes)
    d_size = d_counts.sum(axis=1)
    at = np.searchsorted(k_sorted, d_codes)
    at = np.minimum(at, len(k_sorted) - 1)
    d_key = np.where(k_sorted[at] == d_codes, order[at], -1)  # the template of that multiset

    # transitions: state d, first part p (a template's multiset, neither empty nor d), rest d-p
    pair_d, pair_p, pair_rest, pair_rank = [], [], [], []
    for rows, shape in _by_shape(d_counts):
        subs, mult, rest_mult = shapes.table(shape)
        inner = slice(1, len(subs) - 1)
        runs = d_types[rows, :len(shape)]
        p_codes = runs @ mult[inner].T
        at = np.minimum(np.searchsorted(k_sorted, p_codes), len(k_sorted) - 1)
        hit = k_sorted[at] == p_codes
        r, s = np.nonzero(hit)
        pair_d.append(rows[r])
        pair_p.append(order[at[r, s]])
        pair_rest.append(np.searchsorted(d_codes, (runs[r] * rest_mult[inner][s]).sum(axis=1)))
        pair_rank.append(s)
    pair_d, pair_p, pair_rest, pair_rank = (np.concatenate(a) if a else np.zeros(0, np.int64)
                                            for a in (pair_d, pair_p, pair_rest, pair_rank))

    # best[d]: most capacity in d, d itself allowed; proper[d]: d itself not allowed
    n_d = len(d_codes)
    best = np.zeros(n_d)
    best_pair = np.full(n_d, -1)  # -1: d itself (where it is a template's) or nothing
    proper = np.zeros(n_d)
    proper_pair = np.full(n_d, -1)
    has_key = d_key >= 0
    pair_size = d_size[pair_d]
    for size in range(1, nodes + 1):
        sel = np.nonzero(pair_size == size)[0]
        value = k_cap[pair_p[sel]] + best[pair_rest[sel]]
        # the first in product order among the most capacity
        pick = np.lexsort((pair_rank[sel], -value, pair_d[sel]))
        lead = np.ones(len(pick), dtype=bool)
        lead[1:] = pair_d[sel][pick][1:] != pair_d[sel][pick][:-1]
        win = sel[pick[lead]]
        proper[pair_d[win]] = value[pick[lead]]
        proper_pair[pair_d[win]] = win
        states = np.nonzero(d_size == size)[0]
        own = np.where(has_key[states], k_cap[np.maximum(d_key[states], 0)], 0.0)
        part = proper_pair[states] >= 0
        use_part = part & (~has_key[states] | (proper[states] > own))
        best[states] = np.where(use_part, proper[states], own)
        best_pair[states] = np.where(use_part, proper_pair[states], -1)

    # templates on more than one node whose best proper collection has their capacity
    k_state = np.searchsorted(d_codes, k_codes)
    cand = np.nonzero((k_counts.sum(axis=1) > 1) & (proper_pair[k_state] >= 0)
                      & (proper[k_state] >= k_cap))[0]
    parts = np.full((len(cand), nodes), -1)
    link = proper_pair[k_state[cand]]
    parts[:, 0] = pair_p[link]
    state = pair_rest[link]
    live = np.ones(len(cand), dtype=bool)
    for step in range(1, nodes):
        nxt = best_pair[state]
        own = live & (nxt < 0) & (d_key[state] >= 0)
        parts[own, step] = d_key[state[own]]
        live &= nxt >= 0
        parts[live, step] = pair_p[nxt[live]]
        state = np.where(live, pair_rest[np.maximum(nxt, 0)], state)

    # the collection costs no more in any region the template is priced in
    total = np.zeros((len(cand), len(regions)))
    for step in range(nodes):
        total = total + price[parts[:, step]]
    own_price = price[cand]
    priced = np.isfinite(own_price)
    dearer = (priced & (total > np.where(priced, own_price, 0.0) * (1.0 + 1e-12))).any(axis=1)
    ids = [first[key].id for key in keys]
    out: dict[str, tuple[str, ...]] = {}
    for row in np.nonzero(~dearer)[0]:
        out[ids[cand[row]]] = tuple(ids[p] for p in parts[row] if p >= 0)
    return out


def _by_shape(counts: np.ndarray) -> Iterator[tuple[np.ndarray, tuple[int, ...]]]:
    """Rows grouped by their run counts (the shape), each with its shape."""
    width = counts.shape[1]
    shape_codes = (counts * (width + 1) ** np.arange(width, dtype=np.int64)).sum(axis=1)
    uniq, first_row, inverse = np.unique(shape_codes, return_index=True, return_inverse=True)
    rows_of = np.split(np.argsort(inverse, kind="stable"),
                       np.cumsum(np.bincount(inverse, minlength=len(uniq)))[:-1])
    for u, rows in enumerate(rows_of):
        shape = tuple(int(n) for n in counts[first_row[u]] if n)
        yield rows, shape


# ---------------------------------------------------------------------------------- scalar


def _sub_multisets(key: Multiset) -> Iterator[Multiset]:
    names = [g for g, _ in key]
    for combo in itertools.product(*[range(n + 1) for _, n in key]):
        yield tuple((g, k) for g, k in zip(names, combo) if k)


def _minus(a: Multiset, b: Multiset) -> Multiset:
    take = dict(b)
    return tuple((g, n - take.get(g, 0)) for g, n in a if n > take.get(g, 0))


def _dominated_by_parts_scalar(first: dict[Multiset, TemplateColumn]
                               ) -> dict[str, tuple[str, ...]]:
    """Templates a proper collection of the others dominates, one multiset at a time (a
    memoised scan of sub-multisets): for multisets too large for `_dominated_by_parts`'s
    codes."""
    out: dict[str, tuple[str, ...]] = {}
    cap = {key: t.capacity for key, t in first.items()}
    memo: dict[Multiset, tuple[float, tuple[Multiset, ...]]] = {(): (0.0, ())}

    def best(q: Multiset, *, proper: bool = False) -> tuple[float, tuple[Multiset, ...]]:
        """Most capacity a collection of templates fits in `q` (excluding `q` itself when
        `proper`)."""
        if not proper and q in memo:
            return memo[q]
        value, parts = (0.0, ())
        if not proper and q in cap:
            value, parts = cap[q], (q,)
        for p in _sub_multisets(q):
            if p and p != q and p in cap:
                rest_value, rest_parts = best(_minus(q, p))
                if cap[p] + rest_value > value:
                    value, parts = cap[p] + rest_value, (p,) + rest_parts
        if not proper:
            memo[q] = (value, parts)
        return value, parts

    for key, t in first.items():
        if len(key) == 1 and key[0][1] == 1:
            continue  # one node: nothing smaller to dominate it
        value, parts = best(key, proper=True)
        if parts and value >= t.capacity and _no_dearer(t, [first[p] for p in parts]):
            out[t.id] = tuple(first[p].id for p in parts)
    return out
