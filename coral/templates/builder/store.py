"""A template library on disk: `manifest.json` + `templates.jsonl` in one directory.

- `manifest.json` holds the build's inputs (model, SLO, mode, topology, `nmax`, `rho`, node-type
  and region restriction, batch set, catalog content hash, perf model and operating-point
  versions, format, and the serving engine when it is not Coral's own) and
  their digest; once a build finishes, its report too.
- `templates.jsonl` holds one JSON record per combination, appended as soon as it is decided:
  `{"combo": [...], "outcome": kept|dominated|bound|infeasible|zero, "throughput": ...,
  "template": {...}}` (the full template for kept ones, the summary otherwise). Records of
  pruned and infeasible combinations are stored too, so that a resumed build solves nothing
  twice.

Opening a directory for a build reuses it when the digest matches (resuming an unfinished
build) and otherwise moves it aside to `<dir>.stale-<digest>` and starts afresh; either way
the returned message says which and why.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from coral.errors import CoralError
from coral.catalog.loader import Catalog
from coral.templates.builder.solve import Outcome
from coral.templates.template import Template
from coral.templates.space.engines import ENGINE_RULES_VERSION
from coral.templates.space.enumerate import Combo
from coral.templates.space.operating_points import OPERATING_POINTS_VERSION
from coral.templates.step.search import STEP_SEARCH_VERSION
from coral.templates.slo import SloSpec

log = logging.getLogger(__name__)

#: Version of the on-disk layout; part of the digest.
LIBRARY_FORMAT = 1
MANIFEST = "manifest.json"
RECORDS = "templates.jsonl"


class LibraryError(CoralError, ValueError):
    """A library directory is missing, malformed or not a library."""


def perf_model_version() -> str:
    try:
        import coral.perf.model as pm
    except ImportError:  # pragma: no cover
        return "1"
    return str(getattr(pm, "PERF_MODEL_VERSION", "1"))


@dataclass(frozen=True)
class LibraryInputs:
    """Everything a library's content depends on."""

    model: str
    slo: dict[str, Any]
    mode: str
    topology: str
    nmax: int
    rho: float
    node_types: tuple[str, ...] | None
    regions: tuple[str, ...] | None
    batches: tuple[int, ...]
    catalog_hash: str
    perf_model_version: str
    operating_points_version: str = OPERATING_POINTS_VERSION
    format: int = LIBRARY_FORMAT
    engine: str = "coral"  # the serving engine whose shapes the library is restricted to

    @classmethod
    def create(
        cls,
        *,
        catalog: Catalog,
        model: str,
        slo: SloSpec,
        mode: str,
        topology: str,
        nmax: int,
        rho: float,
        node_types: Sequence[str] | None,
        regions: Sequence[str] | None,
        batches: Sequence[int],
        engine: str = "coral",
    ) -> "LibraryInputs":
        return cls(
            model=model,
            slo=slo.model_dump(mode="json"),
            mode=mode,
            topology=topology,
            nmax=int(nmax),
            rho=float(rho),
            node_types=tuple(sorted(set(node_types))) if node_types is not None else None,
            regions=tuple(sorted(set(regions))) if regions is not None else None,
            batches=tuple(int(b) for b in batches),
            catalog_hash=catalog.content_hash(),
            perf_model_version=perf_model_version(),
            engine=engine,
        )

    def as_dict(self) -> dict[str, Any]:
        out = {
            "model": self.model,
            "slo": self.slo,
            "mode": self.mode,
            "topology": self.topology,
            "nmax": self.nmax,
            "rho": self.rho,
            "node_types": list(self.node_types) if self.node_types is not None else None,
            "regions": list(self.regions) if self.regions is not None else None,
            "batches": list(self.batches),
            "catalog_hash": self.catalog_hash,
            "perf_model_version": self.perf_model_version,
            "operating_points_version": self.operating_points_version,
            "format": self.format,
            # single-pipeline templates are searched under the step model (`placement_step`)
            "step_search": STEP_SEARCH_VERSION,
        }
        if self.engine != "coral":
            # only a restricted engine is named, so that the digests of unrestricted
            # libraries (and the libraries already on disk) stay what they were
            out["engine"] = self.engine
            out["engine_rules"] = ENGINE_RULES_VERSION
        return out

    def digest(self) -> str:
        blob = json.dumps(self.as_dict(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def outcome_record(outcome: Outcome, kind: str, best_sub: float) -> dict[str, Any]:
    """The JSONL record of one decided combination."""
    tpl = outcome.template
    rec: dict[str, Any] = {
        "combo": list(outcome.combo),
        "size": len(outcome.combo),
        "outcome": kind,
        "throughput": (tpl.throughput if tpl is not None and kind != "infeasible" else None),
        "bound": outcome.bound if outcome.bound != float("inf") else None,
        "best_sub": best_sub,
    }
    if tpl is not None:
        rec.update(
            status=tpl.status.value,
            gap=tpl.gap,
            solve_s=tpl.solve_s,
            method=tpl.method,
            upper_bound=tpl.upper_bound if tpl.upper_bound != float("inf") else None,
        )
        if kind == "kept":
            rec["template"] = tpl.to_dict()
        elif tpl.notes:
            rec["notes"] = list(tpl.notes)
    return rec


def _read_records(path: Path) -> tuple[list[dict[str, Any]], int, bool]:
    """(records, byte length of the good prefix, whether a torn last line was found)."""
    records: list[dict[str, Any]] = []
    good = 0
    torn = False
    if not path.exists():
        return records, 0, False
    with path.open("rb") as fh:
        data = fh.read()
    pos = 0
    lineno = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        line = data[pos:] if end < 0 else data[pos:end]
        lineno += 1
        nxt = len(data) if end < 0 else end + 1
        try:
            rec = json.loads(line) if line.strip() else None
        except json.JSONDecodeError as exc:
            if end < 0 or nxt >= len(data):  # the last line: an interrupted write
                torn = True
                break
            raise LibraryError(f"{path}: line {lineno}: not JSON ({exc.msg})") from None
        if end < 0 and rec is not None:  # complete JSON without its newline: keep it
            records.append(rec)
            good = len(data)
            torn = True  # the newline must be added before appending
            break
        if rec is not None:
            if not isinstance(rec, dict) or "combo" not in rec or "outcome" not in rec:
                raise LibraryError(f"{path}: line {lineno}: not a template record")
            records.append(rec)
        good = nxt
        pos = nxt
    return records, good, torn


class TemplateLibrary:
    """One library directory, opened for reading or for a (resumed) build."""

    def __init__(self, path: Path, manifest: dict[str, Any]):
        self.path = path
        self.manifest = manifest
        self._fh = None

    # ---- reading ----

    @classmethod
    def open(cls, path: str | Path) -> "TemplateLibrary":
        path = Path(path)
        mpath = path / MANIFEST
        if not mpath.exists():
            raise LibraryError(
                f"{path}: not a template library (no {MANIFEST}); build one with "
                "`coral templates build`"
            )
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise LibraryError(f"{mpath}: cannot read the manifest: {exc}") from None
        if not isinstance(manifest, dict) or "inputs" not in manifest:
            raise LibraryError(f"{mpath}: malformed manifest (no 'inputs')")
        return cls(path, manifest)

    @property
    def digest(self) -> str:
        return str(self.manifest.get("digest", ""))

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    @property
    def inputs(self) -> dict[str, Any]:
        return dict(self.manifest["inputs"])

    def records(self) -> list[dict[str, Any]]:
        return _read_records(self.path / RECORDS)[0]

    def records_by_combo(self) -> dict[Combo, dict[str, Any]]:
        return {tuple(r["combo"]): r for r in self.records()}

    def templates(self) -> list[Template]:
        """The kept templates, by size then combination."""
        out = [Template.from_dict(r["template"]) for r in self.records()
               if r["outcome"] == "kept" and r.get("template")]
        out.sort(key=lambda t: (len(t.combo), t.combo))
        return out

    def __iter__(self) -> Iterator[Template]:
        return iter(self.templates())

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.records():
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        return counts

    # ---- building ----

    @classmethod
    def open_for_build(cls, path: str | Path, inputs: LibraryInputs) -> tuple["TemplateLibrary", str]:
        """Reuse `path` when its inputs match, else move it aside; returns (library, message)."""
        path = Path(path)
        digest = inputs.digest()
        message: str
        if (path / MANIFEST).exists():
            try:
                old = cls.open(path)
                old_digest, old_inputs = old.digest, old.inputs
            except LibraryError as exc:
                old_digest, old_inputs = "", {}
                log.warning("%s", exc)
            if old_digest == digest:
                lib = old
                n = len(lib.records())
                if lib.complete:
                    message = reuse_message(path, n)
                else:
                    message = (f"resuming the library at {path}: {n} combinations already "
                               "decided are not solved again")
                lib._open_append()
                return lib, message
            changed = sorted(k for k, v in inputs.as_dict().items() if old_inputs.get(k) != v)
            aside = _aside_path(path, old_digest or "unknown")
            path.rename(aside)
            message = (f"the library at {path} was built from other inputs "
                       f"({', '.join(changed) or 'unreadable manifest'} changed): moved it to "
                       f"{aside} and rebuilding")
        elif path.exists() and any(path.iterdir()):
            raise LibraryError(
                f"{path} exists and is not a template library; choose another --out directory"
            )
        else:
            message = f"building a new library at {path}"
        path.mkdir(parents=True, exist_ok=True)
        manifest = {
            "digest": digest,
            "inputs": inputs.as_dict(),
            "complete": False,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        lib = cls(path, manifest)
        lib._write_manifest()
        (path / RECORDS).touch()
        lib._open_append()
        return lib, message

    def _write_manifest(self) -> None:
        tmp = self.path / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.manifest, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, self.path / MANIFEST)

    def _open_append(self) -> None:
        rpath = self.path / RECORDS
        _, good, torn = _read_records(rpath)
        if torn:  # drop an interrupted last line (or finish an unterminated one)
            with rpath.open("rb+") as fh:
                fh.truncate(good)
                if good:
                    fh.seek(good - 1)
                    if fh.read(1) != b"\n":
                        fh.write(b"\n")
        self._fh = rpath.open("a", encoding="utf-8")

    def append(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            self._open_append()
        assert self._fh is not None
        self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def finish(self, report: dict[str, Any]) -> None:
        self.close()
        self.manifest["complete"] = True
        self.manifest["report"] = report
        self.manifest["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self._write_manifest()


def reuse_message(path: Path, combinations: int) -> str:
    """What a build says when it reuses a finished library as it is."""
    return f"reusing the library at {path} ({combinations} combinations, inputs unchanged)"


def _aside_path(path: Path, digest: str) -> Path:
    base = path.with_name(f"{path.name}.stale-{digest[:8]}")
    candidate, i = base, 1
    while candidate.exists():
        candidate = base.with_name(f"{base.name}-{i}")
        i += 1
    return candidate


def find_libraries(root: str | Path) -> list[Path]:
    """Library directories at or under `root` (stale ones excluded)."""
    root = Path(root)
    if (root / MANIFEST).exists():
        return [root]
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such directory")
    return sorted(p.parent for p in root.rglob(MANIFEST) if ".stale-" not in str(p.parent))


def default_library_dir(root: str | Path, model: str, mode: str, engine: str = "coral") -> Path:
    """Where `coral templates build` puts a (model, mode) library under `--out` (an engine
    other than Coral's own gets its own directory, so the two never replace each other)."""
    return Path(root) / model / (mode if engine == "coral" else f"{mode}-{engine}")
