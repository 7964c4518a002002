"""Timelines of demand, availability and prices, which the adaptation loop
(`coral.planning.adapt`) replays.

A timeline is YAML, validated by `TimelineSpec` (unknown fields are errors):

```yaml
schema_version: 1
name: day
scenario: core              # built-in name, or a scenario file (relative to this file)
level: limited              # optional availability level of the scenario
nmax: 2                     # optional: build templates with fewer nodes than the scenario's
periods:
  - name: "00:00"           # optional label (default: the period's index)
    duration_s: 3600
    demand_scale: 0.4                           # every model's demand x 0.4, or per model:
    # demand_scale: {llama-3.1-8b: 0.5}         #   models not listed keep x 1
    demand_rps: {qwen3-14b: 80}                 # absolute req/s (wins over demand_scale)
    availability_scale: {aws-us-east-1: 0.2}    # per region, or one number for every region
    availability: {aws-us-east-1: {8x-h100-sxm: 2}}   # absolute counts (win over the scale)
    price_scale: {gcp-us-central1: 1.3}         # per region, or one number for every region
    node_price_scale: {1x-l4: 0.8}              # per node type
```

Every period is taken **relative to the scenario** (not to the previous period): a period that
says nothing runs the scenario as it is. Scaled availability is rounded down to whole nodes.

Every problem with a timeline file is a `TimelineError` naming the file, the period and the
field, with "Did you mean ...?" for misspelt names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coral.errors import CoralError
from coral.allocator.problem import NodeRegion
from coral.allocator.scenario.load import Scenario, ScenarioError, builtin_scenarios, load_scenario
from coral.catalog.loader import Catalog
from coral.messages import did_you_mean, entry_problem
from coral.yaml_text import safe_load

TIMELINE_SCHEMA_VERSION = 1


class TimelineError(CoralError, ValueError):
    """A timeline file is missing, malformed, or names what its scenario does not hold."""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Period(_Entry):
    """One period of a timeline: how long it lasts and how it differs from the scenario."""

    name: str | None = Field(default=None, description="Label (default: the period's index).")
    duration_s: float = Field(gt=0, description="How long the period lasts, seconds.")
    demand_scale: float | dict[str, float] = Field(
        default=1.0, description="Multiplier of every model's demand, or model -> multiplier.")
    demand_rps: dict[str, float] = Field(
        default_factory=dict, description="Model -> absolute demand, req/s.")
    availability_scale: float | dict[str, float] = Field(
        default=1.0, description="Multiplier of every region's node counts, or region -> it.")
    availability: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="Region -> node type -> absolute node count.")
    price_scale: float | dict[str, float] = Field(
        default=1.0, description="Multiplier of every price, or region -> multiplier.")
    node_price_scale: dict[str, float] = Field(
        default_factory=dict, description="Node type -> price multiplier (every region).")


class TimelineSpec(_Entry):
    """A timeline file, validated."""

    schema_version: int = TIMELINE_SCHEMA_VERSION
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    description: str = ""
    scenario: str = Field(min_length=1, description="Built-in scenario name or file path.")
    level: str | None = Field(default=None, description="Availability level of the scenario.")
    nmax: int | None = Field(default=None, ge=1, le=16,
                             description="Template node limit (default: the scenario's).")
    periods: list[Period] = Field(min_length=1)


@dataclass(frozen=True)
class Timeline:
    """A validated timeline with its scenario loaded."""

    spec: TimelineSpec
    source: str
    scenario: Scenario

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def periods(self) -> tuple[Period, ...]:
        return tuple(self.spec.periods)

    def period_label(self, i: int) -> str:
        p = self.spec.periods[i]
        return p.name if p.name is not None else str(i)

    def period_scenario(self, i: int) -> Scenario:
        """The scenario as it stands during period `i`."""
        return apply_period(self.scenario, self.spec.periods[i])


# ---------------------------------------------------------------------------------------------
# Loading and checking
# ---------------------------------------------------------------------------------------------


def builtin_timelines() -> tuple[str, ...]:
    """Names of the timelines that ship with Coral."""
    folder = resources.files("coral.allocator") / "data" / "timelines"
    return tuple(sorted(p.name[: -len(".yaml")] for p in folder.iterdir()
                        if p.name.endswith(".yaml")))


def load_timeline(path: str | Path, *, catalog: Catalog | None = None) -> Timeline:
    """Read, validate and resolve a timeline file (its scenario included); a bare name that
    is no file is looked up among the built-in timelines (`day`)."""
    text_name = str(path)
    if not Path(text_name).exists() and "/" not in text_name and not text_name.endswith(
            (".yaml", ".yml")):
        builtins = builtin_timelines()
        if text_name not in builtins:
            raise TimelineError(f"unknown timeline {text_name!r}: no such file and not a "
                                f"built-in ({', '.join(builtins)}).{did_you_mean(text_name, builtins)}")
        folder = resources.files("coral.allocator") / "data" / "timelines"
        return parse_timeline((folder / f"{text_name}.yaml").read_text(),
                              source=f"<builtin>/{text_name}.yaml", catalog=catalog)
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TimelineError(f"{source}: no such timeline file") from None
    except OSError as exc:
        raise TimelineError(f"{source}: cannot read timeline file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise TimelineError(f"{source}: not UTF-8 text ({exc.reason})") from None
    return parse_timeline(text, source=source, base_dir=path.parent, catalog=catalog)


def parse_timeline(text: str, *, source: str = "<timeline>", base_dir: Path | None = None,
                   catalog: Catalog | None = None) -> Timeline:
    try:
        doc = safe_load(text)
    except yaml.YAMLError as exc:
        raise TimelineError(f"{source}: malformed YAML: {exc}") from None
    except (ValueError, TypeError, AttributeError, LookupError, RecursionError) as exc:
        # PyYAML's constructors let these escape on bad tagged or implicit scalars
        raise TimelineError(f"{source}: malformed YAML: {type(exc).__name__}: {exc}") from None
    if not isinstance(doc, dict):
        raise TimelineError(f"{source}: expected a mapping with at least 'name', 'scenario' and "
                            "'periods'")
    try:
        spec = TimelineSpec.model_validate(doc)
    except ValidationError as err:
        raise TimelineError(_format_validation_error(source, doc, err)) from None
    if spec.schema_version != TIMELINE_SCHEMA_VERSION:
        raise TimelineError(f"{source}: field 'schema_version': {spec.schema_version} is not "
                            f"supported (this Coral reads {TIMELINE_SCHEMA_VERSION})")
    scenario_ref = _scenario_ref(spec.scenario, base_dir)
    try:
        scenario = load_scenario(scenario_ref, level=spec.level, catalog=catalog)
    except ScenarioError as exc:
        raise TimelineError(f"{source}: field 'scenario': {exc}") from None
    _check_periods(source, spec, scenario)
    return Timeline(spec=spec, source=source, scenario=scenario)


def _scenario_ref(ref: str, base_dir: Path | None) -> str | Path:
    """A built-in name as it is; a path relative to the timeline file's folder."""
    if ref in builtin_scenarios():
        return ref
    path = Path(ref)
    if not path.is_absolute() and base_dir is not None and (base_dir / path).exists():
        return base_dir / path
    return ref


def _period_label(doc: Mapping[str, Any], i: int) -> str:
    periods = doc.get("periods")
    name = None
    if isinstance(periods, list) and i < len(periods) and isinstance(periods[i], dict):
        name = periods[i].get("name")
    return f"periods[{i}]" + (f" {name!r}" if name is not None else "")


def _format_validation_error(source: str, doc: Mapping[str, Any], err: ValidationError) -> str:
    lines: list[str] = []
    for e in err.errors():
        loc = tuple(e["loc"])
        label = ""
        if len(loc) >= 2 and loc[0] == "periods" and isinstance(loc[1], int):
            label = _period_label(doc, loc[1])
            loc = loc[2:]
        # `float | dict` fields report both alternatives; name the field, not the alternative
        line = entry_problem(source, label,
                             (x for x in loc if x not in ("float", "dict[str,float]")), e)
        if line not in lines:
            lines.append(line)
    return "\n".join(lines)


def _check_periods(source: str, spec: TimelineSpec, scenario: Scenario) -> None:
    models = [m.name for m in scenario.models]
    regions = list(scenario.regions)
    node_types = list(scenario.node_types)

    def fail(i: int, field_name: str, msg: str) -> TimelineError:
        label = f"periods[{i}]" + (f" {spec.periods[i].name!r}" if spec.periods[i].name else "")
        return TimelineError(f"{source}: {label}: field '{field_name}': {msg}")

    def check_names(i: int, field_name: str, names: Iterable[str], known: list[str],
                    kind: str) -> None:
        for n in names:
            if n not in known:
                raise fail(i, f"{field_name}.{n}",
                           f"unknown {kind} {n!r} (scenario {scenario.name!r} has "
                           f"{', '.join(known)}).{did_you_mean(n, known)}")

    def check_factors(i: int, field_name: str, values: Mapping[str, float] | float) -> None:
        items = values.items() if isinstance(values, Mapping) else [(None, values)]
        for key, value in items:
            where = field_name if key is None else f"{field_name}.{key}"
            if not value >= 0:
                raise fail(i, where, f"must be >= 0, got {value!r}")

    for i, p in enumerate(spec.periods):
        if isinstance(p.demand_scale, dict):
            check_names(i, "demand_scale", p.demand_scale, models, "model")
        check_factors(i, "demand_scale", p.demand_scale)
        check_names(i, "demand_rps", p.demand_rps, models, "model")
        check_factors(i, "demand_rps", p.demand_rps)
        if isinstance(p.availability_scale, dict):
            check_names(i, "availability_scale", p.availability_scale, regions, "region")
        check_factors(i, "availability_scale", p.availability_scale)
        check_names(i, "availability", p.availability, regions, "region")
        for region, row in p.availability.items():
            check_names(i, f"availability.{region}", row, node_types, "node type")
            for g, n in row.items():
                if n < 0:
                    raise fail(i, f"availability.{region}.{g}", f"must be >= 0, got {n}")
                if n > 0 and (g, region) not in scenario.node_prices:
                    raise fail(i, f"availability.{region}.{g}",
                               f"node type {g!r} has no price in {region!r}, so it cannot be "
                               "rented there")
        if isinstance(p.price_scale, dict):
            check_names(i, "price_scale", p.price_scale, regions, "region")
        check_factors(i, "price_scale", p.price_scale)
        check_names(i, "node_price_scale", p.node_price_scale, node_types, "node type")
        check_factors(i, "node_price_scale", p.node_price_scale)
        for field_name, table in (("price_scale", p.price_scale),
                                  ("node_price_scale", p.node_price_scale)):
            values = table.values() if isinstance(table, Mapping) else [table]
            if any(v == 0 for v in values):
                raise fail(i, field_name, "a price multiplier must be > 0 (free nodes would "
                           "make every plan rent all of them)")


def _factor(table: float | Mapping[str, float], key: str) -> float:
    return float(table.get(key, 1.0)) if isinstance(table, Mapping) else float(table)


def apply_period(scenario: Scenario, period: Period) -> Scenario:
    """`scenario` with `period`'s demand, availability and prices."""
    models = []
    for m in scenario.spec.models:
        demand = period.demand_rps.get(m.name, m.demand_rps * _factor(period.demand_scale,
                                                                      m.name))
        models.append(m.model_copy(update={"demand_rps": float(demand)}))
    spec = scenario.spec.model_copy(update={"models": models})
    prices: dict[NodeRegion, float] = {
        (g, r): usd * _factor(period.price_scale, r) * period.node_price_scale.get(g, 1.0)
        for (g, r), usd in scenario.node_prices.items()
    }
    availability: dict[NodeRegion, int] = {}
    for (g, r) in scenario.node_prices:
        row = period.availability.get(r, {})
        if g in row:
            n = row[g]
        else:
            base = scenario.availability.get((g, r), 0)
            n = math.floor(base * _factor(period.availability_scale, r) + 1e-9)
        if n > 0:
            availability[(g, r)] = int(n)
    return replace(scenario, spec=spec, node_prices=prices, availability=availability)
