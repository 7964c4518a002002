"""Coral's modules import only downwards and never in a cycle.

Layers, lowest first: the shared helpers at the top of the package (`coral/messages.py`,
`coral/errors.py`, `coral/routing.py`) → `solvers` → catalog → perf → templates → plans (the
plan file) → allocator →
baselines → (sim, runtime) → planning (runs the allocator beside the baselines, re-plans) →
evaluation (`coral evaluate`) → cli. Each package is one layer, and a module at the top of
`coral/` is in the lowest; sim and runtime share a layer and import neither one from the
other. Every import is read from the source (those inside functions too), so neither a
back-edge nor a cycle can hide behind a late import.

Inside `allocator/` and `templates/` the same holds one level down: their sub-packages (and
the few modules kept at the package's top) have an order of their own (`INNER_LAYERS`), and
every `__init__.py` there is a docstring and nothing else, so that importing one module never
loads its siblings.
"""

from __future__ import annotations

import ast
from pathlib import Path

import coral

#: Layers, lowest first; packages in one tuple share a layer (and may not import each other).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("base",),
    ("solvers",),
    ("catalog",),
    ("perf",),
    ("templates",),
    ("plans",),
    ("allocator",),
    ("baselines",),
    ("sim", "runtime"),
    ("planning",),
    ("evaluation",),
    ("cli",),
)

#: Inside a package: its sub-packages and top-level modules, lowest first; names in one tuple
#: share a layer (and may not import each other).
INNER_LAYERS: dict[str, tuple[tuple[str, ...], ...]] = {
    "allocator": (
        ("problem",),
        ("kernels", "plan", "scenario"),
        ("decomposition",),
        ("core",),
        ("scarcity",),
        ("solve",),
        ("spot", "robust"),
    ),
    "templates": (
        ("types", "slo"),
        ("space",),
        ("template", "placement", "step"),
        ("builder",),
    ),
}

#: Upward (or sideways) imports still to be removed, each with why it is there today and who
#: owns the fix.
KNOWN_UPWARD: set[tuple[str, str]] = set()

#: Import cycles still to be removed (each a set of modules that reach one another), with
#: why and who owns the fix. A cycle found must lie inside one of these.
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def _modules() -> dict[str, Path]:
    root = Path(coral.__file__).parent
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _import_graph() -> dict[str, set[str]]:
    """Module -> the coral modules it imports anywhere in its source: `from P import N` names
    module `P.N` when that is a module, else `P`."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                graph[mod] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in mods:
                        graph[mod].add(sub)
                    elif target in mods:
                        graph[mod].add(target)
    for mod in graph:
        graph[mod].discard(mod)
    return graph


def _layer(mod: str) -> str:
    """The package under `coral/` that holds `mod`; "base" for a module at the top of it."""
    parts = mod.split(".")
    top = Path(coral.__file__).parent / parts[1] if len(parts) > 1 else None
    return parts[1] if top is not None and top.is_dir() else "base"


def _rank(layer: str) -> int:
    for k, names in enumerate(LAYERS):
        if layer in names:
            return k
    raise AssertionError(f"layer {layer!r} is in no entry of LAYERS")


def _upward_imports() -> set[tuple[str, str]]:
    out = set()
    for mod, targets in _import_graph().items():
        own = _layer(mod)
        for target in targets:
            layer = _layer(target)
            if layer != own and _rank(layer) >= _rank(own):
                out.add((mod, layer))
    return out


def _cycles() -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph = _import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = set()
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.add(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        found.append(frozenset(comp))
    return found


def _inner(mod: str) -> tuple[str, str] | None:
    """(package, sub-package or top-level module) of a module inside a package with
    `INNER_LAYERS`; None for a module elsewhere and for the package's own `__init__`."""
    parts = mod.split(".")
    if len(parts) < 3 or parts[1] not in INNER_LAYERS:
        return None
    return parts[1], parts[2]


def _inner_rank(package: str, unit: str) -> int:
    for k, names in enumerate(INNER_LAYERS[package]):
        if unit in names:
            return k
    raise AssertionError(f"coral.{package}.{unit} is in no entry of INNER_LAYERS[{package!r}] "
                         "(tests/test_layers.py): add it to the layer it belongs to")


def _inner_upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(module, target) for each import inside a package that goes up or sideways between
    its sub-packages."""
    out = set()
    for mod, targets in graph.items():
        own = _inner(mod)
        if own is None:
            continue
        for target in targets:
            other = _inner(target)
            if other is None or other[0] != own[0] or other[1] == own[1]:
                continue
            if _inner_rank(*other) >= _inner_rank(*own):
                out.add((mod, target))
    return out


def test_every_module_has_a_layer():
    for mod in _modules():
        _rank(_layer(mod))
        if _inner(mod) is not None:
            _inner_rank(*_inner(mod))


def test_every_inner_layer_is_there():
    """An entry of `INNER_LAYERS` names a sub-package or module that exists."""
    root = Path(coral.__file__).parent
    for package, layers in INNER_LAYERS.items():
        for unit in (u for names in layers for u in names):
            where = root / package
            assert (where / unit / "__init__.py").exists() or (where / f"{unit}.py").exists(), (
                f"INNER_LAYERS[{package!r}] names {unit!r}, which is not in coral/{package}/")


def test_sub_packages_import_only_downwards():
    found = _inner_upward_imports(_import_graph())
    assert found == set(), sorted(found)


def test_the_inner_check_finds_an_upward_import():
    graph = {"coral.allocator.problem": {"coral.allocator.solve.ilp"},
             "coral.allocator.spot.planner": {"coral.allocator.robust.planner",
                                              "coral.allocator.spot.market",
                                              "coral.allocator.solve.ilp"},
             "coral.templates.builder.build": {"coral.templates.step.search"}}
    assert _inner_upward_imports(graph) == {
        ("coral.allocator.problem", "coral.allocator.solve.ilp"),
        ("coral.allocator.spot.planner", "coral.allocator.robust.planner")}


def test_package_inits_are_docstrings_only():
    """The one `__init__` convention of the walled packages: a docstring that says what the
    package holds, no imports and no re-exports (callers import the defining module)."""
    root = Path(coral.__file__).parent
    for package in INNER_LAYERS:
        for init in sorted((root / package).rglob("__init__.py")):
            body = ast.parse(init.read_text()).body
            assert len(body) == 1 and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str), (
                    f"{init.relative_to(root.parent)}: an __init__ here holds its docstring "
                    "only; import names from the module that defines them")


def test_modules_import_only_downwards():
    found = _upward_imports()
    assert found - KNOWN_UPWARD == set(), sorted(found - KNOWN_UPWARD)


def test_the_known_upward_imports_are_still_there():
    """A removed back-edge leaves `KNOWN_UPWARD`, so that the list never excuses a new one."""
    assert KNOWN_UPWARD <= _upward_imports()


def test_no_import_cycles():
    new = [sorted(c) for c in _cycles() if not any(c <= known for known in KNOWN_CYCLES)]
    assert new == [], new


def test_the_known_cycles_are_still_there():
    """A broken cycle leaves `KNOWN_CYCLES` (or shrinks to what is left of it)."""
    cycles = _cycles()
    for known in KNOWN_CYCLES:
        assert any(c <= known and len(c) > 1 for c in cycles), sorted(known)
        assert known <= set().union(*[c for c in cycles if c <= known]), (
            "part of this known cycle is gone; shrink its entry", sorted(known))


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function(monkeypatch):
    graph = {"coral.a": {"coral.b"}, "coral.b": {"coral.c"}, "coral.c": {"coral.a"},
             "coral.d": {"coral.a"}}
    monkeypatch.setattr(f"{__name__}._import_graph", lambda: graph)
    assert _cycles() == [frozenset({"coral.a", "coral.b", "coral.c"})]


def test_a_module_is_in_its_packages_layer():
    assert _layer("coral.planning.plan") == "planning"
    assert _layer("coral.evaluation.sections") == "evaluation"
    assert _layer("coral.solvers.highs") == "solvers"
    assert _layer("coral.errors") == "base" and _layer("coral") == "base"
