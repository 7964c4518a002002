"""`coral evaluate --paper`'s report on hand-made runs: each claim's row carries the paper's
figure, ours (cost with start-ups amortised over 60 minutes, goodput from the simulations)
and ours / paper; cases not run say so. The runs themselves are `coral evaluate --paper
--quick`, a CI step of its own."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("matplotlib")

from coral.evaluation.paper import PaperConfig, PaperRun, write_paper  # noqa: E402
from coral.evaluation.paper_runs import CaseRun, EpochRun, MethodRun  # noqa: E402
from coral.evaluation.paper_studies import Sensitivity, SensitivityPoint  # noqa: E402


def _method(name: str, usd: float, startup: float, goodput: float, model_usd: dict[str, float],
            attainment: float = 1.0) -> MethodRun:
    sim = {"goodput_tokens_per_s": goodput,
           "models": {m: {"slo_attainment": attainment, "requests": 100} for m in model_usd}}
    epochs = [EpochRun(0, usd, startup, 3, 1.0, 0.5, sim), EpochRun(1, usd, 0.0, 0, 1.0, 0.1, sim)]
    inst = tuple(SimpleNamespace(model=m, usd_per_hour=u, count=1) for m, u in model_usd.items())
    return MethodRun(name, epochs, inst)


def test_paper_report_rows(tmp_path: Path) -> None:
    models = ("phi-4", "qwen3-32b")
    default = CaseRun("paper-core", "default", 2, 360.0, {
        "coral": _method("coral", 40.0, 4.0, 1000.0, dict(zip(models, (15.0, 25.0)))),
        "homo": _method("homo", 60.0, 6.0, 1000.0, dict(zip(models, (10.0, 50.0)))),
        "homo-joint": _method("homo-joint", 50.0, 5.0, 1000.0, dict(zip(models, (20.0, 30.0)))),
        "cauchy": _method("cauchy", 48.0, 0.0, 1000.0, dict(zip(models, (18.0, 30.0)))),
    }, "mixed", 3.0)
    scarce = CaseRun("paper-core", "scarce", 2, 360.0, {
        "coral": _method("coral", 44.0, 0.0, 900.0, dict(zip(models, (20.0, 24.0)))),
        "homo": _method("homo", 44.0, 0.0, 600.0, dict(zip(models, (20.0, 24.0))), 0.5),
        "homo-joint": _method("homo-joint", 44.0, 0.0, 700.0, dict(zip(models, (20.0, 24.0)))),
        "cauchy": _method("cauchy", 66.0, 0.0, 900.0, dict(zip(models, (40.0, 26.0)))),
    }, "pd", 3.0)
    sens = Sensitivity("gpt-oss-120b", [SensitivityPoint(n, r, 10 * n, 20 * n, 0.1 * n,
                                                         100.0 * min(n, 2))
                                        for n in (1, 2, 3) for r in (4.0, 12.0)])
    cfg = PaperConfig(out=tmp_path, epochs=2, epoch_s=360.0)
    run = PaperRun(cfg, {("paper-core", "default"): default, ("paper-core", "scarce"): scarce},
                   sensitivity=sens, timings=[("`paper-core` default", 3.0)])
    text = write_paper(run).read_text()

    # default: Coral $40 + $4 of start-ups over 60 min = $44; Homo $66 -> 1.50x, paper 1.62x
    assert "| core: cost, Homo / Coral | 1.62x | 1.50x | 0.93 |" in text
    assert "| core: cost, Cauchy / Coral | 1.60x | 1.09x | 0.68 |" in text
    # per model from the last epoch's instances: Homo $50 / Coral $25 on Qwen3-32B
    assert "| qwen3-32b alone: homo / Coral | 2.02x | 2.00x | 0.99 |" in text
    # scarce: same cost as Homo, goodput 900 / 600 = 1.5x (the paper: 1.24x)
    assert "| goodput, Coral / Homo | 1.24x | 1.50x | 1.21 |" in text
    assert "| Coral's cost over its default-level cost | 1.10x | 1.00x | 0.91 |" in text
    # start-ups: $4 of $44 with the first deployment, nothing in the re-plans
    assert "| the same with the first deployment's start-ups | 1.0 % | 9.1 % | 9.09 |" in text
    assert "re-plans (default levels, worst) | 1.0 % | 0.0 % |" in text
    # the worst model's SLO attainment of each plan, and the cases not run
    assert "| `paper-core` scarce | 100.0% | 100.0% | 50.0% | 100.0% |" in text
    assert "Default availability, extended: cost ratios and ILP time\n\nNot run" in text
    # sensitivity plateaus at N_max 2 on this grid; simulator rows from benchmarks/results/' figures
    assert "| N_max where the best goodput/USD reaches 99 % of the grid's best | 6.00 | 2.00 |" \
        in text
    assert "vLLM 0.32.0 CPU build (SmolLM2-135M, PP 2): prefill (TTFT p50) mean error | 5.6 % " \
           "| 3.7 % |" in text
    assert (tmp_path / "paper_cost.png").stat().st_size > 0
    assert (tmp_path / "paper_sensitivity.png").stat().st_size > 0


def test_a_plan_with_nothing_to_simulate_is_not_reported_as_cheaper() -> None:
    """Helix's placement (no instances to run) costs less than Coral's because it serves
    little under the SLO: its row says it was not simulated and what it serves, rather than
    a goodput of 0 beside a cost ratio that reads as a saving."""
    from coral.evaluation.paper_runs import _not_simulated
    from coral.evaluation.paper_sections import methods_table

    helix = SimpleNamespace(served_fraction={"phi-4": 0.25, "qwen3-32b": 0.0})
    sim = _not_simulated(helix)
    runs = {"coral": _method("coral", 40.0, 0.0, 1000.0, {"phi-4": 15.0, "qwen3-32b": 25.0}),
            "helix": MethodRun("helix", [EpochRun(0, 20.0, 0.0, 0, 1.0, 0.1, sim)])}
    assert runs["coral"].simulated and not runs["helix"].simulated
    assert runs["helix"].served_under_slo == 0.0
    text = "\n".join(methods_table(CaseRun("paper-core", "default", 1, 360.0, runs, "mixed", 1.0)))
    assert ("| helix | 20.00 | 20.00 | 0.00 | 1.000 | not simulated | - | not comparable: 0.50x "
            "serving 0.0% of its worst model's demand under the SLO |") in text
    assert "| coral | 40.00 | 40.00 | 0.00 | 1.000 | 1,000 | 100.0% | - |" in text
