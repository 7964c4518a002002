"""Wording shared by every error that points a user at a bad entry in one of their files."""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Mapping


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """The " Did you mean ...?" suffix of an error message (empty when nothing is close)."""
    close = difflib.get_close_matches(str(name), list(known), n=3, cutoff=0.5)
    return f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def field_problem(error: Mapping[str, Any], *, with_input: bool = True) -> str:
    """What is wrong with one field, from one entry of pydantic's `ValidationError.errors()`:
    "unknown field", "missing field", or pydantic's message with the value it got."""
    if error["type"] == "extra_forbidden":
        return "unknown field"
    if error["type"] == "missing":
        return "missing field"
    msg = str(error["msg"])
    if with_input and "input" in error and not isinstance(error["input"], (dict, list)):
        msg = f"{msg} (got {error['input']!r})"
    return msg


def entry_problem(source: str, label: str, field_path: Iterable[Any],
                  error: Mapping[str, Any]) -> str:
    """One line naming the file, the entry (`label`, may be empty) and the field of one
    pydantic error: "FILE: ENTRY: field 'a.b': what is wrong"."""
    field = ".".join(str(x) for x in field_path) or "(entry)"
    where = f"{source}: {label}: " if label else f"{source}: "
    return f"{where}field '{field}': {field_problem(error)}"
