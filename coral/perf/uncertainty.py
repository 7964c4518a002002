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
  predicted from fits on the others only, as a type without a profile is; in each phase the
  worst of those held-out types stands for every borrower, as nobody can say which held-out
  type a borrower resembles most.

A slowdown is `measured / predicted` of a point. Each phase (prefill, decode) of a card gets its
own factor: the `PERCENTILE`-th percentile of its points' slowdowns (at least 1), since
slower-than-modelled is what breaks an SLO, and one slowdown stands for most steps rather than
the single worst kernel choice. Phases are kept apart because pooling lets the phase with many
points (Vidur's prefill tables, thousands against hundreds of decode points) hide the other's
error. Two rules bound a phase's factor from below:

- **floor**: no card is planned surer, in a phase, than the best own-profile card is measured
  in it (the smallest own-profile factor of that phase): a few public layer timings cannot
  show a card's model better than a card's full profile shows its own, and a phase whose few
  points all come out slower than measured (the L4's decode) would otherwise plan no margin;
- a layer-fitted card's phase without points takes the borrowers' figure of that phase.

The robust re-rating and `coral simulate --slowdown` slow a card's prefill and decode work
each by its own factor (`coral.perf.slowdown.SlowedPerf`, one computation in both: a mixed
iteration takes the two factors weighted by each part's time), so a card is planned against
each phase's factor, and the plan file's `robust.factors` names both.
The figures live in `data/uncertainty.yaml`, written by
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
from coral.perf.slowdown import PhaseSlowdown, Slowdown, simplest
from coral.perf.vidur_profiles import VIDUR_GPUS

#: Percentile of a phase's slowdowns (measured / predicted) its factor is taken at.
PERCENTILE = 95.0
#: The phases a card's points and factors are kept apart by.
PHASES = ("prefill", "decode")
#: Format of `data/uncertainty.yaml` (2: every figure per phase, with the floor).
FORMAT = 2

Basis = Literal["own profile", "layer fit", "borrowed"]
#: Phase -> slowdown factor.
PhaseFactors = Mapping[str, float]


def uncertainty_file() -> Path:
    return Path(__file__).parent / "data" / "uncertainty.yaml"


@dataclass(frozen=True)
class CardUncertainty:
    """How sure the perf model is of one GPU type, per phase and as planned."""

    gpu: str
    basis: Basis
    factor: float  # the larger phase factor (the card's headline uncertainty)
    donor: str | None = None  # the type whose fit a borrowed one carries
    phases: PhaseFactors | None = None  # phase -> its factor (floor and fallback applied)
    floored: tuple[str, ...] = ()  # phases whose factor is the floor, not their points

    @property
    def r(self) -> float:
        """`--robust R` of this card alone, at its larger phase."""
        return self.factor - 1.0

    @property
    def slowdown(self) -> Slowdown:
        """What a robust plan slows this card by: each phase by its own factor."""
        if not self.phases:
            return self.factor
        return simplest(PhaseSlowdown(self.phases["prefill"], self.phases["decode"]))

    def describe(self) -> str:
        if self.basis == "own profile":
            how = "its own profile"
        elif self.basis == "layer fit":
            how = ("matmuls fitted on its own layers, the rest borrowed from "
                   f"{self.donor or 'a profiled type'}; held-out public points")
        else:
            how = f"borrowed from {self.donor}" if self.donor else "borrowed"
        phases = "; ".join(
            f"{ph} {f:.3g}x" + (" (floor)" if ph in self.floored else "")
            for ph, f in (self.phases or {}).items())
        return f"{self.gpu} {self.factor:.3g}x ({how}" + (f"; {phases})" if phases else ")")


def slowdown_factor(errors: np.ndarray) -> float:
    """The `PERCENTILE`-th percentile of `measured / predicted` over points whose errors are
    `predicted / measured - 1` (at least 1; 1 with no points)."""
    errors = np.asarray(errors, dtype=float)
    if not errors.size:
        return 1.0
    return max(1.0, float(np.percentile(1.0 / (1.0 + errors), PERCENTILE)))


def _phase_factors(errors: Mapping[str, Any]) -> dict[str, float]:
    """Phase -> rounded `slowdown_factor` of its errors; a phase without points is left out
    (the card then takes the borrowers' figure of it)."""
    return {ph: round(slowdown_factor(np.asarray(errors[ph], dtype=float)), 4)
            for ph in PHASES if len(errors.get(ph, ())) > 0}


def measured_profiles(catalog: Catalog, perf: Any
                      ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Per phase, each own-profile type's factor on its own points and each measured type's
    when held out (predicted from fits on the others only)."""
    def layers(held: Any, phase: str) -> np.ndarray:
        return np.concatenate([held.kind(phase).errors,
                               held.kind(phase, ("moe layer",)).errors])

    own: dict[str, dict[str, float]] = {}
    for vgpu, name in VIDUR_GPUS.items():
        eff = perf.efficiencies_for(name)
        if eff.borrowed_from:  # plans carry another type's fit to it: a borrower
            continue
        errs = _vidur_errors(catalog, vgpu, eff)
        own[name] = _phase_factors({ph: errs[("layer", ph)].errors for ph in PHASES})
    if not perf.efficiencies_for("h200").borrowed_from:
        checked = committed_check(catalog, perf)
        own["h200"] = _phase_factors({ph: layers(checked, ph) for ph in PHASES})
    held_out = {h.gpu: _phase_factors({ph: layers(h, ph) for ph in PHASES})
                for h in leave_one_gpu_out(catalog)}
    return own, held_out


def file_figures(own: Mapping[str, PhaseFactors], held_out: Mapping[str, PhaseFactors],
                 layer_fitted: Mapping[str, Mapping[str, Sequence[float]]] | None = None
                 ) -> dict[str, Any]:
    """The file's figures from the own-profile and held-out phase factors and each
    layer-fitted card's errors per phase: the floor is each phase's smallest own-profile
    factor (1 without any), the borrowers' each phase's largest held-out one."""
    def per(section: Mapping[str, PhaseFactors]) -> dict[str, dict[str, float]]:
        return {k: {ph: float(v[ph]) for ph in PHASES if ph in v}
                for k, v in sorted(section.items())}

    def extreme(section: Mapping[str, PhaseFactors], pick: Any, empty: float
                ) -> dict[str, float]:
        return {ph: float(pick([v[ph] for v in section.values() if ph in v], default=empty))
                for ph in PHASES}

    return {"format": FORMAT, "percentile": PERCENTILE,
            "own": per(own), "held_out": per(held_out),
            "layer_fitted": per({k: _phase_factors(v)
                                 for k, v in (layer_fitted or {}).items()}),
            "floor": extreme(own, min, 1.0),
            "borrowed": extreme(held_out, max, 1.0)}


def measure(catalog: Catalog, perf: Any,
            layer_fitted: Mapping[str, Mapping[str, Sequence[float]]] | None = None
            ) -> dict[str, Any]:
    """The file's figures, measured now (`layer_fitted`: card -> phase -> errors of its public
    points the fit did not use, as `benchmarks/perf_public.py` scores them)."""
    return file_figures(*measured_profiles(catalog, perf), layer_fitted)


def write(figures: Mapping[str, Any], path: Path | None = None) -> Path:
    path = path or uncertainty_file()
    head = ("# Written by `python benchmarks/perf_holdout.py --write-uncertainty` "
            "(coral.perf.uncertainty):\n# slowdown factors (measured / predicted at the "
            "percentile), per phase, of each GPU type with\n# its own profile, of each "
            "held-out type when predicted from the others, of each\n# layer-fitted type on "
            "its public points the fit did not use; the floor (the smallest\n# own-profile "
            "factor) and the borrowers' (the worst held-out), per phase.\n")
    path.write_text(head + yaml.safe_dump(dict(figures), sort_keys=False))
    return path


def _problem(path: Path, entry: str, what: str) -> ValueError:
    return ValueError(f"{path}: {entry}: {what}; write the file again with `python "
                      "benchmarks/perf_holdout.py --write-uncertainty`")


def check(doc: Any, path: Path) -> dict[str, Any]:
    """`doc` if it is a format-`FORMAT` uncertainty file, else a `ValueError` naming the entry,
    the field and the fix."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise _problem(path, "format", f"not a format-{FORMAT} uncertainty file")

    def factor(entry: str, value: Any) -> None:
        if not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 1.0):
            raise _problem(path, entry, f"must be a slowdown factor >= 1, got {value!r}")

    for section in ("floor", "borrowed"):
        phases = doc.get(section)
        if not isinstance(phases, dict) or set(phases) != set(PHASES):
            raise _problem(path, section, f"must map each of {', '.join(PHASES)} to a factor")
        for ph, v in phases.items():
            factor(f"{section}.{ph}", v)
    for section in ("own", "held_out", "layer_fitted"):
        cards = doc.get(section) or {}
        if not isinstance(cards, dict):
            raise _problem(path, section, "must map GPU types to their phase factors")
        for gpu, phases in cards.items():
            if not isinstance(phases, dict) or not set(phases) <= set(PHASES):
                raise _problem(path, f"{section}.{gpu}",
                               f"must map some of {', '.join(PHASES)} to a factor")
            for ph, v in phases.items():
                factor(f"{section}.{gpu}.{ph}", v)
    return doc


def load(path: Path | None = None) -> dict[str, Any]:
    path = path or uncertainty_file()
    return check(yaml.safe_load(path.read_text()), path)


def card_uncertainty(catalog: Catalog, perf: Any, gpus: Any = None,
                     figures: Mapping[str, Any] | None = None) -> dict[str, CardUncertainty]:
    """Each GPU type's (`gpus`, default every catalog type) uncertainty from `figures`
    (default the committed file): its own profile's phase factors where the file has them and
    plans use that fit, its layer fit's where plans use the committed layer fit, else the
    borrowers' (a type fitted later by the user counts as borrowed: no held-out figure says
    how good that fit is); each phase at least the floor, the card at its larger phase."""
    doc = figures if figures is not None else load()
    fitted = doc.get("layer_fitted") or {}
    own = doc.get("own") or {}
    floor, borrowed = doc["floor"], doc["borrowed"]
    out = {}
    for name in sorted(gpus if gpus is not None else catalog.gpus):
        eff = perf.efficiencies_for(name)
        basis: Basis
        if not eff.borrowed_from and name in own:
            basis, measured = "own profile", own[name]
        elif eff.borrowed_from and eff.matmul_fitted_on and name in fitted:
            basis, measured = "layer fit", fitted[name]
        else:
            basis, measured = "borrowed", {}
        raw = {ph: float(measured.get(ph, borrowed[ph])) for ph in PHASES}
        phases = {ph: max(v, float(floor[ph])) for ph, v in raw.items()}
        out[name] = CardUncertainty(
            name, basis, max(phases.values()),
            None if basis == "own profile" else (eff.borrowed_from or None), phases,
            tuple(ph for ph in PHASES if raw[ph] < float(floor[ph])))
    return out
