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
