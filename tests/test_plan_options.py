"""`BuildOptions` and `PlanOptions`: checked once, frozen, built from the CLI's flags; the
`Planner` each plan's options choose. No template is built and nothing is solved here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from coral.allocator.problem import DEFAULT_MIP_GAP, DEFAULT_SCARCITY, DEFAULT_TIME_LIMIT_S
from coral.allocator.spot.market import SpotOptions
from coral.catalog import default_catalog
from coral.cli import plan_cmd
from coral.errors import InputError
from coral.planning.adapt import run_timeline
from coral.planning.libraries import DEFAULT_TEMPLATES_DIR
from coral.planning.options import PlanOptions
from coral.planning.planners import (
    PlainPlanning,
    Planner,
    RobustPlanning,
    SpotPlanning,
    planner_for,
)
from coral.planning.timeline import load_timeline
from coral.templates.builder.build_options import BuildOptions
from coral.templates.space.operating_points import DEFAULT_BATCHES
from coral.templates.builder.solve import DEFAULT_TIME_LIMIT_S as DEFAULT_PLACEMENT_TIME_LIMIT_S


def test_defaults_are_the_named_constants():
    build, plan = BuildOptions(), PlanOptions()
    assert build.engine == "coral" and build.topology is None and build.workers == 1
    assert build.batches == DEFAULT_BATCHES
    assert build.time_limit_s == DEFAULT_PLACEMENT_TIME_LIMIT_S
    assert plan.build == build and plan.engine == "coral"
    assert plan.out_root == DEFAULT_TEMPLATES_DIR and plan.nmax is None
    assert (plan.time_limit_s, plan.mip_gap, plan.scarcity) == (
        DEFAULT_TIME_LIMIT_S, DEFAULT_MIP_GAP, DEFAULT_SCARCITY)
    assert plan.robust is None and plan.spot is None


def test_options_are_frozen_and_compare_by_value():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BuildOptions().workers = 4  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        PlanOptions().nmax = 2  # type: ignore[misc]
    assert PlanOptions(nmax=2) == PlanOptions(nmax=2) != PlanOptions(nmax=3)


@pytest.mark.parametrize(("fields", "message"), [
    ({"engine": "tgi"}, "unknown engine 'tgi'"),
    ({"workers": 0}, "workers must be >= 1"),
    ({"time_limit_s": 0.0}, "time limit must be > 0 s"),
    ({"batches": (0, 4)}, "batch sizes must be positive"),
])
def test_build_options_refuse_bad_values(fields, message):
    with pytest.raises(InputError, match=message):
        BuildOptions(**fields)


def test_build_options_normalise_their_batches():
    assert BuildOptions(batches=(8, 1, 8, 2)).batches == (1, 2, 8)


def test_plan_options_refuse_robust_with_spot_and_a_bad_nmax():
    with pytest.raises(InputError, match="--spot and --robust cannot be combined"):
        PlanOptions(robust=0.2, spot=SpotOptions())
    with pytest.raises(InputError, match="nmax must be >= 1"):
        PlanOptions(nmax=0)


def test_the_cli_builds_one_options_object_from_its_flags(tmp_path):
    options = plan_cmd._plan_options(nmax=3, workers=2, templates_dir=tmp_path, time_limit=7.0,
                                     gap=0.01, engine="vllm", robust="AUTO", scarcity="goodput")
    assert options == PlanOptions(build=BuildOptions(engine="vllm", workers=2),
                                  out_root=tmp_path, nmax=3, time_limit_s=7.0, mip_gap=0.01,
                                  scarcity="goodput", robust="auto")
    spot = plan_cmd._plan_options(nmax=None, workers=1, templates_dir=Path("t"), time_limit=5.0,
                                  spot=True, risk_target=0.9, risk_window=600.0)
    assert spot.spot == SpotOptions(risk_target=0.9, window_s=600.0) and spot.robust is None


def test_the_options_choose_the_planner():
    catalog = default_catalog()
    plain = planner_for(PlanOptions(), catalog=catalog, perf=None)
    spot = planner_for(PlanOptions(spot=SpotOptions(risk_target=0.95)), catalog=catalog,
                       perf=None)
    robust = planner_for(PlanOptions(robust=0.2), catalog=catalog, perf=None)
    assert isinstance(plain, PlainPlanning) and plain.scarcity_rule
    assert isinstance(spot, SpotPlanning) and not spot.scarcity_rule
    assert spot.planner.options.risk_target == 0.95
    assert isinstance(robust, RobustPlanning) and not robust.scarcity_rule
    assert robust.planner.factor == pytest.approx(1.2)
    for planner in (plain, spot, robust):
        assert isinstance(planner, Planner)


def test_a_timeline_is_not_replanned_robust_or_on_spot():
    timeline = load_timeline("day")
    for options in (PlanOptions(robust=0.2), PlanOptions(spot=SpotOptions())):
        with pytest.raises(InputError, match="re-planned nominally on demand"):
            run_timeline(timeline, catalog=default_catalog(), options=options)
