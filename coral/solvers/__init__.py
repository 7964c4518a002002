"""Shared helpers for the HiGHS solver (used by the placement and allocation MILPs)."""

from coral.solvers.highs import quiet_highs

__all__ = ["quiet_highs"]
