"""Comparison baselines, built on the same catalog, perf model, templates and allocator as Coral.

- `homo`: homogeneous replicas (`k` copies of one node type), jointly (`homo`) and per model
  on its own (`homo-independent`).
- `melange`: the cheapest mix of single-node replicas.
- `cauchy`: PD-disaggregated units of homogeneous prefill and decode configurations, added
  greedily by tokens per dollar.
- `helix`: one model on a fixed cluster, placed for throughput without the SLO, judged under it.
- `joint`: the monolithic rent-and-place problem on a small pool, solved exhaustively — the
  check that Coral's two-stage decomposition loses nothing.
- `run`: `run_baselines`, every baseline of a scenario in one call.
"""

from coral.baselines.cauchy import MAX_PD_RATIO, PdUnit, UnitTable, cauchy
from coral.baselines.common import BaselineResult, TemplateBuilder
from coral.baselines.helix import (
    NO_SLO_TPOT_S,
    NO_SLO_TTFT_S,
    HelixPlacement,
    helix,
    helix_placement,
    no_slo,
    slo_share,
)
from coral.baselines.homo import (
    homo_independent,
    homo_joint,
    homogeneous_templates,
    is_homogeneous,
)
from coral.baselines.joint import (
    JointInfeasibleError,
    JointModel,
    JointResult,
    joint_optimum,
)
from coral.baselines.melange import melange, single_node_templates
from coral.baselines.run import BASELINES, run_baselines

__all__ = [
    "BASELINES",
    "BaselineResult",
    "HelixPlacement",
    "JointInfeasibleError",
    "JointModel",
    "JointResult",
    "MAX_PD_RATIO",
    "NO_SLO_TPOT_S",
    "NO_SLO_TTFT_S",
    "PdUnit",
    "TemplateBuilder",
    "UnitTable",
    "cauchy",
    "helix",
    "helix_placement",
    "homo_independent",
    "homo_joint",
    "homogeneous_templates",
    "is_homogeneous",
    "joint_optimum",
    "melange",
    "no_slo",
    "run_baselines",
    "single_node_templates",
]
