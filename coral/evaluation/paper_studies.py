"""The single studies of `coral evaluate --paper`: Helix's cluster, the sensitivity of the
template library to N_max and rho, and the simulator's error against real runs.

- `helix_study`: Coral on Helix's cluster (`data/paper-helix.yaml`) as availability, planned
  and simulated at the paper's 4 req/s (its cost) and at all the demand the cluster can serve
  under the SLO (its throughput), beside Helix's no-SLO placement on the whole cluster
  (`coral.baselines.helix_cluster`: its best placement within the time limit, with the
  proven bound on the optimum).
- `sensitivity_study`: GPT-OSS-120B's prefill library of `paper-extended` built for every
  (N_max, rho) of a grid: templates kept, build time, best template's goodput per USD.
- `SIM_ERROR`: ratios sim / served from the runs recorded in
  benchmarks/results/simulator-vs-runtime.md (Coral's
  runtime and vLLM's CPU build); the runs take a runtime and minutes each, so the report
  reuses the measured figures and names their source.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, Sequence

from coral.evaluation.common import run_in_child, simulate_plan

#: The paper's Helix comparison: model demand (req/s) and the cluster, one entry per node type.
HELIX_SCENARIO = "paper-helix.yaml"
#: Demand multiple that asks for more than the cluster serves: the plan then maximises goodput.
HELIX_FLOOD = 50.0


@dataclass(frozen=True)
class HelixStudy:
    cluster_usd_per_hour: float  # every node of the cluster (what Helix rents)
    cluster_nodes: int
    helix: dict[str, Any] | None  # `_run_helix`'s answer on the cluster used, None: timed out
    helix_cluster_note: str
    coral_cost_usd_per_hour: float  # Coral's plan at the paper's demand
    coral_nodes: dict[str, int]  # node type -> nodes Coral rents at that demand
    coral_sim: dict[str, Any]  # its simulation
    coral_max_rps: float  # Coral's SLO-bound capacity on the whole cluster (planned)
    coral_max_sim: dict[str, Any]  # that plan simulated at its served rate
    coral_max_cost: float
    output_tokens: float
    demand_rps: float
    sim_s: float
    seconds: float


def helix_study(ctx: Any, *, sim_s: float, helix_timeout_s: float,
                say: Callable[[str], None] = lambda _m: None) -> HelixStudy:
    from coral.allocator.scenario.load import load_scenario
    from coral.baselines.scale import scaled_scenario
    from coral.allocator.scenario.load import scenario_slo
    from coral.planning.plan import plan_scenario

    t0 = time.perf_counter()
    path = resources.files("coral.evaluation") / "data" / HELIX_SCENARIO
    sc = load_scenario(str(path), catalog=ctx.catalog).in_mode("auto")
    model = sc.models[0]
    cluster = sorted(sc.availability.items())
    cluster_cost = sum(sc.node_prices[k] * n for k, n in cluster)
    tpl = ctx.templates(sc)
    say(f"[paper] helix: Coral on the cluster at {model.demand_rps:g} req/s")
    options = ctx.options()
    res = plan_scenario(sc, catalog=ctx.catalog, options=options, perf=ctx.perf, templates=tpl,
                        baselines=False)
    sim = simulate_plan(ctx, sc, res, sim_s) if res.instances else {}
    used: dict[str, int] = {}
    for (g, _r), n in res.plan.nodes_used.items():
        used[g] = used.get(g, 0) + int(n)
    flood = scaled_scenario(sc, HELIX_FLOOD)
    say("[paper] helix: Coral's most goodput on the cluster")
    big = plan_scenario(flood, catalog=ctx.catalog, options=options, perf=ctx.perf,
                        templates=tpl, baselines=False)
    served = sum(big.plan.served_rps.values())
    # simulated at the rate it plans to serve (the rest would be turned away)
    at = plan_scenario(scaled_scenario(sc, served / model.demand_rps), catalog=ctx.catalog,
                       options=options, perf=ctx.perf, templates=tpl,
                       baselines=False) if served > 0 else big
    big_sim = simulate_plan(ctx, sc, at, sim_s) if served > 0 and at.instances else {}
    nodes = [g for (g, _r), n in cluster for _ in range(n)]
    note = f"the whole cluster ({len(nodes)} nodes)"
    say(f"[paper] helix: Helix's placement on {len(nodes)} nodes")
    out = run_helix(model.name, nodes, scenario_slo(sc, model.name), helix_timeout_s)
    if out is not None and not out.get("ok"):
        note += f": failed, {out['error']}"
        out = None
    elif out is None:
        note += f": did not finish in {helix_timeout_s:g} s"
    return HelixStudy(cluster_cost, len(nodes), out, note, res.cost_per_hour, used, sim,
                      served, big_sim, at.cost_per_hour, float(model.output_tokens),
                      float(model.demand_rps), sim_s, time.perf_counter() - t0)


def _helix_worker(model: str, nodes: list[str], slo: Any, time_limit_s: float, q: Any) -> None:
    try:
        import highspy

        # a forked child inherits HiGHS's task scheduler without its threads, and a MIP
        # run on it waits for them forever: start a new one
        highspy.Highs.resetGlobalScheduler(True)
        from coral.baselines.helix import no_slo
        from coral.baselines.helix_cluster import cluster_placement
        from coral.catalog import load_catalog
        from coral.templates.builder.parallel import default_perf_factory
        from coral.templates.space.operating_points import shared_tables

        t0 = time.perf_counter()
        cat = load_catalog(())
        tables = shared_tables(default_perf_factory(cat), cat)
        left = time_limit_s - (time.perf_counter() - t0)
        cp = cluster_placement(model, nodes, no_slo(slo), catalog=cat, tables=tables,
                               time_limit_s=left)
        share = cp.slo_share(slo)
        rps = cp.template.throughput_rps
        q.put({"ok": True, "seconds": time.perf_counter() - t0, "no_slo": rps,
               "under_slo": rps * share, "share": share, "status": cp.status.value,
               "gap": cp.gap, "bound": cp.upper_bound,
               "warm_start": float(cp.stats.get("warm_start", math.nan)),
               "milp": (f"{int(cp.stats['cols']):,} columns ({int(cp.stats['integers']):,} "
                        f"integer), {int(cp.stats['rows']):,} rows"),
               "nodes_used": sum(e.count for e in cp.entries)})
    except Exception as exc:  # noqa: BLE001 - reported in the table's note
        q.put({"ok": False, "error": f"{type(exc).__name__}: {exc}"})


#: Share of the study's time limit the placement gets (catalog, operating points, bound and
#: MILP); the rest is slack for the child's start, the path LP and the answer's way back.
HELIX_MILP_SHARE = 0.5


def run_helix(model: str, nodes: list[str], slo: Any, timeout_s: float) -> dict | None:
    """Helix's no-SLO placement of `model` on all of `nodes` (`cluster_placement`, given
    `HELIX_MILP_SHARE` of `timeout_s`: its best placement and the proven gap), judged under
    `slo`, in a child process killed after `timeout_s` (None then)."""
    return run_in_child(_helix_worker, (model, nodes, slo, timeout_s * HELIX_MILP_SHARE),
                        timeout_s)


@dataclass(frozen=True)
class SensitivityPoint:
    nmax: int
    rho: float
    templates: int  # kept
    candidates: int  # combinations enumerated
    build_s: float
    best_tokens_per_usd: float  # best kept template: prompt tokens/s per $/hour


@dataclass
class Sensitivity:
    model: str
    points: list[SensitivityPoint] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def sensitivity_study(ctx: Any, nmaxes: Sequence[int], rhos: Sequence[float], *,
                      model: str = "gpt-oss-120b", budget_s: float = math.inf,
                      say: Callable[[str], None] = lambda _m: None) -> Sensitivity:
    """GPT-OSS-120B's prefill library over `nmaxes` x `rhos`, nothing written to disk, N_max
    by N_max (the library grows with it). Once the study has taken `budget_s`, the grid
    points left are skipped and listed."""
    from coral.allocator.scenario.load import scenario_slo
    from coral.planning.libraries import build_regions
    from coral.templates.builder.build import build_library

    sc = ctx.scenario("paper-extended")
    slo = scenario_slo(sc, model)
    out = Sensitivity(model)
    t_all = time.perf_counter()
    for n in nmaxes:
        for rho in rhos:
            if time.perf_counter() - t_all > budget_s:
                out.skipped.append(f"N_max {n}, rho {rho:g}")
                continue
            t0 = time.perf_counter()
            kept, report = build_library(model, ctx.catalog, slo=slo, mode="prefill",
                                         nmax=n, rho=rho, node_types=sc.node_types,
                                         regions=build_regions(sc),
                                         options=ctx.options().build, out=None,
                                         perf=ctx.perf)
            wall = time.perf_counter() - t0
            best = max((t.throughput_tokens_per_s / t.min_usd_per_hour() for t in kept
                        if t.feasible and t.min_usd_per_hour()), default=0.0)
            cand = int(report.enumeration.get("candidates",
                                              report.enumeration.get("total", 0)))
            out.points.append(SensitivityPoint(n, rho, len(kept), cand, wall, best))
            say(f"[paper] sensitivity N_max {n} rho {rho:g}: {len(kept)} templates, "
                f"{wall:.1f} s, best {best:,.0f} tok/s per $/h")
    return out


@dataclass(frozen=True)
class SimErrorRun:
    """One runtime's comparison: per arrival rate, the simulator's TTFT and TPOT p50 over the
    served ones."""

    engine: str
    source: str  # benchmarks/results/ section and the command
    ttft_ratio: tuple[float, ...]
    tpot_ratio: tuple[float, ...]

    @property
    def prefill_error(self) -> float:
        return sum(abs(r - 1.0) for r in self.ttft_ratio) / len(self.ttft_ratio)

    @property
    def decode_error(self) -> float:
        return sum(abs(r - 1.0) for r in self.tpot_ratio) / len(self.tpot_ratio)


#: Measured: benchmarks/results/simulator-vs-runtime.md. Coral's runtime: "The runtime against
#: the simulator ...", the two-runs-per-rate table, `sim adj.` (the run's own step costs),
#: PP 2 and 3 at 0.3 / 0.7 / 1.1 req/s. vLLM 0.32.0's CPU build: "vLLM's CPU build against the
#: simulator, its speed by decode batch", `sim (profile)`, PP 2 at the same rates.
SIM_ERROR: tuple[SimErrorRun, ...] = (
    SimErrorRun("Coral's runtime (SmolLM2-135M, PP 2 and 3, CPU)",
                "`python benchmarks/sim_vs_runtime.py --stages 2 3 --rates 0.3 0.7 1.1 "
                "--duration 60 --repeats 2`",
                (0.92, 0.89, 0.86, 1.02, 1.00, 0.93), (0.99, 0.89, 0.95, 0.91, 0.95, 0.96)),
    SimErrorRun("vLLM 0.32.0 CPU build (SmolLM2-135M, PP 2)",
                "`python benchmarks/sim_vs_runtime.py --engine vllm --stages 2 --rates 0.3 "
                "0.7 1.1 --duration 45 --repeats 2`",
                (1.03, 1.00, 0.92), (0.99, 0.93, 0.92)),
)
