"""The CLI shows a user's error as one message (exit status 2) and a bug as a bug."""

from __future__ import annotations

import pytest
import typer

from coral.catalog import CatalogError, UnknownNameError
from coral.cli.common import UserError, user_errors
from coral.errors import CoralError
from coral.perf.profile_table import ProfileTableError
from coral.perf.validation import ValidationError
from coral.runtime.deployment import RuntimeDeploymentError
from coral.runtime.gguf_file import GgufError
from coral.runtime.instance import TemplateNotServableError
from coral.sim.deployment import DeploymentError
from coral.sim.workload import WorkloadError

USER_ERRORS = (CatalogError, UnknownNameError, UserError, ProfileTableError, ValidationError,
               RuntimeDeploymentError, GgufError, TemplateNotServableError, DeploymentError,
               WorkloadError)


@pytest.mark.parametrize("cls", USER_ERRORS, ids=lambda c: c.__name__)
def test_user_errors_are_coral_errors_and_print_one_line(cls, capsys):
    assert issubclass(cls, CoralError)
    with pytest.raises(typer.Exit) as info:
        with user_errors():
            raise cls("the trace file has no rows; to fix: give one with rows")
    assert info.value.exit_code == 2
    assert "the trace file has no rows; to fix: give one with rows" in capsys.readouterr().err


def test_a_missing_dependency_is_a_user_error_printed_as_plain_text(capsys):
    """Brackets in a message (an extra's name) are text, not console markup."""
    from coral.templates.builder.parallel import MissingDependencyError

    with pytest.raises(typer.Exit) as info:
        with user_errors():
            raise MissingDependencyError("Ray is not installed: pip install coral-serving[ray]")
    assert info.value.exit_code == 2
    assert "pip install coral-serving[ray]" in capsys.readouterr().err


def test_errors_that_were_value_errors_still_are():
    """Callers that catch the old base keep working."""
    for cls in USER_ERRORS:
        if cls not in (UnknownNameError, UserError):
            assert issubclass(cls, ValueError), cls
    assert issubclass(UnknownNameError, KeyError)


def test_a_bug_is_not_shown_as_a_user_error():
    with pytest.raises(RuntimeError, match="a bug"):
        with user_errors():
            raise RuntimeError("a bug")


def test_input_errors_of_every_package_are_coral_errors():
    """What rejects a user's scenario, plan, timeline, library, SLO or option value is a
    `CoralError` (and still a `ValueError`), so the CLI shows it as one message."""
    from coral.allocator.scenario.headroom import HeadroomError
    from coral.plans.errors import PlanFileError
    from coral.allocator.scenario.load import ScenarioError
    from coral.errors import InputError
    from coral.planning.adapt_report import ReportError
    from coral.planning.timeline import TimelineError
    from coral.templates.slo import SloError
    from coral.templates.builder.store import LibraryError

    for cls in (HeadroomError, PlanFileError, ScenarioError, InputError, ReportError,
                TimelineError, SloError, LibraryError):
        assert issubclass(cls, CoralError) and issubclass(cls, ValueError), cls


def test_an_unknown_engine_is_an_input_error():
    from coral.errors import InputError
    from coral.templates.space.engines import check_engine

    with pytest.raises(InputError, match="unknown engine 'vlm'"):
        check_engine("vlm")


BAD_SCENARIO = """\
schema_version: 1
name: tiny
node_types: [1x-l4]
models:
  - {name: llama-3.1-8b, demand_rps: -3}
regions:
  - {name: aws-us-east-1}
base_availability: {1x-l4: 8}
"""


def test_a_bad_scenario_entry_is_one_line_naming_file_and_entry(tmp_path):
    from typer.testing import CliRunner

    from coral.cli.main import app

    path = tmp_path / "neg.yaml"
    path.write_text(BAD_SCENARIO)
    result = CliRunner().invoke(app, ["plan", str(path), "--nmax", "1"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    text = " ".join(result.output.split())
    assert "error:" in text and "neg.yaml" in text, text
    assert "models[0]" in text and "demand_rps" in text, text
    assert "Traceback" not in text


def test_a_value_error_inside_the_planner_shows_as_a_bug(monkeypatch):
    """A `ValueError` that is no user's (a broken invariant deep in the planner) leaves the CLI
    as itself, with exit status 1, not as a one-line user error with status 2."""
    from typer.testing import CliRunner

    import coral.planning.libraries as libraries
    from coral.cli.main import app

    def broken(*args, **kwargs):
        raise ValueError("an internal invariant broke")

    monkeypatch.setattr(libraries, "templates_for_scenario", broken)
    result = CliRunner().invoke(app, ["plan", "core", "--nmax", "1", "--no-baselines"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, ValueError)
    assert str(result.exception) == "an internal invariant broke"
    assert "error:" not in result.output


def test_an_unknown_scarcity_objective_is_one_line():
    from typer.testing import CliRunner

    from coral.cli.main import app

    result = CliRunner().invoke(app, ["plan", "core", "--nmax", "1", "--scarcity", "fairest"])
    assert result.exit_code == 2
    assert "--scarcity must be one of fair, goodput, got 'fairest'" in result.output
