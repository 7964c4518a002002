"""The step-model pipeline search against brute force over the step model itself.

The oracle builds every pipeline over all nodes of a small combination — every ordered
grouping into stages of one node type, every layer split, every node batch of the grid per
stage — and judges each with `coral.perf.step.StepModel.step_cost`, the function the
simulator steps: its KV room, TPOT, TTFT and rate at full occupancy. The search must find
the same best rate, and a library's templates must rate exactly as `template_saturation`
rates them (what the planner plans and the simulator runs are one figure).
"""

from __future__ import annotations

import itertools
import math

import pytest

from coral.catalog.loader import load_catalog
from coral.perf.pipeline import PipelineShape, StageShape
from coral.perf.step import DEFAULT_MAX_BATCHED_TOKENS, build_step_model, stages_from_shape
from coral.perf.step import template_saturation
from coral.templates.builder.build import build_library
from coral.templates.builder.solve import build_template
from coral.templates.space.operating_points import prefill_chunks, shared_tables
from coral.templates.builder.parallel import default_perf_factory
from coral.templates.step.bound import work_bound
from coral.templates.slo import SloSpec

GRID = (4, 16, 64)


@pytest.fixture(scope="module")
def real():
    cat = load_catalog()
    return cat, default_perf_factory(cat)


def _groupings(combo, max_group=None):
    """Ordered sequences of (node type, count) using every node, one type per stage."""
    counts = {x: combo.count(x) for x in sorted(set(combo))}

    def rec(left):
        if not any(left.values()):
            yield ()
            return
        for x, c in left.items():
            for j in range(1, min(c, max_group or c) + 1):
                nxt = dict(left)
                nxt[x] = c - j
                for rest in rec(nxt):
                    yield ((x, j),) + rest

    yield from rec(counts)


def _splits(L, S):
    for cuts in itertools.combinations(range(1, L), S - 1):
        bounds = (0, *cuts, L)
        yield [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(S)]


def _judge(model, mode, shape, slo, perf, cat):
    """(rate in the template's unit, feasible) of one instance of `shape`, busy."""
    try:
        sm = build_step_model(model, stages_from_shape(shape), perf, cat)
    except ValueError:
        return 0.0
    S = sm.n_stages
    B = min(st.batch * st.count for st in shape.stages)
    I, O = slo.input_tokens, slo.output_tokens
    if mode == "prefill":
        if B < I or sm.kv_cap < S * B:
            return 0.0
        dt = sm.step_cost(S * B, 0, 0, min(S, -(-S * B // I)))[0]
        return S * B / dt if dt <= slo.ttft_s * (1 + 1e-9) else 0.0
    if sm.kv_cap < S * B * (I + O):
        return 0.0
    b = S * B
    ctx = int(b * (I + O / 2))
    if mode == "decode":
        dt = sm.step_cost(0, b, ctx, S)[0]
        return b / dt if dt <= slo.tpot_s * (1 + 1e-9) else 0.0
    per_step = b / O
    k = math.floor(per_step)
    f = per_step - k
    lo = sm.step_cost(k * I, b, ctx, S)[0]
    hi = sm.step_cost((k + 1) * I, b, ctx, S)[0]
    dt = (1 - f) * lo + f * hi
    if dt > slo.tpot_s * (1 + 1e-9) or hi > slo.ttft_s * (1 + 1e-9):
        return 0.0
    return min(b / (O * dt), DEFAULT_MAX_BATCHED_TOKENS / ((I + O) * dt))


def _oracle(model, combo, mode, slo, perf, cat, grid, max_group=None):
    L = cat.model(model).num_layers
    best = 0.0
    for groups in _groupings(list(combo), max_group):
        S = len(groups)
        for split in _splits(L, S):
            for batches in itertools.product(grid, repeat=S):
                shape = PipelineShape(tuple(
                    StageShape(x, j, first, k, b, cat.node_type(x).gpu_count)
                    for (x, j), (first, k), b in zip(groups, split, batches)))
                best = max(best, _judge(model, mode, shape, slo, perf, cat))
    return best


CASES = [
    ("llama-3.1-8b", ("1x-l4", "1x-a10g"), "aggregated", 0.06, 1.0, 512, 128),
    ("llama-3.1-8b", ("1x-l4", "1x-l4", "1x-a10g"), "aggregated", 0.08, 2.0, 1024, 256),
    ("llama-3.1-8b", ("1x-a10g", "1x-t4", "1x-t4"), "decode", 0.1, 2.0, 1024, 256),
    ("llama-3.1-8b", ("1x-l4", "1x-t4"), "decode", 0.08, 2.0, 2048, 512),
    ("llama-3.1-8b", ("1x-l4", "1x-a10g", "1x-a10g"), "prefill", 0.1, 1.5, 1024, 256),
    ("qwen3-14b", ("1x-l40s", "1x-l4"), "aggregated", 0.1, 2.0, 1024, 256),
]


@pytest.mark.parametrize("engine", ["coral", "vllm"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[2]}-{len(c[1])}" for c in CASES])
def test_search_matches_brute_force_over_the_step_model(real, case, engine):
    """Coral's stages of any size, and vLLM's of one node (so one batch on every node)."""
    cat, perf = real
    model, combo, mode, tpot, ttft, I, O = case
    slo = SloSpec(tpot_s=tpot, ttft_s=ttft, input_tokens=I, output_tokens=O)
    grid = prefill_chunks(slo) if mode == "prefill" else GRID
    one = engine == "vllm"
    want = _oracle(model, combo, mode, slo, perf, cat, grid, max_group=1 if one else None)
    if one and mode == "decode" and len(combo) > 1:
        want = 0.0  # vLLM's KV connector runs no decode-side pipeline
    tables = shared_tables(perf, cat, GRID)
    tpl = build_template(model, combo, slo, mode, "chain" if one else "flow", perf, cat,
                         tables=tables, floor=0.0, engine=engine)
    if one and want > 0:
        assert tpl.shape.is_chain and len({s.batch for s in tpl.shape.stages}) == 1
    assert tpl.throughput == pytest.approx(want, rel=1e-9, abs=1e-12)
    if want > 0:
        # the template's own shape, judged by the oracle, is what the search says
        assert _judge(model, mode, tpl.shape, slo, perf, cat) == pytest.approx(tpl.throughput,
                                                                              rel=1e-9)
        bound = work_bound(perf, cat, cat.model(model), combo, slo, mode, batches=GRID)
        assert bound >= tpl.throughput * (1 - 1e-12)


def test_a_library_rates_as_the_simulator_runs(real):
    """Every kept template's rate and TPOT are `template_saturation`'s, and within the SLO."""
    cat, perf = real
    slo = SloSpec(tpot_s=0.1, ttft_s=2.0, input_tokens=1024, output_tokens=256)
    for mode in ("aggregated", "decode", "prefill"):
        lib, _ = build_library("llama-3.1-8b", cat, perf=perf, slo=slo, mode=mode, nmax=2,
                               node_types=["1x-l4", "1x-a10g", "1x-l40s"])
        kept = [t for t in lib if t.feasible]
        assert kept
        for tpl in kept:
            sat = template_saturation(tpl, perf=perf, catalog=cat)
            assert sat is not None
            assert sat.rps == pytest.approx(tpl.throughput_rps, rel=1e-9)
            if mode != "prefill":
                assert sat.step_s == pytest.approx(tpl.tpot_s, rel=1e-9)
                assert sat.step_s <= slo.tpot_s * (1 + 1e-9)
            else:
                assert sat.step_s <= slo.ttft_s * (1 + 1e-9)


def test_pairs_are_ordered_by_the_rows_own_figures(real):
    """`StepRows.row_at` (what orders a combination's (S, B) pairs without building their
    rows) gives exactly the built row's entry, None where the row is None."""
    from coral.templates.step.rows import StepRows, node_cost_memo

    cat, perf = real
    arch = cat.model("llama-3.1-8b")
    slo = SloSpec(tpot_s=0.08, ttft_s=1.5, input_tokens=1024, output_tokens=256)
    memo = node_cost_memo(perf, cat, arch.name)
    checked = 0
    for mode in ("aggregated", "decode", "prefill"):
        grid = prefill_chunks(slo) if mode == "prefill" else GRID
        heads = StepRows(memo, arch.num_layers, slo, mode, max(grid))
        rows = StepRows(memo, arch.num_layers, slo, mode, max(grid))
        for name in ("1x-l4", "1x-t4", "4x-a10g"):
            for j in (1, 2, 3):
                for role in range(4):
                    for S in (1, 2, 3):
                        for B in sorted({j * b for b in grid}):
                            if mode == "prefill" and B < slo.input_tokens:
                                continue
                            k = -(-arch.num_layers // S) - 1
                            row = rows.row(name, j, role, S, B)
                            want = None if row is None else (float(row.a[k]), float(row.c[k]))
                            assert heads.row_at(name, j, role, S, B, k) == want
                            checked += want is not None
    assert checked > 100
