"""Performance model: per-layer iteration times of a model on a node type.

`PerfModel` predicts one iteration's time from a roofline with per-GPU efficiencies fitted to
measured operator profiles (`coral.perf.calibration`), or reads a measured profile table where
one exists for the (model, node type).
"""

from coral.perf.calibration import Calibration, calibrate, write_efficiencies
from coral.perf.efficiencies import (
    Efficiencies,
    EfficiencyTable,
    default_efficiencies,
    efficiencies_for,
    load_efficiencies,
)
from coral.perf.model import (
    IterationTime,
    MeasuredTable,
    PerfModel,
)

__all__ = [
    "Calibration",
    "Efficiencies",
    "EfficiencyTable",
    "IterationTime",
    "MeasuredTable",
    "PerfModel",
    "calibrate",
    "default_efficiencies",
    "efficiencies_for",
    "load_efficiencies",
    "write_efficiencies",
]
