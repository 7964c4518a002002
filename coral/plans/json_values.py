"""How the plan check words a JSON value and what is wrong with it: the value as the file
spells it (`show`), and whether it is a bounded whole number or a finite amount."""

from __future__ import annotations

import math
from collections.abc import Mapping as MappingABC
from typing import Any


def whole_problem(value: Any, lo: int, hi: int) -> str | None:
    """What is wrong with `value` as a whole number in [lo, hi] (None: nothing); a float
    with no fraction (8.0) is whole."""
    want = f"must be a whole number from {lo} to {hi}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{want}, got {show(value)}" if value is not None else f"missing ({want})"
    if isinstance(value, float) and not value.is_integer():
        return f"{want}, got {show(value)}"
    if not lo <= value <= hi:
        return f"{want}, got {show(value)}"
    return None


def amount_problem(value: Any, hi: float = math.inf) -> str | None:
    """What is wrong with `value` as a finite number in [0, hi] (None: nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number >= 0, got {show(value)}"
    if not (isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= hi:
        return (f"must be a finite number from 0 to {hi:g}, got {show(value)}"
                if math.isfinite(hi) else f"must be a finite number >= 0, got {show(value)}")
    return None


def short(text: str, most: int = 80) -> str:
    return text if len(text) <= most else text[:most - 3] + "..."


def show(value: Any) -> str:
    """A JSON value, short, as the file spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return f"{value:g}"
    if isinstance(value, int):
        if value.bit_length() > 60:  # str() of a huge int is slow, or refused
            return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
        return str(value)
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {text!r}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, MappingABC):
        return "an object"
    return type(value).__name__
