"""`coral evaluate`: run Coral's experiments and write a markdown report with PNG plots.

Sections (each can be selected on its own):

1. cost: cost to meet demand at several demand scales, Coral against every baseline, and a
   simulation of Coral's plan at 1x (SLO attainment, goodput).
2. goodput: served req/s under the scenario's availability levels, Coral against baselines.
3. solve: allocation solve time as the cluster (availability and demand) grows.
4. helix: Helix's cluster for one model, no-SLO placement against Coral's SLO placement.
5. adapt: a timeline replayed period by period (cost and served demand over time).
6. deploy: the cost of deployability on vLLM (`--engine vllm` against `--engine coral`).

Everything is computed from the project's performance model and price catalog, not measured
on GPUs; the report says which numbers are approximate. The sections live in
`coral.evaluation.sections`, what they share in `coral.evaluation.common`; this module runs
them and writes the report with its headline.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from coral.errors import InputError
from coral.evaluation.common import (
    EvalConfig,
    EvalContext,
    Evaluation,
    PAPER_COST_RATIO,
    PAPER_GOODPUT_RATIO,
    SECTIONS,
    Section,
    md_table,
    num,
    pct,
    slo_held,
)
from coral.evaluation.sections import RUNNERS


def _headline(head: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    coral = head.get("coral_cost")
    bl = head.get("baselines_cost", {})
    if coral and coral > 0:
        homo = bl.get("homo")
        if homo:
            rows.append(("Cost vs homogeneous replicas", f"{PAPER_COST_RATIO}x cheaper",
                         f"{homo[0] / coral:.2f}x cheaper (homo ${homo[0]:,.0f}/h serving "
                         f"{pct(homo[1])}; Coral ${coral:,.0f}/h serving "
                         f"{pct(head.get('coral_served'))}; `{head.get('scenario')}` 1x; homo "
                         "is the paper's greedy Homo)"))
        joint = bl.get("homo-joint")
        if joint:
            rows.append(("Cost vs homogeneous replicas, one joint ILP", "-",
                         f"{joint[0] / coral:.2f}x cheaper (homo-joint ${joint[0]:,.0f}/h "
                         f"serving {pct(joint[1])})"))
        full = {b: c for b, (c, f) in bl.items() if f >= 1 - 1e-6 and c > 0}
        if full:
            b = min(full, key=full.__getitem__)
            rows.append(("Cost vs best baseline meeting all demand", "-",
                         f"{full[b] / coral:.2f}x cheaper than {b}"))
    scarce = head.get("goodput", {}).get("scarce")
    if scarce:
        c = scarce.get("coral", 0.0)
        others = {b: v for b, v in scarce.items() if b != "coral"}
        parts = []
        if others.get("homo", 0) > 0:
            parts.append(f"{c / others['homo']:.2f}x vs homo")
        if others:
            best = max(others, key=others.__getitem__)
            if others[best] > 0:
                parts.append(f"{c / others[best]:.2f}x vs best baseline ({best})")
        rows.append(("Goodput when GPUs are scarce", f"{PAPER_GOODPUT_RATIO}x more",
                     "; ".join(parts) + f" (Coral {c:,.1f} req/s)" if parts else "-"))
    solve = [v for v in (head.get("solve_max_s"), head.get("adapt_solve_max_s")) if v]
    if solve:
        rows.append(("Re-plan time", "seconds", f"at most {max(solve):.1f} s per allocation "
                     "solve (sections 3 and 5)"))
    sim = head.get("sim")
    if sim:
        rows.append(("SLO attainment of Coral's plan (simulated)", "-",
                     f"{pct(sim['slo_attainment'])}, goodput "
                     f"{num(sim['goodput_tokens_per_s'], ',.0f')} tok/s"))
    sims = head.get("sims") or {}
    if sim and slo_held(sim):
        coral = sim["cost_per_hour"]
        held = {b: v["cost_per_hour"] for b, v in sims.items()
                if b != "coral" and "error" not in v and slo_held(v)}
        if held:
            b = min(held, key=held.__getitem__)
            rows.append(("Cost vs cheapest baseline holding every SLO in simulation", "-",
                         f"{held[b] / coral:.2f}x cheaper than {b}"))
        elif sims:
            rows.append(("Cost vs cheapest baseline holding every SLO in simulation", "-",
                         "no baseline's plan held every model's SLO in simulation"))
    for name, (coral, vllm, met) in head.get("deploy", {}).items():
        if coral > 0:
            rows.append((f"Cost of deployability on vLLM (`{name}`)", "-",
                         f"{vllm / coral:.2f}x Coral's cost"
                         + ("" if met else ", and short of demand")))
    return rows


def write_report(cfg: EvalConfig, sections: list[Section],
                 headline: list[tuple[str, str, str]], seconds: float) -> Path:
    lines = ["# Coral evaluation", "",
             f"Mode: {'quick' if cfg.quick else 'full'}; templates n_max {cfg.nmax}; "
             f"{cfg.workers} worker(s); ran in {seconds:.0f} s. All figures come from the "
             "performance model, the price catalog and the event simulator, not from GPUs; "
             "they are approximate, and n_max below the scenarios' own limit can only make "
             "Coral's plans dearer.", "",
             "## Headline", ""]
    if headline:
        lines += md_table(["claim", "paper", "measured here"], headline)
    else:
        lines += ["(no headline figures: the sections they come from were not run)", ""]
    for s in sections:
        lines += [f"## {s.title}", ""] + s.body
    path = cfg.out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def evaluate(cfg: EvalConfig, say: Callable[[str], None] = lambda _m: None) -> Evaluation:
    """Run the selected sections and write `cfg.out/report.md`."""
    unknown = [s for s in cfg.sections if s not in RUNNERS]
    if unknown:
        raise InputError(f"unknown section(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(SECTIONS)}")
    t0 = time.perf_counter()
    cfg.out.mkdir(parents=True, exist_ok=True)
    ctx = EvalContext(cfg, say)
    head: dict[str, Any] = {}
    sections: list[Section] = []
    for name in SECTIONS:
        if name not in cfg.sections:
            continue
        t1 = time.perf_counter()
        try:
            sec = RUNNERS[name](ctx, head)
        except Exception as exc:  # noqa: BLE001 - one failed section leaves the report
            sec = Section(f"{name} (failed)", [f"Section failed: `{type(exc).__name__}: {exc}`",
                                               ""])
        sec.body.append(f"_Section time: {time.perf_counter() - t1:.0f} s._")
        sec.body.append("")
        sections.append(sec)
        say(f"[{name}] done in {time.perf_counter() - t1:.0f} s")
    headline = _headline(head)
    seconds = time.perf_counter() - t0
    report = write_report(cfg, sections, headline, seconds)
    return Evaluation(cfg, sections, headline, report, seconds)
