"""The typed plan file: what `coral plan --out` writes and every reader of a plan reads.

`read_plan` reads a file (or `PlanFile.from_payload` an in-memory payload, such as
`PlanResult.to_dict()`), runs the plan check (`coral.plans.check`) and returns a `PlanFile`:
its rows as `PlanRow` (each with its pipeline shape), each model's `SloSpec` read
through SloSpec's checked constructor, the demand, the market and engine it was planned for
and the spot and robust promises. `write_plan` writes one. What the file holds for people
only (costs, baselines, notes, solver figures) is carried through unread in `report`, so a
plan read and written again is the same JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from coral.perf.pipeline import PipelineShape
from coral.perf.slowdown import Slowdown, slowdown_from_json, slowdown_json
from coral.plans.errors import PlanFileError
from coral.templates.slo import SloError, SloSpec

if TYPE_CHECKING:
    from coral.catalog import Catalog

#: Largest plan file read. A plan holds one row per template and region it uses (and the
#: lists of templates and columns it chose from), far below this; the bound refuses a wrong
#: file at once instead of parsing gigabytes.
MAX_PLAN_FILE_BYTES = 64 << 20

ON_DEMAND, SPOT = "on_demand", "spot"
FROM_PLAN = "expected a file from `coral plan SCENARIO --out FILE`"

#: The plan file's top-level entries in the order the planner writes them (entries not
#: named here follow, in the order read).
PLAN_ORDER = (
    "scenario", "level", "mode", "engine", "slos", "cost_per_hour", "solve_seconds",
    "status", "gap", "goodput_gap", "solved", "meets_demand", "served_fraction", "demand_rps",
    "capacity_rps", "served_rps", "headroom_rps", "shortfall_rps", "startup_penalty_usd",
    "instances", "nodes_per_region", "started", "stopped", "nmax", "scenario_nmax",
    "nmax_reduced", "templates", "columns", "baselines", "notes", "solver_notes", "robust",
    "spot", "goodput_tokens_per_s", "goodput_rps", "served_tokens_per_s", "scarcity",
    "uniform_scale")


@dataclass(frozen=True)
class PlanRow:
    """`count` instances of one template in one region: one row of the plan file."""

    region: str
    template_id: str
    model: str
    mode: str
    count: int
    node_counts: Mapping[str, int]  # node type -> nodes in one instance
    shape: PipelineShape | None  # what one instance deploys (None: no template known)
    capacity: float  # one instance, in `unit`
    unit: str
    capacity_rps: float  # one instance, planned requests/s of the model's workload mix
    usd_per_hour: float  # one instance, in this region
    started: int  # of `count`, started against the current deployment
    utilisation: float = 1.0  # planned capacity / full throughput (queueing headroom)
    market: str = ON_DEMAND  # or `spot` (`coral plan --spot`); a row without it is on demand

    @property
    def name(self) -> str:
        """Unique in a plan: `region/template_id`."""
        return f"{self.region}/{self.template_id}"

    @property
    def node_mix(self) -> str:
        return ", ".join(f"{k}x {g}" for g, k in self.node_counts.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "template_id": self.template_id,
            "model": self.model,
            "mode": self.mode,
            "count": self.count,
            "nodes": dict(self.node_counts),
            "stages": self.shape.to_dicts() if self.shape is not None else [],
            "capacity": self.capacity,
            "unit": self.unit,
            "capacity_rps": self.capacity_rps,
            "usd_per_hour": self.usd_per_hour,
            "usd_per_hour_total": self.usd_per_hour * self.count,
            "started": self.started,
            "utilisation": self.utilisation,
            "market": self.market,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "PlanRow":
        """A row the plan check passed (`stages`, or the older per-node `placement`)."""
        shape = PipelineShape.from_row(row)
        nodes = row.get("nodes")
        if not isinstance(nodes, Mapping):
            nodes = {}
            for st in shape.stages:
                nodes[st.node_type] = nodes.get(st.node_type, 0) + st.count
        return cls(
            region=str(row["region"]), template_id=str(row["template_id"]),
            model=str(row["model"]), mode=str(row.get("mode", "aggregated")),
            count=int(row["count"]), node_counts={str(g): int(k) for g, k in nodes.items()},
            shape=shape, capacity=float(row.get("capacity") or 0.0),
            unit=str(row.get("unit") or "req/s"),
            capacity_rps=float(row.get("capacity_rps") or 0.0),
            usd_per_hour=float(row["usd_per_hour"]), started=int(row.get("started") or 0),
            utilisation=float(row.get("utilisation", 1.0)),
            market=str(row.get("market") or ON_DEMAND))


@dataclass(frozen=True)
class SpotPromise:
    """A spot plan's promise (`coral plan --spot`): every model covered over `window_s`
    with probability at least `risk_target`; `figures` holds the rest as written."""

    risk_target: float
    window_s: float
    figures: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"risk_target": self.risk_target, "window_s": self.window_s, **self.figures}


ROBUST_ORDER = ("R", "factor", "factors", "basis", "gpu_types")


@dataclass(frozen=True)
class RobustPromise:
    """A robust plan's promise (`coral plan --robust R`): every model meets its SLO with the
    GPU types in `factors` slowed by their factor; `figures` holds the rest as written."""

    r: float | str  # R, or "auto" (each GPU type by its own uncertainty)
    factor: float | None  # 1 + R, or None for `auto`
    factors: Mapping[str, Slowdown]  # GPU type -> slowdown planned for (or one per phase)
    basis: Mapping[str, str] = field(default_factory=dict)  # GPU type -> why that much
    figures: Mapping[str, Any] = field(default_factory=dict)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(self.factors)

    def to_dict(self) -> dict[str, Any]:
        return {"R": self.r, "factor": self.factor,
                "factors": {g: slowdown_json(f) for g, f in self.factors.items()},
                "basis": dict(self.basis), "gpu_types": list(self.factors), **self.figures}


@dataclass(frozen=True)
class PlanFile:
    """A plan as `coral plan --out` writes it. `rejected` lists the rows a lenient read
    (`read_plan(..., skip_bad_rows=True)`) left out, with their problems; it is not written."""

    scenario: str | None  # the scenario's name or file (None: an in-memory plan without)
    instances: tuple[PlanRow, ...]
    level: str | None = None
    mode: str | None = None  # aggregated, pd or mixed (an `auto` scenario: the one chosen)
    engine: str | None = None  # the engine every row is deployable on (None: coral)
    slos: Mapping[str, SloSpec] | None = None  # None: a plan written before plans had them
    demand_rps: Mapping[str, float] | None = None  # model -> requests/s planned for
    nmax: int | None = None  # node limit the templates were built with
    objective: str | None = None  # the scarcity objective (fair, priority, ...)
    spot: SpotPromise | None = None
    robust: RobustPromise | None = None
    report: Mapping[str, Any] = field(default_factory=dict)  # the rest, for people
    rejected: tuple[RejectedRow, ...] = ()

    def to_payload(self) -> dict[str, Any]:
        """The JSON object of the file, entries in the planner's order."""
        typed: dict[str, Any] = {"level": self.level}
        if self.scenario is not None:
            typed["scenario"] = self.scenario
        for name, value in (("mode", self.mode), ("engine", self.engine),
                            ("nmax", self.nmax)):
            if value is not None:
                typed[name] = value
        if self.slos is not None:
            typed["slos"] = {m: s.model_dump(mode="json") for m, s in self.slos.items()}
        if self.demand_rps is not None:
            typed["demand_rps"] = dict(self.demand_rps)
        typed["instances"] = [i.to_dict() for i in self.instances]
        if self.spot is not None:
            typed["spot"] = self.spot.to_dict()
        if self.robust is not None:
            typed["robust"] = self.robust.to_dict()
        merged = {**self.report, **typed}
        if self.objective is not None:
            merged["scarcity"] = {"objective": self.objective,
                                  **dict(self.report.get("scarcity") or {})}
        out = {k: merged[k] for k in PLAN_ORDER if k in merged}
        out.update((k, v) for k, v in merged.items() if k not in out)
        return out

    @classmethod
    def from_payload(cls, payload: Any, catalog: Catalog | None = None,
                     source: str = "the plan", *, skip_bad_rows: bool = False) -> "PlanFile":
        """A plan from its JSON object, after the plan check (with `catalog`, its names
        too). A problem of the plan as a whole raises `PlanCheckError` listing every
        problem; so does a bad row, unless `skip_bad_rows` (then it is in `rejected`)."""
        from coral.plans.check import check_plan

        check = check_plan(payload, catalog, source)
        if check.of_plan() or (check.problems and not skip_bad_rows):
            check.raise_if_any()
        rows, rejected = [], []
        for k, row in enumerate(payload["instances"]):
            problems = check.of_row(k)
            if problems:
                rejected.append(RejectedRow(k, _row_name(k, row), problems))
            else:
                rows.append(PlanRow.from_row(row))
        known = {"scenario", "level", "mode", "engine", "nmax", "slos", "demand_rps",
                 "instances", "spot", "robust"}
        report = {k: v for k, v in payload.items() if k not in known}
        scarcity = payload.get("scarcity")
        objective = None
        if isinstance(scarcity, Mapping) and isinstance(scarcity.get("objective"), str):
            objective = scarcity["objective"]
            report["scarcity"] = {k: v for k, v in scarcity.items() if k != "objective"}
        return cls(
            scenario=_opt_text(payload, "scenario", source), instances=tuple(rows),
            level=_opt_text(payload, "level", source), mode=_opt_text(payload, "mode", source),
            engine=_opt_text(payload, "engine", source),
            slos=_slos(payload.get("slos"), source),
            demand_rps=None if payload.get("demand_rps") is None else
            {str(m): float(r) for m, r in payload["demand_rps"].items()},
            nmax=_opt_whole(payload, "nmax", source), objective=objective,
            spot=_spot(payload.get("spot"), source),
            robust=_robust(payload.get("robust"), source),
            report=report, rejected=tuple(rejected))


@dataclass(frozen=True)
class RejectedRow:
    """A row a lenient read left out: its index, its name and every problem found."""

    index: int
    name: str  # `region/template_id`, or `instances[K]` when the row has neither
    problems: tuple[Any, ...]  # of coral.plans.check.PlanProblem


def read_plan(path: str | Path, catalog: Catalog | None = None, *,
              skip_bad_rows: bool = False) -> PlanFile:
    """The plan in a file from `coral plan SCENARIO --out FILE`, or `PlanFileError` naming
    the file, the entry and what is wrong (see `PlanFile.from_payload`)."""
    p = Path(path)
    return PlanFile.from_payload(read_plan_json(p), catalog, str(p),
                                 skip_bad_rows=skip_bad_rows)


def read_plan_json(path: str | Path) -> dict[str, Any]:
    """The JSON object of a plan file, unchecked past its two required entries; the few
    tools that rewrite a plan by hand read it here, every other reader through
    `read_plan`."""
    p = Path(path)
    if not p.is_file():
        raise PlanFileError(f"plan file {p} does not exist")
    size = p.stat().st_size
    if size > MAX_PLAN_FILE_BYTES:
        raise PlanFileError(f"{p} holds {size / 2**20:.0f} MiB, more than a plan file's "
                            f"{MAX_PLAN_FILE_BYTES >> 20} MiB; {FROM_PLAN}")
    try:
        payload = json.loads(p.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanFileError(f"{p} is not JSON ({exc}); {FROM_PLAN}") from None
    except (ValueError, RecursionError) as exc:  # a number of >4300 digits; deep nesting
        raise PlanFileError(f"{p} is not a plan's JSON ({type(exc).__name__}: {exc}); "
                            f"{FROM_PLAN}") from None
    if not isinstance(payload, dict) or "instances" not in payload or "scenario" not in payload:
        raise PlanFileError(f"{p} is not a plan: expected 'scenario' and 'instances' (write "
                            "one with `coral plan SCENARIO --out FILE`)")
    return payload


def write_plan(plan: PlanFile, path: str | Path) -> None:
    """Write `plan` as `coral plan --out` does (indented JSON, no NaN or Infinity)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(plan_json(plan) + "\n")


def plan_json(plan: PlanFile) -> str:
    return json.dumps(plan.to_payload(), indent=2, default=str)


# ---------------------------------------------------------------- entries
def _problem(source: str, entry: str, what: str) -> PlanFileError:
    return PlanFileError(f"{source}: entry '{entry}' {what}; to fix: correct it, or re-plan "
                         "with `coral plan SCENARIO --out FILE`")


def _text(payload: Mapping[str, Any], name: str, source: str) -> str:
    value = payload.get(name)
    if not isinstance(value, str) or not value:
        raise _problem(source, name, f"must be a non-empty string, got {value!r}")
    return value


def _opt_text(payload: Mapping[str, Any], name: str, source: str) -> str | None:
    return None if payload.get(name) is None else _text(payload, name, source)


def _opt_whole(payload: Mapping[str, Any], name: str, source: str) -> int | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _problem(source, name, f"must be a whole number >= 1, got {value!r}")
    return value


def _slos(raw: Any, source: str) -> dict[str, SloSpec] | None:
    """Each model's SLO through `SloSpec.parse` (the check has named every bad field)."""
    if raw is None:
        return None
    out = {}
    for model, values in raw.items():
        try:
            out[str(model)] = SloSpec.parse(values)
        except SloError as exc:
            raise _problem(source, f"slos[{model!r}]", f"is not an SLO ({exc})") from None
    return out


def _number(raw: Mapping[str, Any], key: str, source: str, entry: str) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _problem(source, f"{entry}.{key}", f"must be a finite number, got {value!r}")
    return float(value)


def _spot(raw: Any, source: str) -> SpotPromise | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise _problem(source, "spot", f"must be an object, got {type(raw).__name__}")
    return SpotPromise(risk_target=_number(raw, "risk_target", source, "spot"),
                       window_s=_number(raw, "window_s", source, "spot"),
                       figures={k: v for k, v in raw.items()
                                if k not in ("risk_target", "window_s")})


def _robust(raw: Any, source: str) -> RobustPromise | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise _problem(source, "robust", f"must be an object, got {type(raw).__name__}")
    r = raw.get("R")
    if r != "auto":
        r = _number(raw, "R", source, "robust")
    factor = None if raw.get("factor") is None else _number(raw, "factor", source, "robust")
    factors = raw.get("factors")
    if not isinstance(factors, Mapping):
        raise _problem(source, "robust.factors", "must map each GPU type to its slowdown")
    read: dict[str, Slowdown] = {}
    for g, value in factors.items():
        try:
            read[str(g)] = slowdown_from_json(value)
        except ValueError as exc:
            raise _problem(source, f"robust.factors[{g!r}]", str(exc)) from None
    return RobustPromise(
        r=r, factor=factor, factors=read,
        basis={str(g): str(b) for g, b in (raw.get("basis") or {}).items()},
        figures={k: v for k, v in raw.items() if k not in ROBUST_ORDER})


def _row_name(k: int, row: Any) -> str:
    if isinstance(row, Mapping):
        region, tid = row.get("region"), row.get("template_id")
        if isinstance(region, str) and isinstance(tid, str):
            return f"{region}/{tid}"
    return f"instances[{k}]"
