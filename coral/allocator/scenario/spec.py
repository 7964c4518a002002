"""The scenario file: its schema and the checks that resolve it against the catalog.

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
     tpot_s: 0.10, ttft_s: 2.0, percentile: 0.9, priority: 1,
     trace: azure-conv-2023}   # optional: the trace the shape comes from (a label)
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
  skewed:   {scale: 1.0, demand_rps: {llama-3.1-8b: 240}}   # a demand variant


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

**Demand variants.** A level may also replace some models' `demand_rps` (`demand_rps`), so a
variant of the demand (say, 80 % of the requests to the largest models) is chosen the way an
availability level is (`--level`), is recorded in the plan with its level name, and keeps the
models, SLOs and availability of the file. Models it does not name keep their own demand.
Without `levels`, the base table is the availability.

Every problem is reported as a `ScenarioError` naming the file, the entry and the field, with
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from coral.allocator.scenario.headroom import DEFAULT_ARRIVAL_CV, DEFAULT_OUTPUT_CV
from coral.allocator.problem import NodeRegion
from coral.catalog import Catalog
from coral.errors import CoralError
from coral.messages import did_you_mean, entry_problem
from coral.templates.slo import SloSpec
from coral.yaml_text import safe_load

SCENARIO_SCHEMA_VERSION = 1
ScenarioMode = Literal["aggregated", "pd", "mixed", "auto"]


class ScenarioError(CoralError, ValueError):
    """A scenario file is missing, malformed or names what the catalog does not hold."""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


#: The fields of a model entry that make its `SloSpec` (written flat in the entry).
SLO_FIELDS = ("tpot_s", "ttft_s", "percentile", "input_tokens", "output_tokens")


class ScenarioModel(_Entry):
    """One model to serve: its demand, latency SLO and request shape, and priority.

    The file writes the SLO's fields (`tpot_s`, `ttft_s`, `percentile`, `input_tokens`,
    `output_tokens`) flat in the entry; they are read into `slo`, an `SloSpec`, whose
    checks (ttft_s >= tpot_s among them) are the only ones."""

    name: str = Field(min_length=1, description="Catalog model name.")
    demand_rps: float = Field(ge=0, description="Requests per second to serve.")
    slo: SloSpec = Field(description="TTFT/TPOT targets at a percentile and the mean request "
                         "shape (written flat in the entry).")
    priority: float = Field(default=1.0, gt=0, description="Weight of its goodput under scarcity.")
    arrival_cv: float = Field(
        default=DEFAULT_ARRIVAL_CV, ge=0, le=10,
        description="Coefficient of variation of inter-arrival gaps (1: Poisson; > 1 bursty).")
    output_tokens_cv: float = Field(
        default=DEFAULT_OUTPUT_CV, ge=0, le=10,
        description="Coefficient of variation of output lengths (0: all the same).")
    trace: str | None = Field(
        default=None, min_length=1,
        description="The request trace this model's shape is taken from (a label for reports; "
        "`coral simulate --trace FILE` replays a trace file).")

    @model_validator(mode="before")
    @classmethod
    def _slo_from_flat_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and "slo" not in data:
            data = dict(data)
            data["slo"] = {k: data.pop(k) for k in SLO_FIELDS if k in data}
        return data

    @property
    def tpot_s(self) -> float:
        return self.slo.tpot_s

    @property
    def ttft_s(self) -> float:
        return self.slo.ttft_s

    @property
    def percentile(self) -> float:
        return self.slo.percentile

    @property
    def input_tokens(self) -> int:
        return self.slo.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.slo.output_tokens


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
    demand_rps: dict[str, float] = Field(
        default_factory=dict,
        description="Model -> requests/s replacing its `demand_rps` at this level (a demand "
        "variant at this level's availability).")

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
        for model, rps in self.demand_rps.items():
            if rps < 0:
                raise ValueError(f"demand_rps of {model!r} is {rps}; must be >= 0")
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


#: Largest scenario file read: far above a scenario of a thousand models. The bound refuses
#: a wrong file at once, since parsing builds every value in Python, even with the C
#: parser (figures in benchmarks/results/hostile-input.md, "Careless and hostile plan and ...").
MAX_SCENARIO_BYTES = 256 << 10


def check_size(source: str, size: int) -> None:
    """`ScenarioError` for a scenario file of `size` bytes past `MAX_SCENARIO_BYTES`."""
    if size > MAX_SCENARIO_BYTES:
        raise ScenarioError(f"{source}: {size / 2**10:,.0f} KiB is more than a scenario file "
                            f"may hold ({MAX_SCENARIO_BYTES >> 10} KiB); to fix: give the "
                            "scenario's YAML file (models, regions, node types), not a trace "
                            "or a data file")


def read_yaml(source: str, text: str) -> dict[str, Any]:
    """The mapping of a scenario's YAML text, or `ScenarioError` naming `source`."""
    check_size(source, len(text.encode("utf-8", "surrogatepass")))
    try:
        doc = safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: malformed YAML: {exc}") from None
    except (ValueError, TypeError, AttributeError, LookupError, RecursionError) as exc:
        raise ScenarioError(f"{source}: malformed YAML: {type(exc).__name__}: {exc}") from None
    if not isinstance(doc, dict):
        raise ScenarioError(f"{source}: expected a mapping with at least 'name', 'models' and "
                            "'regions'")
    return doc


def entry_label(doc: Mapping[str, Any], loc: tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
    """('models', 2, 'demand_rps') -> ("models[2] 'qwen3-32b'", ('demand_rps',))."""
    if len(loc) >= 2 and loc[0] in ("models", "regions") and isinstance(loc[1], int):
        entries = doc.get(loc[0])
        name = None
        if isinstance(entries, list) and loc[1] < len(entries) and isinstance(entries[loc[1]],
                                                                              dict):
            name = entries[loc[1]].get("name")
        label = f"{loc[0]}[{loc[1]}]" + (f" {name!r}" if name is not None else "")
        rest = loc[2:]
        if loc[0] == "models" and rest[:1] == ("slo",):  # the file writes the SLO flat
            rest = rest[1:]
        return label, rest
    if len(loc) >= 2 and loc[0] == "levels":
        return f"levels.{loc[1]}", loc[2:]
    return "", loc


def format_validation_error(source: str, doc: Mapping[str, Any], err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        # `availability: dict | str` reports both alternatives; keep the one that applies
        if len(loc) > 3 and loc[0] == "regions" and loc[3] in ("str", "dict[str,int]"):
            loc = loc[:3] + loc[4:]
        label, rest = entry_label(doc, loc)
        line = entry_problem(source, label, (x for x in rest if x not in ("str", "dict[str,int]")),
                             e)
        if line not in lines:
            lines.append(line)
    return "\n".join(lines)


def names_list(names: Iterable[str]) -> str:
    listed = ", ".join(sorted(names))
    return listed if listed else "none"


def check_names(source: str, spec: ScenarioSpec, cat: Catalog) -> None:
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
                f"{r.availability!r}; this scenario defines {names_list(spec.levels)}."
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
        for m in lvl.demand_rps:
            if m not in seen:
                raise unknown(f"levels.{name}: field 'demand_rps.{m}'",
                              "model (not in this scenario's models)", m, seen)
        for r, row in lvl.counts.items():
            if r not in region_names:
                raise unknown(f"levels.{name}: field 'counts.{r}'",
                              "region (not in this scenario's regions)", r, region_names)
            for g in row:
                check_node(f"levels.{name}: field 'counts.{r}.{g}'", g)


def resolve_prices(source: str, spec: ScenarioSpec, cat: Catalog,
                    node_types: tuple[str, ...]) -> dict[NodeRegion, float]:
    prices: dict[NodeRegion, float] = {}
    for r in spec.regions:
        for g in node_types:
            usd = r.price_overrides.get(g, cat.node_types[g].price_in(r.name))
            if usd is not None:
                prices[(g, r.name)] = float(usd)
    return prices


def check_level_counts_priced(source: str, spec: ScenarioSpec,
                               prices: Mapping[NodeRegion, float]) -> None:
    for name, lvl in spec.levels.items():
        for region, row in lvl.counts.items():
            for g, n in row.items():
                if n and (g, region) not in prices:
                    raise ScenarioError(
                        f"{source}: levels.{name}: field 'counts.{region}.{g}': node type {g!r} "
                        f"has no price in {region!r}; add it to that region's "
                        "'price_overrides' or remove this entry")


def resolve_availability(source: str, spec: ScenarioSpec, level: str | None,
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
