"""Helix's whole-cluster placement (`coral.baselines.helix_cluster`): a real placement, its
proven gap, and the same optimum as the per-node DAG solver where that one is exact."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coral.baselines.helix import no_slo, path_share
from coral.baselines.helix_bound import excluded, layer_cover_bound
from coral.baselines.helix_cluster import (
    cluster_placement,
    coverage_bound,
    pipelines,
    solve_cluster,
    _candidates,
)
from coral.catalog import default_catalog
from coral.evaluation.paper_sections import claim_helix
from coral.evaluation.paper_studies import HelixStudy
from coral.perf.model import PerfModel
from coral.templates.placement.exhaustive import exhaustive_placement
from coral.templates.placement.prep import prepare
from coral.templates.placement.verify import verify_placement
from coral.templates.slo import default_slo
from coral.templates.space.operating_points import shared_tables
from coral.templates.types import (
    SINK,
    SOURCE,
    NodeSpec,
    OperatingPoint,
    PlacementProblem,
    SolveStatus,
)

MODEL = "llama-3.1-8b"


@pytest.fixture(scope="module")
def parts():
    catalog = default_catalog()
    perf = PerfModel(catalog)
    return catalog, perf, shared_tables(perf, catalog)


def _problem(parts, nodes):
    catalog, _, tables = parts
    slo = no_slo(default_slo(catalog.model(MODEL)))
    return tables.problem(catalog.model(MODEL), tuple(sorted(nodes)), slo, "aggregated", "dag")


def test_time_limited_placement_is_real_and_states_its_gap(parts):
    # too short a limit to close the gap: the answer is the incumbent, checked from scratch
    nodes = ["1x-t4"] * 6 + ["1x-l4"] * 3
    problem = _problem(parts, nodes)
    placement, entries, bound, stats = solve_cluster(problem, time_limit_s=0.5)
    assert verify_placement(problem, placement) == []
    assert placement.throughput > 0 and placement.throughput >= stats["warm_start"] - 1e-9
    assert bound >= placement.throughput * (1 - 1e-9)
    if placement.status is SolveStatus.OPTIMAL:
        assert placement.gap == 0.0
    else:
        assert placement.gap == pytest.approx((bound - placement.throughput) / bound)
    assert sum(e.count for e in entries) <= len(nodes)
    assert stats["integers"] > 0 and stats["rows"] > 0


def _tiny(seed: int) -> PlacementProblem:
    """A random problem the brute-force oracle solves at once: 2-4 nodes of 1-2 types, 2-6
    layers, no latency bound, NICs that never bind (the boundary MILP bounds a node's whole
    inflow by its NIC, the oracle each edge)."""
    rng = np.random.default_rng(seed)
    L = int(rng.integers(2, 7))
    specs = []
    for t in range(int(rng.integers(1, 3))):
        c0, fixed, kv = rng.uniform(0.5, 2.0), rng.uniform(0.1, 2.0), rng.uniform(0.01, 0.2)
        opts = tuple(
            OperatingPoint(layers=k, batch=b, is_last=last, step_s=k * c0 + fixed,
                           prefill_s=k * c0, capacity=b / (k * c0 + fixed),
                           mem_bytes=k * (1.0 + b * kv))
            for k in range(1, L + 1) for b in (1, 4, 16) for last in (False, True)
            if last or k < L)
        specs.append(NodeSpec(f"t{t}", L * rng.uniform(0.3, 1.6), 1e12, opts))
    nodes = tuple(specs[int(rng.integers(len(specs)))] for _ in range(int(rng.integers(2, 5))))
    nodes = tuple(sorted(nodes, key=lambda n: n.node_type))
    return PlacementProblem(num_layers=L, nodes=nodes, tpot_s=None, ttft_s=None,
                            first_stage_extra_bytes=float(rng.uniform(0.0, 2.0)),
                            edge_bytes_per_unit=1.0, topology="dag")


@pytest.mark.parametrize("seed", range(12))
def test_aggregated_milp_matches_the_brute_force_dag_optimum(seed):
    problem = _tiny(seed)
    want = exhaustive_placement(problem)
    if want.status is SolveStatus.INFEASIBLE:
        with pytest.raises(ValueError):
            solve_cluster(problem, time_limit_s=10)
        return
    got, entries, bound, stats = solve_cluster(problem, time_limit_s=10)
    assert stats["layer_cover_bound"] >= want.throughput * (1 - 1e-9)
    assert verify_placement(problem, got) == []
    assert got.status is SolveStatus.OPTIMAL and got.gap == 0.0
    assert got.throughput == pytest.approx(want.throughput, rel=1e-6, abs=1e-12)
    assert bound == pytest.approx(got.throughput, rel=1e-6, abs=1e-12)


def test_layer_cover_bound_counts_whole_items_per_layer():
    # 3 nodes, 2 layers; a node holds 1 layer at 1.0 req/s or 2 at 0.4. Best: two one-layer
    # nodes in a pipeline beside a two-layer one, 1.4 req/s; counting fractions of a layer
    # (the coverage bound) allows 1.5
    items = [(0, 1, 1.0), (0, 2, 0.4)]
    assert excluded(1.45, 2, [3], items, math.inf) is True
    assert excluded(1.4, 2, [3], items, math.inf) is False
    got = layer_cover_bound(2, [3], items, 0.0, 1.5, deadline=math.inf)
    assert 1.4 <= got <= 1.4 * (1 + 2e-3)
    # out of time: the bound handed in stands
    assert layer_cover_bound(2, [3], items, 0.0, 1.5, deadline=0.0) == 1.5


def test_latency_that_may_bind_is_refused(parts):
    catalog, _, tables = parts
    tight = default_slo(catalog.model(MODEL))
    with pytest.raises(ValueError, match="does not model path latency"):
        cluster_placement(MODEL, ["1x-t4"] * 4, tight, catalog=catalog, tables=tables,
                          time_limit_s=5)


def test_path_share_skips_enumeration_at_the_extremes():
    # two paths, 0.08 s and 0.25 s of step time, one unit each
    step, pre = [0.03, 0.2, 0.05], [0.1, 0.1, 0.1]
    edges = [(SOURCE, 0, 1.0), (SOURCE, 1, 1.0), (0, 2, 1.0), (1, 2, 1.0), (2, SINK, 2.0)]
    share = lambda tpot: path_share(step, pre, edges, 2.0, tpot_s=tpot, ttft_s=None, what="t")
    assert share(0.1) == pytest.approx(0.5)
    assert share(0.3) == 1.0 and share(0.05) == 0.0
    assert path_share(step, pre, [], 2.0, tpot_s=1.0, ttft_s=None, what="t") == 0.0


def _study(helix):
    return HelixStudy(cluster_usd_per_hour=100.0, cluster_nodes=64, helix=helix,
                      helix_cluster_note="the whole cluster (64 nodes)",
                      coral_cost_usd_per_hour=50.0, coral_nodes={"1x-t4": 10},
                      coral_sim={}, coral_max_rps=7.5, coral_max_sim={}, coral_max_cost=80.0,
                      output_tokens=211.0, demand_rps=4.0, sim_s=240.0, seconds=1.0)


def test_claim_helix_fills_the_throughput_row_and_states_the_gap(tmp_path):
    helix = {"ok": True, "seconds": 12.0, "no_slo": 6.0, "under_slo": 0.0, "share": 0.0,
             "status": "time_limit", "gap": 0.25, "bound": 8.0, "warm_start": 6.0,
             "milp": "10 columns (5 integer), 4 rows", "nodes_used": 60}
    claim = claim_helix(_study(helix), tmp_path)
    row = claim.rows[1]
    assert row.ours == pytest.approx(7.5 / 6.0 - 1)
    assert "gap 25.0%" in row.note and "-6%" in row.note
    text = "\n".join(claim.body)
    assert "no placement exceeds 8.00 req/s" in text and "on 60 nodes" in text
    missing = claim_helix(_study(None), tmp_path)
    assert math.isnan(missing.rows[1].ours)
    assert missing.rows[1].note == "Helix's placement did not finish"
