"""A true upper bound on the step-model rate of any pipeline over every node of a
combination (`placement_step`), for a library's cut before searching."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Sequence

from coral.catalog.loader import Catalog
from coral.catalog.schema import ModelArch
from coral.templates.space.operating_points import DEFAULT_BATCHES, prefill_chunks
from coral.templates.step.rows import node_cost_memo
from coral.templates.slo import SloSpec
from coral.templates.types import Mode


def node_batches(batches: Sequence[int], n: int) -> list[int]:
    """Every batch a node of an `n`-node pipeline may run: `ceil(j' b / j)` for group sizes
    `j, j' <= n` and `b` in the grid, up to the grid's largest."""
    return list(_node_batches(tuple(batches), n))


@lru_cache(maxsize=256)
def _node_batches(batches: tuple[int, ...], n: int) -> tuple[int, ...]:
    top = max(batches)
    return tuple(sorted(b2 for b2 in {-(-jp * b // j) for b in batches for j in range(1, n + 1)
                                      for jp in range(1, n + 1)} if 1 <= b2 <= top))


def work_bound(perf: Any, catalog: Catalog, arch: ModelArch, combo: Sequence[str],
               slo: SloSpec, mode: Mode, *, batches: Sequence[int] = DEFAULT_BATCHES) -> float:
    """A true upper bound on the step-model rate of any pipeline over every node of `combo`.

    A stage of `j` nodes on `l` layers delays every step by at least one node's iteration at
    `b = ceil(B / j)` sequences without prompts, first-stage or last-stage extras, and with the
    least context `b` sequences can have (`(b - 1) (I + O / 2)`; the micro-batch holds more
    than `j (b - 1)`), where `l` layers fit the KV cache of more than `b - 1` sequences and
    meet the SLO. So `rate <= B u / it(l, b) <= j b u / it(l, b)` and `rate l <= j kappa`,
    `kappa = max over (b, l) of b u l / it(l, b)`; summing over the stages, `rate L <= sum over
    nodes of kappa` (`b` over `node_batches`, `l` up to the most that fit and meet the SLO).

    And every node type holds at least one stage of at most its `n_t` nodes on at least one
    layer, so `rate <= n_t max_b (b u / it(1, b))` for each type: a slow type caps the whole
    pipeline (what cuts most mixed combinations before they are searched)."""
    memo = node_cost_memo(perf, catalog, arch.name)
    iteration, kv_tokens = memo["fns"][0], memo["fns"][1]
    grid = sorted(prefill_chunks(slo) if mode == "prefill" else batches)
    unit = 1.0 / slo.output_tokens if mode == "aggregated" else 1.0
    I, O = slo.input_tokens, slo.output_tokens
    limit = slo.ttft_s if mode == "prefill" else slo.tpot_s
    L = arch.num_layers
    total = 0.0
    stage_cap = math.inf
    for name in combo:
        key = (slo, mode, len(combo), tuple(grid), name)
        best, one = memo["bounds"].get(key, (None, None))
        if best is None:
            cands = node_batches(grid, len(combo))
            best = one = 0.0
            for b in cands:
                if mode == "prefill":
                    args, need = (b, 0, 0), b - 1
                else:
                    ctx = max(b, int((b - 1) * (I + O / 2)) - 1)
                    args, need = (0, b, ctx), (b - 1) * (I + O)

                def it(layers: int) -> float:
                    return iteration(name, layers, *args, False, False)

                def fits(layers: int) -> bool:
                    return kv_tokens(name, layers, False, False) > need and it(layers) <= limit

                if not fits(1):
                    continue
                one = max(one, b * unit / it(1))
                lo, hi = 1, L  # the most layers that fit (both tests grow with the layers)
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
                t1, t2, tl = it(1), it(2) if lo > 1 else it(1), it(lo)
                if lo > 1 and abs(tl - (t1 + (lo - 1) * (t2 - t1))) > 1e-9 * tl:
                    # not affine in the layers: every count is tried
                    ratio = max(x / it(x) for x in range(1, lo + 1))
                else:  # affine with a positive rest: l / it(l) grows with l
                    ratio = lo / tl
                best = max(best, b * unit * ratio)
            memo["bounds"][key] = (best, one)
        total += best
        stage_cap = min(stage_cap, combo.count(name) * one)
    return min(total / L, stage_cap)
