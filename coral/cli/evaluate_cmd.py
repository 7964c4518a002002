"""`coral evaluate`: run Coral's experiments and write a markdown report with plots."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from coral.cli.common import UserError, console, err_console, user_errors


def evaluate(
    quick: Annotated[bool, typer.Option(
        "--quick", help="Smaller runs (n_max 2, core only, demand 1x, 4 timeline periods) "
        "that finish in minutes.")] = False,
    out: Annotated[Path, typer.Option(
        "--out", help="Folder for report.md and the PNG plots.")] = Path("out/evaluate"),
    sections: Annotated[Optional[str], typer.Option(
        "--sections", help="Comma-separated sections to run: cost, goodput, solve, helix, "
        "adapt, deploy (default: all).")] = None,
    templates_dir: Annotated[Path, typer.Option(
        "--templates-dir", help="Root of the template libraries (reused when inputs match).")]
    = Path("out/templates"),
    workers: Annotated[Optional[int], typer.Option(
        "--workers", help="Local processes that build templates (default: one per CPU).")]
    = None,
    paper: Annotated[bool, typer.Option(
        "--paper", help="The paper's evaluation instead: paper-core and paper-extended at "
        "every level, 30 simulated minutes in 6-minute epochs, Helix's cluster, the "
        "N_max/rho sensitivity, the simulator's error; writes OUT/paper.md (with --quick: "
        "the core setup only, shorter epochs, smaller studies).")] = False,
) -> None:
    """Run the cost, goodput, solve-time, Helix-cluster and adaptation experiments and write
    OUT/report.md with tables and PNG plots (with --paper: the paper's evaluation, OUT/paper.md)."""
    from coral.evaluation.common import SECTIONS, EvalConfig
    from coral.evaluation.evaluate import evaluate as run

    if paper:
        _paper(quick, out, sections, templates_dir, workers)
        return
    with user_errors():
        cfg = replace(EvalConfig.preset(quick, out), templates_dir=templates_dir)
        if workers is not None:
            if workers < 1:
                raise UserError(f"--workers must be >= 1, got {workers}")
            cfg = replace(cfg, workers=workers)
        if sections:
            chosen = tuple(s.strip() for s in sections.split(",") if s.strip())
            bad = [s for s in chosen if s not in SECTIONS]
            if bad:
                raise UserError(f"unknown section(s) {', '.join(bad)}; choose from "
                                f"{', '.join(SECTIONS)}")
            cfg = replace(cfg, sections=chosen)

        def say(msg: str) -> None:
            err_console.print(f"[dim]{escape(msg)}[/]", highlight=False, soft_wrap=True)

        result = run(cfg, say=say)
    for claim, paper, measured in result.headline:
        console.print(f"{escape(claim)}: paper {escape(paper)}; here {escape(measured)}",
                      highlight=False)
    console.print(f"wrote {escape(str(result.report))} in {result.seconds:.0f} s",
                  highlight=False)


def _paper(quick: bool, out: Path, sections: Optional[str], templates_dir: Path,
           workers: Optional[int]) -> None:
    """`coral evaluate --paper [--quick]`."""
    import os

    from coral.evaluation.paper import PaperConfig, run_paper

    with user_errors():
        if sections:
            raise UserError("--sections does not apply to --paper: it runs every claim of the "
                            "paper's Results; drop --sections")
        if workers is not None and workers < 1:
            raise UserError(f"--workers must be >= 1, got {workers}")
        cfg = replace(PaperConfig.preset(quick, out), templates_dir=templates_dir,
                      workers=workers or os.cpu_count() or 1)

        def say(msg: str) -> None:
            err_console.print(f"[dim]{escape(msg)}[/]", highlight=False, soft_wrap=True)

        result = run_paper(cfg, say=say)
    console.print(f"wrote {escape(str(result.report))} in {result.seconds:.0f} s",
                  highlight=False)
