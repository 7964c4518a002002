"""CPU time of the profiler's decoder layer per point of `coral profile`'s CPU grid.

`coral profile` times wall clock, which a shared machine stretches; this times the same calls
(`DecoderLayer.prefill` and `.decode` on the layers `build_layers` makes, as
`coral.perf.profiler` makes them) in CPU seconds of one torch thread, so two trees can be
compared on a loaded machine. Prints one JSON object: per point the median CPU seconds per
layer, and a checksum of the layer's weights (the same seed gives the same weights).

    python benchmarks/decoder_cpu.py --model llama-3.1-8b [--repeats 5] [--warmup 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from coral.catalog import default_catalog
from coral.perf.profiler import CPU_GRID, build_layers, rope_tables


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    arch = default_catalog().model(args.model)
    layer = build_layers(arch, 1)[0]
    checksum = float(sum(p.double().sum() for p in layer.parameters()))
    dtype = torch.float32
    out: dict[str, float] = {}

    def cpu_median(run) -> float:
        for _ in range(args.warmup):
            run()
        times = []
        for _ in range(args.repeats):
            t0 = time.process_time()
            run()
            times.append(time.process_time() - t0)
        return statistics.median(times)

    with torch.inference_mode():
        for p in CPU_GRID.prefill_tokens:
            x = torch.randn(p, arch.hidden_size)
            cos, sin = rope_tables(torch.arange(p), arch.head_dim, dtype)
            out[f"prefill P={p}"] = cpu_median(lambda: layer.prefill(x, cos, sin))
        for b in CPU_GRID.decode_batch:
            for c in CPU_GRID.context:
                x = torch.randn(b, arch.hidden_size)
                k = torch.randn(b, arch.num_kv_heads, c + 1, arch.head_dim)
                v = torch.randn(b, arch.num_kv_heads, c + 1, arch.head_dim)
                cos, sin = rope_tables(torch.tensor([c]), arch.head_dim, dtype)
                out[f"decode B={b} ctx={c}"] = cpu_median(
                    lambda: layer.decode(x, cos, sin, k, v, c))
    print(json.dumps({"model": args.model, "weights_checksum": checksum,
                      "cpu_s_per_layer": out}))


if __name__ == "__main__":
    main()
