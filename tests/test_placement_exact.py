"""The placement solvers against the brute-force oracle, and hand-made cases.

Random tiny problems (<= 4 nodes, <= 12 layers, 1-3 batch options, SLOs sometimes binding,
sometimes impossible) in both topologies, with and without TTFT: the front door, the
tightened MILP alone, the chain DP, the chain MILP and (on a subset) the naive MILP must all
reach the oracle's optimum, and every placement they return must pass `verify_placement`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from coral.templates.placement.exhaustive import exhaustive_placement
from coral.templates.placement.exact import solve_placement
from coral.templates.placement.path_lp import path_lp_bound
from coral.templates.placement.chain import best_replicas, solve_chain
from coral.templates.placement.ilp import solve_ilp
from coral.templates.placement.prep import flow_upper_bound, prepare
from coral.templates.types import (
    NodeSpec,
    OperatingPoint,
    Placement,
    PlacementProblem,
    SolveStatus,
)
from coral.templates.placement.verify import verify_placement

RTOL = 1e-6
N_RANDOM = 50


# ---- instances -------------------------------------------------------------------------------


def _node_type(rng: np.random.Generator, name: str, L: int) -> dict:
    return dict(name=name, c0=rng.uniform(0.5, 2.0), c1=rng.uniform(0.05, 0.5),
                fixed=rng.uniform(0.1, 2.0), comm=rng.uniform(0.0, 0.5), p1=rng.uniform(1, 5),
                kv=rng.uniform(0.01, 0.2), mem=L * rng.uniform(0.3, 1.6),
                nic=rng.uniform(0.5, 20.0))


def _spec(ty: dict, L: int, batches: list[int]) -> NodeSpec:
    """Per-layer times t = k (c0 + c1 b) + fixed (+ send when not last), capacity b / t,
    memory k (1 + b kv)."""
    opts = []
    for k in range(1, L + 1):
        for b in batches:
            for last in (False, True):
                if not last and k == L:
                    continue
                t = k * (ty["c0"] + ty["c1"] * b) + ty["fixed"] + (0.0 if last else ty["comm"])
                opts.append(OperatingPoint(
                    layers=k, batch=b, is_last=last, step_s=t,
                    prefill_s=k * ty["p1"] * (1 + 0.1 * b) + ty["fixed"], capacity=b / t,
                    mem_bytes=k * (1.0 + b * ty["kv"])))
    return NodeSpec(node_type=ty["name"], mem_bytes=ty["mem"], nic_bytes_per_s=ty["nic"],
                    options=tuple(opts))


def random_problem(seed: int) -> PlacementProblem:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5))
    L = int(rng.integers(2, 9 if n == 4 else 13))
    batches = sorted(int(b) for b in rng.choice([1, 2, 4, 8, 16], size=int(rng.integers(1, 4)),
                                                replace=False))
    types = [_node_type(rng, f"t{t}", L) for t in range(int(rng.integers(1, 3)))]
    specs = {ty["name"]: _spec(ty, L, batches) for ty in types}
    names = sorted(types[int(rng.integers(len(types)))]["name"] for _ in range(n))
    fastest = min(L * (ty["c0"] + ty["c1"] * batches[0]) + ty["fixed"] for ty in types)
    fastest_pre = min(L * ty["p1"] * (1 + 0.1 * batches[0]) + ty["fixed"] for ty in types)
    use_tpot, use_ttft = seed % 5 != 4, seed % 2 == 0
    return PlacementProblem(
        num_layers=L, nodes=tuple(specs[n_] for n_ in names),
        tpot_s=fastest * rng.uniform(0.3, 2.5) if use_tpot else None,
        ttft_s=fastest_pre * rng.uniform(0.4, 2.5) if use_ttft else None,
        first_stage_extra_bytes=rng.uniform(0.0, 2.0),
        edge_bytes_per_unit=rng.uniform(0.5, 2.0))


_ORACLE: dict[tuple[int, str], Placement] = {}


def oracle(seed: int, topology: str) -> tuple[PlacementProblem, Placement]:
    problem = dataclasses.replace(random_problem(seed), topology=topology)
    if (seed, topology) not in _ORACLE:
        _ORACLE[seed, topology] = exhaustive_placement(problem)
    return problem, _ORACLE[seed, topology]


def assert_matches(problem: PlacementProblem, got: Placement, want: Placement, what: str) -> None:
    errs = verify_placement(problem, got)
    assert not errs, f"{what}: invalid placement: {errs}"
    assert got.status is want.status, f"{what}: {got.status} vs oracle {want.status}"
    assert got.throughput == pytest.approx(want.throughput, rel=RTOL, abs=1e-12), what


# ---- (a) random instances against the oracle -----------------------------------------------


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_flow_matches_oracle(seed):
    """The staged DP against brute force over replicas of data-parallel stages."""
    problem, want = oracle(seed, "flow")
    assert not verify_placement(problem, want)
    assert_matches(problem, solve_placement(problem), want, "staged DP")


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_dag_matches_oracle(seed):
    problem, want = oracle(seed, "dag")
    assert not verify_placement(problem, want)
    assert_matches(problem, solve_placement(problem), want, "front door")
    assert_matches(problem, solve_ilp(problem), want, "tightened MILP alone")


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_flow_is_a_restriction_of_dag(seed):
    """Every staged placement is a DAG placement: the DAG optimum is never lower."""
    _, staged = oracle(seed, "flow")
    _, dag = oracle(seed, "dag")
    assert staged.throughput <= dag.throughput * (1 + RTOL) + 1e-12


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_chain_matches_oracle(seed):
    problem, want = oracle(seed, "chain")
    assert not verify_placement(problem, want)
    assert_matches(problem, solve_chain(problem), want, "chain DP")
    assert_matches(problem, solve_placement(problem), want, "front door")
    assert_matches(problem, solve_placement(problem, method="ilp"), want, "chain MILP")


@pytest.mark.parametrize("seed", range(0, N_RANDOM, 5))
@pytest.mark.parametrize("topology", ["dag", "chain"])
def test_naive_milp_matches_oracle(seed, topology):
    problem, want = oracle(seed, topology)
    got = solve_placement(problem, method="naive")
    assert got.method == "ilp-naive"
    assert_matches(problem, got, want, "naive MILP")


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_dag_bounds_bracket_the_optimum(seed):
    problem, want = oracle(seed, "dag")
    prep = prepare(problem)
    if prep.infeasible:
        assert want.status is SolveStatus.INFEASIBLE
        return
    low = best_replicas(prep).throughput
    high = min(flow_upper_bound(prep), path_lp_bound(prep, None))
    assert low <= want.throughput * (1 + RTOL) + 1e-12
    assert high >= want.throughput * (1 - RTOL) - 1e-12


def test_random_instances_cover_the_cases():
    """The random set exercises what it is meant to: binding SLOs, both topologies'
    infeasibility, pipelines and data parallelism."""
    seen = set()
    for seed in range(N_RANDOM):
        p, flow = oracle(seed, "flow")
        _, chain = oracle(seed, "chain")
        seen.add(("ttft", p.ttft_s is not None))
        seen.add(("tpot", p.tpot_s is not None))
        seen.add(("chain infeasible", chain.status is SolveStatus.INFEASIBLE))
        seen.add(("flow zero", flow.status is SolveStatus.OPTIMAL and flow.throughput == 0))
        if flow.throughput > 0:
            starts = [flow.nodes[v].first_layer for u, v, f in flow.edges if u >= 0 and v >= 0]
            seen.add(("pipeline", bool(starts)))
            seen.add(("data parallel", sum(1 for u, v, f in flow.edges if u == -1) > 1))
    for case in ("ttft", "tpot", "chain infeasible", "flow zero", "pipeline", "data parallel"):
        assert (case, True) in seen, case
    assert ("ttft", False) in seen and ("tpot", False) in seen


# ---- (c) symmetry breaking keeps the optimum -----------------------------------------------


@pytest.mark.parametrize("seed", [s for s in range(N_RANDOM) if s % 3 == 0])
def test_symmetry_breaking_keeps_the_optimum(seed):
    problem, want = oracle(seed, "flow")
    prep = prepare(problem)
    if prep.infeasible or all(len(g) < 2 for g in prep.groups):
        pytest.skip("no identical nodes")
    on = solve_ilp(problem, symmetry_breaking=True)
    off = solve_ilp(problem, symmetry_breaking=False)
    assert on.throughput == pytest.approx(off.throughput, rel=RTOL, abs=1e-12)
    assert on.throughput == pytest.approx(want.throughput, rel=RTOL, abs=1e-12)


def test_identical_nodes_occur_in_the_symmetry_set():
    ids = [s for s in range(N_RANDOM) if s % 3 == 0]
    assert sum(1 for s in ids
               if any(len(g) >= 2 for g in prepare(random_problem(s)).groups)) >= 5


# ---- (b) hand-made cases with a known optimum ------------------------------------------------


def _linear_node(name: str, L: int, mem: float, *, c: float = 1.0, fixed: float = 0.5,
                 batches=(4,), nic: float = 1e9, pre: float = 0.0) -> NodeSpec:
    """Step time k c + fixed, capacity b / step, memory k, prefill k pre."""
    opts = []
    for k in range(1, L + 1):
        for b in batches:
            for last in (False, True):
                if not last and k == L:
                    continue
                t = k * c + fixed
                opts.append(OperatingPoint(layers=k, batch=b, is_last=last, step_s=t,
                                           prefill_s=k * pre, capacity=b / t,
                                           mem_bytes=float(k)))
    return NodeSpec(node_type=name, mem_bytes=mem, nic_bytes_per_s=nic, options=tuple(opts))


def _problem(nodes, L, *, tpot=None, ttft=None, extra=0.0, topology="flow", edge_bytes=1.0):
    return PlacementProblem(num_layers=L, nodes=tuple(nodes), tpot_s=tpot, ttft_s=ttft,
                            first_stage_extra_bytes=extra, edge_bytes_per_unit=edge_bytes,
                            topology=topology)


ALL_METHODS = ("auto", "auto-dag", "ilp", "naive")


def solve(p: PlacementProblem, method: str) -> Placement:
    """`auto` on the problem as given; the MILPs (and `auto-dag`) on its DAG version when the
    problem is a flow problem (the MILP models the DAG; flow is its staged restriction)."""
    if method != "auto" and p.topology == "flow":
        p = dataclasses.replace(p, topology="dag")
    return solve_placement(p, method="auto" if method == "auto-dag" else method)


@pytest.mark.parametrize("topology", ["flow", "chain"])
@pytest.mark.parametrize("method", ALL_METHODS)
def test_memory_forces_a_two_stage_pipeline(topology, method):
    # each node holds at most 2 of the 4 layers: the only placement is [0,2) -> [2,4)
    node = _linear_node("half", 4, mem=2.5)
    p = _problem([node, node], 4, topology=topology)
    got = solve(p, method)
    assert not verify_placement(p, got)
    assert got.status is SolveStatus.OPTIMAL
    assert got.throughput == pytest.approx(4 / 2.5)  # min capacity of two 2-layer stages
    assert sorted((n.first_layer, n.layers) for n in got.nodes) == [(0, 2), (2, 2)]
    assert (0, 1, pytest.approx(got.throughput)) in got.edges or \
        (1, 0, pytest.approx(got.throughput)) in got.edges


@pytest.mark.parametrize("method", ALL_METHODS)
def test_whole_model_on_each_node_is_data_parallel(method):
    # with a fixed per-iteration cost, two full replicas (2 * 4/4.5) beat a pipeline (4/2.5)
    node = _linear_node("big", 4, mem=10)
    p = _problem([node, node], 4)
    got = solve(p, method)
    assert not verify_placement(p, got)
    assert got.status is SolveStatus.OPTIMAL
    assert got.throughput == pytest.approx(2 * 4 / 4.5)
    assert all((n.first_layer, n.layers) == (0, 4) for n in got.nodes)


@pytest.mark.parametrize("method", ALL_METHODS)
def test_nic_limits_a_pipeline(method):
    node = _linear_node("half", 4, mem=2.5, nic=0.5)
    p = _problem([node, node], 4, edge_bytes=1.0)
    got = solve(p, method)
    assert not verify_placement(p, got)
    assert got.throughput == pytest.approx(0.5)


@pytest.mark.parametrize("method", ALL_METHODS)
def test_tpot_forbids_the_pipeline(method):
    # the pipeline takes 2 * (2 + 0.5) = 5 s per token; a 4 s TPOT leaves no feasible path
    node = _linear_node("half", 4, mem=2.5)
    p = _problem([node, node], 4, tpot=4.0)
    got = solve(p, method)
    assert not verify_placement(p, got)
    assert got.status is SolveStatus.OPTIMAL and got.throughput == 0.0
    chain = solve(dataclasses.replace(p, topology="chain"), method)
    assert chain.status is SolveStatus.INFEASIBLE and chain.throughput == 0.0


@pytest.mark.parametrize("method", ALL_METHODS)
def test_tpot_leaves_the_single_node_option(method):
    # a small node must pipeline (5 s per token), a big one serves alone in 4.5 s
    p = _problem([_linear_node("half", 4, mem=2.5), _linear_node("big", 4, mem=10)], 4,
                 tpot=4.6)
    got = solve(p, method)
    assert not verify_placement(p, got)
    assert got.status is SolveStatus.OPTIMAL
    assert got.throughput == pytest.approx(4 / 4.5)
    assert got.path_step_s == pytest.approx(4.5)
    big = got.nodes[1]
    assert (big.first_layer, big.layers) == (0, 4)


@pytest.mark.parametrize("method", ALL_METHODS)
def test_ttft_binds_like_tpot(method):
    node = _linear_node("half", 4, mem=2.5, pre=1.0)
    p = _problem([node, node], 4, ttft=3.9)  # the pipeline's prefill takes 4 s
    got = solve(p, method)
    assert got.status is SolveStatus.OPTIMAL and got.throughput == 0.0
    p = _problem([node, node], 4, ttft=4.0)
    got = solve(p, method)
    assert got.throughput == pytest.approx(4 / 2.5)
    assert got.path_prefill_s == pytest.approx(4.0)


@pytest.mark.parametrize("topology", ["flow", "chain"])
@pytest.mark.parametrize("method", ALL_METHODS)
def test_memory_too_small_is_infeasible(topology, method):
    p = _problem([_linear_node("tiny", 4, mem=0.5), _linear_node("big", 4, mem=10)], 4,
                 topology=topology)
    got = solve(p, method)
    assert got.status is SolveStatus.INFEASIBLE
    assert got.throughput == 0.0 and not got.edges


@pytest.mark.parametrize("method", ALL_METHODS)
def test_first_stage_memory_is_charged(method):
    # the embedding does not fit next to 2 layers: the only way is [0,1) [1,3) [3,4)... but
    # with two nodes of 2 layers each no split works, so the chain is infeasible
    node = _linear_node("half", 4, mem=2.5)
    p = _problem([node, node], 4, extra=1.0, topology="chain")
    got = solve(p, method)
    assert got.status is SolveStatus.INFEASIBLE
    # three such nodes: [0,1) (1 + 1 extra), then [1,3) and [3,4)
    p = _problem([node, node, node], 4, extra=1.0, topology="chain")
    got = solve(p, method)
    assert not verify_placement(p, got)
    assert got.status is SolveStatus.OPTIMAL
    assert got.throughput == pytest.approx(4 / 2.5)
    assert sorted((n.first_layer, n.layers) for n in got.nodes)[0] == (0, 1)


@pytest.mark.parametrize("method", ALL_METHODS)
def test_idle_node_that_fits_nowhere_useful(method):
    # a node that only fits as a slow full replica beyond the TPOT stays idle (flow 0 through
    # it); the others still serve
    slow = _linear_node("slow", 4, mem=10, c=3.0)
    p = _problem([slow, _linear_node("big", 4, mem=10)], 4, tpot=4.6)
    got = solve(p, method)
    assert not verify_placement(p, got)
    assert got.throughput == pytest.approx(4 / 4.5)
    assert not any(u == 0 or v == 0 for u, v, f in got.edges if f > 0)


def test_time_limit_is_reported_honestly():
    """A MILP stopped by its time limit never claims optimality."""
    p = random_problem(13)
    got = solve_ilp(p, time_limit_s=1e-3)
    assert got.status in (SolveStatus.OPTIMAL, SolveStatus.TIME_LIMIT)
    if got.status is SolveStatus.TIME_LIMIT:
        assert got.gap > 0 or math.isinf(got.gap) or got.throughput == 0
    else:
        assert got.gap == 0


def test_three_stage_chain_with_both_slos():
    node = _linear_node("third", 6, mem=2.2, pre=0.5)
    p = _problem([node] * 3, 6, tpot=3 * 2.5, ttft=3.0, topology="chain")
    got = solve_placement(p)
    assert not verify_placement(p, got)
    assert got.throughput == pytest.approx(4 / 2.5)
    assert got.path_step_s == pytest.approx(7.5)
    assert got.path_prefill_s == pytest.approx(3.0)
