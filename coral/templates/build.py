"""Build serving templates: one combination (`build_template`) or a whole library.

`build_template` solves (model, node combination, SLO, mode, topology) exactly and wraps the
answer in a `Template`: one pipeline over every node by the step-model search
(`placement_step`) when a library asks (a floor) or for vLLM, otherwise the placement problem
of the memoised operating points by `placement.solve_placement`.

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

import itertools
import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from coral.catalog.loader import Catalog
from coral.catalog.schema import ModelArch
from coral.perf.pipeline import PipelineShape, ShapeError, shape_of
from coral.templates.enumerate import (
    DEFAULT_NMAX,
    DEFAULT_RHO,
    Combo,
    Enumeration,
    enumerate_combinations,
    sub_combos,
)
from coral.templates.operating_points import (
    DEFAULT_BATCHES,
    OperatingPointTables,
    PerfLike,
    check_batches,
    check_mode,
    check_topology,
    shared_tables,
)
from coral.templates.engine import (
    DEFAULT_ENGINE,
    check_engine,
    deployable_combo,
    engine_topology,
    max_nodes,
    same_gpu_count,
)
from coral.templates.slo import SloSpec
from coral.templates.placement_step import BELOW_FLOOR_NOTE, solve_step, work_bound
from coral.templates.types import (
    Mode,
    NodePlacement,
    Placement,
    PlacementProblem,
    SolveStatus,
    Topology,
    upper_bound_of,
)

log = logging.getLogger(__name__)

#: Relative tolerance of the dominance test (the solver's own feasibility tolerance is of
#: this order, so two throughputs closer than this are the same).
DOMINANCE_RTOL = 1e-6

#: Default time limit of one placement solve, s.
DEFAULT_TIME_LIMIT_S = 60.0

Solver = Callable[..., Placement]

THROUGHPUT_UNITS: Mapping[str, str] = {
    "aggregated": "req/s",
    "decode": "output tokens/s",
    "prefill": "prompt tokens/s",
}


@dataclass(frozen=True)
class TemplateNode:
    """One node of a template: its layer range [first_layer, first_layer + layers)."""

    node_type: str
    first_layer: int
    layers: int
    batch: int
    tp_degree: int
    capacity: float  # the mode's unit per second
    step_s: float
    prefill_s: float
    mem_bytes: float  # including the input embedding on the node holding layer 0


@dataclass(frozen=True)
class Template:
    """A solved serving template of one model on one node multiset."""

    model: str
    slo: SloSpec
    mode: Mode
    topology: Topology
    combo: tuple[str, ...]  # node-type names, sorted
    nodes: tuple[TemplateNode, ...]
    edges: tuple[tuple[int, int, float], ...]  # (from, to, flow); -1 source, -2 sink
    throughput: float  # in `unit`
    unit: str
    throughput_rps: float  # requests/s of the workload mix
    throughput_tokens_per_s: float  # output tokens/s (aggregated, decode), prompt tokens/s (prefill)
    ttft_s: float | None  # predicted: longest prefill path (None in decode mode)
    tpot_s: float | None  # predicted: longest step path (None in prefill mode)
    usd_per_hour: Mapping[str, float]  # region -> $/hour, regions pricing every node type
    status: SolveStatus
    gap: float
    solve_s: float
    method: str
    upper_bound: float  # proven bound on the combination's throughput
    notes: tuple[str, ...] = ()

    @property
    def num_nodes(self) -> int:
        return len(self.combo)

    @property
    def feasible(self) -> bool:
        return self.status is not SolveStatus.INFEASIBLE and self.throughput > 0

    def min_usd_per_hour(self) -> float | None:
        return min(self.usd_per_hour.values()) if self.usd_per_hour else None

    @property
    def shape(self) -> PipelineShape:
        """What one instance of this template deploys (`coral.perf.pipeline`); raises
        `ShapeError` for a placement that is not one pipeline (a `dag` template, or the best
        split into replicas that `coral templates solve` answers with)."""
        return shape_of(self.nodes)

    @property
    def is_pipeline(self) -> bool:
        """Whether the template is one pipeline of stages (deployable as one instance)."""
        try:
            self.shape
        except ShapeError:
            return False
        return True

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "slo": self.slo.model_dump(mode="json"),
            "mode": self.mode,
            "topology": self.topology,
            "combo": list(self.combo),
            "nodes": [vars(n).copy() for n in self.nodes],
            "edges": [list(e) for e in self.edges],
            "throughput": self.throughput,
            "unit": self.unit,
            "throughput_rps": self.throughput_rps,
            "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "usd_per_hour": dict(self.usd_per_hour),
            "status": self.status.value,
            "gap": self.gap,
            "solve_s": self.solve_s,
            "method": self.method,
            "upper_bound": _finite_or_none(self.upper_bound),
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Template":
        ub = d.get("upper_bound")
        return cls(
            model=d["model"],
            slo=SloSpec(**d["slo"]),
            mode=d["mode"],
            topology=d["topology"],
            combo=tuple(d["combo"]),
            nodes=tuple(TemplateNode(**n) for n in d["nodes"]),
            edges=tuple((int(u), int(v), float(f)) for u, v, f in d["edges"]),
            throughput=float(d["throughput"]),
            unit=d["unit"],
            throughput_rps=float(d["throughput_rps"]),
            throughput_tokens_per_s=float(d["throughput_tokens_per_s"]),
            ttft_s=d.get("ttft_s"),
            tpot_s=d.get("tpot_s"),
            usd_per_hour=dict(d.get("usd_per_hour", {})),
            status=SolveStatus(d["status"]),
            gap=float(d["gap"]),
            solve_s=float(d["solve_s"]),
            method=d.get("method", "ilp"),
            upper_bound=math.inf if ub is None else float(ub),
            notes=tuple(d.get("notes", ())),
        )


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def combo_prices(catalog: Catalog, combo: Sequence[str]) -> dict[str, float]:
    """$/hour of the whole combination in every region that prices all its node types."""
    prices: dict[str, float] | None = None
    for name in combo:
        node = catalog.node_type(name)
        here = {p.region: p.usd_per_hour for p in node.prices}
        if prices is None:
            prices = dict(here)
        else:
            prices = {r: prices[r] + here[r] for r in prices if r in here}
    return {r: round(v, 6) for r, v in sorted((prices or {}).items())}


def _default_solver() -> Solver:
    from coral.templates.placement import solve_placement

    return solve_placement


def canonical_combo(catalog: Catalog, combo: Iterable[str]) -> Combo:
    names = [str(n).strip() for n in combo]
    if not names:
        raise ValueError("a combination needs at least one node type")
    for name in names:
        catalog.node_type(name)  # unknown names raise with suggestions
    return tuple(sorted(names))


def template_from_placement(
    arch: ModelArch,
    combo: Combo,
    slo: SloSpec,
    mode: Mode,
    topology: Topology,
    problem: PlacementProblem,
    placement: Placement,
    catalog: Catalog,
    *,
    solve_s: float | None = None,
) -> Template:
    nodes: list[TemplateNode] = []
    for i, np_ in enumerate(placement.nodes):
        assert isinstance(np_, NodePlacement)
        node_t = catalog.node_type(np_.node_type)
        extra = problem.first_stage_extra_bytes if (np_.layers > 0 and np_.first_layer == 0) else 0.0
        nodes.append(
            TemplateNode(
                node_type=np_.node_type,
                first_layer=int(np_.first_layer),
                layers=int(np_.layers),
                batch=int(np_.batch),
                tp_degree=int(np_.tp_degree or node_t.gpu_count),
                capacity=float(np_.capacity),
                step_s=float(np_.step_s),
                prefill_s=float(np_.prefill_s),
                mem_bytes=float(np_.mem_bytes) + extra,
            )
        )
    thr = float(placement.throughput)
    I, O = slo.input_tokens, slo.output_tokens
    if mode == "aggregated":
        rps, tps = thr, thr * O
    elif mode == "decode":
        rps, tps = thr / O, thr
    else:
        rps, tps = thr / I, thr
    feasible = placement.status is not SolveStatus.INFEASIBLE and thr > 0
    return Template(
        model=arch.name,
        slo=slo,
        mode=mode,
        topology=topology,
        combo=combo,
        nodes=tuple(nodes),
        edges=tuple((int(u), int(v), float(f)) for u, v, f in placement.edges),
        throughput=thr,
        unit=THROUGHPUT_UNITS[mode],
        throughput_rps=rps,
        throughput_tokens_per_s=tps,
        ttft_s=placement.predicted_ttft_s if feasible and mode != "decode" else None,
        tpot_s=placement.predicted_tpot_s if feasible and mode != "prefill" else None,
        usd_per_hour=combo_prices(catalog, combo),
        status=placement.status,
        gap=float(placement.gap),
        solve_s=float(placement.solve_s if solve_s is None else solve_s),
        method=placement.method,
        upper_bound=upper_bound_of(thr, placement.status, float(placement.gap)),
        notes=tuple(placement.notes),
    )


def infeasible_template(
    arch: ModelArch,
    combo: Combo,
    slo: SloSpec,
    mode: Mode,
    topology: Topology,
    catalog: Catalog,
    note: str,
) -> Template:
    return Template(
        model=arch.name, slo=slo, mode=mode, topology=topology, combo=combo, nodes=(), edges=(),
        throughput=0.0, unit=THROUGHPUT_UNITS[mode], throughput_rps=0.0,
        throughput_tokens_per_s=0.0, ttft_s=None, tpot_s=None,
        usd_per_hour=combo_prices(catalog, combo), status=SolveStatus.INFEASIBLE, gap=0.0,
        solve_s=0.0, method="presolve", upper_bound=0.0, notes=(note,),
    )


def build_template(
    model: str | ModelArch,
    combo: Iterable[str],
    slo: SloSpec,
    mode: Mode,
    topology: Topology,
    perf: PerfLike,
    catalog: Catalog,
    *,
    tables: OperatingPointTables | None = None,
    batches: Sequence[int] = DEFAULT_BATCHES,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    method: str = "auto",
    solver: Solver | None = None,
    floor: float | None = None,
    engine: str = DEFAULT_ENGINE,
) -> Template:
    """Solve one combination: the best SLO-feasible placement of `model` on its nodes.

    With `floor` (library builds, `flow` and `chain` topologies) only a single pipeline over
    every node that beats `floor` is sought, under the step model it runs by; when there is
    none the template has throughput 0 and `upper_bound` = `floor` (the combination is
    dominated by its parts). A custom `solver` or `method` is never given the floor.

    `engine` restricts the space to what that engine runs (`coral.templates.engine`): `vllm`
    needs topology `chain` and node types of one GPU count (else the template is infeasible),
    and its template is always one pipeline over every node (one node per stage).
    """
    arch = catalog.model(model) if isinstance(model, str) else model
    mode = check_mode(mode)
    engine = check_engine(engine)
    topology = check_topology(topology)
    if engine != "coral":
        topology = engine_topology(engine, topology)
    names = canonical_combo(catalog, combo)
    if engine == "vllm" and not same_gpu_count(catalog, names):
        return infeasible_template(
            arch, names, slo, mode, topology, catalog,
            "vLLM runs one tensor-parallel size per pipeline: these node types have "
            "different GPU counts",
        )
    limit = max_nodes(engine, mode)
    if limit is not None and len(names) > limit:
        return infeasible_template(
            arch, names, slo, mode, topology, catalog,
            f"a {engine} {mode} instance runs on at most {limit} node(s) (vLLM's KV connector "
            "runs no pipeline parallelism on the decode side)",
        )
    tables = tables or shared_tables(perf, catalog, batches)
    problem = tables.problem(arch, names, slo, mode, topology)
    start = time.perf_counter()
    if uses_step_search(engine, topology, method, solver, floor):
        # one pipeline over every node, exact under the step model it runs by; vLLM (and the
        # chain topology) runs one node per stage
        placement = solve_step(tables.perf, catalog, arch, names, slo, mode,
                               max_group=None if topology == "flow" else 1, floor=floor,
                               batches=tables.batches)
    elif engine == "vllm":
        raise ValueError("vLLM templates are searched under the step model (one pipeline over "
                         "every node); a custom solver or method does not apply")
    elif not any(node.options for node in problem.nodes):
        return infeasible_template(
            arch, names, slo, mode, topology, catalog,
            "no node has an operating point that fits its memory and meets the SLO",
        )
    else:
        placement = (solver or _default_solver())(problem, time_limit_s=time_limit_s,
                                                   method=method)
    wall = time.perf_counter() - start
    # the wall time of the whole call (the solver's own figure may leave out its presolve)
    tpl = template_from_placement(
        arch, names, slo, mode, topology, problem, placement, catalog, solve_s=wall
    )
    if floor is not None and any(n.startswith(BELOW_FLOOR_NOTE) for n in placement.notes):
        tpl = replace(tpl, upper_bound=float(floor))
    return tpl


def uses_step_search(engine: str, topology: str, method: str, solver: Solver | None,
                     floor: float | None) -> bool:
    """Whether `build_template` answers with the step-model search (`placement_step`): a
    single pipeline over every node (a floor given, or vLLM, which runs nothing else), with
    the default solver."""
    if solver is not None or method != "auto" or topology not in ("flow", "chain"):
        return False
    return check_engine(engine) == "vllm" or floor is not None


def explain_infeasible(
    model: str | ModelArch,
    combo: Iterable[str],
    slo: SloSpec,
    mode: Mode,
    tables: OperatingPointTables,
) -> str:
    """Why a combination has no placement, in words (for the CLI)."""
    arch = tables.catalog.model(model) if isinstance(model, str) else model
    names = canonical_combo(tables.catalog, combo)
    n = len(names)
    total_usable = sum(tables.usable_bytes(x) for x in names)
    parts: list[str] = []
    if total_usable < arch.weight_bytes:
        parts.append(
            f"the nodes' usable memory ({total_usable / 1e9:.1f} GB) is below the weights "
            f"({arch.weight_bytes / 1e9:.1f} GB)"
        )
    for name in dict.fromkeys(names):
        spec = tables.node_spec(arch, name, slo, mode, n)
        if not spec.options:
            t1 = tables.time_table(arch, name, slo, mode)
            fastest = float(t1.t[0].min())
            parts.append(
                f"{name} has no operating point (even one layer at batch "
                f"{t1.batches[0]} takes {fastest * 1e3:.1f} ms per iteration; "
                f"TPOT target {slo.tpot_s * 1e3:g} ms, TTFT target {slo.ttft_s:g} s)"
            )
    if not parts:
        parts.append(
            "no split of the layers over these nodes meets both memory and the SLO on every "
            "path (try more nodes, faster node types or a looser --tpot/--ttft)"
        )
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------
# libraries


@dataclass(frozen=True)
class Task:
    """One combination to solve, with the best throughput its proper sub-multisets reach,
    alone or side by side (two disjoint parts whose templates run next to each other)."""

    combo: Combo
    best_sub: float


@dataclass(frozen=True)
class Outcome:
    """What solving (or skipping) one combination gave."""

    combo: Combo
    template: Template | None  # None when skipped by the bound
    bound: float  # the a-priori upper bound on its throughput
    wall_s: float


OUTCOMES = ("kept", "dominated", "bound", "infeasible", "zero")


def solve_task(
    task: Task,
    *,
    model: ModelArch,
    slo: SloSpec,
    mode: Mode,
    topology: Topology,
    perf: PerfLike,
    catalog: Catalog,
    tables: OperatingPointTables,
    time_limit_s: float,
    method: str,
    bound_skip: bool,
    solver: Solver | None = None,
    engine: str = DEFAULT_ENGINE,
) -> Outcome:
    start = time.perf_counter()
    floor = task.best_sub if bound_skip else _one_pipeline_floor(topology)
    by_steps = uses_step_search(engine, topology, method, solver, floor)
    if by_steps:
        bound = work_bound(tables.perf, catalog,
                           catalog.model(model) if isinstance(model, str) else model,
                           task.combo, slo, mode, batches=tables.batches)
    else:
        bound = tables.throughput_bound(model, task.combo, slo, mode)
    if bound_skip and task.best_sub > 0 and bound <= task.best_sub * (1 + DOMINANCE_RTOL):
        return Outcome(task.combo, None, bound, time.perf_counter() - start)
    tpl = build_template(
        model, task.combo, slo, mode, topology, perf, catalog, tables=tables,
        time_limit_s=time_limit_s, method=method, solver=solver,
        floor=floor, engine=engine,
    )
    if math.isfinite(bound) and tpl.upper_bound > bound:
        tpl = replace(tpl, upper_bound=bound)
    return Outcome(task.combo, tpl, bound, time.perf_counter() - start)


def _one_pipeline_floor(topology: Topology) -> float | None:
    """The floor that asks for one pipeline over every node and nothing more: a library's
    templates are single pipelines (one instance each) even without the dominance cut."""
    return 0.0 if topology in ("flow", "chain") else None


def split_floor(combo: Combo, best: Mapping[Combo, float]) -> float:
    """The best throughput of `combo`'s nodes as two disjoint parts served side by side."""
    names = sorted(set(combo))
    counts = [combo.count(n) for n in names]
    out = 0.0
    for vec in itertools.product(*(range(c + 1) for c in counts)):
        size = sum(vec)
        if size == 0 or size == len(combo):
            continue
        rest = tuple(c - v for c, v in zip(counts, vec))
        if rest < vec:  # each split once
            continue
        part = tuple(n for n, v in zip(names, vec) for _ in range(v))
        other = tuple(n for n, v in zip(names, rest) for _ in range(v))
        a, b = best.get(part, 0.0), best.get(other, 0.0)
        if a > 0 and b > 0:
            out = max(out, a + b)
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
    from coral.templates import store as lib_mod

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
    topology: Topology | None = None,
    engine: str = DEFAULT_ENGINE,
    nmax: int = DEFAULT_NMAX,
    rho: float = DEFAULT_RHO,
    node_types: Sequence[str] | None = None,
    regions: Sequence[str] | None = None,
    batches: Sequence[int] = DEFAULT_BATCHES,
    out: str | Path | None = None,
    workers: int | None = 1,
    ray_address: str | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    method: str = "auto",
    bound_skip: bool = True,
    perf: PerfLike | None = None,
    perf_factory: Callable[[Catalog], PerfLike] | None = None,
    solver: Solver | None = None,
    progress: bool = False,
    on_message: Callable[[str], None] | None = None,
) -> tuple[list[Template], BuildReport]:
    """Enumerate, solve and prune every combination of `model`; persist to `out` if given.

    Returns the kept templates (size, then combination order) and the report. With `out`, an
    existing library with the same inputs is reused (resumed when incomplete); one with other
    inputs is moved aside and rebuilt. `workers` > 1 or `ray_address` solve in parallel (each
    worker builds its own perf model with `perf_factory`, default `PerfModel(catalog)`).
    `engine` restricts the library to the shapes that engine runs (`coral.templates.engine`;
    `vllm`: topology `chain`, the default then, and only combinations of one GPU count, which
    the report counts as `combos_pruned_engine`); `topology` defaults to `flow` otherwise.
    """
    from coral.templates import store as lib_mod
    from coral.templates import parallel as par

    arch = catalog.model(model) if isinstance(model, str) else model
    mode = check_mode(mode)
    engine = check_engine(engine)
    topology = check_topology(engine_topology(engine, topology))
    batches = check_batches(batches)
    if time_limit_s <= 0:
        raise ValueError(f"time limit must be > 0 s, got {time_limit_s}")
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
        perf = (perf_factory or par.default_perf_factory)(catalog)
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
    backend = par.make_backend(
        workers=workers, ray_address=ray_address, catalog=catalog, perf=perf,
        perf_factory=perf_factory, model=arch.name, slo=slo, mode=mode, topology=topology,
        batches=batches, time_limit_s=time_limit_s, method=method, bound_skip=bound_skip,
        solver=solver, engine=engine,
    )

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
