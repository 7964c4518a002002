"""Performance model: per-layer iteration times of a model on a node type.

`PerfModel` predicts one iteration's time from a roofline with per-GPU efficiencies fitted to
measured operator profiles (`coral.perf.calibration`), or reads a measured profile table where
one exists for the (model, node type).

The names below load their module on first use, so that reading `coral.perf.pipeline` (every
plan file's stages) does not import the calibration and its fits.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Calibration": "calibration",
    "calibrate": "calibration",
    "write_efficiencies": "calibration",
    "Efficiencies": "efficiencies",
    "EfficiencyTable": "efficiencies",
    "default_efficiencies": "efficiencies",
    "efficiencies_for": "efficiencies",
    "load_efficiencies": "efficiencies",
    "IterationTime": "model",
    "MeasuredTable": "model",
    "PerfModel": "model",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
