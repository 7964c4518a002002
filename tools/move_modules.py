#!/usr/bin/env python3
"""Move the modules of `coral/allocator/` and `coral/templates/` into sub-packages by concern
(issue 38, "inner walls"), and rewrite every reference to them.

Run from the repository root on a clean tree: `python tools/move_modules.py` (`--dry-run`
prints what it would do and changes nothing). It is a script rather than a hand-made move so
that it can be run again on a tree that other branches have changed since: it reads the tree
as it finds it, moves what `MOVES` names, and refuses to start when the tree holds a module
that `MOVES` does not place or when it finds the move half done. A second run on a moved tree
says so and changes nothing.

What it does, in order:

1. `git mv` of each module in `MOVES` (old dotted name -> new dotted name).
2. Every `__init__.py` of the two packages and of their sub-packages becomes a docstring and
   nothing else (the one convention: callers import from the module that defines a name, so
   that importing one module never loads its package's heavy siblings). The docstrings list
   each module with the first sentence of its own docstring.
3. References, in the tracked files under `REWRITE_ROOTS`: dotted names (`import coral.x.y`,
   `from coral.x.y import`, monkeypatch targets, logger names, prose), names imported from a
   package (`from coral.allocator import ilp, AllocationPlan` -> one import per defining
   module, a renamed module keeping its old name with `as`), names the packages re-exported
   (`coral.templates.Template`), file paths (`coral/allocator/ilp.py`, `allocator/ilp.py`)
   and, inside the two packages, the bare file names their docstrings cite (`` `ilp.py` ``).

Package data (`coral/allocator/data`, `coral/templates/data`) stays where it is: its readers
name the package (`resources.files("coral.allocator")`), not a module's folder; a moved module
that finds files from `__file__` is reported for a person to fix.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

#: Old dotted module -> new dotted module. A module that stays at its package's top maps to
#: itself, so that the script can tell a module it places from one it has never seen.
MOVES: dict[str, str] = {
    # allocator: the problem at the top; everything else in a sub-package by concern.
    "coral.allocator.problem": "coral.allocator.problem",
    "coral.allocator.jit": "coral.allocator.kernels.jit",
    "coral.allocator.kernel_arrays": "coral.allocator.kernels.arrays",
    "coral.allocator.knapsack_kernel": "coral.allocator.kernels.knapsack_kernel",
    "coral.allocator.knapsack_programme": "coral.allocator.kernels.knapsack_programme",
    "coral.allocator.pd_cover_kernel": "coral.allocator.kernels.pd_cover_kernel",
    "coral.allocator.scenario": "coral.allocator.scenario.load",
    "coral.allocator.scenario_spec": "coral.allocator.scenario.spec",
    "coral.allocator.headroom": "coral.allocator.scenario.headroom",
    "coral.allocator.plan_decode": "coral.allocator.plan.decode",
    "coral.allocator.knapsack": "coral.allocator.decomposition.knapsack",
    "coral.allocator.pd_cover": "coral.allocator.decomposition.pd_cover",
    "coral.allocator.lagrange": "coral.allocator.decomposition.lagrange",
    "coral.allocator.plan_search": "coral.allocator.decomposition.plan_search",
    "coral.allocator.branch_price": "coral.allocator.decomposition.branch_price",
    "coral.allocator.presolve": "coral.allocator.core.presolve",
    "coral.allocator.formulation": "coral.allocator.core.formulation",
    "coral.allocator.highs_runs": "coral.allocator.core.highs_runs",
    "coral.allocator.scarcity": "coral.allocator.scarcity.phases",
    "coral.allocator.fair": "coral.allocator.scarcity.fair",
    "coral.allocator.fair_search": "coral.allocator.scarcity.fair_search",
    "coral.allocator.uniform_scale": "coral.allocator.scarcity.uniform_scale",
    "coral.allocator.ilp": "coral.allocator.solve.ilp",
    "coral.allocator.starts": "coral.allocator.solve.starts",
    "coral.allocator.rounded_start": "coral.allocator.solve.rounded_start",
    "coral.allocator.bruteforce": "coral.allocator.solve.bruteforce",
    "coral.allocator.spot": "coral.allocator.spot.planner",
    "coral.allocator.spot_ilp": "coral.allocator.spot.ilp",
    "coral.allocator.spot_market": "coral.allocator.spot.market",
    "coral.allocator.spot_repair": "coral.allocator.spot.repair",
    "coral.allocator.spot_risk": "coral.allocator.spot.risk",
    "coral.allocator.robust": "coral.allocator.robust.planner",
    "coral.allocator.robust_problem": "coral.allocator.robust.problem",
    "coral.allocator.robust_rating": "coral.allocator.robust.rating",
    "coral.allocator.robust_starts": "coral.allocator.robust.starts",
    # templates: the types, the SLO and the template at the top.
    "coral.templates.types": "coral.templates.types",
    "coral.templates.slo": "coral.templates.slo",
    "coral.templates.template": "coral.templates.template",
    "coral.templates.grid": "coral.templates.space.grid",
    "coral.templates.engine": "coral.templates.space.engines",
    "coral.templates.enumerate": "coral.templates.space.enumerate",
    "coral.templates.stage_bytes": "coral.templates.space.stage_bytes",
    "coral.templates.operating_points": "coral.templates.space.operating_points",
    "coral.templates.placement": "coral.templates.placement.exact",
    "coral.templates.placement_prep": "coral.templates.placement.prep",
    "coral.templates.placement_chain": "coral.templates.placement.chain",
    "coral.templates.placement_milp": "coral.templates.placement.milp",
    "coral.templates.placement_ilp": "coral.templates.placement.ilp",
    "coral.templates.path_lp": "coral.templates.placement.path_lp",
    "coral.templates.node_memo": "coral.templates.placement.node_memo",
    "coral.templates.exhaustive": "coral.templates.placement.exhaustive",
    "coral.templates.verify": "coral.templates.placement.verify",
    "coral.templates.placement_step": "coral.templates.step.search",
    "coral.templates.stage_groups": "coral.templates.step.stage_groups",
    "coral.templates.step_rows": "coral.templates.step.rows",
    "coral.templates.step_cover": "coral.templates.step.cover",
    "coral.templates.step_bound": "coral.templates.step.bound",
    "coral.templates.solve": "coral.templates.builder.solve",
    "coral.templates.build": "coral.templates.builder.build",
    "coral.templates.build_options": "coral.templates.builder.build_options",
    "coral.templates.store": "coral.templates.builder.store",
    "coral.templates.parallel": "coral.templates.builder.parallel",
    "coral.templates.homogeneous": "coral.templates.builder.homogeneous",
}

#: The first paragraph of each package's and sub-package's `__init__` docstring; the list of
#: its modules (and sub-packages) follows it.
DOCS: dict[str, str] = {
    "coral.allocator": (
        "Online allocation: how many instances of each serving template to run in each "
        "region. Sub-packages, lowest first (`tests/test_layers.py` holds the order): "
        "`problem` -> `kernels`, `plan`, `scenario` -> `decomposition` -> `core` -> "
        "`scarcity` -> `solve` -> `spot`, `robust`. Planning a scenario end to end (template "
        "libraries, the allocation in each mode, the baselines beside it, re-plans over a "
        "timeline) is `coral.planning`, the layer above."),
    "coral.allocator.kernels": (
        "The allocator's compiled loops (numba), compiled once per install by `jit`."),
    "coral.allocator.scenario": (
        "Scenario files: their schema, their checks against the catalog, and the problems "
        "they give."),
    "coral.allocator.plan": "The plan file: its format, its decoded instances and its check.",
    "coral.allocator.decomposition": (
        "The allocation problem decomposed by model: exact per-model covers, the Lagrangian "
        "bound that prices nodes out, and branch and price over it."),
    "coral.allocator.core": (
        "The allocation ILP as HiGHS sees it: the columns kept, the rows, and the runs."),
    "coral.allocator.scarcity": (
        "When the demand cannot be met in full: the goodput phases, the fair objective and "
        "the paper's uniform-scale rule."),
    "coral.allocator.solve": (
        "The allocation ILP's solve (`solve_allocation`), the plans it starts from, and the "
        "exhaustive oracle it is tested against."),
    "coral.allocator.spot": (
        "Spot capacity (`coral plan --spot`): plans that mix spot and on-demand instances and "
        "keep each model's demand covered with a stated probability."),
    "coral.allocator.robust": (
        "Plans robust to performance-model error (`coral plan --robust R`)."),
    "coral.templates": (
        "Serving templates: the best SLO-feasible placement of a model on each node "
        "combination. Sub-packages, lowest first (`tests/test_layers.py` holds the order): "
        "`types`, `slo` -> `space` -> `template`, `placement`, `step` -> `builder`."),
    "coral.templates.space": (
        "The space a library is built over: node combinations, modes, topologies, batches, "
        "serving engines, and what one node can do at each point."),
    "coral.templates.placement": (
        "The exact placement solvers of each topology, their shared preparation, and the "
        "independent checks of their answers."),
    "coral.templates.step": (
        "The best pipeline over every node of a combination under the step model, and the "
        "bound that cuts a library before searching."),
    "coral.templates.builder": (
        "Template libraries: one combination's solve, a whole library's build, its store on "
        "disk, and the pools that run the solves."),
}

PACKAGES = ("coral.allocator", "coral.templates")
REWRITE_ROOTS = ("coral", "tests", "benchmarks", "docs", "README.md", ".ci", "pyproject.toml")
WIDTH = 100


def sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def mod_path(dotted: str) -> Path:
    return Path(*dotted.split(".")).with_suffix(".py")


def first_sentence(path: Path) -> str:
    """The first sentence of a module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    para = " ".join(doc.split("\n\n")[0].split())
    m = re.search(r"(?<=[.!?])\s(?=[A-Z`(])", para)
    return para[: m.start()] if m else para


def bullet(name: str, text: str) -> str:
    if len(text) > 1 and text[1].islower():
        text = text[0].lower() + text[1:]
    if text.endswith(":"):
        text = text[:-1] + "."
    return textwrap.fill(f"- `{name}`: {text}", WIDTH, subsequent_indent="  ",
                         break_on_hyphens=False)


def init_text(package: str, root: Path) -> str:
    """The docstring-only `__init__.py` of `package`, listing its sub-packages and modules."""
    folder = root / Path(*package.split("."))
    if package not in DOCS:
        raise SystemExit(f"tools/move_modules.py: DOCS has no entry for {package}; add its "
                         "one-paragraph summary to DOCS and run again")
    lines = [textwrap.fill(DOCS[package], WIDTH, initial_indent='"""',
                           break_on_hyphens=False)]
    subs = sorted(p.name for p in folder.iterdir()
                  if p.is_dir() and (p / "__init__.py").exists())
    mods = sorted(p.stem for p in folder.glob("*.py") if p.name != "__init__.py")
    if subs:
        lines.append("\n".join(bullet(f"{s}/", first_line_of_doc(f"{package}.{s}"))
                               for s in subs))
    if mods:
        lines.append("\n".join(bullet(m, first_sentence(folder / f"{m}.py")) for m in mods))
    body = "\n\n".join(lines)
    return f'{body}\n"""\n'


def first_line_of_doc(package: str) -> str:
    text = DOCS.get(package, "")
    m = re.search(r"(?<=[.!?])\s(?=[A-Z`(])", text)
    return text[: m.start()] if m else text


def reexports(package: str) -> dict[str, str]:
    """Names a package's `__init__` re-exports -> the old dotted module defining each."""
    init = Path(*package.split(".")) / "__init__.py"
    tree = ast.parse(init.read_text())
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.startswith(package + "."):
            for alias in node.names:
                out[alias.asname or alias.name] = node.module
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and \
                any(isinstance(t, ast.Name) and t.id == "_WHERE" for t in node.targets):
            # the lazy form: {"name": "module", ...}
            for k, v in zip(node.value.keys, node.value.values):
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant):
                    out[k.value] = f"{package}.{v.value}"
    return out


def check_tree(root: Path) -> tuple[dict[str, str], list[str]]:
    """The moves still to make; refuses (exits) when the tree is half moved or holds a module
    that `MOVES` does not place. Returns (moves to make, modules skipped as absent)."""
    todo: dict[str, str] = {}
    skipped: list[str] = []
    done = 0
    for old, new in MOVES.items():
        if old == new:
            continue
        o, n = root / mod_path(old), root / mod_path(new)
        if o.exists() and n.exists():
            raise SystemExit(f"tools/move_modules.py: both {o} and {n} exist; the move is half "
                             "done. Reset the tree (git checkout/clean) and run again.")
        if o.exists():
            todo[old] = new
        elif n.exists():
            done += 1
        else:
            skipped.append(old)
    if done and todo:
        raise SystemExit(f"tools/move_modules.py: {done} modules are moved and {len(todo)} "
                         f"are not (for example {next(iter(todo))}); the move is half done. "
                         "Reset the tree and run again.")
    placed = set(MOVES) | set(MOVES.values())
    unknown = []
    for package in PACKAGES:
        for p in sorted((root / Path(*package.split("."))).rglob("*.py")):
            dotted = ".".join(p.relative_to(root).with_suffix("").parts)
            if p.name != "__init__.py" and dotted not in placed:
                unknown.append(dotted)
    if unknown:
        raise SystemExit("tools/move_modules.py: these modules are not in MOVES: "
                         + ", ".join(unknown) + ". Add each to MOVES (old -> new, or to "
                         "itself to keep it at its package's top) and run again.")
    return todo, skipped


def tracked_files(root: Path) -> list[Path]:
    out = []
    for name in sh("git", "ls-files", "--", *REWRITE_ROOTS).splitlines():
        path = root / name
        if path.is_file():
            out.append(path)
    return out


class Rewriter:
    """Every textual rewrite, built from the moves and the packages' re-exported names."""

    def __init__(self, moves: dict[str, str], names: dict[str, dict[str, str]]) -> None:
        self.moves = moves
        # the package -> {name: new dotted module} for names imported from the package
        self.names = names
        dotted = dict(moves)
        for package, table in names.items():
            for name, module in table.items():
                dotted.setdefault(f"{package}.{name}", f"{module}.{name}")
        keys = sorted(dotted, key=len, reverse=True)
        self.new_names = {".".join(new.split(".")[:k]) for new in MOVES.values()
                          for k in range(3, len(new.split(".")) + 1)}
        self.dotted = dotted
        self.dotted_re = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, keys))
                                    + r")(?![\w*])")
        paths: dict[str, str] = {}
        for old, new in moves.items():
            for drop in (0, 1):  # coral/allocator/x.py and allocator/x.py
                paths["/".join(old.split(".")[drop:]) + ".py"] = \
                    "/".join(new.split(".")[drop:]) + ".py"
        self.paths = paths
        self.path_re = re.compile(r"(?<![\w./:-])(" + "|".join(
            map(re.escape, sorted(paths, key=len, reverse=True))) + r")(?![\w])")
        self.bare: dict[str, dict[str, str]] = defaultdict(dict)
        for old, new in moves.items():
            package = next(p for p in PACKAGES if old.startswith(p + "."))
            rel = "/".join(new[len(package) + 1:].split("."))
            self.bare[package][old.rsplit(".", 1)[1] + ".py"] = rel + ".py"

    def text(self, text: str, path: Path, root: Path) -> tuple[str, int]:
        n = 0

        def sub_dotted(m: re.Match[str]) -> str:
            nonlocal n
            # `coral.allocator.spot.market` is already a new name (the old module `spot` is
            # now a package): text that names a new module is left as it is
            after = re.match(r"\.(\w+)", m.string[m.end():])
            if after and f"{m.group(1)}.{after.group(1)}" in self.new_names:
                return m.group(0)
            n += 1
            return self.dotted[m.group(1)]

        def sub_path(m: re.Match[str]) -> str:
            nonlocal n
            n += 1
            return self.paths[m.group(1)]

        text = self.dotted_re.sub(sub_dotted, text)
        text = self.path_re.sub(sub_path, text)
        rel = ".".join(path.relative_to(root).parts)
        for package, table in self.bare.items():
            if rel.startswith(package + ".") and path.suffix == ".py":
                pattern = re.compile(r"`(" + "|".join(map(re.escape, table)) + r")`")
                # the folder of this file inside the package: a sibling is cited by its name
                here = "/".join(path.relative_to(root).parts[len(package.split(".")):-1])

                def sub_bare(m: re.Match[str], table: dict[str, str] = table,
                             here: str = here) -> str:
                    nonlocal n
                    folder, _, name = table[m.group(1)].rpartition("/")
                    new = name if folder == here else table[m.group(1)]
                    n += new != m.group(1)
                    return f"`{new}`"

                text = pattern.sub(sub_bare, text)
            elif path.suffix == ".md":
                # a Markdown line that names the package's folder (a table row of docs/design.md)
                # cites its files relative to that folder
                folder = "/".join(package.split(".")) + "/"
                pattern = re.compile(r"`(" + "|".join(map(re.escape, table)) + r")`")

                def sub_line(line: str, table: dict[str, str] = table,
                             pattern: re.Pattern[str] = pattern) -> str:
                    nonlocal n
                    found = pattern.findall(line)
                    n += len(found)
                    return pattern.sub(lambda m: f"`{table[m.group(1)]}`", line)

                text = "".join(sub_line(line) if folder in line else line
                               for line in text.splitlines(keepends=True))
        return text, n

    def target(self, package: str, name: str, asname: str | None) -> tuple[str, str] | None:
        """(module to import from, what to import) for `from package import name [as asname]`."""
        old = f"{package}.{name}"
        if old in self.moves:
            new_pkg, new_base = self.moves[old].rsplit(".", 1)
            local = asname or name
            return new_pkg, new_base if new_base == local else f"{new_base} as {local}"
        if name in self.names.get(package, {}):
            return self.names[package][name], name if not asname else f"{name} as {asname}"
        if (Path(*package.split(".")) / name / "__init__.py").exists() or \
                (Path(*package.split(".")) / f"{name}.py").exists():
            return package, name if not asname else f"{name} as {asname}"
        return None

    def python_imports(self, text: str, label: str, manual: list[str]) -> tuple[str, int]:
        """`from <package> import a, b` -> one import per defining module."""
        try:
            tree = ast.parse(text)
        except SyntaxError:
            manual.append(f"{label}: not Python that parses; imports not rewritten")
            return text, 0
        lines = text.splitlines(keepends=True)
        edits = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.startswith("coral.") and node.module not in PACKAGES and \
                    node.lineno == node.end_lineno and len(lines[node.lineno - 1]) > WIDTH + 1:
                line = lines[node.lineno - 1]
                head, tail = line[: node.col_offset], line[node.end_col_offset:].strip()
                if not head.strip() and (not tail or tail.startswith("#")):
                    names = [a.name if not a.asname else f"{a.name} as {a.asname}"
                             for a in node.names]
                    edits.append((node.lineno, node.end_lineno, import_lines(
                        head, node.module, names, f"  {tail}" if tail else "")))
                continue
            if not (isinstance(node, ast.ImportFrom) and node.level == 0
                    and node.module in PACKAGES):
                continue
            first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
            head, tail = first[: node.col_offset], last[node.end_col_offset:]
            if head.strip() or (tail.strip() and not tail.strip().startswith("#")):
                manual.append(f"{label}:{node.lineno}: an import that shares its line")
                continue
            groups: dict[str, list[str]] = {}
            for alias in node.names:
                got = self.target(node.module, alias.name, alias.asname)
                if got is None:
                    manual.append(f"{label}:{node.lineno}: {node.module} has no "
                                  f"{alias.name} that the script knows")
                    break
                groups.setdefault(got[0], []).append(got[1])
            else:
                comment = ("  " + tail.strip()) if tail.strip() else ""
                new = "".join(import_lines(head, module, names, comment)
                              for module, names in groups.items())
                edits.append((node.lineno, node.end_lineno, new))
        for start, end, new in sorted(edits, reverse=True):
            lines[start - 1: end] = [new]
        return "".join(lines), len(edits)

    def other_imports(self, text: str, label: str, manual: list[str]) -> tuple[str, int]:
        """The same in prose and shell lines (`python -c "from coral.allocator import jit"`)."""
        n = 0

        def sub(m: re.Match[str]) -> str:
            nonlocal n
            names = [s.strip() for s in m.group(2).split(",")]
            got = [self.target(m.group(1), name, None) for name in names]
            if any(g is None for g in got) or len({g[0] for g in got if g}) != 1:
                manual.append(f"{label}: `{m.group(0)}` (names from several modules)")
                return m.group(0)
            n += 1
            return f"from {got[0][0]} import " + ", ".join(g[1] for g in got if g)

        pattern = r"from (" + "|".join(map(re.escape, PACKAGES)) + r") import (\w+(?:, \w+)*)"
        return re.sub(pattern, sub, text), n


def import_lines(indent: str, module: str, names: list[str], comment: str) -> str:
    one = f"{indent}from {module} import {', '.join(names)}{comment}\n"
    if len(one) <= WIDTH + 1:
        return one
    inner = "".join(f"{indent}    {name},\n" for name in names)
    return f"{indent}from {module} import ({comment}\n{inner}{indent})\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="run on a tree with uncommitted changes")
    args = parser.parse_args()
    root = Path.cwd()
    if not (root / "pyproject.toml").exists() or not (root / "coral" / "allocator").is_dir():
        raise SystemExit("tools/move_modules.py: run it from the repository root")
    if not args.allow_dirty and sh("git", "status", "--porcelain", "--untracked-files=no"):
        raise SystemExit("tools/move_modules.py: the tree has uncommitted changes; commit or "
                         "stash them (or pass --allow-dirty) and run again")
    todo, skipped = check_tree(root)
    if not todo:
        print("tools/move_modules.py: every module in MOVES is already where it belongs; "
              "nothing to do")
        return 0
    names = {p: {n: MOVES.get(m, m) for n, m in reexports(p).items()} for p in PACKAGES}
    for old in skipped:
        print(f"skipped (not in the tree): {old}")
    for old, new in todo.items():
        print(f"move {mod_path(old)} -> {mod_path(new)}")
    if args.dry_run:
        return 0

    for old, new in todo.items():
        (root / mod_path(new)).parent.mkdir(parents=True, exist_ok=True)
        sh("git", "mv", str(mod_path(old)), str(mod_path(new)))

    rewriter = Rewriter({o: n for o, n in MOVES.items() if o != n and o not in skipped},
                        names)
    manual: list[str] = []
    changed = 0
    for path in tracked_files(root):
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        label = str(path.relative_to(root))
        new, n = rewriter.text(text, path, root)
        k = 0
        if path.suffix == ".py":
            new, k = rewriter.python_imports(new, label, manual)
        new, j = rewriter.other_imports(new, label, manual)
        if new != text:
            was_long = {line for line in text.splitlines() if len(line) > WIDTH}
            for i, line in enumerate(new.splitlines(), 1):
                if len(line) > WIDTH and line not in was_long and path.suffix == ".py":
                    manual.append(f"{label}:{i}: longer than {WIDTH} characters now; "
                                  "re-wrap it")
            path.write_text(new)
            changed += 1
            print(f"rewrote {label}: {n + k + j} references")

    packages = set(PACKAGES)
    for new in MOVES.values():
        parts = new.split(".")
        for k in range(3, len(parts)):
            if (root / Path(*parts[:k])).is_dir():
                packages.add(".".join(parts[:k]))
    for package in sorted(packages, key=lambda p: (-p.count("."), p)):
        init = root / Path(*package.split(".")) / "__init__.py"
        existed = init.exists()
        init.write_text(init_text(package, root))
        sh("git", "add", str(init.relative_to(root)))
        print(f"{'rewrote' if existed else 'wrote'} {init.relative_to(root)} (docstring only)")

    for new in MOVES.values():
        path = root / mod_path(new)
        if path.exists() and "__file__" in path.read_text():
            manual.append(f"{mod_path(new)}: finds files from __file__; make it name its "
                          "package (importlib.resources.files) instead")
    for path in tracked_files(root):
        rel = path.relative_to(root)
        inside = ".".join(rel.parts[:2])
        olds = [o for o in MOVES if o != MOVES[o] and (inside not in PACKAGES
                                                       or o.startswith(inside + "."))]
        stale = re.compile(r"(?<![\w/.])(" + "|".join(
            re.escape(o.rsplit(".", 1)[1] + ".py") for o in olds) + r")(?![\w])")
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            # a file beside this one is cited by its name alone
            if any(not (path.parent / m.group(1)).exists() for m in stale.finditer(line)):
                manual.append(f"{rel}:{i}: names a moved file without its package: "
                              f"{line.strip()[:90]}")
    print(f"moved {len(todo)} modules, rewrote {changed} files, "
          f"{len(packages)} docstring-only __init__.py files")
    if manual:
        print(f"for a person to check ({len(manual)}):")
        for line in manual:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
