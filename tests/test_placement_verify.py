"""`verify_placement` accepts valid placements and names every kind of violation."""

from __future__ import annotations

import dataclasses

import pytest

from coral.templates.placement.exact import solve_placement
from coral.templates.types import (
    SINK,
    SOURCE,
    NodePlacement,
    NodeSpec,
    OperatingPoint,
    Placement,
    PlacementProblem,
    SolveStatus,
)
from coral.templates.placement.verify import verify_placement


def _node(name="n", L=4, mem=2.5, nic=10.0, c=1.0, fixed=0.5, pre=1.0) -> NodeSpec:
    opts = []
    for k in range(1, L + 1):
        for b in (2, 4):
            for last in (False, True):
                if not last and k == L:
                    continue
                t = k * c + fixed + 0.1 * b
                opts.append(OperatingPoint(layers=k, batch=b, is_last=last, step_s=t,
                                           prefill_s=k * pre, capacity=b / t, mem_bytes=float(k)))
    return NodeSpec(node_type=name, mem_bytes=mem, nic_bytes_per_s=nic, options=tuple(opts))


def _problem(n=2, topology="flow", **kw) -> PlacementProblem:
    args = dict(num_layers=4, nodes=tuple(_node() for _ in range(n)), tpot_s=10.0, ttft_s=10.0,
                first_stage_extra_bytes=0.0, edge_bytes_per_unit=1.0, topology=topology)
    args.update(kw)
    return PlacementProblem(**args)


def _np(spec: NodeSpec, first: int, k: int, b: int) -> NodePlacement:
    op = next(o for o in spec.options if o.layers == k and o.batch == b
              and o.is_last == (first + k == 4))
    return NodePlacement(node_type=spec.node_type, first_layer=first, layers=k, batch=b,
                         tp_degree=0, capacity=op.capacity, step_s=op.step_s,
                         prefill_s=op.prefill_s, mem_bytes=op.mem_bytes)


@pytest.fixture
def pipeline():
    """Two nodes, [0,2) -> [2,4) at batch 4, carrying the bottleneck capacity."""
    p = _problem()
    a, b = _np(p.nodes[0], 0, 2, 4), _np(p.nodes[1], 2, 2, 4)
    thr = min(a.capacity, b.capacity)
    pl = Placement(throughput=thr, nodes=(a, b),
                   edges=((SOURCE, 0, thr), (0, 1, thr), (1, SINK, thr)),
                   status=SolveStatus.OPTIMAL, gap=0.0, solve_s=0.0)
    return p, pl


def _with(pl: Placement, **kw) -> Placement:
    return dataclasses.replace(pl, **kw)


def _has(errs: list[str], word: str) -> bool:
    return any(word in e for e in errs)


def test_valid_pipeline_passes(pipeline):
    p, pl = pipeline
    assert verify_placement(p, pl) == []
    assert verify_placement(dataclasses.replace(p, topology="chain"), pl) == []


def test_solver_output_passes():
    for topology in ("flow", "chain"):
        p = _problem(3, topology=topology)
        got = solve_placement(p)
        assert got.throughput > 0
        assert verify_placement(p, got) == []


def test_memory_overflow(pipeline):
    p, pl = pipeline
    assert _has(verify_placement(dataclasses.replace(p, first_stage_extra_bytes=1.0), pl),
                "bytes")


def test_range_outside_the_model(pipeline):
    p, pl = pipeline
    bad = dataclasses.replace(pl.nodes[1], first_layer=3)
    errs = verify_placement(p, _with(pl, nodes=(pl.nodes[0], bad)))
    assert _has(errs, "outside") and _has(errs, "ends at")


def test_unknown_operating_point(pipeline):
    p, pl = pipeline
    bad = dataclasses.replace(pl.nodes[0], capacity=pl.nodes[0].capacity * 2)
    assert _has(verify_placement(p, _with(pl, nodes=(bad, pl.nodes[1]))), "operating point")


def test_edge_between_non_adjacent_ranges(pipeline):
    p, pl = pipeline
    a = _np(p.nodes[0], 0, 1, 4)  # now ends at 1, node 1 starts at 2
    assert _has(verify_placement(p, _with(pl, nodes=(a, pl.nodes[1]))), "starts at")


def test_source_edge_to_a_later_stage(pipeline):
    p, pl = pipeline
    t = pl.throughput
    edges = ((SOURCE, 1, t), (1, SINK, t))
    errs = verify_placement(p, _with(pl, edges=edges))
    assert _has(errs, "source edge")


def test_conservation(pipeline):
    p, pl = pipeline
    t = pl.throughput
    edges = ((SOURCE, 0, t), (0, 1, t / 2), (1, SINK, t / 2))
    assert _has(verify_placement(p, _with(pl, edges=edges)), "outflow")


def test_capacity(pipeline):
    p, pl = pipeline
    t = pl.throughput * 1.5
    edges = ((SOURCE, 0, t), (0, 1, t), (1, SINK, t))
    errs = verify_placement(p, _with(pl, throughput=t, edges=edges))
    assert _has(errs, "exceeds capacity")


def test_nic(pipeline):
    p, pl = pipeline
    slow = tuple(dataclasses.replace(n, nic_bytes_per_s=0.1) for n in p.nodes)
    assert _has(verify_placement(dataclasses.replace(p, nodes=slow), pl), "NIC")


def test_tpot_and_ttft(pipeline):
    p, pl = pipeline
    step = pl.nodes[0].step_s + pl.nodes[1].step_s
    errs = verify_placement(dataclasses.replace(p, tpot_s=step * 0.99), pl)
    assert _has(errs, "TPOT")
    errs = verify_placement(dataclasses.replace(p, ttft_s=3.9), pl)  # prefill takes 4 s
    assert _has(errs, "TTFT")
    # an edge without flow does not count as a path
    dead = ((SOURCE, 0, 0.0), (0, 1, 0.0), (1, SINK, 0.0))
    assert verify_placement(dataclasses.replace(p, tpot_s=step * 0.99),
                            _with(pl, throughput=0.0, edges=dead)) == []


def test_throughput_figure(pipeline):
    p, pl = pipeline
    assert _has(verify_placement(p, _with(pl, throughput=pl.throughput * 1.1)), "throughput")


def test_wrong_node_count(pipeline):
    p, pl = pipeline
    assert verify_placement(p, _with(pl, nodes=pl.nodes[:1]))


def test_optimal_with_gap(pipeline):
    p, pl = pipeline
    assert _has(verify_placement(p, _with(pl, gap=0.5)), "gap")
    assert verify_placement(p, _with(pl, gap=0.5, status=SolveStatus.TIME_LIMIT)) == []


def test_chain_must_be_one_path_through_every_node():
    p = _problem(3, topology="chain", nodes=(_node(), _node(), _node(mem=10.0)))
    a, b = _np(p.nodes[0], 0, 2, 4), _np(p.nodes[1], 2, 2, 4)
    c = _np(p.nodes[2], 0, 4, 2)  # a separate replica: fine for flow, not for a chain
    t1 = min(a.capacity, b.capacity)
    edges = ((SOURCE, 0, t1), (0, 1, t1), (1, SINK, t1), (SOURCE, 2, c.capacity),
             (2, SINK, c.capacity))
    pl = Placement(throughput=t1 + c.capacity, nodes=(a, b, c), edges=edges,
                   status=SolveStatus.OPTIMAL, gap=0.0, solve_s=0.0)
    assert verify_placement(dataclasses.replace(p, topology="flow"), pl) == []
    assert _has(verify_placement(p, pl), "chain")


def test_chain_throughput_is_the_bottleneck():
    p = _problem(2, topology="chain")
    a, b = _np(p.nodes[0], 0, 2, 4), _np(p.nodes[1], 2, 2, 2)
    low = min(a.capacity, b.capacity) / 2
    pl = Placement(throughput=low, nodes=(a, b),
                   edges=((SOURCE, 0, low), (0, 1, low), (1, SINK, low)),
                   status=SolveStatus.OPTIMAL, gap=0.0, solve_s=0.0)
    assert _has(verify_placement(p, pl), "bottleneck")


def test_infeasible_placement_carries_no_flow():
    p = _problem()
    ok = Placement(throughput=0.0, nodes=(), edges=(), status=SolveStatus.INFEASIBLE, gap=0.0,
                   solve_s=0.0)
    assert verify_placement(p, ok) == []
    assert verify_placement(p, _with(ok, throughput=1.0))
