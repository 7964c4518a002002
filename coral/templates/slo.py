"""Latency SLO and workload mix of one model: what a serving template must meet.

A `SloSpec` carries both the targets (TTFT, TPOT at a percentile) and the mean request shape
(input and output tokens) that the operating points are computed for. Defaults per model come
from `data/default_slos.yaml` (see the comments there for where the figures come from).

The planner predicts *mean-shaped* iterations against the targets; the percentile is recorded
so that the simulator judges a plan at the same percentile.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo,
                      field_validator)

from coral.errors import CoralError
from coral.catalog.schema import ModelArch


class SloError(CoralError, ValueError):
    """An SLO or workload value is missing, malformed or impossible."""


class SloSpec(BaseModel):
    """TTFT/TPOT targets at a percentile, plus the mean request shape they apply to."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    tpot_s: float = Field(gt=0, le=60, description="Time per output token target, seconds.")
    ttft_s: float = Field(gt=0, le=3600, description="Time to first token target, seconds.")
    percentile: float = Field(default=0.9, gt=0, le=1, description="Quantile the targets hold at.")
    input_tokens: int = Field(default=1024, ge=1, le=1_000_000, description="Mean prompt tokens.")
    output_tokens: int = Field(default=256, ge=1, le=1_000_000, description="Mean output tokens.")

    @field_validator("ttft_s")
    @classmethod
    def _ttft_not_below_tpot(cls, ttft_s: float, info: ValidationInfo) -> float:
        # a field validator, so that the error names ttft_s (tpot_s is validated first)
        tpot_s = info.data.get("tpot_s")
        if tpot_s is not None and ttft_s < tpot_s:
            raise ValueError(
                f"ttft_s ({ttft_s:g} s) is below tpot_s ({tpot_s:g} s): the first token "
                "cannot come faster than one decode step; to fix: raise ttft_s or lower tpot_s"
            )
        return ttft_s

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> "SloSpec":
        """The checked constructor for an untrusted SLO object (a plan file's, a template
        store's): raises `SloError` with one line per bad field, so that the caller can name
        its file and entry."""
        if not isinstance(values, Mapping):
            raise SloError(
                f"an SLO must map field names to values (got {values!r}); to fix: give an "
                "object such as {\"tpot_s\": 0.1, \"ttft_s\": 2.0}"
            )
        try:
            return cls.model_validate({str(k): v for k, v in values.items()})
        except ValidationError as err:
            lines = []
            for e in err.errors():
                loc = ".".join(str(x) for x in e["loc"]) or "slo"
                lines.append(f"SLO field '{loc}': {e['msg']} (got {e.get('input')!r})")
            raise SloError("; ".join(lines)) from None

    def with_overrides(
        self,
        *,
        tpot_s: float | None = None,
        ttft_s: float | None = None,
        percentile: float | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> "SloSpec":
        """A copy with the given fields replaced (None keeps the field), checked again."""
        changes = {
            "tpot_s": tpot_s,
            "ttft_s": ttft_s,
            "percentile": percentile,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
        }
        merged = {**self.model_dump(), **{k: v for k, v in changes.items() if v is not None}}
        return SloSpec.parse(merged)

    def key(self) -> str:
        """Short stable hash of every field (part of a template library's identity)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def describe(self) -> str:
        return (
            f"TPOT <= {self.tpot_s * 1e3:g} ms, TTFT <= {self.ttft_s:g} s at "
            f"p{self.percentile * 100:g}; mean {self.input_tokens} in / "
            f"{self.output_tokens} out tokens"
        )


Workload = SloSpec
"""The same record seen as the workload mix (mean input/output tokens)."""


@lru_cache(maxsize=1)
def _defaults_doc() -> dict[str, Any]:
    text = (resources.files("coral.templates") / "data" / "default_slos.yaml").read_text()
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or not {"workload", "models", "by_weight_gb"} <= set(doc):
        raise SloError("default_slos.yaml: expected sections workload, models, by_weight_gb")
    return doc


def default_slo(model: ModelArch | str, weight_bytes: float | None = None) -> SloSpec:
    """The default SLO of `model` (a catalog entry, or a name plus its weight bytes)."""
    doc = _defaults_doc()
    name = model if isinstance(model, str) else model.name
    if weight_bytes is None and not isinstance(model, str):
        weight_bytes = float(model.weight_bytes)
    targets = doc["models"].get(name)
    if targets is None:
        if weight_bytes is None:
            raise SloError(f"no default SLO for model {name!r} and its weight size is unknown")
        gb = weight_bytes / 1e9
        for bracket in doc["by_weight_gb"]:
            if gb <= float(bracket["max_weight_gb"]):
                targets = bracket
                break
        else:  # pragma: no cover - the last bracket is unbounded
            targets = doc["by_weight_gb"][-1]
    return SloSpec.parse({
        **doc["workload"],
        "tpot_s": float(targets["tpot_s"]),
        "ttft_s": float(targets["ttft_s"]),
    })


def resolve_slo(
    model: ModelArch,
    *,
    tpot_s: float | None = None,
    ttft_s: float | None = None,
    percentile: float | None = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
) -> SloSpec:
    """The model's default SLO with any of the given fields overridden."""
    for name, value in (("tpot_s", tpot_s), ("ttft_s", ttft_s)):
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
            raise SloError(f"SLO field '{name}': must be a finite number of seconds (got {value!r})")
    return default_slo(model).with_overrides(
        tpot_s=tpot_s,
        ttft_s=ttft_s,
        percentile=percentile,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )
