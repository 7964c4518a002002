"""The tables of `coral evaluate --paper`: one per claim of the paper's "Results", each row
the paper's figure, ours from this run and ours / paper (`paper_claims.Row`), with the
plots and the measured details under them. Presentation only: the runs are
`paper_runs.run_case` and `paper_studies`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from coral.evaluation.common import bar_plot, md_table, num, pct, pyplot
from coral.evaluation.paper_claims import (
    PAPER_ALONE,
    PAPER_COST,
    PAPER_HELIX,
    PAPER_INIT_SHARE,
    PAPER_PLATEAU,
    PAPER_SCARCE,
    PAPER_SIM_ERROR,
    Row,
)
from coral.evaluation.paper_runs import CaseRun
from coral.evaluation.paper_studies import SIM_ERROR, HelixStudy, Sensitivity

ROW_HEADER = ["figure", "paper", "ours", "ours / paper", "note"]
SETUP = {"paper-core": "core", "paper-extended": "extended"}


@dataclass
class Claim:
    """One claim's table and what goes under it."""

    title: str
    rows: list[Row] = field(default_factory=list)
    body: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"## {self.title}", ""]
        if self.rows:
            out += md_table(ROW_HEADER, [r.cells() for r in self.rows])
        return out + self.body


def per_model_usd(instances: Sequence) -> dict[str, float]:
    out: dict[str, float] = {}
    for inst in instances:
        out[inst.model] = out.get(inst.model, 0.0) + inst.usd_per_hour * inst.count
    return out


def methods_table(case: CaseRun) -> list[str]:
    """Every method of a case: cost (provisioning + amortised start-up), served share,
    simulated goodput and the worst model's SLO attainment."""
    rows = []
    coral = case.methods["coral"]
    for name, m in case.methods.items():
        ratio = "-" if name == "coral" else f"{m.cost_usd_per_hour / coral.cost_usd_per_hour:.2f}x"
        goodput, worst = num(m.goodput_tokens_per_s, ",.0f"), pct(m.min_attainment)
        if not m.simulated:
            # a plan with nothing to simulate is not a cheaper plan: say what it serves
            goodput, worst = "not simulated", "-"
            ratio = (f"not comparable: {ratio} serving {pct(m.served_under_slo)} of its worst "
                     "model's demand under the SLO")
        rows.append([name, num(m.cost_usd_per_hour), num(m.provisioning_usd_per_hour),
                     num(m.init_usd_per_hour), f"{m.demand_scale:.3f}", goodput, worst, ratio])
    head = [f"`{case.scenario}` {case.level}: {case.epochs} epochs of {case.epoch_s:g} s, "
            f"Coral in mode {case.coral_mode}, {case.seconds:.0f} s to run", ""]
    return head + md_table(["method", "$/hour", "nodes $/hour", "start-up $/hour (60 min)",
                            "demand x", "goodput tok/s (sim)", "worst model SLO",
                            "cost / Coral"], rows)


def value_table(case: CaseRun) -> list[str]:
    """Why the ratios are what they are: per model, the best value of one aggregated instance
    per GPU family and of mixed nodes, and how much mixing gains over the best family."""
    fams = sorted({f for row in case.value.values() for f in row if f != "mixed"}) + ["mixed"]
    rows = []
    for model, row in case.value.items():
        best = min((v for f, v in row.items() if f != "mixed"), default=math.nan)
        pick = min((f for f in row if f != "mixed"), key=row.__getitem__, default="-")
        gain = best / row["mixed"] if row.get("mixed") else math.nan
        rows.append([model, *(num(row.get(f, math.nan), ",.3f") for f in fams), pick,
                     "-" if not math.isfinite(gain) else f"{gain:.2f}x"])
    return (["Least $/hour per req/s of one aggregated instance (Coral's templates), by GPU "
             "family: where one family is the best value for every model, a plan of one "
             "family per replica (Homo) is close to Coral's, and the ratios stay below the "
             "paper's.", ""]
            + md_table(["model", *fams, "best family", "best family / mixed"], rows))


def value_note(case: CaseRun) -> str:
    """One family the best value for most models: the measurement behind a cost ratio below
    the paper's (the value table under the default level's claim)."""
    picks = [min((f for f in row if f != "mixed"), key=row.__getitem__)
             for row in case.value.values() if any(f != "mixed" for f in row)]
    if not picks:
        return ""
    top = max(set(picks), key=picks.count)
    return (f"{top} is the best value per req/s for {picks.count(top)} of {len(picks)} models "
            "(value table, default level)")


def _cost_rows(case: CaseRun, label: str) -> list[Row]:
    ph, pc, _ = PAPER_COST[(case.scenario, case.level)]
    rows = []
    for name, b, p in (("Homo", "homo", ph), ("Cauchy", "cauchy", pc)):
        r = case.ratio(b)
        rows.append(Row(f"{label}: cost, {name} / Coral", p, r,
                        note=value_note(case) if r < p else ""))
    return rows + [Row(f"{label}: cost, joint Homo / Coral (not in the paper)", math.nan,
                       case.ratio("homo-joint"))]


def scarce_note(case: CaseRun, baseline: str) -> str:
    """Under the rule each method serves its own share of the demand: cost per goodput is
    what compares them."""
    b, c = case.methods.get(baseline), case.methods["coral"]
    if b is not None and b.demand_scale <= 0:
        return (f"{baseline} meets no uniform share of the demand (factor 0: a model it "
                "cannot serve at all within the supply), so the rule leaves it no plan")
    if b is None or not (b.goodput_tokens_per_s > 0 and c.goodput_tokens_per_s > 0):
        return ""
    per = ((b.cost_usd_per_hour / b.goodput_tokens_per_s)
           / (c.cost_usd_per_hour / c.goodput_tokens_per_s))
    return (f"{baseline} at demand x{b.demand_scale:.3f}, Coral x{c.demand_scale:.3f}: "
            f"$/hour per goodput tok/s {baseline} / Coral = {per:.2f}x")


def claim_default(cases: dict[tuple[str, str], CaseRun]) -> list[Claim]:
    out = []
    for scen in ("paper-core", "paper-extended"):
        case = cases.get((scen, "default"))
        title = f"Default availability, {SETUP[scen]}: cost ratios and ILP time"
        if case is None:
            out.append(Claim(title, body=["Not run (`--quick` runs the core setup only).", ""]))
            continue
        c = Claim(title, _cost_rows(case, SETUP[scen]))
        _, _, ilp = PAPER_COST[(scen, "default")]
        solves = case.methods["coral"].solve_s
        c.rows.append(Row("Coral's ILP time per epoch (mean; paper: Gurobi, 32 cores; ours: "
                          "HiGHS, 2 cores)", ilp, sum(solves) / len(solves), "s"))
        plans = case.methods["coral"].plan_s
        c.rows.append(Row("Coral's planning per epoch (mean; its three modes)", ilp,
                          sum(plans) / len(plans), "s"))
        model, ph, pc = PAPER_ALONE[scen]
        split = {n: per_model_usd(m.instances) for n, m in case.methods.items()}
        cm = split["coral"].get(model, 0.0)
        row = case.value.get(model, {})
        fam = min((f for f in row if f != "mixed"), key=row.__getitem__, default=None)
        why = (f"{model}: {fam} the best value per req/s, mixed nodes "
               f"{row['mixed'] / row[fam]:.2f}x its $/hour per req/s (value table)"
               if fam and row.get("mixed") else "")
        for b, p in (("homo", ph), ("cauchy", pc)):
            r = split[b].get(model, 0.0) / cm if cm > 0 else math.nan
            c.rows.append(Row(f"{model} alone: {b} / Coral", p, r, note=why if r < p else ""))
        c.body += methods_table(case)
        models = sorted(split["coral"])
        c.body += ["Each plan's $/hour per model (last epoch):", ""]
        c.body += md_table(["method", *models], [[n, *(num(s.get(m, 0.0)) for m in models)]
                                                 for n, s in split.items() if s])
        c.body += value_table(case)
        c.body += [f"- {n}" for n in case.notes] + ([""] if case.notes else [])
        out.append(c)
    return out


def claim_scarce(cases: dict[tuple[str, str], CaseRun],
                 default: dict[str, CaseRun]) -> list[Claim]:
    out = []
    for scen in ("paper-core", "paper-extended"):
        case = cases.get((scen, "scarce"))
        title = f"Scarce availability, {SETUP[scen]}: cost and goodput under the scarcity rule"
        if case is None:
            out.append(Claim(title, body=["Not run.", ""]))
            continue
        ch, gh, cc, gc, ilp, worst, over = PAPER_SCARCE[scen]
        coral = case.methods["coral"]
        g = {n: case.ratio(n, "goodput") for n in case.methods}
        rows = []
        for name, b, pcost, pgood in (("Homo", "homo", ch, gh), ("Cauchy", "cauchy", cc, gc)):
            r, gr = case.ratio(b), (1 / g[b] if g.get(b) else math.nan)
            note = scarce_note(case, b) if (r < pcost or gr < pgood) else ""
            rows += [Row(f"cost, {name} / Coral", pcost, r, note=note if r < pcost else ""),
                     Row(f"goodput, Coral / {name}", pgood, gr, note=note if gr < pgood else "")]
        rows += [Row("Coral's ILP time per epoch (mean; the final plan's allocation solve)",
                     ilp, sum(coral.solve_s) / len(coral.solve_s), "s"),
                Row("Coral's planning per epoch, mean (every mode and the uniform rule's "
                    "solves)", ilp, sum(coral.plan_s) / len(coral.plan_s), "s"),
                Row("Coral's planning, worst epoch", worst, max(coral.plan_s), "s")]
        d = default.get(scen)
        rows.append(Row("Coral's cost over its default-level cost", over,
                        coral.cost_usd_per_hour / d.methods["coral"].cost_usd_per_hour
                        if d else math.nan))
        c = Claim(title, rows)
        c.body += methods_table(case)
        c.body += ["Goodput is simulated: every method's plan at the uniform share of the "
                   "demand it meets (demand x), requests meeting the SLO. The planning time "
                   "is the wall time of all of Coral's allocation solves in the epoch: every "
                   "mode, at full demand and through the uniform rule's bisection.", ""]
        out.append(c)
    return out


def claim_imbalance(cases: dict[tuple[str, str], CaseRun]) -> list[Claim]:
    out = []
    for level, name in (("large-heavy", "Large-Heavy"), ("small-heavy", "Small-Heavy")):
        c = Claim(f"{name} demand: cost ratios")
        for scen in ("paper-extended", "paper-core"):
            case = cases.get((scen, level))
            if case is None:
                c.body += [f"{SETUP[scen]}: not run.", ""]
                continue
            c.rows += _cost_rows(case, SETUP[scen])
            c.body += methods_table(case)
        out.append(c)
    return out


def claim_init(cases: dict[tuple[str, str], CaseRun]) -> Claim:
    c = Claim("Initialization cost")
    rows = []
    for (scen, level), case in cases.items():
        m = case.methods["coral"]
        rows.append([f"`{scen}` {level}", pct(m.init_share), pct(m.replan_init_share),
                     num(m.init_usd_per_hour), sum(e.started for e in m.epochs[1:])])
    default = [case.methods["coral"] for (s, lv), case in cases.items() if lv == "default"]
    if default:
        worst = max(m.replan_init_share for m in default)
        first = max(m.init_share for m in default)
        c.rows.append(Row("amortised start-up share of the hourly cost, re-plans (default "
                          "levels, worst)", PAPER_INIT_SHARE, worst, "%",
                          "upper bound in the paper"))
        c.rows.append(Row("the same with the first deployment's start-ups", PAPER_INIT_SHARE,
                          first, "%", "each instance's price over its 300 s start-up"))
    c.body += md_table(["case", "start-ups / $/hour", "re-plans only", "start-up $/hour",
                        "instances started by re-plans"], rows)
    c.body += ["The demand is the same in every epoch, so Coral's re-plans keep the running "
               "deployment: the penalty K makes a new instance dearer than keeping one.", ""]
    return c


def claim_helix(h: HelixStudy | None, out_dir: Path) -> Claim:
    c = Claim("Against Helix on Helix's cluster")
    if h is None:
        c.body += ["Not run.", ""]
        return c
    served = h.coral_max_rps
    share = served / h.demand_rps if h.demand_rps > 0 else math.nan
    cheaper = 1 - h.coral_max_cost / h.cluster_usd_per_hour
    short = (f"Coral serves {served:.2f} of the {h.demand_rps:g} req/s under the SLO "
             "(the perf model's ceiling on this cluster)" if share < 1 - 1e-6 else "")
    c.rows.append(Row("Coral's cost below Helix's (whole cluster)", PAPER_HELIX[0], cheaper,
                      "%", short))
    helix_rps = h.helix["no_slo"] if h.helix else math.nan
    more = served / helix_rps - 1 if helix_rps and helix_rps > 0 else math.nan
    c.rows.append(Row("Coral's throughput above Helix's (both planned: Coral under the SLO, "
                      "Helix without it)", PAPER_HELIX[1], more, "%", _helix_note(h)))
    nodes = ", ".join(f"{n} {g}" for g, n in sorted(h.coral_nodes.items()))
    att = h.coral_max_sim.get("slo_attainment") if h.coral_max_sim else None
    c.body += [f"Cluster: {h.cluster_nodes} nodes, ${h.cluster_usd_per_hour:,.2f}/hour. "
               f"Coral's plan at the paper's {h.demand_rps:g} req/s rents {nodes} "
               f"(${h.coral_cost_usd_per_hour:,.2f}/hour); its most served under the SLO "
               f"on the whole cluster is {served:.2f} req/s (${h.coral_max_cost:,.2f}/hour), "
               f"simulated at that rate for {h.sim_s:g} s: SLO attainment {pct(att)} "
               f"({num(h.coral_max_sim.get('goodput_tokens_per_s'), ',.0f')} goodput tok/s; "
               "a request of 211 output tokens at a TPOT near 730 ms runs for minutes, so "
               "those still running at the end count as misses).", ""]
    if h.helix:
        hx = h.helix
        proven = ("optimal" if hx["status"] == "optimal" else
                  f"the best found in the time limit, within {pct(hx['gap'])} of the optimum: "
                  f"no placement exceeds {num(hx['bound'])} req/s")
        c.body += [f"Helix's placement ({h.helix_cluster_note}): {num(hx['no_slo'])} req/s "
                   f"without an SLO on {hx['nodes_used']} nodes ({proven}; warm start "
                   f"{num(hx['warm_start'])} req/s; MILP of {hx['milp']}), of which "
                   f"{num(hx['under_slo'])} req/s ({pct(hx['share'])}) on paths meeting the "
                   f"SLO; solved in {hx['seconds']:.0f} s.", ""]
    else:
        c.body += [f"Helix's placement on {h.helix_cluster_note}: no figure.", ""]
    c.body += ["Helix's placement is our reimplementation of its max-flow placement (a MILP "
               "over layer boundaries with identical nodes aggregated, no latency bound; "
               "`coral.baselines.helix_cluster`), on Coral's operating points and solved by "
               "HiGHS under a time limit, not Helix's own code; the paper sets Coral beside "
               "the figures Helix's paper reports.", ""]
    return c


def _helix_note(h: HelixStudy) -> str:
    """The throughput row's note: how far Helix's figure is from proven, and what meets the
    SLO."""
    if not h.helix:
        return "Helix's placement did not finish"
    hx = h.helix
    note = f"Helix {num(hx['no_slo'])} req/s, {pct(hx['share'])} of it meeting the SLO"
    if hx["status"] != "optimal" and hx["bound"] > 0:
        note += (f"; not proven optimal (gap {pct(hx['gap'])}): against its bound "
                 f"{num(hx['bound'])} req/s Coral is {h.coral_max_rps / hx['bound'] - 1:+.0%}")
    return note


def claim_sensitivity(s: Sensitivity | None, out_dir: Path) -> Claim:
    c = Claim("Sensitivity of the template library to N_max and rho")
    if s is None or not s.points:
        c.body += ["Not run.", ""]
        return c
    best = max(p.best_tokens_per_usd for p in s.points)
    plateau = min((p for p in s.points if p.best_tokens_per_usd >= best * 0.99),
                  key=lambda p: (p.nmax, p.rho))
    c.rows.append(Row("N_max where the best goodput/USD reaches 99 % of the grid's best",
                      PAPER_PLATEAU[0], plateau.nmax, ""))
    c.rows.append(Row("rho there", PAPER_PLATEAU[1], plateau.rho, ""))
    c.body += md_table(["N_max", "rho", "candidates", "templates", "build s",
                        "best prompt tok/s per $/hour"],
                       [[p.nmax, f"{p.rho:g}", f"{p.candidates:,}", f"{p.templates:,}",
                         num(p.build_s, ",.1f"), num(p.best_tokens_per_usd, ",.0f")]
                        for p in s.points])
    if s.skipped:
        c.body += ["Skipped (the study's time budget was spent): "
                   + "; ".join(s.skipped) + ".", ""]
    fig = _sensitivity_plot(s, out_dir / "paper_sensitivity.png")
    c.body += [f"![sensitivity]({fig.name})", ""]
    return c


def _sensitivity_plot(s: Sensitivity, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for rho in sorted({p.rho for p in s.points}):
        pts = sorted((p for p in s.points if p.rho == rho), key=lambda p: p.nmax)
        xs = [p.nmax for p in pts]
        for ax, ys in zip(axes, ([p.templates for p in pts], [p.build_s for p in pts],
                                 [p.best_tokens_per_usd for p in pts])):
            ax.plot(xs, ys, marker="o", label=f"rho {rho:g}")
    for ax, t in zip(axes, ("templates kept", "build time, s", "best prompt tok/s per $/h")):
        ax.set_xlabel("N_max")
        ax.set_title(t)
    axes[0].set_yscale("symlog")
    axes[1].set_yscale("symlog")
    axes[2].legend(fontsize=8)
    fig.suptitle(f"{s.model} prefill library, paper-extended")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def claim_simulator() -> Claim:
    c = Claim("Simulator against real runs")
    for run in SIM_ERROR:
        c.rows.append(Row(f"{run.engine}: prefill (TTFT p50) mean error", PAPER_SIM_ERROR[0],
                          run.prefill_error, "%"))
        c.rows.append(Row(f"{run.engine}: decode (TPOT p50) mean error", PAPER_SIM_ERROR[1],
                          run.decode_error, "%"))
    c.body += ["Not rerun here (each needs a runtime and minutes per rate): the ratios sim / "
               "served recorded in benchmarks/results/simulator-vs-runtime.md, mean "
               "|ratio - 1| over the rates. "
               "Sources: " + "; ".join(f"{r.engine}: {r.source}" for r in SIM_ERROR) + ". "
               "The paper's error is against GPU runs of its models; ours against CPU runs "
               "of SmolLM2-135M.", ""]
    return c


def slo_claim(cases: dict[tuple[str, str], CaseRun]) -> Claim:
    """Every plan's worst model SLO attainment (the done-when asks >= 99 % at default)."""
    c = Claim("SLO attainment of every simulated plan (worst model)")
    names = sorted({n for case in cases.values() for n in case.methods})
    c.body += md_table(["case", *names],
                       [[f"`{s}` {lv}", *(pct(case.methods[n].min_attainment)
                                          if n in case.methods else "-" for n in names)]
                        for (s, lv), case in cases.items()])
    return c


def cost_plot(cases: dict[tuple[str, str], CaseRun], path: Path) -> Path:
    labels = [f"{SETUP.get(s, s)} {lv}" for s, lv in cases]
    series = {b: [c.ratio(b) for c in cases.values()] for b in ("homo", "homo-joint", "cauchy")}
    return bar_plot(path, labels, series, "baseline $/hour / Coral's",
                    "Cost of the baselines over Coral's (simulated runs)")
