"""`coral evaluate` on a tiny scenario: the report, its tables and its plots."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from coral.evaluation.common import EvalConfig  # noqa: E402
from coral.evaluation.evaluate import evaluate  # noqa: E402

SCENARIO = """\
schema_version: 1
name: tiny
description: "one small model on cheap single-GPU nodes in one region"
mode: aggregated
n_max: 2
rho: 12
startup_s: 300
node_types: [1x-l4, 1x-t4, 1x-a10g]
models:
  - {name: llama-3.1-8b, demand_rps: 20, input_tokens: 1024, output_tokens: 256, tpot_s: 0.10, ttft_s: 2.0, percentile: 0.9, priority: 1}
regions:
  - {name: aws-us-east-1}
base_availability: {1x-l4: 16, 1x-t4: 16, 1x-a10g: 16}
availability: limited
levels:
  abundant: {description: "all", scale: 1.0}
  limited: {description: "a half", scale: 0.5}
  scarce: {description: "an eighth", scale: 0.125}
"""


def _timeline(scenario: Path) -> str:
    return (f"schema_version: 1\nname: tinyday\nscenario: {scenario}\nlevel: limited\n"
            "periods:\n  - {name: a, duration_s: 3600, demand_scale: 0.5}\n"
            "  - {name: b, duration_s: 3600, demand_scale: 1.0}\n")


def test_report_on_tiny_scenario(tmp_path: Path) -> None:
    scen = tmp_path / "tiny.yaml"
    scen.write_text(SCENARIO)
    tl = tmp_path / "tinyday.yaml"
    tl.write_text(_timeline(scen))
    out = tmp_path / "eval"
    cfg = EvalConfig(
        out=out, quick=True, nmax=2, scenarios=(str(scen),), demand_scales=(1.0, 2.0),
        sim_seconds=5.0, goodput_scenario=str(scen), solve_scenario=str(scen),
        cluster_scales=(1, 2), helix_model="llama-3.1-8b",
        helix_cluster=(("1x-l4", 1), ("1x-t4", 1)), helix_timeout_s=60.0,
        timeline=str(tl), timeline_periods=None, templates_dir=tmp_path / "templates",
        workers=1, time_limit_s=5.0,
    )
    result = evaluate(cfg)
    text = result.report.read_text()
    assert result.report == out / "report.md"
    assert "(failed)" not in text, text
    for title in ("## Headline", "## 1. Cost", "## 2. Goodput", "## 3. Online solve",
                  "## 4. Helix", "## 5. Adaptation", "## 6. Cost of deployability on vLLM"):
        assert title in text
    # tables hold numbers
    rows = [ln for ln in text.splitlines() if ln.startswith("| coral") or ln.startswith("| x")]
    assert rows and all(re.search(r"\d", r) for r in rows)
    assert re.search(r"\| x1 \| coral \| [\d,.]+ \|", text)
    assert "SLO attainment" in text and re.search(r"\d+\.\d%", text)
    # every planner's deployment simulated alike, Coral's first
    assert "Every planner's deployment" in text
    assert re.search(r"\| coral \| [\d,.]+ \| \d+\.\d% \|", text)
    assert re.search(r"\| homo \| [\d,.]+ \| (\d+\.\d%|-) \|", text)
    # Coral's plan and the vLLM-deployable plan side by side
    assert re.search(r"\| \S*tiny\S* \| vllm \| [\d,.]+ \| [\d.]+ \| \d+\.\d% \|", text)
    for png in ("goodput.png", "solve_time.png", "helix.png", "adapt/adapt.png"):
        assert (out / png).is_file() and (out / png).stat().st_size > 1000, png
    assert list(out.glob("cost_*.png"))
    for _, _, measured in result.headline:
        assert re.search(r"\d", measured)


def test_unknown_section(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown section"):
        evaluate(EvalConfig(out=tmp_path, sections=("nope",)))
