"""Load the built-in catalog and users' YAML files into one validated `Catalog`.

A catalog file is a YAML mapping with any of the sections `gpus`, `node_types`, `regions`,
`models` (each a list of entries) and an optional `schema_version`. Files are applied in
order: an entry whose name is new is added (and must be complete); an entry whose name
already exists is merged onto it field by field (top-level fields replace), so a user can
change one price list or one NIC speed without restating the rest.

Every problem is reported as a `CatalogError` naming the file, the entry and the field.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from coral.errors import CoralError
from coral.messages import did_you_mean, field_problem
from coral.yaml_text import safe_load
from coral.catalog.schema import (
    SCHEMA_VERSION,
    CloudSpotTerms,
    GpuType,
    Interruption,
    ModelArch,
    NodeType,
    Region,
)

SECTIONS: dict[str, type[BaseModel]] = {
    "gpus": GpuType,
    "node_types": NodeType,
    "regions": Region,
    "models": ModelArch,
    "clouds": CloudSpotTerms,
}
BUILTIN_FILES = ("gpus.yaml", "regions.yaml", "node_types.yaml", "models.yaml", "clouds.yaml")
#: Sections whose content template libraries depend on (`Catalog.content_hash`). Spot terms
#: and spot prices never enter a template, so editing them keeps the cached libraries.
HASHED_SECTIONS = ("gpus", "node_types", "regions", "models")
_UNHASHED_FIELDS = {"node_types": ("spot_prices",)}

T = TypeVar("T", bound=BaseModel)


class CatalogError(CoralError, ValueError):
    """A catalog file is malformed or inconsistent; the message says where and why."""


class UnknownNameError(CoralError, KeyError):
    """A name was asked for that the catalog does not hold (message suggests close names)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def format_validation_error(where: str, err: ValidationError) -> str:
    """One line per invalid field: "WHERE: field 'a.b': what is wrong"."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(entry)"
        msg = field_problem(e, with_input=False)
        parts.append(f"{where}: field '{loc}': {msg}")
    return "\n".join(parts)


@dataclass(frozen=True)
class Catalog:
    """The validated catalog: every entry by name, plus where each came from."""

    gpus: Mapping[str, GpuType]
    node_types: Mapping[str, NodeType]
    regions: Mapping[str, Region]
    models: Mapping[str, ModelArch]
    files: tuple[str, ...] = field(default=())
    clouds: Mapping[str, CloudSpotTerms] = field(default_factory=dict)

    def _get(self, section: str, name: str) -> Any:
        table: Mapping[str, Any] = getattr(self, section)
        if name not in table:
            kind = section.rstrip("s").replace("_", " ")
            raise UnknownNameError(
                f"unknown {kind} {name!r}.{did_you_mean(name, table)} "
                f"(`coral catalog list` shows them all)"
            )
        return table[name]

    def gpu(self, name: str) -> GpuType:
        return self._get("gpus", name)

    def node_type(self, name: str) -> NodeType:
        return self._get("node_types", name)

    def region(self, name: str) -> Region:
        return self._get("regions", name)

    def model(self, name: str) -> ModelArch:
        return self._get("models", name)

    def gpu_of(self, node_type: str | NodeType) -> GpuType:
        node = self.node_type(node_type) if isinstance(node_type, str) else node_type
        return self.gpus[node.gpu]

    def node_memory_bytes(self, node_type: str | NodeType) -> float:
        node = self.node_type(node_type) if isinstance(node_type, str) else node_type
        return self.gpus[node.gpu].memory_bytes * node.gpu_count

    def interruption(self, node_type: str, region: str) -> Interruption:
        """The interruption band of the spot pool (node type, region): the figure given with
        its spot price, else its cloud's stated default."""
        entry = self.node_type(node_type).spot_entry(region)
        if entry is not None and entry.interruption is not None:
            return entry.interruption
        return self._cloud_terms(region).default_interruption

    def preemption_rate_per_hour(self, node_type: str, region: str) -> float:
        """Expected preemptions per node-hour in the pool (node type, region).

        The clouds publish a share `f` of spot instances reclaimed within a period of `T`
        hours (AWS's Spot Instance Advisor and Azure: per month, T = 730; Google Cloud: per
        day, T = 24), a share of instances rather than a count of events. Read as a constant
        (Poisson) hazard per node, an instance survives the period with probability
        `exp(-rate * T) = 1 - f`, so `rate = -ln(1 - f) / T` (`Interruption.rate_per_hour`).
        `f` is the band's midpoint (the open top band, `>20%`, counts as 25 %), from the
        pool's own band or its cloud's stated default. E.g. `>20%` per month gives
        3.9e-4 per node-hour (not 0.25 / 730 = 3.4e-4: that reads the share as a count of
        events per instance-month, and reclaims only 1 - exp(-0.25) = 22 % of the instances
        in a month), and Google Cloud's 5-15 % per day 4.4e-3.
        """
        return self.interruption(node_type, region).rate_per_hour()

    def preemption_notice_s(self, region: str) -> float:
        """Seconds of notice the cloud of `region` gives before reclaiming a spot node."""
        return self._cloud_terms(region).notice_s

    def _cloud_terms(self, region: str) -> CloudSpotTerms:
        cloud = self.region(region).cloud
        if cloud not in self.clouds:
            raise UnknownNameError(
                f"no spot terms for cloud {cloud!r} (region {region!r}); add a 'clouds' entry "
                f"for it to the catalog"
            )
        return self.clouds[cloud]

    def lookup(self, name: str) -> BaseModel:
        """Any entry by name, whatever its section."""
        for section in SECTIONS:
            table: Mapping[str, BaseModel] = getattr(self, section)
            if name in table:
                return table[name]
        every = [n for s in SECTIONS for n in getattr(self, s)]
        raise UnknownNameError(f"no catalog entry named {name!r}.{did_you_mean(name, every)}")

    def content_hash(self) -> str:
        """Stable hash of the catalog's content, used to key cached template libraries."""
        payload = {
            s: [e.model_dump(mode="json", exclude=set(_UNHASHED_FIELDS.get(s, ())))
                for _, e in sorted(getattr(self, s).items())]
            for s in HASHED_SECTIONS
        }
        blob = json.dumps({"schema": SCHEMA_VERSION, **payload}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _read_yaml(path: Path | str, text: str) -> dict[str, Any]:
    try:
        doc = safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: malformed YAML: {exc}") from None
    except (ValueError, TypeError, AttributeError, LookupError, RecursionError) as exc:
        # PyYAML's constructors let these escape on bad tagged or implicit scalars,
        # e.g. `date: 2026-02-30` or `n: !!int x`.
        raise CatalogError(f"{path}: malformed YAML: {type(exc).__name__}: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise CatalogError(f"{path}: expected a mapping of sections {sorted(SECTIONS)}")
    unknown = set(doc) - set(SECTIONS) - {"schema_version"}
    if unknown:
        bad = sorted(str(u) for u in unknown)[0]
        raise CatalogError(
            f"{path}: unknown section {bad!r}; valid sections are {sorted(SECTIONS)}."
            f"{did_you_mean(bad, SECTIONS)}"
        )
    version = doc.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise CatalogError(
            f"{path}: schema_version {version!r} is not supported (this Coral reads "
            f"{SCHEMA_VERSION})"
        )
    return doc


Origins = dict[tuple[str, str], str]
"""(section, name) -> "file: section[index] 'name'" of the file that last defined or changed it."""


def _apply_section(
    path: str,
    section: str,
    entries: Any,
    table: dict[str, BaseModel],
    origins: Origins | None = None,
) -> None:
    model_cls = SECTIONS[section]
    if not isinstance(entries, list):
        raise CatalogError(
            f"{path}: section '{section}' must be a list of entries, got {type(entries).__name__}"
        )
    seen_here: dict[str, int] = {}
    for index, raw in enumerate(entries):
        where = f"{path}: {section}[{index}]"
        if not isinstance(raw, dict):
            raise CatalogError(f"{where}: expected a mapping, got {type(raw).__name__}")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise CatalogError(f"{where}: field 'name': missing field (a non-empty string)")
        where = f"{path}: {section}[{index}] '{name}'"
        if name in seen_here:
            raise CatalogError(
                f"{where}: field 'name': duplicate name {name!r} in this file (first at "
                f"{section}[{seen_here[name]}])"
            )
        seen_here[name] = index
        merged = dict(raw)
        if name in table:
            merged = {**table[name].model_dump(), **raw}
        try:
            table[name] = model_cls.model_validate(merged)
        except ValidationError as err:
            raise CatalogError(format_validation_error(where, err)) from None
        if origins is not None:
            origins[(section, name)] = where


def _check_references(
    cat_tables: dict[str, dict[str, BaseModel]], origins: Origins | None = None
) -> None:
    gpus, regions = cat_tables["gpus"], cat_tables["regions"]
    clouds = cat_tables.get("clouds", {})
    for node in cat_tables["node_types"].values():
        assert isinstance(node, NodeType)
        where = (origins or {}).get(("node_types", node.name), f"node_types '{node.name}'")
        if node.gpu not in gpus:
            raise CatalogError(
                f"{where}: field 'gpu': unknown GPU type {node.gpu!r}."
                f"{did_you_mean(node.gpu, gpus)}"
            )
        for i, price in enumerate(node.prices):
            if price.region not in regions:
                raise CatalogError(
                    f"{where}: field 'prices.{i}.region': unknown region "
                    f"{price.region!r}.{did_you_mean(price.region, regions)}"
                )
            region = regions[price.region]
            assert isinstance(region, Region)
            if region.cloud not in node.instances:
                raise CatalogError(
                    f"{where}: field 'prices.{i}.region': region "
                    f"{price.region!r} is on {region.cloud}, but 'instances' names no "
                    f"{region.cloud} instance"
                )
        for i, spot in enumerate(node.spot_prices):
            region = regions.get(spot.region)
            assert region is None or isinstance(region, Region)
            if region is not None and spot.interruption is None and clouds \
                    and region.cloud not in clouds:
                raise CatalogError(
                    f"{where}: field 'spot_prices.{i}.interruption': no band given and no "
                    f"'clouds' entry for {region.cloud} to take a default from"
                )


def load_catalog(
    extra_files: Iterable[Path | str] = (), *, include_builtin: bool = True
) -> Catalog:
    """Built-in catalog, then each of `extra_files` applied on top, validated as a whole."""
    tables: dict[str, dict[str, BaseModel]] = {s: {} for s in SECTIONS}
    files: list[str] = []
    origins: Origins = {}
    sources: list[tuple[str, str]] = []
    if include_builtin:
        data = resources.files("coral.catalog") / "data"
        for fname in BUILTIN_FILES:
            sources.append((f"<builtin>/{fname}", (data / fname).read_text()))
    for extra in extra_files:
        path = Path(extra)
        try:
            sources.append((str(path), path.read_text()))
        except OSError as exc:
            raise CatalogError(f"{path}: cannot read catalog file: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise CatalogError(
                f"{path}: cannot read catalog file: not UTF-8 text ({exc.reason})"
            ) from None
    for path, text in sources:
        doc = _read_yaml(path, text)
        for section in SECTIONS:
            if section in doc and doc[section] is not None:
                _apply_section(path, section, doc[section], tables[section], origins)
        files.append(path)
    _check_references(tables, origins)
    return Catalog(
        gpus=dict(tables["gpus"]),  # type: ignore[arg-type]
        node_types=dict(tables["node_types"]),  # type: ignore[arg-type]
        regions=dict(tables["regions"]),  # type: ignore[arg-type]
        models=dict(tables["models"]),  # type: ignore[arg-type]
        files=tuple(files),
        clouds=dict(tables["clouds"]),  # type: ignore[arg-type]
    )


_DEFAULT: Catalog | None = None


def default_catalog() -> Catalog:
    """The built-in catalog, loaded once per process."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = load_catalog()
    return _DEFAULT
