"""Per-GPU efficiencies of the roofline model: the figures, the borrowing rule for GPU types
without their own fit, and the committed file they are read from.

`coral.perf.calibration` fits and writes them; `coral.perf.model` reads them. They sit apart
from both so that neither imports the other's job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Mapping

import yaml

from coral.catalog.schema import GpuType

EFFICIENCIES_FILE = "efficiencies.yaml"
EFFICIENCIES_SCHEMA = 1

#: Which architecture's fitted efficiencies a GPU without its own fit borrows.
#: Ada (L4, L40S) and the older Volta/Turing parts borrow Ampere's figures (closest tensor-core
#: generation among those profiled), Blackwell borrows Hopper's.
DONOR_ARCHITECTURE: Mapping[str, str] = {
    "hopper": "hopper",
    "ampere": "ampere",
    "ada": "ampere",
    "volta": "ampere",
    "turing": "ampere",
    "blackwell": "hopper",
    "other": "ampere",
}


@dataclass(frozen=True)
class Efficiencies:
    """Achieved fractions of peak and fixed costs for one GPU type.

    `eta_compute`: matmul/attention FLOP/s over peak dense bf16. `eta_memory`: bandwidth of
    weight-streaming matmuls and attention over peak. `eta_elementwise`: bandwidth of the
    element-wise kernels (norms, rope, activation, add) over peak. `kernel_overhead_s`: fixed
    GPU time per kernel. `fitted_on` says which measurements; `borrowed_from` names the GPU type
    whose fit these are when this GPU type has no measurements of its own;
    `matmul_fitted_on` says which of this type's own measurements `eta_compute` was fitted on
    when the rest is borrowed (`coral.perf.layer_fits`).
    """

    gpu: str
    architecture: str
    eta_compute: float
    eta_memory: float
    eta_elementwise: float
    kernel_overhead_s: float
    fitted_on: str
    borrowed_from: str | None = None
    matmul_fitted_on: str | None = None

    def __post_init__(self) -> None:
        for name in ("eta_compute", "eta_memory", "eta_elementwise"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} of {self.gpu!r} must be in (0, 1], got {value}")
        if self.kernel_overhead_s < 0:
            raise ValueError(f"kernel_overhead_s of {self.gpu!r} must be >= 0")

    @property
    def label(self) -> str:
        """Where these figures come from, for reports."""
        if self.borrowed_from and self.matmul_fitted_on:
            return (f"borrowed from {self.borrowed_from} ({self.architecture} GPU, no operator "
                    f"fit), matmul efficiency fitted on {self.matmul_fitted_on}")
        if self.borrowed_from:
            return f"borrowed from {self.borrowed_from} ({self.architecture} GPU, no own fit)"
        return f"fitted on {self.gpu} ({self.fitted_on})"


class EfficiencyTable:
    """Fitted efficiencies by catalog GPU name, with the borrowing rule for the others."""

    def __init__(self, entries: Mapping[str, Efficiencies]):
        self.entries: dict[str, Efficiencies] = dict(entries)

    def __repr__(self) -> str:
        return f"EfficiencyTable({sorted(self.entries)})"

    def for_gpu(self, gpu: GpuType) -> Efficiencies:
        """The GPU's own fit, or the fit of the nearest profiled architecture (marked borrowed)."""
        own = self.entries.get(gpu.name)
        if own is not None:
            return own
        fitted = [e for _, e in sorted(self.entries.items()) if e.borrowed_from is None]
        if not fitted:
            raise ValueError("the efficiency table holds no fitted GPU type")
        wanted = DONOR_ARCHITECTURE.get(gpu.architecture, "ampere")
        for arch in (wanted, "ampere", "hopper"):
            donors = [e for e in fitted if e.architecture == arch]
            if donors:
                break
        else:
            donors = fitted
        donor = donors[0]
        return replace(
            donor, gpu=gpu.name, architecture=gpu.architecture, borrowed_from=donor.gpu
        )


# ---- the committed file ----


def efficiencies_file() -> Path:
    """The package's committed efficiencies file."""
    return Path(str(resources.files("coral.perf") / "data" / EFFICIENCIES_FILE))


def load_efficiencies(path: Path | str | None = None) -> EfficiencyTable:
    """Read a fitted efficiencies file (default: the committed one)."""
    path = Path(path) if path is not None else efficiencies_file()
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("schema_version") != EFFICIENCIES_SCHEMA:
        raise ValueError(f"{path}: not an efficiencies file of schema {EFFICIENCIES_SCHEMA}")
    entries = {}
    for name, d in (doc.get("gpus") or {}).items():
        try:
            entries[name] = Efficiencies(
                gpu=name,
                architecture=d["architecture"],
                eta_compute=float(d["eta_compute"]),
                eta_memory=float(d["eta_memory"]),
                eta_elementwise=float(d["eta_elementwise"]),
                kernel_overhead_s=float(d["kernel_overhead_s"]),
                fitted_on=str(d["fitted_on"]),
            )
        except KeyError as exc:
            raise ValueError(f"{path}: gpus.{name}: missing field {exc.args[0]!r}") from None
    return EfficiencyTable(entries)


@lru_cache(maxsize=1)
def default_efficiencies() -> EfficiencyTable:
    """The committed fit, read once per process."""
    return load_efficiencies()


def efficiencies_for(gpu: GpuType) -> Efficiencies:
    """The committed efficiencies of `gpu`; `borrowed_from` is set when it has no own fit."""
    return default_efficiencies().for_gpu(gpu)
