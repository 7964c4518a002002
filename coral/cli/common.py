"""Shared CLI plumbing: catalog option, JSON output, user-facing errors."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Iterator

import typer
from rich.markup import escape
from rich.console import Console

from coral.errors import CoralError
from coral.catalog import Catalog, load_catalog

#: Width of tables written to a file or pipe (Rich's default there, 80 columns, crops the
#: wider plan and baseline tables); a terminal's own width, or $COLUMNS, wins.
PIPE_WIDTH = 160


def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=PIPE_WIDTH if piped else None)


console = _console()
err_console = _console(stderr=True)

CatalogFiles = Annotated[
    list[Path] | None,
    typer.Option(
        "--catalog",
        help="Extra catalog YAML file that adds or overrides entries (repeatable).",
        exists=False,
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


class UserError(CoralError):
    """An error caused by the user's input; printed without a traceback."""


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a user's error into one message and exit status 2: a `CoralError`, or a file the
    user named that is not there (`FileNotFoundError`). Anything else is a bug in Coral and
    leaves with its traceback (exit status 1)."""
    try:
        yield
    except (CoralError, FileNotFoundError) as exc:
        # the message is plain text: a name like coral-serving[ray] is not markup
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False,
                          soft_wrap=True)
        raise typer.Exit(code=2) from None


def open_catalog(files: list[Path] | None) -> Catalog:
    return load_catalog(files or ())


def print_json(payload: Any) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")


@contextmanager
def native_stdout_to_stderr(enabled: bool) -> Iterator[None]:
    """While solving for `--json`, send whatever native code prints on file descriptor 1
    (a solver's banner) to stderr, so that stdout holds the JSON document only."""
    if not enabled:
        yield
        return
    try:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
    except (OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
