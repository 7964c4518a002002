"""Scenarios: which models to serve, how much, where, and how many nodes each region can give.

A scenario file is YAML, validated by `ScenarioSpec` (unknown fields are errors):

```yaml
name: core
description: ...
mode: aggregated            # or pd (prefill/decode disaggregated), mixed (both, per model), or auto (plan each, keep the best)
n_max: 6                    # template size limits used to build the template libraries
rho: 12
startup_s: 300              # seconds a new instance loads weights before it serves
node_types: [1x-l4, ...]    # optional: only these catalog node types (default: all)
models:
  - {name: llama-3.1-8b, demand_rps: 120, input_tokens: 1024, output_tokens: 256,
     tpot_s: 0.10, ttft_s: 2.0, percentile: 0.9, priority: 1}
base_availability: {1x-l4: 256, 8x-h100-sxm: 16, ...}   # nodes per region at scale 1
regions:
  - name: aws-us-east-1
    availability: {8x-h100-sxm: 32}    # this region's own base counts (replace the defaults)
    price_overrides: {1x-l4: 0.75}     # $/hour, replaces (or adds) the catalog price here
  - {name: azure-eastus, availability: scarce}   # or: pin this region to a named level
availability: limited       # level used unless the caller asks for another
levels:
  abundant: {scale: 1.0}
  limited:  {scale: 0.25, node_type_scale: {8x-h100-sxm: 0.5}}
  scarce:   {scale: 0.05, counts: {aws-us-east-1: {8x-h100-sxm: 1}}}
```

**Availability levels.** Real availability cannot be looked up, so a scenario states it. We
chose *multipliers of one base table* rather than a full table per level: the base says how
the supply is shaped (many cheap single-GPU nodes, few 8-GPU H100 nodes, some regions bigger
than others), and a level scales it, so the three levels differ only in abundance and cannot
drift apart by editing one of them. A level may still make one node type or region scarcer
(`node_type_scale`, `region_scale`) or pin an absolute count (`counts`) where a multiplier does
not say what is meant. The count of node type `g` in region `r` at level `L` is:

- `L.counts[r][g]` when given, else
- `floor(base[r][g] * L.scale * L.node_type_scale[g] * L.region_scale[r])` (missing
  multipliers are 1), where `base[r][g]` is the region's own `availability` entry when it
  has one, else `base_availability[g]`, else 0;
- always 0 where `g` has no price in `r` (in the catalog or the region's `price_overrides`).

A region whose `availability` names a level uses that level whatever the scenario's level is.
Without `levels`, the base table is the availability.

Every problem is reported as a `ScenarioError` naming the file, the entry and the field, with
"Did you mean ...?" for misspelt catalog names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field as dc_field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from coral.messages import did_you_mean, field_problem
from coral.allocator.headroom import DEFAULT_ARRIVAL_CV, DEFAULT_OUTPUT_CV, planned_capacity
from coral.allocator.problem import (
    DEFAULT_MIP_GAP,
    DEFAULT_TIME_LIMIT_S,
    AllocationProblem,
    ModelDemand,
    Mode,
    NodeRegion,
    TemplateColumn,
    TemplateRegion,
    priced_column,
)
from coral.catalog import Catalog, default_catalog
from coral.perf.step import template_saturation

SCENARIO_SCHEMA_VERSION = 1
ScenarioMode = Literal["aggregated", "pd", "mixed", "auto"]
_TEMPLATE_MODES: dict[str, tuple[Mode, ...]] = {
    "aggregated": ("aggregated",),
    "pd": ("prefill", "decode"),
    # each model may run aggregated instances beside prefill/decode pairs
    "mixed": ("aggregated", "prefill", "decode"),
    "auto": ("aggregated", "prefill", "decode"),
}
#: The serving modes `auto` plans in, in this order (ties keep the first). `mixed` holds every
#: plan of the other two, but a solve that stops at its time limit may end above them.
AUTO_MODES: tuple[ScenarioMode, ...] = ("aggregated", "pd", "mixed")


class ScenarioError(ValueError):
    """A scenario file is missing, malformed or names what the catalog does not hold."""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ScenarioModel(_Entry):
    """One model to serve: its demand, request shape, latency SLO and priority."""

    name: str = Field(min_length=1, description="Catalog model name.")
    demand_rps: float = Field(ge=0, description="Requests per second to serve.")
    input_tokens: int = Field(default=1024, ge=1, description="Mean prompt tokens per request.")
    output_tokens: int = Field(default=256, ge=1, description="Mean output tokens per request.")
    tpot_s: float = Field(gt=0, le=60, description="Time per output token target, seconds.")
    ttft_s: float = Field(gt=0, le=3600, description="Time to first token target, seconds.")
    percentile: float = Field(default=0.9, gt=0, le=1, description="Quantile the SLO holds at.")
    priority: float = Field(default=1.0, gt=0, description="Weight of its goodput under scarcity.")
    arrival_cv: float = Field(
        default=DEFAULT_ARRIVAL_CV, ge=0, le=10,
        description="Coefficient of variation of inter-arrival gaps (1: Poisson; > 1 bursty).")
    output_tokens_cv: float = Field(
        default=DEFAULT_OUTPUT_CV, ge=0, le=10,
        description="Coefficient of variation of output lengths (0: all the same).")

    @model_validator(mode="after")
    def _check(self) -> "ScenarioModel":
        if self.ttft_s < self.tpot_s:
            raise ValueError(
                f"ttft_s ({self.ttft_s:g} s) is below tpot_s ({self.tpot_s:g} s): the first "
                "token cannot come faster than one decode step"
            )
        return self

    def slo_values(self) -> dict[str, float | int]:
        """The SLO and request shape, as the template builder's `SloSpec` fields."""
        return {
            "tpot_s": self.tpot_s,
            "ttft_s": self.ttft_s,
            "percentile": self.percentile,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }


class ScenarioRegion(_Entry):
    """A region the scenario may use, its base availability and any price overrides."""

    name: str = Field(min_length=1, description="Catalog region name.")
    availability: dict[str, int] | str | None = Field(
        default=None,
        description="Base nodes per node type in this region (replacing `base_availability`), "
        "or the name of a level this region always takes.",
    )
    price_overrides: dict[str, float] = Field(
        default_factory=dict, description="Node type -> $/hour in this region."
    )

    @model_validator(mode="after")
    def _check(self) -> "ScenarioRegion":
        if isinstance(self.availability, dict):
            for node_type, n in self.availability.items():
                if n < 0:
                    raise ValueError(f"availability of {node_type!r} is {n}; must be >= 0")
        for node_type, usd in self.price_overrides.items():
            if not usd > 0:
                raise ValueError(f"price_overrides of {node_type!r} is {usd}; must be > 0")
        return self


class AvailabilityLevel(_Entry):
    """How one availability level scales the base table (see the module docstring)."""

    description: str = ""
    scale: float = Field(default=1.0, ge=0, description="Multiplier of every base count.")
    node_type_scale: dict[str, float] = Field(
        default_factory=dict, description="Extra multiplier per node type."
    )
    region_scale: dict[str, float] = Field(
        default_factory=dict, description="Extra multiplier per region."
    )
    counts: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="Region -> node type -> absolute node count."
    )

    @model_validator(mode="after")
    def _check(self) -> "AvailabilityLevel":
        for field, table in (("node_type_scale", self.node_type_scale),
                             ("region_scale", self.region_scale)):
            for key, value in table.items():
                if value < 0:
                    raise ValueError(f"{field} of {key!r} is {value}; must be >= 0")
        for region, row in self.counts.items():
            for node_type, n in row.items():
                if n < 0:
                    raise ValueError(f"counts of {node_type!r} in {region!r} is {n}; must be >= 0")
        return self


class ScenarioSpec(_Entry):
    """A scenario file, validated."""

    schema_version: int = SCENARIO_SCHEMA_VERSION
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    description: str = ""
    mode: ScenarioMode = "aggregated"
    n_max: int = Field(default=6, ge=1, le=16, description="Most nodes in one template.")
    rho: float = Field(default=12.0, gt=1, description="Most template memory / weight bytes.")
    startup_s: float = Field(default=300.0, ge=0, description="Loading time of a new instance.")
    node_types: list[str] | None = Field(default=None, min_length=1)
    models: list[ScenarioModel] = Field(min_length=1)
    regions: list[ScenarioRegion] = Field(min_length=1)
    base_availability: dict[str, int] = Field(default_factory=dict)
    availability: str | None = Field(default=None, description="Default level name.")
    levels: dict[str, AvailabilityLevel] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> "ScenarioSpec":
        for node_type, n in self.base_availability.items():
            if n < 0:
                raise ValueError(f"base_availability of {node_type!r} is {n}; must be >= 0")
        return self


# ---------------------------------------------------------------------------------------------
# The resolved scenario
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """A validated scenario at one availability level, with prices and counts resolved."""

    spec: ScenarioSpec
    source: str  # the file it came from ("<builtin>/core.yaml" for built-ins)
    level: str | None
    regions: tuple[str, ...]
    node_types: tuple[str, ...]
    node_prices: Mapping[NodeRegion, float]  # $/hour; only pairs priced there
    availability: Mapping[NodeRegion, int]  # nodes; only non-zero pairs
    # template -> its rate at full occupancy under the pipeline step model the simulator runs
    # (`coral.perf.step`), when the scenario was given a perf model (`with_perf`); None: the
    # templates' own figures
    saturation_of: Callable[[Any], Any] | None = dc_field(default=None, compare=False, repr=False)

    def with_perf(self, perf: Any, catalog: Catalog) -> "Scenario":
        """This scenario, planning multi-stage templates by the rate the simulator's step
        model gives them at full occupancy (memoised per template)."""
        memo: dict[int, tuple[Any, Any]] = {}

        def saturation_of(template: Any) -> Any:
            hit = memo.get(id(template))
            if hit is None or hit[0] is not template:
                hit = memo[id(template)] = (template, template_saturation(
                    template, perf=perf, catalog=catalog))
            return hit[1]

        return replace(self, saturation_of=saturation_of)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def mode(self) -> ScenarioMode:
        return self.spec.mode

    @property
    def models(self) -> tuple[ScenarioModel, ...]:
        return tuple(self.spec.models)

    @property
    def levels(self) -> tuple[str, ...]:
        return tuple(self.spec.levels)

    def in_mode(self, mode: ScenarioMode) -> "Scenario":
        """This scenario served in `mode` (what `auto` plans each of its modes with)."""
        return replace(self, spec=self.spec.model_copy(update={"mode": mode}))

    @property
    def template_modes(self) -> tuple[Mode, ...]:
        """Template modes this scenario serves with."""
        return _TEMPLATE_MODES[self.spec.mode]

    def demands(self) -> tuple[ModelDemand, ...]:
        return tuple(
            ModelDemand(
                m.name,
                m.demand_rps,
                input_tokens=float(m.input_tokens),
                output_tokens=float(m.output_tokens),
                priority=m.priority,
            )
            for m in self.spec.models
        )

    def planned_capacity(self, template: Any) -> float:
        """The capacity one instance of `template` is planned for: its throughput times the
        utilisation at which its TTFT still holds under this scenario's traffic shape for the
        model (see `coral.allocator.headroom`)."""
        m = self.model_spec(template.model)
        sat = self.saturation_of(template) if self.saturation_of is not None else None
        return planned_capacity(template, arrival_cv=m.arrival_cv,
                                output_cv=m.output_tokens_cv, saturation=sat)

    def model_spec(self, name: str) -> ScenarioModel:
        """The scenario's entry of model `name` (KeyError naming the models it serves)."""
        for m in self.spec.models:
            if m.name == name:
                return m
        raise KeyError(f"model {name!r} is not in scenario {self.name!r}; it serves "
                       + ", ".join(m.name for m in self.spec.models))

    def column(self, id: str, model: str, mode: Mode, node_counts: Mapping[str, int],
               capacity: float) -> TemplateColumn:
        """A template column priced in this scenario's regions (overrides included)."""
        return priced_column(id, model, mode, node_counts, capacity, self.node_prices,
                             self.regions)

    def problem(
        self,
        templates: Sequence[TemplateColumn],
        *,
        current: Mapping[TemplateRegion, int] | None = None,
        time_limit_s: float = DEFAULT_TIME_LIMIT_S,
        mip_gap: float = DEFAULT_MIP_GAP,
    ) -> AllocationProblem:
        """The allocation problem of this scenario over `templates`.

        Templates of other models, or of modes this scenario does not serve with, are left out.
        """
        names = {m.name for m in self.spec.models}
        modes = set(self.template_modes)
        kept = tuple(t for t in templates if t.model in names and t.mode in modes)
        return AllocationProblem(
            demands=self.demands(),
            templates=kept,
            regions=self.regions,
            availability=self.availability,
            current=dict(current or {}),
            startup_s=self.spec.startup_s,
            time_limit_s=time_limit_s,
            mip_gap=mip_gap,
        )

    def total_nodes(self) -> int:
        return sum(self.availability.values())


def builtin_scenarios() -> tuple[str, ...]:
    """Names of the scenarios that ship with Coral."""
    folder = resources.files("coral.allocator") / "data" / "scenarios"
    return tuple(sorted(p.name[: -len(".yaml")] for p in folder.iterdir()
                        if p.name.endswith(".yaml")))


def load_scenario(
    name_or_path: str | Path,
    *,
    level: str | None = None,
    catalog: Catalog | None = None,
) -> Scenario:
    """A built-in scenario by name (`core`, `advanced`) or a scenario YAML file by path,
    resolved at `level` (default: the file's `availability`)."""
    source, text = _read_source(name_or_path)
    return parse_scenario(text, source=source, level=level, catalog=catalog)


def parse_scenario(
    text: str,
    *,
    source: str = "<scenario>",
    level: str | None = None,
    catalog: Catalog | None = None,
) -> Scenario:
    """Validate scenario YAML text and resolve it against `catalog` (default: built-in)."""
    cat = catalog if catalog is not None else default_catalog()
    doc = _read_yaml(source, text)
    try:
        spec = ScenarioSpec.model_validate(doc)
    except ValidationError as err:
        raise ScenarioError(_format_validation_error(source, doc, err)) from None
    if spec.schema_version != SCENARIO_SCHEMA_VERSION:
        raise ScenarioError(
            f"{source}: field 'schema_version': {spec.schema_version} is not supported (this "
            f"Coral reads {SCENARIO_SCHEMA_VERSION})"
        )
    _check_names(source, spec, cat)
    chosen = level if level is not None else spec.availability
    if chosen is not None and chosen not in spec.levels:
        where = "level" if level is not None else "field 'availability'"
        raise ScenarioError(
            f"{source}: {where}: unknown availability level {chosen!r}; this scenario defines "
            f"{_names(spec.levels)}.{did_you_mean(chosen, spec.levels)}"
        )
    if chosen is None and spec.levels:
        raise ScenarioError(
            f"{source}: field 'availability': no level chosen; name one of "
            f"{_names(spec.levels)} here or when loading the scenario"
        )
    node_types = tuple(spec.node_types) if spec.node_types is not None else tuple(
        sorted(cat.node_types))
    regions = tuple(r.name for r in spec.regions)
    prices = _resolve_prices(source, spec, cat, node_types)
    _check_level_counts_priced(source, spec, prices)
    availability = _resolve_availability(source, spec, chosen, node_types, prices)
    return Scenario(
        spec=spec,
        source=source,
        level=chosen,
        regions=regions,
        node_types=node_types,
        node_prices=prices,
        availability=availability,
    )


# ---------------------------------------------------------------------------------------------
# Reading and checking
# ---------------------------------------------------------------------------------------------


def _read_source(name_or_path: str | Path) -> tuple[str, str]:
    text_name = str(name_or_path)
    looks_like_path = isinstance(name_or_path, Path) or any(
        s in text_name for s in ("/", "\\")) or text_name.endswith((".yaml", ".yml"))
    if not looks_like_path:
        builtins = builtin_scenarios()
        if text_name in builtins:
            folder = resources.files("coral.allocator") / "data" / "scenarios"
            return f"<builtin>/{text_name}.yaml", (folder / f"{text_name}.yaml").read_text()
        if not Path(text_name).exists():
            raise ScenarioError(
                f"unknown scenario {text_name!r}: not a built-in ({_names(builtins)}) and no "
                f"such file.{did_you_mean(text_name, builtins)}"
            )
    path = Path(name_or_path)
    try:
        return str(path), path.read_text()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read scenario file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: cannot read scenario file: not UTF-8 text ({exc.reason})"
                            ) from None


def _read_yaml(source: str, text: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: malformed YAML: {exc}") from None
    except (ValueError, TypeError, AttributeError, LookupError, RecursionError) as exc:
        raise ScenarioError(f"{source}: malformed YAML: {type(exc).__name__}: {exc}") from None
    if not isinstance(doc, dict):
        raise ScenarioError(f"{source}: expected a mapping with at least 'name', 'models' and "
                            "'regions'")
    return doc


def _entry_label(doc: Mapping[str, Any], loc: tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
    """('models', 2, 'demand_rps') -> ("models[2] 'qwen3-32b'", ('demand_rps',))."""
    if len(loc) >= 2 and loc[0] in ("models", "regions") and isinstance(loc[1], int):
        entries = doc.get(loc[0])
        name = None
        if isinstance(entries, list) and loc[1] < len(entries) and isinstance(entries[loc[1]],
                                                                              dict):
            name = entries[loc[1]].get("name")
        label = f"{loc[0]}[{loc[1]}]" + (f" {name!r}" if name is not None else "")
        return label, loc[2:]
    if len(loc) >= 2 and loc[0] == "levels":
        return f"levels.{loc[1]}", loc[2:]
    return "", loc


def _format_validation_error(source: str, doc: Mapping[str, Any], err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        # `availability: dict | str` reports both alternatives; keep the one that applies
        if len(loc) > 3 and loc[0] == "regions" and loc[3] in ("str", "dict[str,int]"):
            loc = loc[:3] + loc[4:]
        label, rest = _entry_label(doc, loc)
        field = ".".join(str(x) for x in rest if x not in ("str", "dict[str,int]")) or "(entry)"
        msg = field_problem(e)
        where = f"{source}: {label}: " if label else f"{source}: "
        line = f"{where}field '{field}': {msg}"
        if line not in lines:
            lines.append(line)
    return "\n".join(lines)


def _names(names: Iterable[str]) -> str:
    listed = ", ".join(sorted(names))
    return listed if listed else "none"


def _check_names(source: str, spec: ScenarioSpec, cat: Catalog) -> None:
    def unknown(where: str, kind: str, name: str, known: Iterable[str]) -> ScenarioError:
        return ScenarioError(f"{source}: {where}: unknown {kind} {name!r}."
                             f"{did_you_mean(name, known)}")

    seen: dict[str, int] = {}
    for i, m in enumerate(spec.models):
        where = f"models[{i}] {m.name!r}: field 'name'"
        if m.name not in cat.models:
            raise unknown(where, "model", m.name, cat.models)
        if m.name in seen:
            raise ScenarioError(f"{source}: {where}: model listed twice (first at "
                                f"models[{seen[m.name]}])")
        seen[m.name] = i
    if spec.node_types is not None:
        listed: set[str] = set()
        for i, g in enumerate(spec.node_types):
            if g not in cat.node_types:
                raise unknown(f"field 'node_types[{i}]'", "node type", g, cat.node_types)
            if g in listed:
                raise ScenarioError(f"{source}: field 'node_types[{i}]': {g!r} listed twice")
            listed.add(g)
    allowed = set(spec.node_types) if spec.node_types is not None else set(cat.node_types)

    def check_node(where: str, g: str) -> None:
        if g not in cat.node_types:
            raise unknown(where, "node type", g, cat.node_types)
        if g not in allowed:
            raise ScenarioError(f"{source}: {where}: node type {g!r} is not in this "
                                "scenario's 'node_types'; add it there or remove this entry")

    for g in spec.base_availability:
        check_node(f"field 'base_availability.{g}'", g)
    region_names: dict[str, int] = {}
    for i, r in enumerate(spec.regions):
        label = f"regions[{i}] {r.name!r}"
        if r.name not in cat.regions:
            raise unknown(f"{label}: field 'name'", "region", r.name, cat.regions)
        if r.name in region_names:
            raise ScenarioError(f"{source}: {label}: field 'name': region listed twice (first "
                                f"at regions[{region_names[r.name]}])")
        region_names[r.name] = i
        if isinstance(r.availability, str) and r.availability not in spec.levels:
            raise ScenarioError(
                f"{source}: {label}: field 'availability': unknown availability level "
                f"{r.availability!r}; this scenario defines {_names(spec.levels)}."
                f"{did_you_mean(r.availability, spec.levels)}")
        if isinstance(r.availability, dict):
            for g in r.availability:
                check_node(f"{label}: field 'availability.{g}'", g)
        for g in r.price_overrides:
            check_node(f"{label}: field 'price_overrides.{g}'", g)
    for name, lvl in spec.levels.items():
        for g in lvl.node_type_scale:
            check_node(f"levels.{name}: field 'node_type_scale.{g}'", g)
        for r in lvl.region_scale:
            if r not in region_names:
                raise unknown(f"levels.{name}: field 'region_scale.{r}'",
                              "region (not in this scenario's regions)", r, region_names)
        for r, row in lvl.counts.items():
            if r not in region_names:
                raise unknown(f"levels.{name}: field 'counts.{r}'",
                              "region (not in this scenario's regions)", r, region_names)
            for g in row:
                check_node(f"levels.{name}: field 'counts.{r}.{g}'", g)


def _resolve_prices(source: str, spec: ScenarioSpec, cat: Catalog,
                    node_types: tuple[str, ...]) -> dict[NodeRegion, float]:
    prices: dict[NodeRegion, float] = {}
    for r in spec.regions:
        for g in node_types:
            usd = r.price_overrides.get(g, cat.node_types[g].price_in(r.name))
            if usd is not None:
                prices[(g, r.name)] = float(usd)
    return prices


def _check_level_counts_priced(source: str, spec: ScenarioSpec,
                               prices: Mapping[NodeRegion, float]) -> None:
    for name, lvl in spec.levels.items():
        for region, row in lvl.counts.items():
            for g, n in row.items():
                if n and (g, region) not in prices:
                    raise ScenarioError(
                        f"{source}: levels.{name}: field 'counts.{region}.{g}': node type {g!r} "
                        f"has no price in {region!r}; add it to that region's "
                        "'price_overrides' or remove this entry")


def _resolve_availability(source: str, spec: ScenarioSpec, level: str | None,
                          node_types: tuple[str, ...], prices: Mapping[NodeRegion, float]
                          ) -> dict[NodeRegion, int]:
    out: dict[NodeRegion, int] = {}
    for i, r in enumerate(spec.regions):
        own = r.availability if isinstance(r.availability, dict) else {}
        for g in own:
            if (g, r.name) not in prices:
                raise ScenarioError(
                    f"{source}: regions[{i}] {r.name!r}: field 'availability.{g}': node type "
                    f"{g!r} has no price in {r.name!r}; add it to 'price_overrides' there or "
                    "remove this entry")
        lvl_name = r.availability if isinstance(r.availability, str) else level
        lvl = spec.levels.get(lvl_name) if lvl_name is not None else None
        for g in node_types:
            if (g, r.name) not in prices:
                continue
            base = own.get(g, spec.base_availability.get(g, 0))
            if lvl is None:
                n = base
            elif g in lvl.counts.get(r.name, {}):
                n = lvl.counts[r.name][g]
            else:
                factor = (lvl.scale * lvl.node_type_scale.get(g, 1.0)
                          * lvl.region_scale.get(r.name, 1.0))
                n = math.floor(base * factor + 1e-9)
            if n > 0:
                out[(g, r.name)] = int(n)
    return out
