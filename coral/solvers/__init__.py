"""Shared helpers for the HiGHS solver (used by the placement and allocation MILPs)."""

from coral.solvers.highs import quiet_highs, set_threads

__all__ = ["quiet_highs", "set_threads"]
