"""A library built with every shortcut equals one built without any.

The default build solves each combination only for a single pipeline over all of its nodes
that beats the floor (its parts' best), with the step-model search (`placement_step`) and
its work bound in front. The reference build (`bound_skip=False`) gives the floor to nobody
and cuts nothing before solving: every combination's best pipeline is found in full and
classified afterwards. On random small instances (random node-type subsets of the real
catalog, random SLOs, both topologies) the two must keep the same combinations with the
same throughputs, and agree on every dominated one.
"""

from __future__ import annotations

import random

import pytest

from coral.perf.model import PerfModel
from coral.templates.builder.build import build_library
from coral.templates.builder.build_options import BuildOptions
from coral.templates.slo import SloSpec

MODELS = ("llama-3.1-8b", "qwen3-14b", "qwen3-30b-a3b")


@pytest.fixture(scope="module")
def real():
    from coral.catalog import default_catalog

    cat = default_catalog()
    return cat, PerfModel(cat)


def _instance(cat, seed: int) -> dict:
    """4-6 node types of at most 200 GB (so that rho leaves combinations of several nodes),
    up to 4 nodes, a random SLO and workload; every fourth instance in the chain topology."""
    rng = random.Random(seed)
    small = [n for n in sorted(cat.node_types) if cat.node_memory_bytes(n) <= 200e9]
    return dict(
        model=MODELS[seed % len(MODELS)],
        node_types=rng.sample(small, rng.randint(4, 6)),
        slo=SloSpec(tpot_s=rng.choice([0.06, 0.1, 0.2]), ttft_s=rng.choice([1.0, 2.0, 5.0]),
                    input_tokens=rng.choice([256, 1024]), output_tokens=rng.choice([64, 256])),
        nmax=4,
        topology="chain" if seed % 4 == 3 else "flow",
    )


def _sig(templates):
    return {t.combo: t.throughput for t in templates}


@pytest.mark.parametrize("seed", range(8))
def test_shortcuts_keep_the_library(real, seed):
    cat, perf = real
    inst = _instance(cat, seed)
    model = inst.pop("model")
    topology = inst.pop("topology")
    fast, rep_fast = build_library(model, cat, perf=perf,
                                   options=BuildOptions(topology=topology), **inst)
    slow, rep_slow = build_library(model, cat, perf=perf,
                                   options=BuildOptions(topology=topology, bound_skip=False),
                                   **inst)
    want, got = _sig(slow), _sig(fast)
    assert set(got) == set(want), (sorted(set(got) ^ set(want)), inst)
    for combo, thr in want.items():
        assert got[combo] == pytest.approx(thr, rel=1e-9), combo
    assert rep_fast.kept == rep_slow.kept
    assert sum(rep_fast.outcomes.values()) == sum(rep_slow.outcomes.values())
    assert rep_fast.optimal == rep_fast.solved  # every solve proven optimal


def test_instances_keep_and_drop_something(real):
    """The random instances are not trivial: together they keep and drop combinations."""
    cat, perf = real
    kept = dropped = 0
    for seed in range(8):
        inst = _instance(cat, seed)
        model = inst.pop("model")
        options = BuildOptions(topology=inst.pop("topology"))
        _, rep = build_library(model, cat, perf=perf, options=options, **inst)
        kept += rep.kept
        dropped += rep.outcomes["dominated"] + rep.outcomes["bound"]
    assert kept > 50 and dropped > 50


def test_work_bound_skip_matches_the_solve(real):
    """A combination skipped because its work bound is no more than the floor is one the
    search, given that floor, finds nothing above; below the best it is solved."""
    from coral.templates.builder.solve import Task, build_template, solve_task
    from coral.templates.space.operating_points import shared_tables
    from coral.templates.step.bound import work_bound
    from coral.templates.slo import default_slo

    cat, perf = real
    model = cat.model("llama-3.1-8b")
    slo = default_slo(model)
    tables = shared_tables(perf, cat)
    combo = ("1x-l4", "1x-l4", "1x-t4")
    bound = work_bound(perf, cat, model, combo, slo, "aggregated")
    best = build_template(model, combo, slo, "aggregated", "flow", perf, cat, tables=tables,
                          floor=0.0).throughput
    assert 0 < best <= bound
    kw = dict(model=model, slo=slo, mode="aggregated", topology="flow", perf=perf, catalog=cat,
              tables=tables, time_limit_s=60.0, method="auto")
    skipped = solve_task(Task(combo, bound), bound_skip=True, **kw)
    assert skipped.template is None and skipped.bound <= bound
    solved = build_template(model, combo, slo, "aggregated", "flow", perf, cat, tables=tables,
                            floor=bound)
    assert solved.throughput == 0 and solved.upper_bound == bound
    below = solve_task(Task(combo, 0.5 * best), bound_skip=True, **kw)
    assert below.template is not None
    assert below.template.throughput == pytest.approx(best, rel=1e-12)
