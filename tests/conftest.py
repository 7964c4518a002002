"""Fixtures and helpers shared by the test modules.

`cat` and `perf` are the built-in catalog and the default performance model, built once per
run; a module that needs another catalog defines its own `cat` fixture, which takes
precedence in that module.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest

from coral.catalog import Catalog, default_catalog
from coral.perf.model import PerfModel

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@contextmanager
def benchmark_module(filename: str, name: str) -> Iterator[ModuleType]:
    """A `benchmarks/` script imported as module `name` (registered while in use: dataclasses
    look their module up while being defined)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


@pytest.fixture(scope="session")
def cat() -> Catalog:
    """The built-in catalog."""
    return default_catalog()


@pytest.fixture(scope="session")
def perf(cat: Catalog) -> PerfModel:
    """The default performance model of the built-in catalog."""
    return PerfModel(cat)


@pytest.fixture
def one_model_plan(tmp_path: Path) -> Path:
    """A plan file of two aggregated llama-3.1-8b instances on one L40S each (what the
    simulator's command-line tests read)."""
    plan = {
        "scenario": "core",
        "demand_rps": {"llama-3.1-8b": 2.0},
        "instances": [{
            "region": "r1", "template_id": "llama-3.1-8b|aggregated|1x-l40s",
            "model": "llama-3.1-8b", "mode": "aggregated", "count": 2,
            "placement": [{"node_type": "1x-l40s", "first_layer": 0, "layers": 32,
                           "batch": 128, "tp_degree": 1}],
            "capacity_rps": 5.8, "usd_per_hour": 1.5,
        }],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of sample `name` whose labels include `labels` in Prometheus exposition
    `text` (None when there is none)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return sample.value
    return None
