"""How sure the perf model is of each GPU type: the slowdown `coral plan --robust auto` plans
against, card by card.

A GPU type's iteration times come either from a fit on its own measurements (a100-80gb,
h100-sxm and a40 on Vidur's per-operator profiles, h200 on the shipped whole-layer tables)
or from a profiled type's fit borrowed by architecture and carried by the sustained-throughput
ratio (`coral.perf.efficiencies`, `coral.perf.sustained`). How far each is off is measured,
not assumed:

- **own profile**: the type's whole-layer points (prefill and decode) against the figures
  plans use (the committed fit; a type whose committed figures are borrowed, as the h200's
  and the a40's are, is a borrower);
- **layer fit**: a borrower whose matmul efficiency is fitted on its own public per-layer
  profile (`coral.perf.layer_fits`: the A100-40GB, L4, T4 and V100): its public points that
  the fit did not use (the held-out model's prefill layers and every decode layer), predicted
  by the model plans use;
- **borrowed**: the leave-one-GPU-out check (`coral.perf.holdout`): each measured type
  predicted from fits on the others only, as a type without a profile is; the worst of
  those held-out types stands for every borrower, as nobody can say which held-out type a
  borrower resembles most.

A slowdown is `measured / predicted` of a point; a card's factor is its `PERCENTILE`-th
percentile over its points (at least 1): slower-than-modelled is what breaks an SLO, and one
slowdown is applied to every step of the card, so the factor stands for most steps rather
than the single worst kernel choice. The figures live in `data/uncertainty.yaml`, written by
`python benchmarks/perf_holdout.py --write-uncertainty`, which reads the layer-fitted cards'
public points through `benchmarks/perf_public.py` (`tests/test_perf_holdout.py` checks
the file against a fresh measurement, so a perf-model change that moves them cannot go
unnoticed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import yaml

from coral.catalog.loader import Catalog
from coral.perf.holdout import _vidur_errors, committed_check, leave_one_gpu_out
from coral.perf.vidur_profiles import VIDUR_GPUS

#: Percentile of a card's slowdowns (measured / predicted) its factor is taken at.
PERCENTILE = 95.0
#: Format of `data/uncertainty.yaml`.
FORMAT = 1


def uncertainty_file() -> Path:
    return Path(__file__).parent / "data" / "uncertainty.yaml"


@dataclass(frozen=True)
class CardUncertainty:
    """How sure the perf model is of one GPU type."""

    gpu: str
    basis: Literal["own profile", "layer fit", "borrowed"]
    factor: float  # slowdown planned against: measured / predicted at PERCENTILE
    donor: str | None = None  # the type whose fit a borrowed one carries

    @property
    def r(self) -> float:
        """`--robust R` of this card alone."""
        return self.factor - 1.0

    def describe(self) -> str:
        if self.basis == "own profile":
            how = "its own profile"
        elif self.basis == "layer fit":
            how = ("matmuls fitted on its own layers, the rest borrowed from "
                   f"{self.donor or 'a profiled type'}; held-out public points")
        else:
            how = f"borrowed from {self.donor}" if self.donor else "borrowed"
        return f"{self.gpu} {self.factor:.3g}x ({how})"


def slowdown_factor(errors: np.ndarray) -> float:
    """The `PERCENTILE`-th percentile of `measured / predicted` over points whose errors are
    `predicted / measured - 1` (at least 1; 1 with no points)."""
    errors = np.asarray(errors, dtype=float)
    if not errors.size:
        return 1.0
    return max(1.0, float(np.percentile(1.0 / (1.0 + errors), PERCENTILE)))


def measure(catalog: Catalog, perf: Any,
            layer_fitted: Mapping[str, Sequence[float]] | None = None) -> dict[str, Any]:
    """The file's figures, measured now: each own-profile type's factor, each layer-fitted
    type's (from `layer_fitted`: card -> errors of its public points the fit did not use,
    as `benchmarks/perf_public.py` scores them) and the borrowers'."""
    def layers(held: Any) -> np.ndarray:
        return np.concatenate([held.kind("prefill").errors, held.kind("decode").errors,
                               held.kind("prefill", ("moe layer",)).errors,
                               held.kind("decode", ("moe layer",)).errors])

    own: dict[str, float] = {}
    for vgpu, name in VIDUR_GPUS.items():
        eff = perf.efficiencies_for(name)
        if eff.borrowed_from:  # plans carry another type's fit to it: a borrower
            continue
        errs = _vidur_errors(catalog, vgpu, eff)
        own[name] = slowdown_factor(np.concatenate(
            [errs[("layer", "prefill")].errors, errs[("layer", "decode")].errors]))
    if not perf.efficiencies_for("h200").borrowed_from:
        own["h200"] = slowdown_factor(layers(committed_check(catalog, perf)))
    held_out = {h.gpu: slowdown_factor(layers(h)) for h in leave_one_gpu_out(catalog)}
    return {"format": FORMAT, "percentile": PERCENTILE,
            "own": {k: round(v, 4) for k, v in sorted(own.items())},
            "held_out": {k: round(v, 4) for k, v in sorted(held_out.items())},
            "layer_fitted": {k: round(slowdown_factor(np.asarray(v, dtype=float)), 4)
                             for k, v in sorted((layer_fitted or {}).items())},
            "borrowed": round(max(held_out.values()), 4)}


def write(figures: Mapping[str, Any], path: Path | None = None) -> Path:
    path = path or uncertainty_file()
    head = ("# Written by `python benchmarks/perf_holdout.py --write-uncertainty` "
            "(coral.perf.uncertainty):\n# slowdown factors (measured / predicted at the "
            "percentile) per GPU type with its own profile,\n# each held-out type's when "
            "predicted from the others, each layer-fitted type's on its\n# public points "
            "the fit did not use, and the borrowers' (the worst held-out).\n")
    path.write_text(head + yaml.safe_dump(dict(figures), sort_keys=False))
    return path


def load() -> dict[str, Any]:
    doc = yaml.safe_load(uncertainty_file().read_text())
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{uncertainty_file()}: not a format-{FORMAT} uncertainty file; "
                         "write it again with `python benchmarks/perf_holdout.py "
                         "--write-uncertainty`")
    return doc


def card_uncertainty(catalog: Catalog, perf: Any, gpus: Any = None
                     ) -> dict[str, CardUncertainty]:
    """Each GPU type's (`gpus`, default every catalog type) uncertainty: its own profile's
    figure where the committed file has one and plans use that fit, its layer fit's where
    plans use the committed layer fit, else the borrowers' (a type fitted later by the user
    counts as borrowed: no held-out figure says how good that fit is)."""
    doc = load()
    fitted = doc.get("layer_fitted") or {}
    out = {}
    for name in sorted(gpus if gpus is not None else catalog.gpus):
        eff = perf.efficiencies_for(name)
        if not eff.borrowed_from and name in doc["own"]:
            out[name] = CardUncertainty(name, "own profile", float(doc["own"][name]))
        elif eff.borrowed_from and eff.matmul_fitted_on and name in fitted:
            out[name] = CardUncertainty(name, "layer fit", float(fitted[name]),
                                        eff.borrowed_from)
        else:
            out[name] = CardUncertainty(name, "borrowed", float(doc["borrowed"]),
                                        eff.borrowed_from or None)
    return out
