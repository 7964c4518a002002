"""Scenarios: which models to serve, how much, where, and how many nodes each region can give.

A scenario file (YAML; its schema, availability levels and checks in
`coral.allocator.scenario.spec`) is read by `load_scenario` / `parse_scenario` and resolved
against the catalog into a `Scenario`: node prices and availability per region at one
availability level, the demand per model, and the allocation problem over a set of template
columns.

Every problem is reported as a `ScenarioError` naming the file, the entry and the field, with
"Did you mean ...?" for misspelt catalog names.
"""

from __future__ import annotations

from dataclasses import dataclass, field as dc_field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pydantic import ValidationError

from coral.allocator.scenario.headroom import planned_capacity
from coral.allocator.problem import (
    DEFAULT_MIP_GAP,
    DEFAULT_SCARCITY,
    DEFAULT_TIME_LIMIT_S,
    AllocationProblem,
    ModelDemand,
    Mode,
    NodeRegion,
    Scarcity,
    TemplateColumn,
    TemplateRegion,
    priced_column,
)
from coral.allocator.scenario.spec import (
    SCENARIO_SCHEMA_VERSION,
    ScenarioError,
    ScenarioMode,
    ScenarioModel,
    ScenarioSpec,
    check_level_counts_priced,
    check_names,
    check_size,
    format_validation_error,
    names_list,
    read_yaml,
    resolve_availability,
    resolve_prices,
)
from coral.catalog import Catalog, default_catalog
from coral.messages import did_you_mean
from coral.perf.step import IterationCache, template_saturation
from coral.templates.slo import SloSpec
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
        model gives them at full occupancy (memoised per template; their step models share
        iteration times, `IterationCache`)."""
        memo: dict[int, tuple[Any, Any]] = {}
        iterations = IterationCache()

        def saturation_of(template: Any) -> Any:
            hit = memo.get(id(template))
            if hit is None or hit[0] is not template:
                hit = memo[id(template)] = (template, template_saturation(
                    template, perf=perf, catalog=catalog, iter_cache=iterations))
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
        model (see `coral.allocator.scenario.headroom`)."""
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
        scarcity: Scarcity = DEFAULT_SCARCITY,
    ) -> AllocationProblem:
        """The allocation problem of this scenario over `templates` (`scarcity`: what it
        maximises when demand cannot be met, `AllocationProblem.scarcity`).

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
            scarcity=scarcity,
        )


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
    doc = read_yaml(source, text)
    try:
        spec = ScenarioSpec.model_validate(doc)
    except ValidationError as err:
        raise ScenarioError(format_validation_error(source, doc, err)) from None
    if spec.schema_version != SCENARIO_SCHEMA_VERSION:
        raise ScenarioError(
            f"{source}: field 'schema_version': {spec.schema_version} is not supported (this "
            f"Coral reads {SCENARIO_SCHEMA_VERSION})"
        )
    check_names(source, spec, cat)
    chosen = level if level is not None else spec.availability
    if chosen is not None and chosen not in spec.levels:
        where = "level" if level is not None else "field 'availability'"
        raise ScenarioError(
            f"{source}: {where}: unknown availability level {chosen!r}; this scenario defines "
            f"{names_list(spec.levels)}.{did_you_mean(chosen, spec.levels)}"
        )
    if chosen is None and spec.levels:
        raise ScenarioError(
            f"{source}: field 'availability': no level chosen; name one of "
            f"{names_list(spec.levels)} here or when loading the scenario"
        )
    variant = spec.levels[chosen].demand_rps if chosen is not None else {}
    if variant:
        spec = spec.model_copy(update={"models": [
            m.model_copy(update={"demand_rps": float(variant[m.name])}) if m.name in variant
            else m for m in spec.models]})
    node_types = tuple(spec.node_types) if spec.node_types is not None else tuple(
        sorted(cat.node_types))
    regions = tuple(r.name for r in spec.regions)
    prices = resolve_prices(source, spec, cat, node_types)
    check_level_counts_priced(source, spec, prices)
    availability = resolve_availability(source, spec, chosen, node_types, prices)
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
                f"unknown scenario {text_name!r}: not a built-in ({names_list(builtins)}) and no "
                f"such file.{did_you_mean(text_name, builtins)}"
            )
    path = Path(name_or_path)
    try:
        if path.is_file():  # before reading: a wrong file may be gigabytes
            check_size(str(path), path.stat().st_size)
        return str(path), path.read_text()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read scenario file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: cannot read scenario file: not UTF-8 text ({exc.reason})"
                            ) from None


def scenario_slo(scenario: Scenario, model: str) -> SloSpec:
    """The SLO and request shape the scenario asks of `model` (its entry's `SloSpec`);
    KeyError naming the models it serves."""
    return scenario.model_spec(model).slo
