"""Packages import only downwards: catalog → perf → templates → allocator → baselines → sim →
runtime → cli. Every import is read from the source (those inside functions too), so a
back-edge cannot hide behind a late import; the shared pieces (the instance shape and the
pipeline step model in `coral.perf`) stay below everything that reads them."""

from __future__ import annotations

import ast
from pathlib import Path

import coral

ORDER = ("catalog", "perf", "templates", "allocator", "baselines", "sim", "runtime", "cli")

#: Upward imports still to be removed, each with why it is there today.
KNOWN = {
    # planning orchestrates the allocator and the baselines (every plan shows them beside
    # Coral's): it belongs in a layer above both
    ("coral/allocator/planning.py", "baselines"),
}


def _upward_imports() -> set[tuple[str, str]]:
    root = Path(coral.__file__).parent
    out = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        if len(rel.parts) < 3 or rel.parts[1] not in ORDER:
            continue
        own = ORDER.index(rel.parts[1])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "coral" and len(parts) > 1 and parts[1] in ORDER \
                        and ORDER.index(parts[1]) > own:
                    out.add((rel.as_posix(), parts[1]))
    return out


def test_packages_import_only_downwards():
    found = _upward_imports()
    assert found - KNOWN == set(), sorted(found - KNOWN)


def test_the_known_upward_imports_are_still_there():
    """A removed back-edge leaves `KNOWN`, so that the list never excuses a new one."""
    assert KNOWN <= _upward_imports()
