"""Comparison baselines, built on the same catalog, perf model, templates and allocator as Coral.

- `homo`: homogeneous replicas (`k` copies of one node type): the paper's greedy per model by
  goodput per USD (`homo`), and one allocation ILP over all models (`homo-joint`).
- `melange`: the cheapest mix of single-node replicas.
- `cauchy`: PD-disaggregated GPU combos (one homogeneous prefill instance feeding several
  homogeneous decode instances), top combos by Token/USD, deployed by Cauchy's ILP.
- `helix`: one model on a fixed cluster, placed for throughput without the SLO, judged under it.
- `joint`: the monolithic rent-and-place problem on a small pool, solved exhaustively — the
  check that Coral's two-stage decomposition loses nothing.
- `scale`: the paper's scarcity rule (`scale_down`): short of demand, every model's demand
  scaled down uniformly until the baseline meets it.
- `run`: `run_baselines`, every baseline of a scenario in one call, each under that rule.
"""

from coral.baselines.cauchy import (
    CANDIDATES_PER_REGION,
    MAX_DECODE_PER_PREFILL,
    PdUnit,
    UnitTable,
    cauchy,
)
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
    HomoStrategy,
    homo_greedy,
    homo_joint,
    homo_strategies,
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
from coral.baselines.scale import scale_down, scaled_scenario

__all__ = [
    "BASELINES",
    "BaselineResult",
    "CANDIDATES_PER_REGION",
    "HelixPlacement",
    "JointInfeasibleError",
    "JointModel",
    "JointResult",
    "HomoStrategy",
    "MAX_DECODE_PER_PREFILL",
    "NO_SLO_TPOT_S",
    "NO_SLO_TTFT_S",
    "PdUnit",
    "TemplateBuilder",
    "UnitTable",
    "cauchy",
    "helix",
    "helix_placement",
    "homo_greedy",
    "homo_joint",
    "homo_strategies",
    "homogeneous_templates",
    "is_homogeneous",
    "joint_optimum",
    "melange",
    "no_slo",
    "run_baselines",
    "scale_down",
    "scaled_scenario",
    "single_node_templates",
]
