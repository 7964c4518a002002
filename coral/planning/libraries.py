"""A scenario's template libraries: one per (model, template mode), built or reused from disk.

`templates_for_scenario` builds each library with the scenario's SLO, node types, `n_max` and
`rho`, and reuses it from disk when its inputs are unchanged (`coral.templates.builder.store`). The
libraries live under `OUT_ROOT/MODEL/MODE-nN-KEY` (`MODE-ENGINE-nN-KEY` for an engine other
than Coral's own, e.g. `--engine vllm`, whose libraries hold only the shapes vLLM runs), where
`KEY` hashes what the scenario chooses (SLO, request shape, `rho`, node types, regions,
engine), so scenarios that ask for different libraries of the same model do not overwrite
each other's.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from coral.allocator.scenario.load import Scenario, scenario_slo
from coral.catalog.loader import Catalog
from coral.errors import InputError
from coral.templates.builder.build import BuildReport, Template, build_library
from coral.templates.builder.build_options import BuildOptions
from coral.templates.space.engines import DEFAULT_ENGINE, check_engine, engine_topology
from coral.templates.builder.homogeneous import cached_completions, homogeneous_combos
from coral.templates.space.operating_points import PerfLike, shared_tables
from coral.templates.builder.solve import build_template
from coral.templates.builder.store import MANIFEST, TemplateLibrary

log = logging.getLogger(__name__)

#: Where template libraries go unless the caller says otherwise (as `coral templates build`).
DEFAULT_TEMPLATES_DIR = Path("out/templates")


@dataclass(frozen=True)
class ScenarioTemplates(MappingABC):
    """Model -> its kept templates (every template mode of the scenario), plus how they were
    built. Reads like a `dict[str, tuple[Template, ...]]`.

    `nmax` is the node limit the libraries were built with; `scenario_nmax` the one the
    scenario asks for. When they differ (`reduced`), the templates are a quick approximation:
    larger combinations, which may be cheaper per request, were never considered.
    """

    by_model: Mapping[str, tuple[Template, ...]]
    nmax: int
    scenario_nmax: int
    reports: tuple[BuildReport, ...] = ()
    template_dirs: Mapping[str, str] = field(default_factory=dict)  # "model/mode" -> directory
    engine: str = DEFAULT_ENGINE  # the serving engine whose shapes the templates are limited to

    def __getitem__(self, model: str) -> tuple[Template, ...]:
        return self.by_model[model]

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_model)

    def __len__(self) -> int:
        return len(self.by_model)

    @property
    def reduced(self) -> bool:
        return self.nmax != self.scenario_nmax

    @property
    def total(self) -> int:
        return sum(len(t) for t in self.by_model.values())

    def notes(self) -> tuple[str, ...]:
        if not self.reduced:
            return ()
        return (f"templates built with n_max = {self.nmax} instead of the scenario's "
                f"{self.scenario_nmax} (quick run): combinations of more than {self.nmax} "
                "nodes were not considered, so costs may be higher than a full plan's",)


def build_regions(scenario: Scenario) -> tuple[str, ...] | None:
    """Regions to restrict enumeration to. None when a price override may price a node type
    that the catalog does not price there: enumeration reads catalog prices, so restricting
    it would drop combinations the scenario can run."""
    if any(r.price_overrides for r in scenario.spec.regions):
        return None
    return scenario.regions


def library_dir(out_root: str | Path, scenario: Scenario, model: str, mode: str,
                nmax: int, engine: str = DEFAULT_ENGINE) -> Path:
    """Directory of the (model, mode) library this scenario asks for at `nmax` nodes, for
    `engine` (its libraries never share a directory with another engine's)."""
    engine = check_engine(engine)
    regions = build_regions(scenario)
    key_doc: dict[str, Any] = {
        "slo": scenario_slo(scenario, model).model_dump(mode="json"),
        "rho": float(scenario.spec.rho),
        "node_types": sorted(scenario.node_types),
        "regions": sorted(regions) if regions is not None else None,
    }
    if engine != "coral":  # Coral's own keys stay as they were, so its libraries are reused
        key_doc["engine"] = engine
    key = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()[:10]
    name = f"{mode}-n{nmax}-{key}" if engine == "coral" else f"{mode}-{engine}-n{nmax}-{key}"
    return Path(out_root) / model / name


def library_digest(out: Path | None) -> str:
    """The digest of the library built at `out` ("" when none was written)."""
    if out is None or not (Path(out) / MANIFEST).exists():
        return ""
    return TemplateLibrary.open(out).digest


def templates_for_scenario(
    scenario: Scenario,
    catalog: Catalog,
    perf: PerfLike,
    *,
    options: BuildOptions = BuildOptions(),
    out_root: str | Path | None = DEFAULT_TEMPLATES_DIR,
    nmax: int | None = None,
    progress: bool = False,
    on_message: Callable[[str], None] | None = None,
) -> ScenarioTemplates:
    """Build (or reuse) one library per model and template mode of `scenario`.

    The scenario says which libraries (SLO, modes, node types, regions, `rho`, `n_max`);
    `options` how they are built, handed to `build_library` whole. `nmax` overrides the
    scenario's `n_max` (quick runs); the result says so (`reduced`, `notes()`). With
    `out_root=None` nothing is written and everything is solved afresh. `options.engine`
    limits every template, the homogeneous completions included, to the shapes that engine
    runs (`coral.templates.space.engines`; `vllm` solves in topology `chain`). Coral's own
    templates need no vLLM-shaped ones beside them: both are searched under the one step
    model, and Coral's space holds every vLLM pipeline.
    """
    n = int(scenario.spec.n_max if nmax is None else nmax)
    if n < 1:
        raise InputError(f"nmax must be >= 1, got {n}")
    engine = options.engine
    regions = build_regions(scenario)
    topology = engine_topology(engine, options.topology)
    tables = shared_tables(perf, catalog, options.batches)
    by_model: dict[str, tuple[Template, ...]] = {}
    reports: list[BuildReport] = []
    dirs: dict[str, str] = {}
    for m in scenario.models:
        slo = scenario_slo(scenario, m.name)
        kept_all: list[Template] = []
        for mode in scenario.template_modes:
            out = None if out_root is None else library_dir(out_root, scenario, m.name,
                                                             mode, n, engine)
            kept, report = build_library(
                m.name, catalog, slo=slo, mode=mode, nmax=n, rho=scenario.spec.rho,
                node_types=scenario.node_types, regions=regions, options=options, out=out,
                perf=perf, progress=progress, on_message=on_message,
            )
            kept_all.extend(kept)
            # the k x g combinations the library dropped by throughput: one instance pools its
            # queue, so it may plan above its parts (`coral.templates.builder.homogeneous`)
            useful = [g for g in scenario.node_types if g not in report.excluded_node_types]
            combos = homogeneous_combos(m.name, catalog, slo, mode, node_types=useful,
                                        n_max=n, rho=scenario.spec.rho,
                                        memory_reserve=tables.memory_reserve)
            kept_all.extend(cached_completions(
                out, library_digest(out), kept, combos,
                lambda c, mode=mode: build_template(
                    m.name, c, slo, mode, topology, perf, catalog, tables=tables,
                    time_limit_s=options.time_limit_s, solver=options.solver,
                    floor=0.0, engine=engine)))
            reports.append(report)
            if out is not None:
                dirs[f"{m.name}/{mode}"] = str(out)
            log.info("%s %s %s: %d templates kept (n_max %d)", m.name, mode, engine,
                     len(kept), n)
        by_model[m.name] = tuple(kept_all)
    return ScenarioTemplates(by_model=by_model, nmax=n, scenario_nmax=int(scenario.spec.n_max),
                             reports=tuple(reports), template_dirs=dirs, engine=engine)
