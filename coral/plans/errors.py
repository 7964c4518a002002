"""The error every plan-file reader raises."""

from __future__ import annotations

from coral.errors import CoralError


class PlanFileError(CoralError, ValueError):
    """A file that should hold a plan written by `coral plan --out` does not."""
