"""Profile one decoder layer of every catalog model on this machine's CUDA device.

Writes one profile table per model (`<model>__<node>.csv`, the format `coral profile` writes
and `coral perf validate` reads) and `device.json` with the device's name and two raw
probes (a large bf16 matmul's TFLOP/s, a device-to-device copy's GB/s), so that the
efficiencies the perf model assumes can be read against what this very device achieves.

    python benchmarks/profile_gpu.py --out profiles/h200 [--models a,b] [--layers K]

A model that does not fit (or fails) is reported and skipped; the others still run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from coral.catalog import load_catalog
from coral.perf.profiler import device_name, gpu_type_for_device, profile_model


def _probe_matmul(dev: torch.device, n: int = 8192, reps: int = 10) -> float:
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize(dev)
    return 2.0 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def _probe_copy(dev: torch.device, nbytes: int = 4 << 30, reps: int = 10) -> float:
    src = torch.empty(nbytes // 2, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    torch.cuda.synchronize(dev)
    return 2.0 * nbytes * reps / (time.perf_counter() - t0) / 1e9  # read + write


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("profiles"))
    ap.add_argument("--models", default="", help="comma-separated (default: every catalog model)")
    ap.add_argument("--layers", type=int, default=None,
                    help="layers stacked (default: enough to stream past the GPU's L2)")
    ap.add_argument("--node", default="", help="node type label (default: 1x-<gpu> or 'cuda')")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark profiles a GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    name = device_name(dev)
    gpu = gpu_type_for_device(name)
    node = args.node or (f"1x-{gpu}" if gpu else "cuda")
    catalog = load_catalog()
    models = [m for m in args.models.split(",") if m] or list(catalog.models)
    args.out.mkdir(parents=True, exist_ok=True)

    info = {"device": name, "gpu_type": gpu, "node_label": node, "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "bf16_matmul_tflops_8192": round(_probe_matmul(dev), 1),
            "copy_gb_per_s_read_plus_write": round(_probe_copy(dev), 1),
            "models": {}}
    print(f"{name}: bf16 matmul {info['bf16_matmul_tflops_8192']} TFLOP/s, "
          f"copy {info['copy_gb_per_s_read_plus_write']} GB/s", flush=True)
    for model in models:
        arch = catalog.model(model)
        t0 = time.perf_counter()
        try:
            table = profile_model(arch, node_type=node, device=dev, layers=args.layers)
        except Exception as exc:  # keep going: one model's failure must not lose the rest
            traceback.print_exc()
            info["models"][model] = {"error": f"{type(exc).__name__}: {exc}"}
            torch.cuda.empty_cache()
            continue
        path = table.save(args.out / f"{model}__{node}.csv")
        wall = time.perf_counter() - t0
        info["models"][model] = {"rows": len(table.rows), "skipped": len(table.skipped),
                                 "wall_s": round(wall, 1), "file": path.name}
        print(f"{model}: {len(table.rows)} points, {len(table.skipped)} skipped, "
              f"{wall:.1f} s", flush=True)
        torch.cuda.empty_cache()
    (args.out / "device.json").write_text(json.dumps(info, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
