"""Fixtures and helpers shared by the test modules.

`cat` and `perf` are the built-in catalog and the default performance model, built once per
run; a module that needs another catalog defines its own `cat` fixture, which takes
precedence in that module.
"""

from __future__ import annotations

import pytest

from coral.catalog import Catalog, default_catalog
from coral.perf.model import PerfModel


@pytest.fixture(scope="session")
def cat() -> Catalog:
    """The built-in catalog."""
    return default_catalog()


@pytest.fixture(scope="session")
def perf(cat: Catalog) -> PerfModel:
    """The default performance model of the built-in catalog."""
    return PerfModel(cat)


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of sample `name` whose labels include `labels` in Prometheus exposition
    `text` (None when there is none)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return sample.value
    return None
