"""`coral catalog ...`: list and show what the catalog holds."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from coral.catalog import Catalog, GpuType, ModelArch, NodeType, Region
from coral.cli.common import CatalogFiles, JsonFlag, console, open_catalog, print_json, user_errors

app = typer.Typer(help="Models, GPU types, node types and regions with prices.",
                  no_args_is_help=True)


def _model_row(m: ModelArch) -> dict:
    return {
        **m.model_dump(mode="json"),
        "total_params": m.total_params,
        "active_params": m.active_params,
        "weight_bytes": m.weight_bytes,
        "kv_bytes_per_token_per_layer": m.kv_bytes_per_token_per_layer,
    }


def _node_row(cat: Catalog, n: NodeType) -> dict:
    gpu = cat.gpus[n.gpu]
    return {
        **n.model_dump(mode="json"),
        "memory_gb": gpu.memory_gb * n.gpu_count,
        "min_usd_per_hour": min((p.usd_per_hour for p in n.prices), default=None),
    }


def catalog_payload(cat: Catalog) -> dict:
    """The whole catalog as plain JSON-able data."""
    return {
        "models": [_model_row(m) for m in cat.models.values()],
        "gpus": [g.model_dump(mode="json") for g in cat.gpus.values()],
        "node_types": [_node_row(cat, n) for n in cat.node_types.values()],
        "regions": [r.model_dump(mode="json") for r in cat.regions.values()],
        "content_hash": cat.content_hash(),
        "files": list(cat.files),
    }


def _print_tables(cat: Catalog) -> None:
    models = Table(title="Models", title_justify="left")
    for col in ("name", "layers", "hidden", "heads/kv", "MoE experts (active)",
                "params total (B)", "params active (B)", "weights (GB)"):
        models.add_column(col, justify="left" if col == "name" else "right", no_wrap=col == "name")
    for m in cat.models.values():
        moe = f"{m.moe.num_experts} ({m.moe.experts_per_token})" if m.moe else "-"
        models.add_row(m.name, str(m.num_layers), str(m.hidden_size),
                       f"{m.num_heads}/{m.num_kv_heads}", moe, f"{m.total_params / 1e9:.1f}",
                       f"{m.active_params / 1e9:.1f}", f"{m.weight_bytes / 1e9:.1f}")
    console.print(models)

    gpus = Table(title="GPU types", title_justify="left")
    for col in ("name", "memory (GB)", "bf16 (TFLOP/s)", "mem BW (GB/s)", "link", "arch"):
        gpus.add_column(col, justify="left" if col in ("name", "link", "arch") else "right",
                        no_wrap=col == "name")
    for g in cat.gpus.values():
        approx = "~" if g.approximate else ""
        gpus.add_row(g.name, f"{g.memory_gb:g}", f"{approx}{g.bf16_tflops:g}",
                     f"{g.mem_bandwidth_gb_per_s:g}",
                     f"{g.intra_node_link} {g.intra_node_link_gb_per_s:g} GB/s", g.architecture)
    console.print(gpus)

    nodes = Table(title="Node types (on-demand $/hour)", title_justify="left")
    for col in ("name", "GPUs", "NIC (Gbit/s)", "instances", "regions priced", "$/hour min–max"):
        nodes.add_column(col, justify="right" if col in ("NIC (Gbit/s)", "regions priced") else "left",
                         no_wrap=col == "name")
    for n in cat.node_types.values():
        prices = [p.usd_per_hour for p in n.prices]
        approx = "~" if any(p.approximate for p in n.prices) else ""
        span = f"{approx}{min(prices):.2f}–{max(prices):.2f}" if prices else "-"
        nodes.add_row(n.name, f"{n.gpu_count}x {n.gpu}", f"{n.nic_gbps:g}",
                      ", ".join(f"{c}:{i or '(none: priced pro rata)'}"
                                for c, i in n.instances.items()),
                      str(len(prices)), span)
    console.print(nodes)

    regions = Table(title="Regions", title_justify="left")
    for col in ("name", "cloud", "location", "node types priced"):
        regions.add_column(col)
    for r in cat.regions.values():
        count = sum(1 for n in cat.node_types.values() if n.price_in(r.name) is not None)
        regions.add_row(r.name, r.cloud, r.location, str(count))
    console.print(regions)
    console.print("[dim]~ marks approximate figures; `coral catalog show NAME` gives sources.[/]")


@app.command("list")
def list_(catalog: CatalogFiles = None, json: JsonFlag = False) -> None:
    """List every model, GPU type, node type and region."""
    with user_errors():
        cat = open_catalog(catalog)
    if json:
        print_json(catalog_payload(cat))
    else:
        _print_tables(cat)


@app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="Name of a model, GPU type, node type or region.")],
    catalog: CatalogFiles = None,
    json: JsonFlag = False,
) -> None:
    """Show one catalog entry in full, with its sources."""
    with user_errors():
        cat = open_catalog(catalog)
        entry = cat.lookup(name)
    if isinstance(entry, ModelArch):
        payload = _model_row(entry)
    elif isinstance(entry, NodeType):
        payload = _node_row(cat, entry)
    else:
        assert isinstance(entry, (GpuType, Region))
        payload = entry.model_dump(mode="json")
    payload = {"kind": type(entry).__name__, **payload}
    if json:
        print_json(payload)
        return
    table = Table(title=f"{payload['kind']} {name}", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in payload.items():
        if key == "prices":
            value = "\n".join(
                f"{p['region']}: ${p['usd_per_hour']}/h{' (approx.)' if p['approximate'] else ''}"
                f" — {p['source']}, {p['date']}" for p in value
            )
        table.add_row(key, str(value))
    console.print(table)
