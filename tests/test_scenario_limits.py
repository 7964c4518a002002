"""Scenario files a user may give carelessly: a file far larger than any scenario is refused
before it is parsed, YAML is read with PyYAML's C parser where it is built, and an SLO whose
TTFT is below its TPOT names the field and the entry."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from coral.allocator.scenario.load import load_scenario, parse_scenario
from coral.allocator.scenario.spec import MAX_SCENARIO_BYTES, ScenarioError
from coral.cli.main import app
from coral.templates.slo import SloError, SloSpec
from coral.yaml_text import SAFE_LOADER, safe_load

CORE = (Path(__file__).resolve().parents[1] / "coral" / "allocator" / "data" / "scenarios"
        / "core.yaml").read_text()
runner = CliRunner(env={"COLUMNS": "300"})


def _padded(size: int) -> str:
    """The core scenario with extra model entries (each a duplicate) up to `size` bytes."""
    head, sep, tail = CORE.partition("\nmodels:\n")
    entry = "  - {name: llama-3.1-8b, demand_rps: 1.0, tpot_s: 0.1, ttft_s: 2.0}\n"
    return head + sep + entry * max(0, (size - len(CORE)) // len(entry)) + tail


def test_a_20_mb_scenario_is_refused_at_once_naming_the_file(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(_padded(20_000_000))
    started = time.perf_counter()
    result = runner.invoke(app, ["plan", str(path), "--nmax", "1"])
    assert time.perf_counter() - started < 10
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    text = " ".join(result.output.split())
    assert str(path) in text and f"({MAX_SCENARIO_BYTES >> 10} KiB)" in text
    assert "to fix:" in text and "Traceback" not in text
    with pytest.raises(ScenarioError, match="more than a scenario file may hold"):
        parse_scenario(_padded(MAX_SCENARIO_BYTES + 1000), source="text")


def test_a_scenario_under_the_bound_is_parsed_and_checked(tmp_path):
    """Just under the bound, the file is read and its first real error reported."""
    path = tmp_path / "long.yaml"
    path.write_text(_padded(MAX_SCENARIO_BYTES - 4096))
    with pytest.raises(ScenarioError, match=r"models\[1\] 'llama-3.1-8b': field 'name': model "
                                            r"listed twice"):
        load_scenario(path)


def test_yaml_is_read_with_the_c_parser_where_built():
    assert SAFE_LOADER is (yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)
    assert safe_load("a: [1, 2.5, x, null, 2026-01-02]") == yaml.safe_load(
        "a: [1, 2.5, x, null, 2026-01-02]")
    with pytest.raises(yaml.YAMLError):
        safe_load("!!python/object:os.system {}")  # the safe subset only


def test_ttft_below_tpot_names_the_field_and_the_entry(tmp_path):
    path = tmp_path / "slo.yaml"
    path.write_text(CORE.replace("ttft_s: 2.0", "ttft_s: 0.01", 1))
    result = runner.invoke(app, ["plan", str(path), "--nmax", "1"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "models[0] 'llama-3.1-8b': field 'ttft_s'" in text and "below tpot_s" in text
    assert "(entry)" not in text
    with pytest.raises(SloError, match="SLO field 'ttft_s': .*below tpot_s"):
        SloSpec.parse({"tpot_s": 0.5, "ttft_s": 0.2})
