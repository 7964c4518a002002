"""Enumeration of node combinations: counts against brute force, memory and region bounds."""

from __future__ import annotations

import itertools

import pytest
from test_templates_support import tiny_catalog

from coral.catalog import default_catalog
from coral.templates.space.enumerate import (
    enumerate_combinations,
    multisets_count,
    parse_combo,
    sub_combos,
)


def brute_force(cat, model, nmax, rho, names, min_kv_tokens, reserve=0.10, regions=None):
    arch = cat.model(model)
    need = arch.weight_bytes + min_kv_tokens * arch.num_layers * arch.kv_bytes_per_token_per_layer
    seen = set()
    kept, low, high, noreg, total = set(), 0, 0, 0, 0
    for size in range(1, nmax + 1):
        for prod in itertools.product(names, repeat=size):
            combo = tuple(sorted(prod))
            if combo in seen:
                continue
            seen.add(combo)
            total += 1
            mem = sum(cat.node_memory_bytes(n) for n in combo)
            common = None
            for n in combo:
                here = {p.region for p in cat.node_type(n).prices
                        if regions is None or p.region in regions}
                common = here if common is None else common & here
            if mem > rho * arch.weight_bytes * (1 + 1e-12):
                high += 1
            elif mem * (1 - reserve) < need:
                low += 1
            elif not common:
                noreg += 1
            else:
                kept.add(combo)
    return kept, total, low, high, noreg


@pytest.mark.parametrize("nmax, rho", [(1, 12.0), (3, 12.0), (4, 3.0), (4, 1.2)])
def test_tiny_catalog_matches_brute_force(tmp_path, nmax, rho):
    cat = tiny_catalog(tmp_path)
    names = list(cat.node_types)
    e = enumerate_combinations("tiny-4l", cat, nmax=nmax, rho=rho, min_kv_tokens=640)
    kept, total, low, high, noreg = brute_force(cat, "tiny-4l", nmax, rho, names, 640)
    assert set(e.combos) == kept and len(e.combos) == len(kept)
    assert (e.total, e.pruned_memory_low, e.pruned_memory_high, e.pruned_no_region) == (
        total, low, high, noreg)
    assert e.total == sum(multisets_count(len(names), s) for s in range(1, nmax + 1))
    assert e.total == len(kept) + low + high + noreg


def test_real_catalog_subset_matches_brute_force():
    cat = default_catalog()
    names = ["1x-t4", "1x-l4", "1x-a10g", "4x-l4", "1x-a100-80gb", "8x-a100-40gb"]
    e = enumerate_combinations("qwen3-32b", cat, nmax=4, rho=12, node_types=names,
                               min_kv_tokens=1280)
    kept, total, low, high, noreg = brute_force(cat, "qwen3-32b", 4, 12, names, 1280)
    assert set(e.combos) == kept
    assert (e.total, e.pruned_memory_low, e.pruned_memory_high, e.pruned_no_region) == (
        total, low, high, noreg)
    # ordered by size, every combination sorted by name
    assert list(e.combos) == sorted(e.combos, key=lambda c: (len(c), c))
    assert all(list(c) == sorted(c) for c in e.combos)


def test_memory_bounds_hold():
    cat = default_catalog()
    arch = cat.model("llama-3.3-70b")
    e = enumerate_combinations(arch, cat, nmax=3, rho=4)
    for combo in e.combos:
        mem = sum(cat.node_memory_bytes(n) for n in combo)
        assert mem <= 4 * arch.weight_bytes * (1 + 1e-12)
        assert 0.9 * mem >= arch.weight_bytes
        assert len(combo) <= 3


def test_region_restriction(tmp_path):
    cat = tiny_catalog(tmp_path)
    e = enumerate_combinations("tiny-4l", cat, nmax=2, regions=["r2"], min_kv_tokens=0)
    assert set(e.node_types) == {"1x-b", "1x-r2only"}
    assert set(e.excluded_node_types) == {"1x-s", "2x-s"}
    kept, *_ = brute_force(cat, "tiny-4l", 2, 12.0, ["1x-b", "1x-r2only"], 0, regions={"r2"})
    assert set(e.combos) == kept
    anywhere = enumerate_combinations("tiny-4l", cat, nmax=2, min_kv_tokens=0,
                                      require_common_region=False)
    assert ("1x-r2only", "1x-s") in anywhere.combos
    assert ("1x-r2only", "1x-s") not in enumerate_combinations(
        "tiny-4l", cat, nmax=2, min_kv_tokens=0).combos


def test_bad_inputs(tmp_path):
    cat = tiny_catalog(tmp_path)
    with pytest.raises(KeyError, match="Did you mean"):
        enumerate_combinations("tiny-4l", cat, node_types=["1x-bb"])
    with pytest.raises(ValueError, match="nmax"):
        enumerate_combinations("tiny-4l", cat, nmax=0)
    with pytest.raises(ValueError, match="rho"):
        enumerate_combinations("tiny-4l", cat, rho=0)


def test_parse_combo_and_sub_combos():
    assert parse_combo("1x-l4,1x-l4, 4x-a100-40gb") == ["1x-l4", "1x-l4", "4x-a100-40gb"]
    assert parse_combo("1x-l4*2,4x-a100-40gb") == ["1x-l4", "1x-l4", "4x-a100-40gb"]
    for bad in ("", "1x-l4,,1x-t4", "1x-l4*0", "1x-l4*x"):
        with pytest.raises(ValueError):
            parse_combo(bad)
    assert sub_combos(("a", "a", "b")) == [("a", "b"), ("a", "a")]
    assert sub_combos(("a",)) == [()]


@pytest.mark.perf
def test_full_catalog_enumeration_is_fast():
    import time

    cat = default_catalog()
    start = time.perf_counter()
    e = enumerate_combinations("mixtral-8x22b", cat)
    assert time.perf_counter() - start < 2.0
    assert e.total == sum(multisets_count(len(cat.node_types), s) for s in range(1, 7))
