"""Library building: persistence, resume, rebuild on changed inputs, pruning, parallel runs."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from test_templates_support import (
    TINY_BATCHES,
    CountingSolver,
    reference_solve,
    tiny_catalog,
    tiny_slo,
)

from coral.perf.model import PerfModel
from coral.templates.builder.build import build_library, classify
from coral.templates.builder.build_options import BuildOptions
from coral.templates.builder.solve import Outcome, build_template
from coral.templates.template import Template
from coral.templates.types import upper_bound_of
from coral.templates.space.enumerate import sub_combos
from coral.templates.builder.store import MANIFEST, RECORDS, LibraryError, TemplateLibrary
from coral.templates.types import Placement, SolveStatus


@pytest.fixture()
def tiny(tmp_path):
    cat = tiny_catalog(tmp_path)
    return cat, PerfModel(cat)


def _build(cat, perf, out=None, solver=reference_solve, *, slo=None, node_types=None,
           bound_skip=True, workers=1, ray_address=None):
    options = BuildOptions(batches=TINY_BATCHES, solver=solver, bound_skip=bound_skip,
                           workers=workers, ray_address=ray_address)
    return build_library("tiny-4l", cat, slo=slo or tiny_slo(), nmax=2, node_types=node_types,
                         options=options, perf=perf, out=out)


def _sig(templates):
    return [(t.combo, round(t.throughput, 9), tuple((n.first_layer, n.layers, n.batch)
             for n in t.nodes)) for t in templates]


def test_template_fields(tiny):
    cat, perf = tiny
    slo = tiny_slo()
    tpl = build_template("tiny-4l", ["1x-s", "1x-b"], slo, "aggregated", "flow", perf, cat,
                         batches=TINY_BATCHES, solver=reference_solve)
    assert tpl.combo == ("1x-b", "1x-s") and tpl.status is SolveStatus.OPTIMAL
    assert tpl.throughput > 0 and tpl.unit == "req/s"
    assert tpl.throughput_tokens_per_s == pytest.approx(tpl.throughput * slo.output_tokens)
    assert 0 < tpl.tpot_s <= slo.tpot_s and 0 < tpl.ttft_s <= slo.ttft_s
    assert tpl.usd_per_hour == {"r1": 2.5}  # 1x-b is priced in r2 too, 1x-s is not
    first = [n for n in tpl.nodes if n.layers and n.first_layer == 0]
    assert first and all(n.mem_bytes <= cat.node_memory_bytes(n.node_type) for n in tpl.nodes)
    back = Template.from_dict(json.loads(json.dumps(tpl.to_dict())))
    assert back == tpl
    dec = build_template("tiny-4l", ["1x-b"], slo, "decode", "flow", perf, cat,
                         batches=TINY_BATCHES, solver=reference_solve)
    assert dec.unit == "output tokens/s" and dec.ttft_s is None
    assert dec.throughput_rps == pytest.approx(dec.throughput / slo.output_tokens)
    pre = build_template("tiny-4l", ["1x-b"], slo, "prefill", "flow", perf, cat,
                         batches=TINY_BATCHES, solver=reference_solve)
    assert pre.unit == "prompt tokens/s" and pre.tpot_s is None
    impossible = build_template("tiny-4l", ["1x-b"], slo.with_overrides(tpot_s=1e-4, ttft_s=1e-4),
                                "aggregated", "flow", perf, cat, batches=TINY_BATCHES,
                                solver=reference_solve)
    assert impossible.status is SolveStatus.INFEASIBLE and not impossible.feasible


def test_round_trip_and_reuse(tiny, tmp_path):
    cat, perf = tiny
    out = tmp_path / "lib"
    kept, report = _build(cat, perf, out)
    assert kept and report.solved > 0 and report.reused == 0
    lib = TemplateLibrary.open(out)
    assert lib.complete and lib.manifest["inputs"]["model"] == "tiny-4l"
    assert lib.manifest["inputs"]["catalog_hash"] == cat.content_hash()
    assert _sig(lib.templates()) == _sig(kept)
    assert [t.to_dict() for t in lib.templates()] == [t.to_dict() for t in kept]
    counts = lib.counts()
    assert sum(counts.values()) == report.enumeration["candidates"]
    # same inputs: nothing is solved again
    solver = CountingSolver()
    kept2, report2 = _build(cat, perf, out, solver=solver)
    assert solver.calls == [] and report2.reused == sum(counts.values())
    assert "reusing" in report2.message
    assert _sig(kept2) == _sig(kept)


def test_a_finished_library_is_read_back_without_operating_points(tiny, tmp_path,
                                                                    monkeypatch):
    """Reusing a finished library computes no operating point (nothing is solved, and the
    node types it excluded are on record): the same templates and the same report."""
    from coral.templates.space.operating_points import OperatingPointTables

    cat, perf = tiny
    out = tmp_path / "lib"
    kept, built = _build(cat, perf, out)

    def refuse(*args, **kwargs):
        raise AssertionError("operating points computed for a finished library")

    monkeypatch.setattr(OperatingPointTables, "useful_node_types", refuse)
    monkeypatch.setattr(OperatingPointTables, "node_spec", refuse)
    again, report = _build(cat, perf, out)
    assert _sig(again) == _sig(kept)
    assert report.enumeration == built.enumeration
    assert report.excluded_node_types == built.excluded_node_types
    assert report.outcomes == built.outcomes and report.reused == sum(built.outcomes.values())
    assert "reusing" in report.message


def test_changed_inputs_rebuild(tiny, tmp_path):
    cat, perf = tiny
    out = tmp_path / "lib"
    _build(cat, perf, out)
    solver = CountingSolver()
    _, report = _build(cat, perf, out, solver=solver, slo=tiny_slo().with_overrides(tpot_s=0.3))
    assert "slo" in report.message and "moved it to" in report.message
    assert solver.calls and report.reused == 0
    stale = [p for p in tmp_path.iterdir() if p.name.startswith("lib.stale-")]
    assert len(stale) == 1 and (stale[0] / MANIFEST).exists()
    assert TemplateLibrary.open(out).manifest["inputs"]["slo"]["tpot_s"] == 0.3


def test_resume_after_interruption_solves_nothing_twice(tiny, tmp_path):
    cat, perf = tiny
    out = tmp_path / "lib"
    full_solver = CountingSolver()
    full, _ = _build(cat, perf, tmp_path / "reference", solver=full_solver, bound_skip=False)

    class Interrupt(Exception):
        pass

    first = CountingSolver()
    budget = len(full_solver.calls) // 2

    def stopping(problem, **kw):
        if len(first.calls) >= budget:
            raise Interrupt
        return first(problem, **kw)

    with pytest.raises(Interrupt):
        _build(cat, perf, out, solver=stopping, bound_skip=False)
    assert not TemplateLibrary.open(out).complete
    # simulate a torn last line from a killed write
    with (out / RECORDS).open("a") as fh:
        fh.write('{"combo": ["1x-b", "1x-')
    second = CountingSolver()
    resumed, report = _build(cat, perf, out, solver=second, bound_skip=False)
    assert "resuming" in report.message
    assert not set(first.calls) & set(second.calls)
    assert sorted(first.calls + second.calls) == sorted(full_solver.calls)
    assert _sig(resumed) == _sig(full)
    assert TemplateLibrary.open(out).complete


REAL_NODES = ["1x-h100-nvl", "1x-t4", "1x-a100-80gb", "1x-l4", "1x-h100-sxm"]


@pytest.fixture(scope="module")
def real():
    from coral.catalog import default_catalog

    cat = default_catalog()
    return cat, PerfModel(cat)


def _real_build(real, out=None, **kw):
    """llama-3.1-8b, chain topology (exact DP, fast), a few node types, up to 3 nodes.

    In a chain every node is a stage, so a slow node can only hurt: here some combinations
    (e.g. an H100 NVL plus a T4) are dominated by a sub-multiset."""
    from coral.templates.slo import default_slo

    cat, perf = real
    return build_library("llama-3.1-8b", cat, slo=default_slo(cat.model("llama-3.1-8b")),
                         nmax=3, node_types=REAL_NODES,
                         options=BuildOptions(topology="chain", **kw), perf=perf, out=out)


def _below(combo):
    """Every proper non-empty sub-multiset, recursively."""
    out, todo = set(), [combo]
    while todo:
        for s in sub_combos(todo.pop()):
            if s and s not in out:
                out.add(s)
                todo.append(s)
    return out


def _parts_floor(combo, thr, memo):
    """Best throughput of `combo`'s nodes without a template of all of them: a proper
    sub-multiset alone, or two disjoint parts side by side (recursively)."""
    def best(c):
        if c not in memo:
            memo[c] = max(thr.get(c, 0.0), floor(c))
        return memo[c]

    def floor(c):
        out = max((best(s) for s in sub_combos(c) if s), default=0.0)
        for r in range(1, len(c)):
            for idx in itertools.combinations(range(len(c)), r):
                a = tuple(c[i] for i in idx)
                b = tuple(c[i] for i in range(len(c)) if i not in idx)
                out = max(out, best(a) + best(b))
        return out

    return floor(combo)


def test_dominance_keeps_only_non_dominated(real, tmp_path):
    """Against brute force over every solved combination (bound skip off, to see them all)."""
    kept, report = _real_build(real, tmp_path / "lib", bound_skip=False)
    records = TemplateLibrary.open(tmp_path / "lib").records_by_combo()
    thr = {c: (r["throughput"] or 0.0) for c, r in records.items()}
    kept_set = {t.combo for t in kept}
    assert report.outcomes["dominated"] > 0 and report.outcomes["kept"] > 0
    memo: dict = {}
    for combo, rec in records.items():
        floor = _parts_floor(combo, thr, memo)
        if rec["outcome"] == "kept":
            assert thr[combo] > floor * (1 + 1e-7)
            assert combo in kept_set
        elif rec["outcome"] == "dominated":
            assert floor >= thr[combo] * (1 - 1e-6)
            assert combo not in kept_set
        else:
            assert rec["outcome"] in ("zero", "infeasible") and combo not in kept_set


def test_bound_skip_is_lossless(real):
    with_skip, rep_a = _real_build(real, bound_skip=True)
    without, rep_b = _real_build(real, bound_skip=False)
    assert _sig(with_skip) == _sig(without)
    assert rep_a.solved + rep_a.outcomes["bound"] == rep_b.solved


def test_dominance_with_scripted_throughputs(tiny, tmp_path):
    """A made-up throughput per combination exercises every outcome."""
    cat, perf = tiny
    table = {
        ("1x-b",): 10.0, ("1x-s",): 0.0, ("2x-s",): 4.0,
        ("1x-b", "1x-b"): 21.0, ("1x-b", "1x-s"): 10.0, ("1x-b", "2x-s"): 9.0,
        ("1x-s", "1x-s"): 0.0, ("1x-s", "2x-s"): 4.0, ("2x-s", "2x-s"): 8.5,
    }

    def scripted(problem, **kw):
        combo = tuple(sorted(n.node_type for n in problem.nodes))
        value = table[combo]
        status = SolveStatus.OPTIMAL if value > 0 else SolveStatus.INFEASIBLE
        return Placement(value, (), (), status, 0.0, 0.001, "scripted")

    kept, report = _build(cat, perf, tmp_path / "lib", solver=scripted, bound_skip=False,
                          node_types=["1x-s", "2x-s", "1x-b"])
    # (1x-s,) alone cannot hold the weights: never enumerated
    assert report.enumeration["pruned_memory_low"] == 1
    assert {t.combo for t in kept} == {("1x-b",), ("2x-s",), ("1x-b", "1x-b"),
                                       ("2x-s", "2x-s")}
    # (1x-b,1x-s), (1x-b,2x-s) by 1x-b (+ 2x-s: 14 side by side), (1x-s,2x-s) by 2x-s
    assert report.outcomes["dominated"] == 3
    assert report.outcomes["infeasible"] == 1  # (1x-s,1x-s)


def test_time_limited_templates_are_compared_by_their_bound():
    assert upper_bound_of(10.0, SolveStatus.OPTIMAL, 0.0) == 10.0
    assert upper_bound_of(10.0, SolveStatus.TIME_LIMIT, 0.5) == pytest.approx(20.0)
    assert upper_bound_of(10.0, SolveStatus.TIME_LIMIT, 1.0) == math.inf

    def outcome(thr, status, gap):
        tpl = Template(model="m", slo=tiny_slo(), mode="aggregated", topology="flow",
                       combo=("a", "b"), nodes=(), edges=(), throughput=thr, unit="req/s",
                       throughput_rps=thr, throughput_tokens_per_s=thr, ttft_s=None, tpot_s=None,
                       usd_per_hour={}, status=status, gap=gap, solve_s=0.0, method="x",
                       upper_bound=upper_bound_of(thr, status, gap))
        return Outcome(("a", "b"), tpl, math.inf, 0.0)

    assert classify(outcome(10.0, SolveStatus.OPTIMAL, 0.0), 10.0) == "dominated"
    assert classify(outcome(10.0, SolveStatus.TIME_LIMIT, 0.2), 10.0) == "kept"
    assert classify(outcome(10.0, SolveStatus.TIME_LIMIT, 0.2), 12.5) == "dominated"
    assert classify(Outcome(("a",), None, 1.0, 0.0), 2.0) == "bound"


def test_parallel_matches_serial(tiny, tmp_path):
    cat, perf = tiny
    serial, rep1 = _build(cat, perf, tmp_path / "one", workers=1)
    parallel, rep2 = _build(cat, perf, tmp_path / "two", workers=2)
    assert _sig(serial) == _sig(parallel)
    assert rep1.outcomes == rep2.outcomes
    one = TemplateLibrary.open(tmp_path / "one").records_by_combo()
    two = TemplateLibrary.open(tmp_path / "two").records_by_combo()
    assert set(one) == set(two)
    for combo, rec in one.items():
        assert rec["outcome"] == two[combo]["outcome"]
        assert rec["throughput"] == two[combo]["throughput"]


def test_not_a_library(tmp_path):
    with pytest.raises(LibraryError, match="not a template library"):
        TemplateLibrary.open(tmp_path)
    (tmp_path / "junk.txt").write_text("x")
    cat = tiny_catalog(tmp_path)
    with pytest.raises(LibraryError, match="not a template library"):
        build_library("tiny-4l", cat, slo=tiny_slo(), nmax=1,
                      options=BuildOptions(batches=TINY_BATCHES, solver=reference_solve),
                      perf=PerfModel(cat), out=tmp_path)


def test_ray_backend_reports_missing_dependency(tiny):
    pytest.importorskip  # noqa: B018 - documented below
    try:
        import ray  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("ray is installed")
    from coral.templates.builder.parallel import MissingDependencyError

    cat, perf = tiny
    with pytest.raises(MissingDependencyError, match=r"pip install coral-serving\[ray\]"):
        _build(cat, perf, None, ray_address="auto")


def test_parallel_matches_serial_with_the_real_solver(real, tmp_path):
    serial, rep1 = _real_build(real, tmp_path / "one", workers=1)
    parallel, rep2 = _real_build(real, tmp_path / "two", workers=2)
    assert _sig(serial) == _sig(parallel) and rep1.outcomes == rep2.outcomes


def test_catalog_change_triggers_rebuild(tiny, tmp_path):
    from coral.catalog import load_catalog
    from test_templates_support import TINY_CATALOG_YAML

    cat, perf = tiny
    out = tmp_path / "lib"
    _build(cat, perf, out)
    manifest = TemplateLibrary.open(out).manifest["inputs"]
    assert manifest["perf_model_version"] and manifest["operating_points_version"]
    assert manifest["batches"] == list(TINY_BATCHES) and manifest["nmax"] == 2
    base = tmp_path / "base.yaml"
    base.write_text(TINY_CATALOG_YAML)
    cheaper = tmp_path / "cheaper.yaml"
    cheaper.write_text("node_types:\n  - name: 1x-s\n    prices:\n"
                       "      - {region: r1, usd_per_hour: 0.4, source: test}\n")
    cat2 = load_catalog([base, cheaper], include_builtin=False)
    solver = CountingSolver()
    _, report = _build(cat2, PerfModel(cat2), out, solver=solver)
    assert "catalog_hash" in report.message and solver.calls
