"""Matmul efficiency fitted on a card's own whole-layer profile, for cards without an operator fit.

A GPU type without Vidur's per-operator profiles borrows a profiled type's efficiencies,
carried by the sustained-throughput ratio (`coral.perf.sustained`). Where a public per-layer
profile of the card itself exists (Helix's simulator profiles of the A100-40GB, L4, T4 and
V100), the level its matmuls reach is measured rather than carried: `eta_compute` is fitted on
one model's prefill layers (compute-bound, so the other figures hardly enter) and checked on
another model's, a cross-model hold-out. The rest of the card's figures (weight streaming,
element-wise, per-kernel time) stay borrowed: a prefill layer does not constrain them, and the
decode layers, which would, depend on a context length the profiles do not state.

Why a fit instead of the carried figure: the carried level is the donor's fitted matmul level
times the ratio of two benchmark figures, so it inherits the donor profile's level relative
to its benchmark (Vidur's harness runs the A100's matmuls below that benchmark's level), while
the cards' own layers in a serving engine reach their benchmark's level, and a power-capped
card's clock depends on how long it runs (benchmarks/results/perf-model.md, "Perf model 8").

The fits are committed in `coral/perf/data/layer_fits.yaml`, written by
`python benchmarks/perf_public.py --write-fits` from `benchmarks/data/public_measurements.yaml`;
`PerfModel` applies them to the borrowed efficiencies of the committed calibration.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Mapping

import yaml

from coral.perf.efficiencies import Efficiencies

LAYER_FITS_FILE = "layer_fits.yaml"
LAYER_FITS_FORMAT = 1


@dataclass(frozen=True)
class LayerFit:
    """One card's matmul efficiency fitted on its own prefill layers.

    `in_sample_error` / `held_out_error`: signed median of predicted / measured - 1 over the
    fitted model's prefill points and over the held-out model's."""

    gpu: str
    eta_compute: float
    fitted_on: str
    points: int
    in_sample_error: float
    held_out_on: str
    held_out_points: int
    held_out_error: float

    def __post_init__(self) -> None:
        if not 0.0 < self.eta_compute <= 1.0:
            raise ValueError(f"{LAYER_FITS_FILE}: gpus.{self.gpu}.eta_compute must be in (0, 1], "
                             f"got {self.eta_compute}; write the file again with "
                             "`python benchmarks/perf_public.py --write-fits`")


def apply_layer_fit(eff: Efficiencies, fit: LayerFit) -> Efficiencies:
    """`eff` (borrowed) with its matmul efficiency replaced by the card's own layer fit."""
    return replace(eff, eta_compute=fit.eta_compute, matmul_fitted_on=fit.fitted_on)


def layer_fits_file() -> Path:
    """The package's committed layer-fits file."""
    return Path(__file__).parent / "data" / LAYER_FITS_FILE


def load_layer_fits(path: Path | str | None = None) -> dict[str, LayerFit]:
    """Read a layer-fits file (default: the committed one); an absent file holds no fits."""
    path = Path(path) if path is not None else layer_fits_file()
    if not path.exists():
        return {}
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("format") != LAYER_FITS_FORMAT:
        raise ValueError(f"{path}: not a format-{LAYER_FITS_FORMAT} layer-fits file; write it "
                         "again with `python benchmarks/perf_public.py --write-fits`")
    out = {}
    for name, d in (doc.get("gpus") or {}).items():
        try:
            out[name] = LayerFit(
                gpu=name,
                eta_compute=float(d["eta_compute"]),
                fitted_on=str(d["fitted_on"]),
                points=int(d["points"]),
                in_sample_error=float(d["in_sample_error"]),
                held_out_on=str(d["held_out_on"]),
                held_out_points=int(d["held_out_points"]),
                held_out_error=float(d["held_out_error"]),
            )
        except KeyError as exc:
            raise ValueError(f"{path}: gpus.{name}: missing field {exc.args[0]!r}; write the "
                             "file again with `python benchmarks/perf_public.py --write-fits`"
                             ) from None
    return out


@lru_cache(maxsize=1)
def default_layer_fits() -> Mapping[str, LayerFit]:
    """The committed fits, read once per process."""
    return load_layer_fits()


def layer_fits_document(fits: Mapping[str, LayerFit], source: str) -> dict:
    """The file's content for `fits`, fitted on the measurements `source` names."""
    return {
        "format": LAYER_FITS_FORMAT,
        "source": source,
        "gpus": {
            name: {
                "eta_compute": round(f.eta_compute, 4),
                "fitted_on": f.fitted_on,
                "points": f.points,
                "in_sample_error": round(f.in_sample_error, 4),
                "held_out_on": f.held_out_on,
                "held_out_points": f.held_out_points,
                "held_out_error": round(f.held_out_error, 4),
            }
            for name, f in sorted(fits.items())
        },
    }


def write_layer_fits(fits: Mapping[str, LayerFit], source: str,
                     path: Path | str | None = None) -> Path:
    """Write `fits` (default: the committed file) with a header saying how it is made."""
    path = Path(path) if path is not None else layer_fits_file()
    header = ("# Matmul efficiency of GPU types without an operator fit, fitted on their own\n"
              "# whole-layer profiles (coral.perf.layer_fits). Written by\n"
              "# `python benchmarks/perf_public.py --write-fits`; do not edit by hand.\n")
    path.write_text(header + yaml.safe_dump(layer_fits_document(fits, source), sort_keys=False,
                                            width=100))
    return path
