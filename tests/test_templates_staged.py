"""The multiset search for the best pipeline over every node (`placement_staged`) against the
ordered DP (`_ChainDP`) and brute force.

Random problems of up to 6 nodes of 1-3 types and up to 24 layers, in both topologies, with
every combination of bounded SLOs (TPOT only, TTFT only, both with prefill never the longer
one — one latency suffices —, both for real, none), NIC limits that sometimes bind, and
floors below, at and above the optimum. The search must give the ordered DP's throughput
(bit for bit: both take the same capacity products), a placement that passes
`verify_placement`, and on small problems the brute-force optimum. The random set is
checked to exercise each way the search can go (the multiset answer, the ordered DP when a
link may bind or both latencies bind, the one-stage pipeline, nothing above the floor).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import numpy as np
import pytest

from coral.templates import node_memo
from coral.templates import placement_staged as staged
from coral.templates.exhaustive import staged_pipeline
from coral.templates.placement import BELOW_FLOOR_NOTE, solve_placement
from coral.templates.placement_chain import best_chain
from coral.templates.placement_ilp import prepare, to_placement
from coral.templates.node_memo import pipeline_bound, prepare_unfiltered
from coral.templates.placement_staged import best_full_pipeline
from coral.templates.types import (
    NodeSpec,
    OperatingPoint,
    PlacementProblem,
    SolveStatus,
)
from coral.templates.verify import verify_placement

N_RANDOM = 120
N_SMALL = 40  # of which brute force is run on the small ones


def _node_type(rng: np.random.Generator, name: str, L: int, batches: list[int]) -> NodeSpec:
    """Per-layer times t = k (c0 + c1 b) + fixed (+ send when not last), capacity b / t,
    memory k (w + b kv) (+ head on the last stage)."""
    c0, c1 = rng.uniform(0.5, 2.0), rng.uniform(0.05, 0.5)
    fixed, send = rng.uniform(0.1, 0.6), rng.uniform(0.0, 0.5)
    p1 = rng.uniform(0.05, 3.0)
    w, kv, head = rng.uniform(0.5, 1.5), rng.uniform(0.01, 0.2), rng.uniform(0.0, 2.0)
    mem = L * rng.uniform(0.3, 1.6) + head + 3.0
    opts = []
    for k in range(1, L + 1):
        for b in batches:
            for last in (False, True):
                if not last and k == L:
                    continue
                t = k * (c0 + c1 * b) + fixed + (0.0 if last else send)
                opts.append(OperatingPoint(
                    layers=k, batch=b, is_last=last, step_s=t,
                    prefill_s=k * p1 * (1 + 0.1 * b) + fixed, capacity=b / t,
                    mem_bytes=k * (w + b * kv) + (head if last else 0.0)))
    return NodeSpec(node_type=name, mem_bytes=mem, nic_bytes_per_s=float(rng.uniform(0.3, 30.0)),
                    options=tuple(opts))


def random_problem(seed: int, *, small: bool = False) -> PlacementProblem:
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(1, 5 if small else 7))
    L = int(rng.integers(2, 9 if small else 25))
    batches = sorted(int(b) for b in rng.choice([1, 2, 4, 8, 16, 32],
                                                size=int(rng.integers(1, 4)), replace=False))
    types = [_node_type(rng, f"t{t}", L, batches) for t in range(int(rng.integers(1, 4)))]
    nodes = sorted((types[int(rng.integers(len(types)))] for _ in range(n)),
                   key=lambda s: s.node_type)
    # SLOs around the time the whole model takes on a typical node type
    whole = float(np.median([min(op.step_s for op in s.options if op.layers == L)
                            for s in types]))
    whole_pre = float(np.median([min(op.prefill_s for op in s.options if op.layers == L)
                                 for s in types]))
    case = seed % 5  # 0 TPOT, 1 TTFT, 2 both (prefill short), 3 both, 4 none
    tpot = whole * rng.uniform(1.0, 3.0) if case in (0, 2, 3) else None
    ttft = whole_pre * rng.uniform(1.0, 3.0) if case in (1, 3) else None
    if case == 2:
        ttft = 1e6  # bounded, but never binding: the search keeps one latency
    return PlacementProblem(
        num_layers=L, nodes=tuple(nodes), tpot_s=tpot, ttft_s=ttft,
        first_stage_extra_bytes=float(rng.uniform(0.0, 3.0)),
        edge_bytes_per_unit=float(rng.uniform(0.5, 2.0)))


def _route(monkeypatch) -> list[str]:
    """Record which way each `best_full_pipeline` call went."""
    seen: list[str] = []
    ordered = staged._ChainDP.best
    largest = staged.StagedPipelines.largest

    def ordered_best(self, at_least):
        seen.append("ordered")
        return ordered(self, at_least)

    def staged_largest(self, at_least):
        seen.append("multiset")
        return largest(self, at_least)

    monkeypatch.setattr(staged._ChainDP, "best", ordered_best)
    monkeypatch.setattr(staged.StagedPipelines, "largest", staged_largest)
    return seen


def _check(problem: PlacementProblem, prep, chain, groups: bool) -> None:
    placement = to_placement(prep, chain.assignment(), status=SolveStatus.OPTIMAL, gap=0.0,
                             solve_s=0.0, method="test", keep_empty_edges=not groups)
    errs = verify_placement(problem, placement)
    assert not errs, errs
    assert all(n.layers > 0 for n in placement.nodes)  # every node is a stage
    assert placement.throughput == pytest.approx(chain.throughput, rel=1e-9)


ROUTES: Counter = Counter()


@pytest.mark.parametrize("seed", range(N_RANDOM))
@pytest.mark.parametrize("topology", ["flow", "chain"])
def test_matches_the_ordered_dp(seed, topology, monkeypatch):
    problem = dataclasses.replace(random_problem(seed), topology=topology)
    groups = topology == "flow"
    prep = prepare_unfiltered(problem)
    if prep.infeasible or any(u is None for u in prep.usable):
        if not prep.infeasible:
            assert best_full_pipeline(prep, groups=groups) is None
        ROUTES["no pipeline at all"] += 1
        return
    want = best_chain(prep, require_all=True, groups=groups)
    route = _route(monkeypatch)
    got = best_full_pipeline(prep, groups=groups)
    assert (got is None) == (want is None)
    if want is None:
        ROUTES["none"] += 1
        return
    assert got.throughput == want.throughput
    _check(problem, prep, got, groups)
    # "multiset", "ordered" (both latencies bind), "multiset+ordered" (a link may bind)
    ROUTES["+".join(route)] += 1
    if len(got.stages) == 1:
        ROUTES["one stage"] += 1
    # floors: just below, at and just above the optimum, and far below
    best = want.throughput
    for floor, expect in ((best * (1 - 1e-9), best), (best, None), (best * 1.01, None),
                          (best * 0.5, best)):
        route.clear()
        got = best_full_pipeline(prep, groups=groups, at_least=floor)
        if expect is None:
            assert got is None
            ROUTES["nothing above the floor"] += 1
        else:
            assert got is not None and got.throughput == expect
        ref = best_chain(prep, require_all=True, groups=groups, at_least=floor)
        assert (ref is None) == (got is None)


def test_the_random_set_takes_every_route():
    """Runs after the parametrised cases above (file order)."""
    if sum(ROUTES.values()) < N_RANDOM:
        pytest.skip("run with the whole file")
    for route in ("multiset", "ordered", "multiset+ordered", "one stage",
                  "nothing above the floor", "none"):
        assert ROUTES[route] > 0, (route, dict(ROUTES))


@pytest.mark.parametrize("seed", range(N_SMALL))
def test_matches_brute_force(seed):
    problem = random_problem(seed, small=True)
    prep = prepare_unfiltered(problem)
    full = staged_pipeline(problem, tuple(range(len(problem.nodes))))
    want = full[0] if full is not None else 0.0
    if prep.infeasible:
        assert want == 0.0
        return
    got = best_full_pipeline(prep, groups=True)
    assert (got.throughput if got is not None else 0.0) == pytest.approx(want, rel=1e-9,
                                                                         abs=1e-12)


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_prepare_unfiltered_is_prepare(seed):
    problem = random_problem(seed)
    a, b = prepare(problem, path_filter=False), prepare_unfiltered(problem)
    assert (a.infeasible, a.idle, a.groups, a.stats) == (b.infeasible, b.idle, b.groups, b.stats)
    assert len(a.usable) == len(b.usable)
    for u, v in zip(a.usable, b.usable):
        assert (u is None) == (v is None)
        if u is not None:
            for f in dataclasses.fields(u):
                assert np.array_equal(getattr(u, f.name), getattr(v, f.name)), f.name


@pytest.mark.parametrize("seed", range(0, N_RANDOM, 3))
def test_pipeline_bound_is_a_bound(seed):
    problem = random_problem(seed)
    prep = prepare_unfiltered(problem)
    if prep.infeasible:
        return
    got = best_full_pipeline(prep, groups=True)
    assert (got.throughput if got is not None else 0.0) <= pipeline_bound(problem)


def test_pipeline_bound_groups_equal_specs():
    """Equal node specs that are distinct objects still form one group of identical nodes."""
    problem = random_problem(0)
    spec = problem.nodes[0]
    same = dataclasses.replace(problem, nodes=(spec, spec))
    twins = dataclasses.replace(problem, nodes=(spec, dataclasses.replace(spec)))
    assert pipeline_bound(twins) == pipeline_bound(same) > 0


def test_front_door_floor_uses_the_search():
    """`solve_placement(floor=...)` answers through the search, with the below-floor note."""
    for seed in range(40):
        problem = random_problem(seed)
        prep = prepare_unfiltered(problem)
        if prep.infeasible:
            continue
        ch = best_full_pipeline(prep, groups=True)
        if ch is None:
            continue
        got = solve_placement(problem, floor=ch.throughput * 0.999)
        assert got.throughput == pytest.approx(ch.throughput, rel=1e-12)
        above = solve_placement(problem, floor=ch.throughput)
        assert above.throughput == 0 and BELOW_FLOOR_NOTE in above.notes[0]
        return
    pytest.fail("no random problem with a pipeline")


def test_memo_is_keyed_by_identity_and_bounded():
    """Equal but distinct node specs get their own entries; the memo never grows past its
    bound."""
    problem = random_problem(3)
    spec = problem.nodes[0]
    twin = dataclasses.replace(spec)
    assert twin == spec and twin is not spec
    a = node_memo.node_memo(problem, spec)
    b = node_memo.node_memo(problem, twin)
    assert a is not b and a.spec is spec and b.spec is twin
    assert node_memo.node_memo(problem, spec) is a
    for _ in range(3):
        for seed in range(60):
            prepare_unfiltered(random_problem(seed))
    assert len(node_memo._NODE_MEMO) <= node_memo._NODE_MEMO_SIZE


def test_infinite_links_and_no_slo():
    """Without NIC limits or SLOs the search still finds the best pipeline."""
    base = random_problem(4)  # case 4: no SLO
    assert base.tpot_s is None and base.ttft_s is None
    problem = dataclasses.replace(base, edge_bytes_per_unit=0.0)
    prep = prepare_unfiltered(problem)
    if prep.infeasible or any(u is None for u in prep.usable):
        pytest.skip("no usable nodes")
    want = best_chain(prep, require_all=True, groups=True)
    got = best_full_pipeline(prep, groups=True)
    assert (want is None and got is None) or got.throughput == want.throughput
    assert math.isinf(staged.edge_limit(problem, 0, 0))


@pytest.mark.parametrize("seed", range(6))
def test_combinations_sharing_node_specs(seed):
    """Like a library: many combinations of the same few node specs (so the tables kept
    across searches are reused, at many floors) agree with the ordered DP."""
    base = random_problem(5 * seed + 3)  # TPOT only
    rng = np.random.default_rng(seed)
    specs = sorted({id(s): s for s in base.nodes}.values(), key=lambda s: s.node_type)
    staged._SHARED_TYPE_TABLES.clear()
    for _ in range(25):
        n = int(rng.integers(1, 6))
        nodes = tuple(sorted((specs[int(rng.integers(len(specs)))] for _ in range(n)),
                             key=lambda s: s.node_type))
        problem = dataclasses.replace(base, nodes=nodes)
        prep = prepare_unfiltered(problem)
        if prep.infeasible or any(u is None for u in prep.usable):
            continue
        want = best_chain(prep, require_all=True, groups=True)
        if want is None:
            assert best_full_pipeline(prep, groups=True) is None
            continue
        for floor in (-math.inf, want.throughput * 0.3, want.throughput * 0.9,
                      want.throughput * (1 - 1e-12), want.throughput):
            ref = best_chain(prep, require_all=True, groups=True, at_least=floor)
            got = best_full_pipeline(prep, groups=True, at_least=floor)
            assert (got is None) == (ref is None)
            if got is not None:
                assert got.throughput == ref.throughput
                _check(problem, prep, got, True)
    SHARED.append(len(staged._SHARED_TYPE_TABLES))


SHARED: list[int] = []


def test_sharing_was_exercised():
    """Runs after the cases above (file order): most of them went through shared tables."""
    if len(SHARED) < 6:
        pytest.skip("run with the whole file")
    assert sum(1 for n in SHARED if n > 0) >= 3, SHARED
