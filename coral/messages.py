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
