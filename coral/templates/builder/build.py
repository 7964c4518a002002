"""Build a template library (`build_library`); one combination is `solve.build_template`.

`build_library` enumerates the model's combinations and solves them in waves of increasing
size, so that when a combination is solved every multiset it contains is already known. That
makes two lossless cuts possible:

- **dominance** (after solving): a template is dropped when some proper sub-multiset of its
  nodes reaches at least its throughput — fewer nodes of the same types cost less in every
  region and need less availability. `best(c)`, the best throughput over `c` and all its
  sub-multisets, is carried from wave to wave, so "some sub-multiset" is checked recursively
  through the one-node-smaller ones. A template solved only to a time limit is compared by its
  proven upper bound, never by its incumbent.
- **floor** (while solving): `best_sub`, the best a proper part of the combination reaches
  (a sub-multiset alone, or two disjoint parts side by side, see `split_floor`), is the
  floor; anything that splits the nodes into smaller replicas is at most that, so only one
  pipeline over *all* the nodes can beat it, and that is all the search looks for (its
  micro-batches and stage counts are tried best bound first, so most stop at once).
- **bound** (before solving): `placement_step.work_bound` (for a custom solver or method,
  `OperatingPointTables.throughput_bound`) is a true upper bound on a combination's
  throughput; when it is no more than the floor, the combination cannot be kept, and it is
  not solved.

Zero-throughput and infeasible combinations are recorded and dropped. Every outcome is written
to the library as it arrives (see `store.py`), so an interrupted build resumes where it
stopped; `parallel.py` runs the solves on local processes or a Ray cluster.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from coral.catalog.loader import Catalog
from coral.catalog.schema import ModelArch
from coral.templates.builder.build_options import BuildOptions
from coral.templates.space.engines import deployable_combo, engine_topology
from coral.templates.space.enumerate import (
    DEFAULT_NMAX,
    DEFAULT_RHO,
    Combo,
    Enumeration,
    enumerate_combinations,
    sub_combos,
)
from coral.templates.space.operating_points import (
    PerfLike,
    check_mode,
    check_topology,
    shared_tables,
)
from coral.templates.slo import SloSpec
from coral.templates.builder.solve import (
    DEFAULT_TIME_LIMIT_S,
    DOMINANCE_RTOL,
    Outcome,
    Solver,
    Task,
)
from coral.templates.template import Template
from coral.templates.types import Mode, SolveStatus

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# libraries


OUTCOMES = ("kept", "dominated", "bound", "infeasible", "zero")


def split_floor(combo: Combo, best: Mapping[Combo, float]) -> float:
    """The best throughput of `combo`'s nodes as two disjoint parts served side by side.

    A part takes a leading slice of each node type's run in the sorted combination and the
    other part the rest, so both are sorted as built; each split is visited once (the part
    is at most its complement at the first type where they differ)."""
    runs = []  # (start, end) of each node type's run
    start = 0
    for i in range(1, len(combo) + 1):
        if i == len(combo) or combo[i] != combo[start]:
            runs.append((start, i))
            start = i
    out = 0.0
    last = len(runs) - 1

    def visit(k: int, part: Combo, other: Combo, tie: bool) -> None:
        nonlocal out
        s, e = runs[k]
        c = e - s
        for v in range(c + 1):
            still_tied = tie
            if tie:
                if 2 * v > c:
                    break
                still_tied = 2 * v == c
            p, o = part + combo[s:s + v], other + combo[s + v:e]
            if k < last:
                visit(k + 1, p, o, still_tied)
            elif p and o:
                a = best.get(p, 0.0)
                if a > 0:
                    b = best.get(o, 0.0)
                    if b > 0 and a + b > out:
                        out = a + b

    visit(0, (), (), True)
    return out


def classify(outcome: Outcome, best_sub: float) -> str:
    """kept / dominated / bound / infeasible / zero (see the module docstring)."""
    tpl = outcome.template
    if tpl is None:
        return "bound"
    if tpl.status is SolveStatus.INFEASIBLE:
        return "infeasible"
    if best_sub > 0 and best_sub >= tpl.upper_bound * (1 - DOMINANCE_RTOL):
        return "dominated"
    if tpl.throughput <= 0:
        return "zero"
    return "kept"


@dataclass
class BuildReport:
    """Counts and timings of one library build (or resume)."""

    model: str
    mode: str
    path: str | None
    enumeration: dict[str, int]
    excluded_node_types: dict[str, str]
    outcomes: dict[str, int] = field(default_factory=lambda: {k: 0 for k in OUTCOMES})
    solved: int = 0
    optimal: int = 0
    reused: int = 0  # outcomes found in the library from an earlier run
    solve_seconds: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    tables_s: float = 0.0
    message: str = ""

    @property
    def kept(self) -> int:
        return self.outcomes["kept"]

    def summary(self) -> dict[str, Any]:
        secs = sorted(self.solve_seconds)
        return {
            "model": self.model,
            "mode": self.mode,
            "path": self.path,
            "message": self.message,
            **{f"combos_{k}": v for k, v in self.enumeration.items()},
            "excluded_node_types": self.excluded_node_types,
            "outcomes": dict(self.outcomes),
            "solved_now": self.solved,
            "reused": self.reused,
            "optimal_share": (self.optimal / self.solved) if self.solved else None,
            "solve_s_median": _quantile(secs, 0.5),
            "solve_s_p99": _quantile(secs, 0.99),
            "solve_s_total": sum(secs),
            "tables_s": self.tables_s,
            "wall_s": self.wall_s,
        }


def _finished_library(out: Path, inputs: Any, model: str, mode: Mode
                      ) -> tuple[list[Template], BuildReport] | None:
    """A finished library at `out` built from these same inputs, read back whole: its kept
    templates and a report from what it recorded (the enumeration's counts and the node types
    it excluded), without computing the operating points of every node type again; None
    when there is none (then the build opens, resumes or rebuilds it)."""
    from coral.templates.builder import store as lib_mod

    if not (out / lib_mod.MANIFEST).exists():
        return None
    try:
        library = lib_mod.TemplateLibrary.open(out)
    except lib_mod.LibraryError:
        return None
    stored = library.manifest.get("report")
    if library.digest != inputs.digest() or not library.complete \
            or not isinstance(stored, dict) or "excluded_node_types" not in stored:
        return None
    counts = library.counts()
    report = BuildReport(
        model=model, mode=mode, path=str(out),
        enumeration={k[len("combos_"):]: int(v) for k, v in stored.items()
                     if k.startswith("combos_")},
        excluded_node_types=dict(stored["excluded_node_types"]),
        message=lib_mod.reuse_message(out, sum(counts.values())),
    )
    report.outcomes.update(counts)
    report.reused = sum(counts.values())
    return library.templates(), report


def _quantile(sorted_values: Sequence[float], q: float) -> float | None:
    if not sorted_values:
        return None
    idx = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return float(sorted_values[idx])


def build_library(
    model: str | ModelArch,
    catalog: Catalog,
    *,
    slo: SloSpec,
    mode: Mode = "aggregated",
    nmax: int = DEFAULT_NMAX,
    rho: float = DEFAULT_RHO,
    node_types: Sequence[str] | None = None,
    regions: Sequence[str] | None = None,
    options: BuildOptions = BuildOptions(),
    out: str | Path | None = None,
    perf: PerfLike | None = None,
    progress: bool = False,
    on_message: Callable[[str], None] | None = None,
) -> tuple[list[Template], BuildReport]:
    """Enumerate, solve and prune every combination of `model`; persist to `out` if given.

    The keywords before `options` say which library (its SLO, mode, size and pools); the
    `BuildOptions` say how it is built. Returns the kept templates (size, then combination
    order) and the report. With `out`, an existing library with the same inputs is reused
    (resumed when incomplete); one with other inputs is moved aside and rebuilt.
    `options.workers` > 1 or `options.ray_address` solve in parallel (each worker builds its
    own perf model with `options.perf_factory`, default `PerfModel(catalog)`).
    `options.engine` restricts the library to the shapes that engine runs
    (`coral.templates.space.engines`; `vllm`: topology `chain`, the default then, and only
    combinations of one GPU count, which the report counts as `combos_pruned_engine`); the
    topology defaults to `flow` otherwise.
    """
    from coral.templates.builder import store as lib_mod
    from coral.templates.builder import parallel as par

    arch = catalog.model(model) if isinstance(model, str) else model
    mode = check_mode(mode)
    engine = options.engine
    topology = check_topology(engine_topology(engine, options.topology))
    batches = options.batches
    say = on_message or (lambda msg: log.info("%s", msg))
    t_start = time.perf_counter()

    if out is not None:
        inputs = lib_mod.LibraryInputs.create(
            catalog=catalog, model=arch.name, slo=slo, mode=mode, topology=topology, nmax=nmax,
            rho=rho, node_types=node_types, regions=regions, batches=batches, engine=engine,
        )
        finished = _finished_library(Path(out), inputs, arch.name, mode)
        if finished is not None:
            kept, report = finished
            say(report.message)
            report.wall_s = time.perf_counter() - t_start
            return kept, report

    if perf is None:
        perf = (options.perf_factory or par.default_perf_factory)(catalog)
    tables = shared_tables(perf, catalog, batches)

    # node types that can hold no layer at any operating point are useless everywhere
    candidates = list(catalog.node_types) if node_types is None else list(dict.fromkeys(node_types))
    for name in candidates:
        catalog.node_type(name)
    useful, useless = tables.useful_node_types(arch, candidates, slo, mode)
    min_kv_tokens = slo.input_tokens + (slo.output_tokens if mode != "prefill" else 0)
    enum: Enumeration = enumerate_combinations(
        arch, catalog, nmax=nmax, rho=rho, node_types=useful, regions=regions,
        min_kv_tokens=min_kv_tokens, memory_reserve=tables.memory_reserve,
    )
    excluded = {n: "no operating point fits its memory and meets the SLO" for n in useless}
    excluded.update(enum.excluded_node_types)
    combos = enum.combos
    enumeration = enum.counts()
    if engine == "vllm":
        # one TP size per pipeline (and single-node decode instances); every sub-multiset of
        # a kept combination is kept too, so the dominance and floor cuts still see every part
        combos = tuple(c for c in combos if deployable_combo(engine, catalog, c, mode))
        enumeration["pruned_engine"] = len(enum.combos) - len(combos)
        enumeration["candidates"] = len(combos)

    report = BuildReport(
        model=arch.name, mode=mode, path=str(out) if out is not None else None,
        enumeration=enumeration, excluded_node_types=excluded,
    )

    # the backend first: a missing optional dependency fails before anything is written
    backend = par.make_backend(options, catalog=catalog, perf=perf, model=arch.name, slo=slo,
                               mode=mode, topology=topology)

    library = None
    done: dict[Combo, dict[str, Any]] = {}
    if out is not None:
        try:
            library, message = lib_mod.TemplateLibrary.open_for_build(out, inputs)
        except BaseException:
            backend.close()
            raise
        report.message = message
        say(message)
        done = library.records_by_combo()

    best: dict[Combo, float] = {}
    kept: list[Template] = []
    pending_total = sum(1 for c in combos if c not in done)
    bar = par.ProgressBar(enabled=progress, total=pending_total,
                          description=f"{arch.name} {mode}")
    try:
        with bar:
            for size in range(1, nmax + 1):
                wave = [c for c in combos if len(c) == size]
                tasks: list[Task] = []
                for c in wave:
                    bs = max(max((best.get(s, 0.0) for s in sub_combos(c)), default=0.0),
                             split_floor(c, best))
                    rec = done.get(c)
                    if rec is not None:
                        report.reused += 1
                        report.outcomes[rec["outcome"]] += 1
                        thr = float(rec.get("throughput") or 0.0)
                        best[c] = max(bs, thr)
                        if rec["outcome"] == "kept" and rec.get("template"):
                            kept.append(Template.from_dict(rec["template"]))
                        continue
                    tasks.append(Task(c, bs))
                if not tasks:
                    continue
                best_sub = {t.combo: t.best_sub for t in tasks}
                for outcome in backend.run(tasks):
                    bs = best_sub[outcome.combo]
                    kind = classify(outcome, bs)
                    tpl = outcome.template
                    thr = tpl.throughput if tpl is not None and kind != "infeasible" else 0.0
                    best[outcome.combo] = max(bs, thr)
                    report.outcomes[kind] += 1
                    if tpl is not None:
                        report.solved += 1
                        report.solve_seconds.append(tpl.solve_s)
                        if tpl.status is SolveStatus.OPTIMAL:
                            report.optimal += 1
                    if kind == "kept":
                        assert tpl is not None
                        kept.append(tpl)
                    if library is not None:
                        library.append(lib_mod.outcome_record(outcome, kind, bs))
                    bar.advance()
    finally:
        backend.close()
        if library is not None:
            library.close()
    report.tables_s = tables.stats.time_table_s + tables.stats.node_spec_s
    report.wall_s = time.perf_counter() - t_start
    if library is not None:
        library.finish(report.summary())
    kept.sort(key=lambda t: (len(t.combo), t.combo))
    return kept, report
