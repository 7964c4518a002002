"""The paper's figures (Coral, arXiv 2605.04357v1, "Results"; ../shared/PAPER.md) that
`coral evaluate --paper` sets its own beside, and the row type of its tables.

Ratios follow the paper: cost ratios are baseline / Coral ($/hour; above 1: Coral cheaper),
goodput ratios Coral / baseline (above 1: Coral serves more).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: (scenario, level) -> (cost vs Homo, cost vs Cauchy, Coral's ILP time s or NaN).
PAPER_COST: dict[tuple[str, str], tuple[float, float, float]] = {
    ("paper-core", "default"): (1.62, 1.60, 0.24),
    ("paper-extended", "default"): (3.14, 2.66, 9.68),
    ("paper-core", "large-heavy"): (1.82, 1.78, math.nan),
    ("paper-extended", "large-heavy"): (2.79, 3.47, math.nan),
    # "core ~1.1x": the paper gives one figure for both baselines
    ("paper-core", "small-heavy"): (1.1, 1.1, math.nan),
    ("paper-extended", "small-heavy"): (2.34, 1.64, math.nan),
}
#: The model the paper singles out per setup at the default level, with its cost ratios
#: against Homo and Cauchy.
PAPER_ALONE: dict[str, tuple[str, float, float]] = {
    "paper-core": ("qwen3-32b", 2.02, 1.88),
    "paper-extended": ("qwen3-235b-a22b", 4.93, 4.08),
}
#: Scarce level: cost vs Homo, goodput vs Homo, cost vs Cauchy, goodput vs Cauchy, mean ILP
#: time s, worst epoch's ILP time s (NaN: not given), Coral's cost over its default-level cost.
PAPER_SCARCE: dict[str, tuple[float, float, float, float, float, float, float]] = {
    "paper-core": (1.0, 1.24, 1.51, 1.0, 0.11, math.nan, 1.10),
    # "1.52x dearer" than Homo: Homo / Coral = 1 / 1.52
    "paper-extended": (1 / 1.52, 7.64, 1.25, 2.39, 41.0, 120.0, math.nan),
}
#: vs Helix: Coral's cost below Helix's (share), Coral's throughput above Helix's (share).
PAPER_HELIX = (0.21, 0.26)
#: Sensitivity: the (N_max, rho) where the best template's goodput per USD plateaus.
PAPER_PLATEAU = (6, 12.0)
#: Simulator: mean latency error against real runs, prefill and decode.
PAPER_SIM_ERROR = (0.056, 0.072)
#: Initialization: amortised start-up cost below this share of the hourly cost.
PAPER_INIT_SHARE = 0.01


@dataclass(frozen=True)
class Row:
    """One row of a claim's table: the paper's figure, ours from this run, ours / paper."""

    what: str
    paper: float
    ours: float
    unit: str = "x"  # "x" ratio, "s" seconds, "%" share, "" plain
    note: str = ""

    @property
    def vs_paper(self) -> float:
        if not (math.isfinite(self.paper) and math.isfinite(self.ours)) or self.paper == 0:
            return math.nan
        return self.ours / self.paper

    def cells(self) -> list[str]:
        return [self.what, fmt(self.paper, self.unit), fmt(self.ours, self.unit),
                "-" if not math.isfinite(self.vs_paper) else f"{self.vs_paper:.2f}",
                self.note]


def fmt(x: float, unit: str) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    if unit == "x":
        return f"{x:.2f}x"
    if unit == "s":
        return f"{x:.2f} s" if x < 100 else f"{x:,.0f} s"
    if unit == "%":
        return f"{x * 100:.1f} %"
    return f"{x:,.2f}"
