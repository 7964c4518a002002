"""The YAML parser for the files users give (scenarios, catalogs, timelines).

PyYAML's C parser (`CSafeLoader`, built when libyaml is present) reads several times faster
than its pure-Python one and is used wherever it is built; both construct the same plain
values (the safe subset: no Python objects). A file's size is bounded by its reader, before
parsing, because even the C parser builds every value in Python.
"""

from __future__ import annotations

from typing import Any

import yaml

#: The fastest safe loader this PyYAML has.
SAFE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """`yaml.safe_load(text)`, with the C parser where it is built."""
    return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 - a safe loader
