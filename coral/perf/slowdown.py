"""A plan under perturbed GPU speeds: the perf model with some GPU types slower than modelled.

`coral simulate PLAN --slowdown l4=1.3,t4=1.3` runs the plan as it is (same instances, layer
splits and batches) while every iteration on an L4 or T4 node takes 1.3x what the perf model
says. The factor multiplies the whole iteration (compute, memory and the per-iteration
overhead) of a node of that GPU type: the error of a GPU type's model is the question, and
the NIC between nodes is not part of it. KV-cache room is unchanged (memory sizes are known).

A card's prefill and decode can be slowed apart (`l4:prefill=1.08,l4:decode=1.07`): the perf
model errs by a different amount in each phase (`coral.perf.uncertainty`). An iteration of
one phase takes that phase's factor; a mixed one (a prefill chunk beside decodes) takes the
mean of the two weighted by the time each part alone takes, so it lies between the two and is
each phase's own factor where the other part is empty.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Union

from coral.errors import CoralError

#: The phases a card can be slowed apart in (`GPU:PHASE=FACTOR`).
PHASES = ("prefill", "decode")


class SlowdownError(CoralError, ValueError):
    """A --slowdown specification that cannot be applied (the message says why)."""


@dataclass(frozen=True)
class PhaseSlowdown:
    """How many times longer than modelled a GPU type's prefill and its decode work take."""

    prefill: float
    decode: float

    @classmethod
    def of(cls, value: "Slowdown") -> "PhaseSlowdown":
        """`value` per phase: a number slows both phases alike."""
        return value if isinstance(value, PhaseSlowdown) else cls(float(value), float(value))

    @property
    def uniform(self) -> bool:
        return self.prefill == self.decode

    @property
    def worst(self) -> float:
        return max(self.prefill, self.decode)

    def text(self) -> str:
        """'1.2x', or 'prefill 1.08x, decode 1.07x'."""
        if self.uniform:
            return f"{self.prefill:.4g}x"
        return f"prefill {self.prefill:.4g}x, decode {self.decode:.4g}x"


#: A card's slowdown: one factor for every iteration, or one per phase.
Slowdown = Union[float, PhaseSlowdown]


def simplest(value: Slowdown) -> Slowdown:
    """`value` as a number where both phases share it (how plan files and keys write it)."""
    s = PhaseSlowdown.of(value)
    return float(s.prefill) if s.uniform else s


def slowdown_json(value: Slowdown) -> float | dict[str, float]:
    """`value` as a plan file writes it: a number, or {"prefill": P, "decode": D}."""
    s = simplest(value)
    return s if isinstance(s, float) else {"prefill": s.prefill, "decode": s.decode}


def slowdown_from_json(raw: Any) -> Slowdown:
    """`slowdown_json`'s value back; `ValueError` saying what is wrong otherwise."""
    if isinstance(raw, Mapping):
        if set(raw) != set(PHASES):
            raise ValueError(f"must be a number or map each of {', '.join(PHASES)} to a "
                             f"number, got keys {sorted(map(str, raw))}")
        values = [raw[ph] for ph in PHASES]
    else:
        values = [raw]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v <= 0:
            raise ValueError(f"a slowdown factor must be a finite number > 0, got {v!r}")
    return (float(raw) if not isinstance(raw, Mapping)
            else simplest(PhaseSlowdown(*(float(v) for v in values))))


def slowdown_spec(gpu: str, value: Slowdown) -> str:
    """The `--slowdown` text that slows `gpu` by `value` (exact to 12 digits)."""
    s = PhaseSlowdown.of(value)
    if s.uniform:
        return f"{gpu}={s.prefill:.12g}"
    return f"{gpu}:prefill={s.prefill:.12g},{gpu}:decode={s.decode:.12g}"


def parse_slowdown(text: str, gpu_names: Mapping[str, Any] | list[str]) -> dict[str, Slowdown]:
    """'l4=1.3,t4=1.3' -> {'l4': 1.3, 't4': 1.3}; 'l4:prefill=1.1,l4:decode=1.05' ->
    {'l4': PhaseSlowdown(1.1, 1.05)} (a phase not given is not slowed); names must be catalog
    GPU types."""
    known = sorted(gpu_names)
    given: dict[str, dict[str, float]] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name, _, phase = (x.strip() for x in name.partition(":"))
        if not sep or not name or not value.strip():
            raise SlowdownError(f"--slowdown: {part!r} is not GPU=FACTOR (e.g. l4=1.3) or "
                                "GPU:PHASE=FACTOR (e.g. l4:prefill=1.1)")
        if name not in known:
            raise SlowdownError(f"--slowdown: unknown GPU type {name!r}; known: "
                                f"{', '.join(known)}")
        if ":" in part.partition("=")[0] and phase not in PHASES:
            raise SlowdownError(f"--slowdown: {part!r}: the phase must be one of "
                                f"{', '.join(PHASES)}, got {phase!r}")
        phases = PHASES if not phase else (phase,)
        card = given.setdefault(name, {})
        if any(ph in card for ph in phases):
            raise SlowdownError(f"--slowdown: {name!r}"
                                + (f" ({phase})" if phase else "") + " is given twice")
        try:
            factor = float(value)
        except ValueError:
            raise SlowdownError(f"--slowdown: factor of {name!r} must be a number, got "
                                f"{value.strip()!r}") from None
        if not math.isfinite(factor) or factor <= 0:
            raise SlowdownError(f"--slowdown: factor of {name!r} must be a finite number > 0 "
                                f"(1.3 = 30 % slower), got {value.strip()}")
        card.update({ph: factor for ph in phases})
    if not given:
        raise SlowdownError("--slowdown: give at least one GPU=FACTOR (e.g. l4=1.3)")
    return {name: simplest(PhaseSlowdown(card.get("prefill", 1.0), card.get("decode", 1.0)))
            for name, card in given.items()}


class SlowedPerf:
    """`perf` with every iteration on a node of a GPU type in `factors` that many times longer
    (per phase where a card's factor is a `PhaseSlowdown`; see the module docstring).

    Everything else (memory, KV room, breakdowns' sources) is the wrapped model's."""

    def __init__(self, perf: Any, catalog: Any, factors: Mapping[str, Slowdown]):
        self._perf = perf
        self._catalog = catalog
        self.factors = dict(factors)
        self._by_node: dict[str, PhaseSlowdown] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._perf, name)

    def factor(self, node: Any) -> PhaseSlowdown:
        """The slowdown of a node type (a name or a NodeType)."""
        key = node if isinstance(node, str) else node.name
        f = self._by_node.get(key)
        if f is None:
            f = PhaseSlowdown.of(self.factors.get(self._catalog.gpu_of(node).name, 1.0))
            self._by_node[key] = f
        return f

    def iteration_seconds(self, model: Any, node: Any, layers: int, prefill_tokens: int = 0,
                          decode_batch: int = 0, context_tokens: int = 0, *,
                          first_stage: bool = False, last_stage: bool = False) -> float:
        def base(p: int, b: int, c: int) -> float:
            return self._perf.iteration_seconds(model, node, layers, p, b, c,
                                                first_stage=first_stage, last_stage=last_stage)

        s = self.factor(node)
        t = base(prefill_tokens, decode_batch, context_tokens)
        if s.uniform or not decode_batch:
            return t * s.prefill
        if not prefill_tokens:
            return t * s.decode
        t_prefill, t_decode = base(prefill_tokens, 0, 0), base(0, decode_batch, context_tokens)
        return t * (s.prefill * t_prefill + s.decode * t_decode) / (t_prefill + t_decode)
