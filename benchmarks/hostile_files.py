"""Benchmark: careless and hostile plan and scenario files, each through the command that
reads it, with its exit status, wall time and peak memory.

Plan files (issue 35): a valid two-instance llama-3.1-8b plan, then that plan with stages
over half the model's layers, a count of 1e9, an Infinity or NaN batch, the count "two",
`instances` as a string, empty `slos`, an unknown node type, an unknown model and a negative
count; each through `coral simulate` (5 s of arrivals) and `coral serve --dry-run`.
Scenario files: the core scenario with its first TTFT below its TPOT, and padded with
duplicate model entries to 20 MB; each through `coral plan`.

Every command runs as its own process under `--timeout` seconds; peak memory is that
process's maximum resident set (`os.wait4`). A clean refusal is exit status 2, shown with
the error's line that names the field; 1 is a traceback; `timeout` is a command still
running when killed.

    python benchmarks/hostile_files.py
    python benchmarks/hostile_files.py --timeout 200 --only huge_count,big_scenario
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
CORE = (ROOT / "coral" / "allocator" / "data" / "scenarios" / "core.yaml").read_text()

PLAN: dict[str, Any] = {
    "scenario": "core", "demand_rps": {"llama-3.1-8b": 2.0},
    "slos": {"llama-3.1-8b": {"tpot_s": 0.1, "ttft_s": 2.0, "percentile": 0.9,
                              "input_tokens": 1024, "output_tokens": 256}},
    "instances": [{"region": "r1", "template_id": "llama-3.1-8b|aggregated|1x-l40s",
                   "model": "llama-3.1-8b", "mode": "aggregated", "count": 2,
                   "stages": [{"node_type": "1x-l40s", "count": 1, "first_layer": 0,
                               "layers": 32, "batch": 128, "tp_degree": 1}],
                   "capacity_rps": 5.8, "usd_per_hour": 1.5}]}


def _stage(**values: Any) -> Callable[[dict], None]:
    return lambda p: p["instances"][0]["stages"][0].update(values)


def _row(**values: Any) -> Callable[[dict], None]:
    return lambda p: p["instances"][0].update(values)


PLAN_CASES: dict[str, Callable[[dict], None]] = {
    "valid": lambda p: None,
    "half_layers": _stage(layers=16),
    "huge_count": _row(count=1_000_000_000),
    "infinity_batch": _stage(batch=float("inf")),
    "nan_batch": _stage(batch=float("nan")),
    "two_count": _row(count="two"),
    "string_instances": lambda p: p.update(instances="llama-3.1-8b"),
    "empty_slos": lambda p: p.update(slos={}),
    "unknown_node_type": _stage(node_type="16x-b300-imaginary"),
    "unknown_model": _row(model="llama-9-imaginary"),
    "negative_count": _row(count=-1),
}


def _padded_scenario(size: int) -> str:
    head, sep, tail = CORE.partition("\nmodels:\n")
    entry = "  - {name: llama-3.1-8b, demand_rps: 1.0, tpot_s: 0.1, ttft_s: 2.0}\n"
    return head + sep + entry * ((size - len(CORE)) // len(entry)) + tail


def cases(folder: Path) -> list[tuple[str, list[str]]]:
    """(case, coral arguments) of every file written to `folder`."""
    out = []
    for name, spoil in PLAN_CASES.items():
        plan = copy.deepcopy(PLAN)
        spoil(plan)
        path = folder / f"{name}.json"
        path.write_text(json.dumps(plan))  # Infinity and NaN as Python's json writes them
        out.append((name, ["simulate", str(path), "--duration", "5", "--no-progress",
                           "--workers", "1", "--out", str(folder / "sim")]))
        out.append((name, ["serve", str(path), "--dry-run"]))
    ttft = folder / "ttft_below_tpot.yaml"
    ttft.write_text(CORE.replace("ttft_s: 2.0", "ttft_s: 0.01", 1))
    big = folder / "big_scenario.yaml"
    big.write_text(_padded_scenario(20_000_000))
    out += [("ttft_below_tpot", ["plan", str(ttft), "--nmax", "1"]),
            ("big_scenario", ["plan", str(big), "--nmax", "1"])]
    return out


def run(args: list[str], timeout: float) -> tuple[str, float, float, str]:
    """(exit status or `timeout`, wall s, peak RSS MiB, the error line naming a field) of
    `coral ARGS`."""
    with tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "coral.cli.main", *args],
                                stdout=subprocess.DEVNULL, stderr=err, text=True,
                                start_new_session=True, env={**os.environ, "COLUMNS": "400"})
        timed_out = False
        while True:  # os.wait4, not Popen.wait: it gives this child's own peak memory
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - started > timeout and not timed_out:
                os.killpg(proc.pid, signal.SIGKILL)
                timed_out = True
            time.sleep(0.02)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        lines = [ln.strip() for ln in err.read().splitlines() if ln.strip()]
    rc = "timeout" if timed_out else str(proc.returncode)
    named = [ln for ln in lines if "field '" in ln] + [ln for ln in lines if "rror" in ln]
    shown = named[0] if named else (lines[-1] if lines and rc != "0" else "")
    return rc, wall, usage.ru_maxrss / 1024, shown[:160].replace("|", "/")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per command")
    ap.add_argument("--only", default="", help="comma-separated case names")
    opts = ap.parse_args()
    only = {c for c in opts.only.split(",") if c}
    with tempfile.TemporaryDirectory() as tmp:
        print("| case | command | exit | wall s | peak MiB | message |")
        print("|---|---|---|---|---|---|")
        for name, args in cases(Path(tmp)):
            if only and name not in only:
                continue
            rc, wall, rss, shown = run(args, opts.timeout)
            shown = shown.replace(f"{tmp}/", "")
            print(f"| {name} | {args[0]} | {rc} | {wall:.1f} | {rss:.0f} | {shown} |",
                  flush=True)


if __name__ == "__main__":
    main()
