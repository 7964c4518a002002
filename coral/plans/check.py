"""The one check of a plan file's content, run by every reader before it believes a row.

`coral simulate`, `coral serve` (its dry run too) and the runtime's deployment read plan rows
written by `coral plan --out`, or by hand. A row they believe unchecked can simulate a model
on half its layers, allocate a billion instances, or fail deep inside with a traceback; so
each reader calls `check_plan` first, and every problem found names the file, the instance
(its index, model and `region/template_id`) and the field, says what is wrong and how to fix
it. All problems are collected, not just the first.

What is checked:

- the plan: 'instances' is a list; 'slos', when present, maps every model the plan serves
  or has demand for to a valid SLO (`SloSpec`); 'demand_rps' maps models to finite rates;
  the plan's instances and nodes in all stay within `MAX_PLAN_INSTANCES` and
  `MAX_PLAN_NODES` (a bound a real deployment stays far below, that a simulation or a
  deployment can still hold in memory); scenario, level, mode and engine are text and nmax
  a whole number; a `spot` or `robust` promise has the numbers its readers take;
- each row: model, region and template_id are strings; `count` is a whole number from 0
  (a row that runs nothing) to `MAX_ROW_INSTANCES`; `mode` and `market` are known values;
  its price (`usd_per_hour`, which the simulator adds up) and capacities are finite and not
  negative; `nodes` maps node types to whole numbers; its `stages` (or the older per-node
  `placement`) have whole, bounded counts,
  layers, batches and tensor-parallel degrees, and tile the model's layers [0, L) exactly
  once (no gap, no overlap);
- given a catalog: each model and node type is in it, a stage's `tp_degree` fits its node
  type's GPUs, and the stages cover the model's number of layers;
- anywhere in the file: no Infinity or NaN (Python's JSON reader accepts them; JSON has
  neither).

Which rows a command then refuses is its choice: `coral simulate` refuses the plan on any
problem; `coral serve` refuses the plan on a problem of the plan as a whole and lists a bad
row among the rows it cannot run (`--skip-unservable` deploys the others).
"""

from __future__ import annotations

import math
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pydantic import ValidationError

from coral.plans.errors import PlanFileError
from coral.plans.json_values import amount_problem, short, show, whole_problem
from coral.catalog import Catalog
from coral.messages import did_you_mean, field_problem
from coral.perf.pipeline import PipelineShape, ShapeError
from coral.perf.slowdown import slowdown_from_json
from coral.templates.slo import SloSpec

#: Most instances one row may run. Plans for the paper's scenarios run tens; the bound
#: refuses a typo such as a count of 1e9 at once instead of building that many instances.
MAX_ROW_INSTANCES = 100_000
#: Most instances a whole plan may run, and most nodes (instances x nodes per instance).
MAX_PLAN_INSTANCES = 100_000
MAX_PLAN_NODES = 1_000_000
#: Most nodes in one stage of one instance (data-parallel copies of the same layers).
MAX_STAGE_NODES = 1_024
#: Most sequences (prefill: prompt tokens) one node runs per iteration.
MAX_BATCH = 1 << 20
#: Most GPUs that split a layer when the node type is not known (the catalog's largest
#: node type has 8; a known node type bounds it by its own GPU count).
MAX_TP_DEGREE = 8
#: Most layers of a model (the catalog's deepest has under 130).
MAX_LAYERS = 10_000
#: Most rows of a plan's 'instances' list.
MAX_ROWS = 100_000
#: Requests/s a model's demand may ask for.
MAX_DEMAND_RPS = 1e6
#: Problems spelled out in one error message (the rest are counted).
LISTED_PROBLEMS = 12

MODES = ("aggregated", "prefill", "decode")
MARKETS = ("on_demand", "spot")
REPLAN = "or re-plan with `coral plan SCENARIO --out FILE`"


class PlanCheckError(PlanFileError):
    """A plan file whose content a reader must not believe; the message lists every problem."""



def _factor_problem(value: Any) -> str | None:
    """What is wrong with a robust promise's slowdown of one GPU type (None: nothing)."""
    try:
        slowdown_from_json(value)
    except ValueError as exc:
        return str(exc)
    return None

@dataclass(frozen=True)
class PlanProblem:
    """One thing wrong with a plan: where (the plan, or one row), which field, what, and
    how to fix it."""

    row: int | None  # index in 'instances'; None for the plan as a whole
    where: str  # "instances[0] (model 'llama-3.1-8b', r1/llama-3.1-8b|aggregated|1x-l40s)"
    field: str  # "stages[0].batch"
    problem: str
    fix: str

    def __str__(self) -> str:
        where = f"{self.where}: " if self.where else ""
        return f"{where}field '{self.field}': {self.problem}; to fix: {self.fix}"


@dataclass(frozen=True)
class PlanCheck:
    """Every problem `check_plan` found in one plan."""

    source: str  # the file (or "the plan")
    problems: tuple[PlanProblem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def of_plan(self) -> tuple[PlanProblem, ...]:
        """Problems of the plan as a whole (no row can be believed while one stands)."""
        return tuple(p for p in self.problems if p.row is None)

    def of_row(self, row: int) -> tuple[PlanProblem, ...]:
        return tuple(p for p in self.problems if p.row == row)

    def message(self, problems: Sequence[PlanProblem] | None = None) -> str:
        """One line per problem (the first `LISTED_PROBLEMS`), under a line naming the file."""
        items = list(self.problems if problems is None else problems)
        lines = [f"  - {p}" for p in items[:LISTED_PROBLEMS]]
        if len(items) > LISTED_PROBLEMS:
            lines.append(f"  ... and {len(items) - LISTED_PROBLEMS} more")
        noun = "problem" if len(items) == 1 else "problems"
        return f"{self.source}: the plan has {len(items)} {noun}:\n" + "\n".join(lines)

    def raise_if_any(self, problems: Sequence[PlanProblem] | None = None) -> None:
        """`PlanCheckError` listing `problems` (default: all of them), if there are any."""
        items = self.problems if problems is None else problems
        if items:
            raise PlanCheckError(self.message(items))


def check_plan(payload: Any, catalog: Catalog | None = None, source: str = "the plan"
               ) -> PlanCheck:
    """Every problem of a plan payload (`coral plan --out`'s JSON, or `PlanResult.to_dict()`);
    `catalog` adds the checks of model and node type names and
    of each model's layer count. Never raises on any JSON value."""
    c = _Checker(catalog)
    if not isinstance(payload, MappingABC):
        c.add(None, "", "(plan)", f"must be a JSON object, got {show(payload)}",
              "give a file written by `coral plan SCENARIO --out FILE`")
        return PlanCheck(str(source), tuple(c.problems))
    rows = payload.get("instances")
    if not isinstance(rows, list):
        c.add(None, "", "instances", "missing (the plan has no 'instances' list)"
              if rows is None else f"must be a list of instance rows, got {show(rows)}",
              f"give the rows as `coral plan --out` writes them, {REPLAN}")
        rows = []
    elif len(rows) > MAX_ROWS:
        c.add(None, "", "instances", f"has {len(rows)} rows, more than {MAX_ROWS}",
              f"merge rows of the same template, {REPLAN}")
        rows = []
    served: dict[str, str] = {}  # model -> the first row running it
    instances = nodes = 0
    for k, row in enumerate(rows):
        counted = c.row(k, row)
        if counted is not None:
            _, count, per_instance = counted
            instances += count
            nodes += count * per_instance
        # a row with other problems still needs its model's SLO, unless the model is unknown
        model = row.get("model") if isinstance(row, MappingABC) else None
        if (isinstance(model, str) and row.get("count") != 0
                and (catalog is None or model in catalog.models)):
            served.setdefault(model, f"instances[{k}]")
    if instances > MAX_PLAN_INSTANCES:
        c.add(None, "", "instances", f"the rows run {instances} instances in all, more than "
              f"{MAX_PLAN_INSTANCES}", f"lower the rows' 'count', {REPLAN}")
    elif nodes > MAX_PLAN_NODES:
        c.add(None, "", "instances", f"the rows run {nodes} nodes in all, more than "
              f"{MAX_PLAN_NODES}", f"lower the rows' 'count', {REPLAN}")
    demand = c.demand(payload.get("demand_rps"))
    c.slos(payload, served, demand)
    c.entries(payload)
    c.non_finite(payload)
    return PlanCheck(str(source), tuple(c.problems))


class _Checker:
    """Collects the problems of one plan."""

    def __init__(self, catalog: Catalog | None) -> None:
        self.catalog = catalog
        self.problems: list[PlanProblem] = []

    def add(self, row: int | None, where: str, field: str, problem: str, fix: str) -> None:
        self.problems.append(PlanProblem(row, where, field, problem, fix))

    # ------------------------------------------------------------ one row
    def row(self, k: int, row: Any) -> tuple[str, int, int] | None:
        """Check row `k`; (model, count, nodes per instance) when it can be believed."""
        where = _row_where(k, row)
        if not isinstance(row, MappingABC):
            self.add(k, where, "(row)", f"must be an object, got {show(row)}",
                     f"write the row as `coral plan --out` does, {REPLAN}")
            return None
        model = row.get("model")
        before = len(self.problems)
        for name in ("model", "region", "template_id"):
            value = row.get(name)
            if not isinstance(value, str) or not value:
                self.add(k, where, name, "missing" if value is None else
                         f"must be a non-empty string, got {show(value)}",
                         f"give the row's {name} as `coral plan --out` writes it")
        arch = None
        if isinstance(model, str) and model and self.catalog is not None:
            arch = self.catalog.models.get(model)
            if arch is None:
                self.add(k, where, "model", f"unknown model {short(model)!r}"
                         f"{_close(model, self.catalog.models)}",
                         "name a model of the catalog (`coral catalog list`), or pass the "
                         "catalog the plan was made with (--catalog FILE)")
        count = row.get("count")
        problem = whole_problem(count, 0, MAX_ROW_INSTANCES)
        if problem:
            self.add(k, where, "count", problem, "give the number of instances to run (0 "
                     f"runs none, at most {MAX_ROW_INSTANCES}), {REPLAN}")
        mode = row.get("mode", "aggregated")
        if mode not in MODES:
            self.add(k, where, "mode", f"must be one of {', '.join(MODES)}, got {show(mode)}",
                     "give the row's mode as `coral plan --out` writes it")
        market = row.get("market", "on_demand")
        if market not in MARKETS:
            self.add(k, where, "market", f"must be one of {', '.join(MARKETS)}, got "
                     f"{show(market)}", "leave it out for on-demand nodes")
        for name in ("usd_per_hour", "capacity", "capacity_rps", "utilisation"):
            value = row.get(name)
            if value is None and name == "usd_per_hour":  # the simulator's cost of the row
                self.add(k, where, name, "missing", f"give one instance's price in USD/hour, "
                         f"{REPLAN}")
            elif value is not None and (problem := amount_problem(value)):
                self.add(k, where, name, problem, f"give a finite number >= 0, {REPLAN}")
        nodes = row.get("nodes")
        fix = f"leave 'nodes' out (the stages give it), {REPLAN}"
        if nodes is not None and not isinstance(nodes, MappingABC):
            self.add(k, where, "nodes", f"must map node types to numbers of nodes, got "
                     f"{show(nodes)}", fix)
        for g, n in (nodes.items() if isinstance(nodes, MappingABC) else ()):
            if problem := whole_problem(n, 0, MAX_PLAN_NODES):
                self.add(k, where, f"nodes.{g}", problem, fix)
        shape = self.shape(k, where, row)
        if shape is not None and arch is not None and shape.num_layers != arch.num_layers:
            self.add(k, where, "stages", f"the stages cover layers [0, {shape.num_layers}) "
                     f"but {model} has {arch.num_layers} layers",
                     f"make the stages hold every layer 0..{arch.num_layers - 1} of {model} "
                     f"exactly once, {REPLAN}")
        if len(self.problems) > before or shape is None:
            return None
        return str(model), int(count), shape.num_nodes

    def shape(self, k: int, where: str, row: Mapping[str, Any]) -> PipelineShape | None:
        """The row's pipeline once every stage field is sound; None after a problem."""
        before = len(self.problems)
        if "stages" in row:
            stages = row["stages"]
            if not isinstance(stages, list) or not stages:
                self.add(k, where, "stages", "must be a non-empty list of stages, got "
                         f"{show(stages)}", f"give the row's stages, {REPLAN}")
                return None
            for j, st in enumerate(stages):
                self.node(k, where, f"stages[{j}]", st, stage=True)
        elif "placement" in row:
            nodes = row["placement"]
            if not isinstance(nodes, list) or not nodes:
                self.add(k, where, "placement", "must be a non-empty list of nodes, got "
                         f"{show(nodes)}", f"give the row's nodes, {REPLAN}")
                return None
            if len(nodes) > MAX_STAGE_NODES * 16:
                self.add(k, where, "placement", f"has {len(nodes)} nodes, more than "
                         f"{MAX_STAGE_NODES * 16}", REPLAN.removeprefix("or "))
                return None
            for j, node in enumerate(nodes):
                self.node(k, where, f"placement[{j}]", node, stage=False)
        else:
            self.add(k, where, "stages", "missing (the row has neither 'stages' nor the "
                     "older 'placement')", f"give the row's stages, {REPLAN}")
            return None
        if len(self.problems) > before:
            return None
        try:
            return PipelineShape.from_row(row)
        except ShapeError as exc:
            field = "stages" if "stages" in row else "placement"
            self.add(k, where, field, f"the layer ranges are not one pipeline ({exc})",
                     "make the stages hold consecutive layer ranges from layer 0, each "
                     f"layer exactly once, {REPLAN}")
            return None

    def node(self, k: int, where: str, field: str, node: Any, *, stage: bool) -> None:
        """Check one stage, or one node of a `placement` (which may be idle: no layers,
        and has no count)."""
        if not isinstance(node, MappingABC):
            self.add(k, where, field, f"must be an object, got {show(node)}",
                     f"write it as `coral plan --out` does, {REPLAN}")
            return
        node_type = node.get("node_type")
        gpus = MAX_TP_DEGREE
        if not isinstance(node_type, str) or not node_type:
            self.add(k, where, f"{field}.node_type", "missing" if node_type is None else
                     f"must be a node type's name, got {show(node_type)}",
                     "name a node type of the catalog (`coral catalog list`)")
        elif self.catalog is not None:
            known = self.catalog.node_types.get(node_type)
            if known is None:
                self.add(k, where, f"{field}.node_type", f"unknown node type {short(node_type)!r}"
                         f"{_close(node_type, self.catalog.node_types)}",
                         "name a node type of the catalog (`coral catalog list`), or pass "
                         "the catalog the plan was made with (--catalog FILE)")
            else:
                gpus = int(known.gpu_count)
        checks = [("first_layer", 0, MAX_LAYERS - 1, True),
                  ("layers", 1 if stage else 0, MAX_LAYERS, True),
                  ("batch", 1 if stage else 0, MAX_BATCH, stage), ("tp_degree", 1, gpus, False)]
        if stage:
            checks.insert(0, ("count", 1, MAX_STAGE_NODES, True))
        for name, lo, hi, required in checks:
            value = node.get(name)
            if value is None and not required:
                continue
            if problem := whole_problem(value, lo, hi):
                self.add(k, where, f"{field}.{name}", problem,
                         f"give a whole number from {lo} to {hi}, {REPLAN}")

    def non_finite(self, payload: Mapping[str, Any]) -> None:
        """Name every Infinity or NaN (which Python's JSON reader accepts, and JSON does
        not have) the field checks above have not named already."""
        named = {(p.row, p.field) for p in self.problems}
        # 'slos' and 'demand_rps' are checked for finite numbers field by field
        stack: list[tuple[str, Any]] = [(str(key), v) for key, v in payload.items()
                                        if key not in ("slos", "demand_rps")]
        while stack:
            path, value = stack.pop()
            if isinstance(value, float) and not math.isfinite(value):
                row, field = None, path
                if path.startswith("instances["):
                    index, _, rest = path.removeprefix("instances[").partition("]")
                    row, field = int(index), rest.lstrip(".") or "(row)"
                if (row, field) in named:
                    continue
                rows = payload.get("instances")
                where = "" if row is None else _row_where(row, rows[row])
                self.add(row, where, field, f"is {show(value)}, which JSON does not have",
                         f"give a finite number (or null), {REPLAN}")
            elif isinstance(value, MappingABC):
                stack.extend((f"{path}.{key}" if path else str(key), v)
                             for key, v in value.items())
            elif isinstance(value, list):
                stack.extend((f"{path}[{j}]", v) for j, v in enumerate(value))

    # ------------------------------------------------------------ the plan
    def entries(self, payload: Mapping[str, Any]) -> None:
        """The plan's own entries: what it was planned for and its spot or robust promise."""
        for name in ("scenario", "level", "mode", "engine"):
            value = payload.get(name)
            if value is not None and (not isinstance(value, str) or not value):
                self.add(None, "", name, f"must be a non-empty string, got {show(value)}",
                         f"give it as `coral plan --out` writes it, {REPLAN}")
        nmax = payload.get("nmax")
        if nmax is not None and (problem := whole_problem(nmax, 1, MAX_STAGE_NODES)):
            self.add(None, "", "nmax", problem, f"give the templates' node limit, {REPLAN}")
        spot = payload.get("spot")
        if spot is not None:
            self.promise("spot", spot, ("risk_target", "window_s"), ())
        robust = payload.get("robust")
        if robust is not None:
            fields = robust if isinstance(robust, MappingABC) else {}
            numbers = ("factor",) if fields.get("factor") is not None else ()
            if fields.get("R") != "auto":  # `--robust auto`: each GPU type its own factor
                numbers = ("R", *numbers)
            self.promise("robust", robust, numbers, ("factors", "basis"))

    def promise(self, name: str, raw: Any, numbers: Sequence[str],
                maps: Sequence[str]) -> None:
        """A spot or robust entry: an object whose `numbers` are finite numbers >= 0 and
        whose `maps` map names to numbers (`factors`) or text (`basis`)."""
        fix = f"give the '{name}' entry as `coral plan --{name}` writes it, {REPLAN}"
        if not isinstance(raw, MappingABC):
            self.add(None, "", name, f"must be an object, got {show(raw)}", fix)
            return
        for key in numbers:
            if problem := amount_problem(raw.get(key)):
                self.add(None, "", f"{name}.{key}", problem, fix)
        for key in maps:
            value = raw.get(key)
            if key == "basis" and value is None:
                continue
            ok = isinstance(value, MappingABC) and all(
                isinstance(g, str) and (isinstance(v, str) if key == "basis"
                                        else not _factor_problem(v))
                for g, v in value.items())
            if not ok:
                self.add(None, "", f"{name}.{key}", "must map GPU types to "
                         + ("text" if key == "basis" else
                            "numbers (or, per phase, {\"prefill\": P, \"decode\": D})")
                         + f", got {show(value)}", fix)

    def demand(self, raw: Any) -> dict[str, float]:
        """The models with demand (req/s > 0) of a sound 'demand_rps'."""
        if raw is None:
            return {}
        fix = "map each model to its requests/s (a number >= 0), or leave 'demand_rps' out"
        if not isinstance(raw, MappingABC):
            self.add(None, "", "demand_rps", f"must map models to requests/s, got {show(raw)}",
                     fix)
            return {}
        out = {}
        for model, rps in raw.items():
            if problem := amount_problem(rps, MAX_DEMAND_RPS):
                self.add(None, "", f"demand_rps[{model!r}]", problem, fix)
            elif rps > 0:
                out[str(model)] = float(rps)
        return out

    def slos(self, payload: Mapping[str, Any], served: Mapping[str, str],
             demand: Mapping[str, float]) -> None:
        """'slos', when present: a valid SLO for every model served or with demand."""
        if "slos" not in payload:
            return  # a plan written before plans carried SLOs: the scenario's are used
        raw = payload["slos"]
        fix = ("give each model's SLO as {\"tpot_s\": ..., \"ttft_s\": ...} (ttft_s >= "
               "tpot_s > 0), or leave 'slos' out to use the scenario's")
        if not isinstance(raw, MappingABC):
            self.add(None, "", "slos", f"must map each model to its SLO, got {show(raw)}", fix)
            return
        for model, values in raw.items():
            field = f"slos[{model!r}]"
            if not isinstance(values, MappingABC):
                self.add(None, "", field, f"must be an object, got {show(values)}", fix)
                continue
            try:
                SloSpec.model_validate({str(key): v for key, v in values.items()})
            except ValidationError as err:
                for e in err.errors():
                    loc = ".".join(str(x) for x in e["loc"])
                    self.add(None, "", f"{field}.{loc}" if loc else field,
                             field_problem(e), fix)
        for model, first in {**{m: "demand_rps" for m in demand}, **served}.items():
            if model not in raw:
                self.add(None, "", "slos", f"has no SLO for model {model!r} (served by "
                         f"{first})" if first != "demand_rps" else
                         f"has no SLO for model {model!r} (in demand_rps)", fix)


def _row_where(k: int, row: Any) -> str:
    """`instances[K] (model 'M', REGION/TEMPLATE_ID)`, with what of that the row has."""
    if not isinstance(row, MappingABC):
        return f"instances[{k}]"
    model, region, tid = row.get("model"), row.get("region"), row.get("template_id")
    named = [f"model {short(model)!r}"] if isinstance(model, str) else []
    if isinstance(region, str) and isinstance(tid, str):
        named.append(f"{short(region)}/{short(tid)}")
    return f"instances[{k}] ({', '.join(named)})" if named else f"instances[{k}]"


def _close(name: str, known: Any) -> str:
    """" (did you mean 'x'?)" for the catalog names close to `name`, or nothing."""
    hint = did_you_mean(name, known).strip()
    return f" ({hint[0].lower()}{hint[1:]})" if hint else ""
