"""`coral profile`: measure real per-layer times of a model on this machine's device."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
import yaml
from pydantic import ValidationError
from rich.table import Table

from coral.catalog import Catalog, CatalogError, ModelArch, load_catalog
from coral.catalog.loader import format_validation_error
from coral.cli.common import (
    CatalogFiles,
    JsonFlag,
    UserError,
    console,
    err_console,
    print_json,
    user_errors,
)

SPECIAL_NODES = ("cpu", "cuda")


def _is_model_file(value: str) -> bool:
    return value.endswith((".yaml", ".yml")) or Path(value).is_file()


def _load_model(value: str, catalog_files: list[Path]) -> tuple[ModelArch, Catalog]:
    """A catalog model name, or a YAML file holding one model (a catalog file with a
    `models:` section, or a bare mapping of ModelArch fields)."""
    if not _is_model_file(value):
        catalog = load_catalog(catalog_files)
        return catalog.model(value), catalog
    path = Path(value)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UserError(f"{path}: cannot read model file: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: malformed YAML: {exc}") from None
    if isinstance(doc, dict) and "models" in doc:
        entries = doc["models"] or []
        names = [e.get("name") for e in entries if isinstance(e, dict)]
        if len(names) != 1:
            raise UserError(
                f"{path}: expected exactly one model in 'models', found {len(names)} "
                f"({', '.join(map(str, names))}); pass the file with --catalog and name the "
                f"model with --model"
            )
        catalog = load_catalog([*catalog_files, path])
        return catalog.model(str(names[0])), catalog
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a mapping of model fields or a 'models:' section")
    raw: dict[str, Any] = dict(doc)
    raw.setdefault("source", str(path))
    if isinstance(raw.get("name"), str):
        raw.setdefault("hf_id", f"local/{raw['name']}")
    try:
        arch = ModelArch.model_validate(raw)
    except ValidationError as err:
        raise CatalogError(format_validation_error(f"{path}: model", err)) from None
    return arch, load_catalog(catalog_files)


def _default_node(device_name: str, device_type: str, catalog: Catalog) -> str:
    from coral.perf.profiler import gpu_type_for_device

    if device_type == "cpu":
        return "cpu"
    gpu = gpu_type_for_device(device_name, catalog.gpus)
    return f"1x-{gpu}" if gpu else "cuda"


def _check_node(node: str, catalog: Catalog, device_name: str, device_type: str) -> None:
    if node in SPECIAL_NODES:
        return
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", node):
        raise UserError(f"--node {node!r}: node type names are lower-case letters, digits, '-'")
    node_type = catalog.node_type(node)  # unknown -> error with suggestions
    if node_type.gpu_count != 1:
        raise UserError(
            f"--node {node}: it has {node_type.gpu_count} GPUs, but the profiler runs on one "
            f"device without tensor parallelism; profile a 1-GPU node type"
        )
    if device_type == "cuda":
        from coral.perf.profiler import ProfilerWarning, gpu_type_for_device

        seen = gpu_type_for_device(device_name)
        if seen and seen != node_type.gpu:
            warnings.warn(f"--node {node} has a {node_type.gpu} GPU, but this device is "
                          f"{device_name!r}", ProfilerWarning)


def _results_table(table: Any) -> Table:
    from coral.perf.profiler import table_summary

    out = Table(title=f"{table.model} on {table.node_type} — {table.device_name}, {table.dtype}, "
                      f"{table.layers_timed} layer(s) timed, median of {table.repeats}")
    for col in ("kind", "prefill tokens", "batch", "context/seq", "total context"):
        out.add_column(col, justify="right" if col != "kind" else "left")
    out.add_column("ms / layer", justify="right")
    for r in table_summary(table):
        pre = r["kind"] == "prefill"
        out.add_row(
            str(r["kind"]), str(r["prefill_tokens"]) if pre else "",
            "" if pre else str(r["decode_batch"]), "" if pre else str(r["context_per_sequence"]),
            "" if pre else str(r["context_tokens"]), f"{r['ms_per_layer']:.4f}",
        )
    return out


def profile(
    model: Annotated[str, typer.Option(
        "--model", "-m", help="Catalog model name, or a YAML file holding one model's config.")],
    layers: Annotated[Optional[int], typer.Option(
        "--layers", help="Layers stacked and timed together (result is per layer; default: "
        "enough that their weights are twice the device's last-level cache, so decode streams "
        "them from memory as a served stage does).")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:N.")] = "cpu",
    node: Annotated[Optional[str], typer.Option(
        "--node", help="Node type the table describes (default: 'cpu' on CPU; on CUDA "
        "'1x-<gpu>' when the GPU is in the catalog, else 'cuda').")] = None,
    dtype: Annotated[Optional[str], typer.Option(
        "--dtype", help="float32, bfloat16 or float16 (default: float32 on CPU, the model's "
        "dtype (bfloat16) on CUDA).")] = None,
    prefill_tokens: Annotated[Optional[str], typer.Option(
        "--prefill-tokens", help="Prompt lengths, comma-separated (default: per device).")] = None,
    decode_batch: Annotated[Optional[str], typer.Option(
        "--decode-batch", help="Decode batch sizes, comma-separated (default: per device).")] = None,
    context: Annotated[Optional[str], typer.Option(
        "--context", help="Per-sequence decode contexts, comma-separated (default: per device)."
    )] = None,
    repeats: Annotated[Optional[int], typer.Option(
        "--repeats", help="Timed repeats per point (median) (default: 5 CPU, 10 CUDA).")] = None,
    warmup: Annotated[Optional[int], typer.Option(
        "--warmup", help="Untimed runs per point (default: 2 CPU, 3 CUDA).")] = None,
    cuda_graphs: Annotated[bool, typer.Option(
        "--cuda-graphs/--no-cuda-graphs", help="Replay each timed step as a CUDA graph, as serving engines launch it.")] = True,
    out: Annotated[Optional[Path], typer.Option(
        "--out", "-o", help="Output CSV (default: profiles/<model>__<node>.csv).")] = None,
    catalog: CatalogFiles = None,
    json_out: JsonFlag = False,
) -> None:
    """Measure per-layer prefill and decode times with torch and write a profile table."""
    with user_errors():
        try:
            import torch  # noqa: F401
        except ImportError:
            raise UserError("coral profile needs torch: pip install 'coral-serving[profile]'"
                            ) from None
        from coral.perf.profiler import (
            ProfileGrid,
            ProfilerWarning,
            device_name,
            parse_int_list,
            profile_model,
            resolve_device,
            resolve_dtype,
        )

        arch, cat = _load_model(model, list(catalog or []))
        dev = resolve_device(device)
        name = device_name(dev)
        torch_dtype = resolve_dtype(dtype, dev, arch)
        default = ProfileGrid.default(dev)
        grid = ProfileGrid(
            prefill_tokens=parse_int_list(prefill_tokens, "--prefill-tokens")
            if prefill_tokens is not None else default.prefill_tokens,
            decode_batch=parse_int_list(decode_batch, "--decode-batch")
            if decode_batch is not None else default.decode_batch,
            context=parse_int_list(context, "--context")
            if context is not None else default.context,
        )
        node_type = node or _default_node(name, dev.type, cat)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ProfilerWarning)
            _check_node(node_type, cat, name, dev.type)
            table = profile_model(
                arch, node_type=node_type, device=dev, dtype=torch_dtype, layers=layers,
                grid=grid, repeats=repeats, warmup=warmup, cuda_graphs=cuda_graphs,
                show_progress=not json_out, console=err_console,
            )
        for w in caught:
            if issubclass(w.category, ProfilerWarning):
                err_console.print(f"[yellow]warning:[/] {w.message}", highlight=False,
                                  soft_wrap=True)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        path = out or Path("profiles") / f"{arch.name}__{node_type}.csv"
        table.save(path)

    if json_out:
        from coral.perf.profiler import table_summary

        print_json({
            "model": table.model,
            "node_type": table.node_type,
            "device": table.device_name,
            "torch_device": str(dev),
            "dtype": table.dtype,
            "torch_version": table.torch_version,
            "layers_timed": table.layers_timed,
            "repeats": table.repeats,
            "cuda_graphs": table.cuda_graphs,
            "rows": [
                {**{k: v for k, v in r.items() if k != "ms_per_layer"},
                 "seconds_per_layer": row.seconds_per_layer}
                for r, row in zip(table_summary(table), table.rows)
            ],
            "skipped": table.metadata()["skipped"],
            "out": str(path),
        })
        return
    console.print(_results_table(table))
    if table.skipped:
        console.print(f"[yellow]{len(table.skipped)} point(s) skipped[/] (recorded in the file)")
    console.print(f"wrote {path}")
