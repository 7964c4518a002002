"""Template dominance on arrays against a brute-force reference and the scalar scan, on random
small libraries (seeded)."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import numpy as np
import pytest

from coral.allocator.core import dominance
from coral.allocator.core.dominance import dominated_templates
from coral.allocator.problem import TemplateColumn, priced_column

TYPES = ("a", "b", "c")
REGIONS = ("r1", "r2")


def _library(rng: random.Random, *, additive: bool) -> list[TemplateColumn]:
    """Templates of 1-4 nodes for two models in two modes. Capacities are small multiples of
    1/2, so ties are common and sums exact; prices are sums of node prices (`additive`) or
    those sums with a random change, so collections can be dearer than the template."""
    node_prices = {(g, r): rng.choice([0.5, 1.0, 1.5, 2.25])
                   for g in TYPES for r in REGIONS if rng.random() < 0.85}
    out = []
    for i in range(rng.randint(4, 28)):
        n = rng.randint(1, 4)
        counts = Counter(rng.choice(TYPES[: rng.randint(1, 3)]) for _ in range(n))
        t = priced_column(f"t{i:02d}", rng.choice(["m", "n"]), rng.choice(["aggregated",
                          "prefill"]), dict(counts), rng.randint(1, 4 * n) / 2, node_prices,
                          REGIONS)
        if not t.price_usd_per_hour:
            continue
        if not additive:
            t = TemplateColumn(t.id, t.model, t.mode, t.node_counts, t.capacity,
                               {r: usd * rng.choice([0.5, 1.0, 1.0, 2.0])
                                for r, usd in t.price_usd_per_hour.items()})
        out.append(t)
    return out


def _collections(parts: list[TemplateColumn], room: Counter) -> list[list[TemplateColumn]]:
    """Every collection (repeats allowed, order ignored) of `parts` whose nodes fit in
    `room`, the empty one included."""
    if not parts:
        return [[]]
    head, rest = parts[0], parts[1:]
    out = []
    k = 0
    while all(room[g] >= k * n for g, n in head.node_counts.items()):
        left = room.copy()
        left.subtract({g: k * n for g, n in head.node_counts.items()})
        out += [[head] * k + c for c in _collections(rest, left)]
        k += 1
    return out


def _brute_force(templates: list[TemplateColumn]) -> set[str]:
    """Dominated templates by the definition, where prices are sums of node prices: a twin of
    a kept template (same model, mode and nodes; the kept one of highest capacity, then first
    by id), or a kept multi-node template that some collection of the other kept ones fits in
    its nodes with at least its capacity."""
    kept: dict[tuple, TemplateColumn] = {}
    out: set[str] = set()
    for t in sorted(templates, key=lambda t: (-t.capacity, t.id)):
        key = (t.model, t.mode, tuple(sorted(t.node_counts.items())))
        if key in kept:
            out.add(t.id)
        else:
            kept[key] = t
    for t in kept.values():
        if t.num_nodes == 1:
            continue
        parts = [p for p in kept.values()
                 if (p.model, p.mode) == (t.model, t.mode) and p is not t]
        if any(sum(p.capacity for p in c) >= t.capacity
               for c in _collections(parts, Counter(t.node_counts))):
            out.add(t.id)
    return out


def _valid(t: TemplateColumn, parts: list[TemplateColumn]) -> bool:
    nodes = Counter()
    for p in parts:
        nodes.update(p.node_counts)
        if (p.model, p.mode) != (t.model, t.mode):
            return False
    return (all(nodes[g] <= t.node_counts.get(g, 0) for g in nodes)
            and sum(p.capacity for p in parts) >= t.capacity
            and all(sum(p.price_usd_per_hour.get(r, float("inf")) for p in parts)
                    <= usd * (1 + 1e-12) for r, usd in t.price_usd_per_hour.items()))


@pytest.mark.parametrize("seed", range(40))
def test_dominance_equals_brute_force_and_the_scalar_scan(seed: int, monkeypatch) -> None:
    rng = random.Random(seed)
    libraries = [_library(rng, additive=True), _library(rng, additive=False)]
    outs = [dominated_templates(templates) for templates in libraries]
    for templates, out in zip(libraries, outs):
        by_id = {t.id: t for t in templates}
        for tid, parts in out.items():
            assert _valid(by_id[tid], [by_id[p] for p in parts]), (tid, parts)
    assert set(outs[0]) == _brute_force(libraries[0])
    monkeypatch.setattr(dominance, "_fits_codes", lambda first: False)
    for templates, out in zip(libraries, outs):
        assert out == dominated_templates(templates)  # the same collections, ties included


def test_dominance_on_a_group_too_large_for_the_codes() -> None:
    # 40 nodes of one type: (nodes + 1) ** nodes overflows, so the group takes the scalar scan
    one = TemplateColumn("one", "m", "aggregated", {"a": 1}, 1.0, {"r1": 1.0})
    wide = TemplateColumn("wide", "m", "aggregated", {"a": 40}, 39.0, {"r1": 40.0})
    first = {dominance._multiset(t): t for t in (one, wide)}
    assert not dominance._fits_codes(first)
    assert dominated_templates([one, wide]) == {"wide": ("one",) * 40}


def test_every_sub_multiset_shape_is_in_product_order() -> None:
    # the tie rule: the arrays enumerate sub-multisets as the scalar scan does
    subs, mult, rest = dominance._Shapes(base=4).table((2, 1))
    assert [tuple(s) for s in subs] == list(itertools.product(range(3), range(2)))
    types = np.array([[1, 3]])  # 2 x type 1, 1 x type 3: code digits 1, 1, 3
    codes = (types @ mult.T)[0]
    assert codes[-1] == 1 + 1 * 4 + 3 * 16 and codes[0] == 0
    assert list((types @ rest.T)[0]) == list(codes[::-1])
