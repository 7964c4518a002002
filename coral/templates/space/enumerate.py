"""Node combinations a model's templates are solved on: multisets of node types.

A combination is a multiset of 1..`nmax` node types (names sorted, so one tuple per multiset).
It is kept when

- its usable memory (`MEMORY_RESERVE_FRACTION` kept free per node) holds the model's weights
  plus a minimum KV reserve (`min_kv_tokens` tokens over every layer; the template builder
  passes one request of the workload, which every operating point needs at least: lossless);
- its total GPU memory is at most `rho` x the model's weight bytes (larger ones are left to
  be replicas of smaller templates: the design's memory-ratio cut);
- some region prices every node type in it (a template runs inside one region), when
  `require_common_region` (the default); with `regions` given, that region must be one of them.

Node types are visited in increasing memory order, so the moment adding a node type breaks the
`rho` bound every larger one does too and the whole branch is cut without being enumerated. The
number of multisets cut that way is counted in closed form, so the report is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from coral.catalog.loader import Catalog
from coral.catalog.schema import ModelArch
from coral.errors import InputError

try:
    from coral.perf.model import MEMORY_RESERVE_FRACTION
except ImportError:  # pragma: no cover
    MEMORY_RESERVE_FRACTION = 0.10

#: Default largest number of nodes in one combination (template quality plateaus here).
DEFAULT_NMAX = 6
#: Default largest total GPU memory of a combination, as a multiple of the weight bytes.
DEFAULT_RHO = 12.0
#: KV reserve a combination must hold beyond the weights when no workload is given, tokens
#: over every layer (one ~1k-token request).
MIN_KV_RESERVE_TOKENS = 1024

Combo = tuple[str, ...]


@dataclass(frozen=True)
class Enumeration:
    """The kept combinations (by size, then by name) and what was cut and why."""

    combos: tuple[Combo, ...]
    node_types: tuple[str, ...]  # candidates, increasing memory
    total: int  # multisets of 1..nmax of the candidates
    pruned_memory_low: int
    pruned_memory_high: int
    pruned_no_region: int
    excluded_node_types: dict[str, str] = field(default_factory=dict)  # name -> why

    @property
    def enumerated(self) -> int:
        return self.total

    def counts(self) -> dict[str, int]:
        return {
            "enumerated": self.total,
            "pruned_memory_low": self.pruned_memory_low,
            "pruned_memory_high": self.pruned_memory_high,
            "pruned_no_region": self.pruned_no_region,
            "candidates": len(self.combos),
        }


def multisets_count(types: int, size: int) -> int:
    """Number of multisets of `size` items from `types` kinds."""
    if size == 0:
        return 1
    if types <= 0:
        return 0
    return math.comb(types + size - 1, size)


def parse_combo(text: str) -> list[str]:
    """`1x-l4,1x-l4,4x-a100-40gb` or `1x-l4*2,4x-a100-40gb` -> node-type names."""
    if not text or not text.strip():
        raise InputError("empty combination: give node types separated by commas, "
                         "e.g. 1x-l4,1x-l4,4x-a100-40gb (or 1x-l4*2,4x-a100-40gb)")
    names: list[str] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            raise InputError(f"bad combination {text!r}: empty entry between commas")
        count = 1
        if "*" in part:
            name, _, num = part.partition("*")
            if not num.strip().isdigit() or int(num) < 1:
                raise InputError(f"bad combination entry {part!r}: expected NAME*COUNT with "
                                 "COUNT a positive integer")
            part, count = name.strip(), int(num)
        names.extend([part] * count)
    return names


def combo_key(combo: Sequence[str]) -> str:
    """`("1x-l4", "1x-l4", "1x-t4")` -> `"1x-l4*2+1x-t4"`: the stable, readable name of a
    combination in every template column id (the planner's and the baselines' alike)."""
    return "+".join(g if n == 1 else f"{g}*{n}" for g, n in node_counts(combo).items())


def node_counts(combo: Sequence[str]) -> dict[str, int]:
    """`("1x-l4", "1x-t4", "1x-l4")` -> `{"1x-l4": 2, "1x-t4": 1}`, node types sorted."""
    out: dict[str, int] = {}
    for g in sorted(combo):
        out[g] = out.get(g, 0) + 1
    return out


def enumerate_combinations(
    model: ModelArch | str,
    catalog: Catalog,
    *,
    nmax: int = DEFAULT_NMAX,
    rho: float = DEFAULT_RHO,
    node_types: Iterable[str] | None = None,
    regions: Iterable[str] | None = None,
    min_kv_tokens: int = MIN_KV_RESERVE_TOKENS,
    memory_reserve: float = MEMORY_RESERVE_FRACTION,
    require_common_region: bool = True,
) -> Enumeration:
    """Every kept combination of `model`, with the counts of the cut ones."""
    arch = catalog.model(model) if isinstance(model, str) else model
    if nmax < 1:
        raise InputError(f"nmax must be >= 1, got {nmax}")
    if not rho > 0:
        raise InputError(f"rho must be > 0, got {rho}")
    if min_kv_tokens < 0:
        raise InputError(f"min_kv_tokens must be >= 0, got {min_kv_tokens}")

    excluded: dict[str, str] = {}
    names = list(catalog.node_types) if node_types is None else list(dict.fromkeys(node_types))
    for name in names:
        catalog.node_type(name)  # unknown names raise with suggestions
    region_set: set[str] | None = None
    if regions is not None:
        region_set = set(regions)
        for r in region_set:
            catalog.region(r)
        kept = []
        for name in names:
            if any(p.region in region_set for p in catalog.node_type(name).prices):
                kept.append(name)
            else:
                excluded[name] = "not priced in any of the given regions"
        names = kept
    if require_common_region:
        kept = []
        for name in names:
            if catalog.node_type(name).prices:
                kept.append(name)
            else:
                excluded[name] = "priced in no region"
        names = kept

    mem = {n: catalog.node_memory_bytes(n) for n in names}
    names.sort(key=lambda n: (mem[n], n))
    price_regions = {
        n: frozenset(
            p.region for p in catalog.node_type(n).prices
            if region_set is None or p.region in region_set
        )
        for n in names
    }
    need = float(arch.weight_bytes) + min_kv_tokens * arch.num_layers * float(
        arch.kv_bytes_per_token_per_layer
    )
    high = rho * float(arch.weight_bytes)
    usable_factor = 1.0 - memory_reserve
    T = len(names)

    total = sum(multisets_count(T, s) for s in range(1, nmax + 1))
    kept_combos: list[Combo] = []
    within_high = 0
    low = no_region = 0
    mems = [mem[n] for n in names]

    # depth-first over non-decreasing indices (the order of combinations_with_replacement)
    stack: list[int] = []

    def visit(start: int, mem_sum: float, common: frozenset[str] | None) -> None:
        nonlocal within_high, low, no_region
        for i in range(start, T):
            m = mem_sum + mems[i]
            if m > high * (1 + 1e-12):
                break  # every later node type has at least as much memory
            stack.append(i)
            within_high += 1
            regions_here = price_regions[names[i]] if common is None else common & price_regions[names[i]]
            if m * usable_factor < need:
                low += 1
            elif require_common_region and not regions_here:
                no_region += 1
            else:
                kept_combos.append(tuple(names[j] for j in stack))
            if len(stack) < nmax:
                visit(i, m, regions_here if require_common_region else None)
            stack.pop()

    visit(0, 0.0, None)
    combos = sorted((tuple(sorted(c)) for c in kept_combos), key=lambda c: (len(c), c))
    return Enumeration(
        combos=tuple(combos),
        node_types=tuple(names),
        total=total,
        pruned_memory_low=low,
        pruned_memory_high=total - within_high,
        pruned_no_region=no_region,
        excluded_node_types=excluded,
    )


def sub_combos(combo: Sequence[str]) -> list[Combo]:
    """The distinct multisets obtained by removing one node from `combo`."""
    out: list[Combo] = []
    seen: set[str] = set()
    for i, name in enumerate(combo):
        if name in seen:
            continue
        seen.add(name)
        out.append(tuple(combo[:i]) + tuple(combo[i + 1:]))
    return out
