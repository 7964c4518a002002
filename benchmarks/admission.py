"""Benchmark: `coral serve --tiny` under 64 concurrent streams, without and with an admission
limit (`--max-queue`).

For each setting a fresh `coral serve --tiny --random-weights` runs as its own process (the
gateway and 3 pipeline workers); `--clients` asyncio clients each send streamed greedy
completions (`--max-tokens` tokens) back to back for `--seconds`. A client refused with 429
waits the Retry-After it was given, as an OpenAI client does, then sends again. Prints, per
setting: completions/s; time to first token and whole-request latency (p50/p99) of the
admitted requests; how many were refused and how fast the 429 came (p50/p99).

    python benchmarks/admission.py
    python benchmarks/admission.py --clients 64 --max-queue 8 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_server(port: int, max_queue: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "coral.cli.main", "serve", "--tiny", "--random-weights",
            "--port", str(port), "--max-queue", str(max_queue)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    import httpx

    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()["status"] == "ok":
                return proc
        except (httpx.HTTPError, ValueError):
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"coral serve exited with {proc.returncode}")
        time.sleep(0.3)
    stop_server(proc)
    raise RuntimeError("coral serve did not become ready within 120 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def load(url: str, clients: int, seconds: float, max_tokens: int) -> dict:
    import httpx

    body = {"model": "tiny-random", "prompt": "The quick brown fox", "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    ttft: list[float] = []
    latency: list[float] = []
    refused: list[float] = []
    errors: list[str] = []
    end = time.monotonic() + seconds

    async def client(http: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            t0 = time.monotonic()
            first = None
            try:
                async with http.stream("POST", url + "/v1/completions", json=body) as r:
                    if r.status_code == 429:
                        refused.append(time.monotonic() - t0)
                        await r.aread()
                        await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                        continue
                    if r.status_code != 200:
                        errors.append(f"HTTP {r.status_code}")
                        continue
                    # the gateway starts a stream once its first text is there: the first
                    # bytes are the first token (read raw: the client's own CPU time would
                    # otherwise count in every figure)
                    async for _ in r.aiter_raw():
                        if first is None:
                            first = time.monotonic() - t0
            except httpx.HTTPError as exc:
                errors.append(type(exc).__name__)
                continue
            latency.append(time.monotonic() - t0)
            if first is not None:
                ttft.append(first)

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        t0 = time.monotonic()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall = time.monotonic() - t0
    return {"completions_per_s": len(latency) / wall, "completed": len(latency),
            "ttft": ttft, "latency": latency, "refused": refused, "errors": errors,
            "wall_s": wall}


def report(name: str, res: dict) -> str:
    ms = 1000.0
    line = (f"{name}: {res['completed']} completed in {res['wall_s']:.0f} s "
            f"({res['completions_per_s']:.2f}/s); admitted: TTFT p50 "
            f"{_pct(res['ttft'], .5):.2f} s, p99 {_pct(res['ttft'], .99):.2f} s, latency p50 "
            f"{_pct(res['latency'], .5):.2f} s, p90 {_pct(res['latency'], .9):.2f} s, p99 "
            f"{_pct(res['latency'], .99):.2f} s")
    if res["refused"]:
        line += (f"; refused {len(res['refused'])} with 429 in p50 "
                 f"{_pct(res['refused'], .5) * ms:.0f} ms, p90 "
                 f"{_pct(res['refused'], .9) * ms:.0f} ms, p99 "
                 f"{_pct(res['refused'], .99) * ms:.0f} ms")
    if res["errors"]:
        line += f"; errors {len(res['errors'])} ({statistics.mode(res['errors'])})"
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-queue", type=int, default=16)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    import httpx

    for name, max_queue in (("no limit", 0), (f"--max-queue {args.max_queue}", args.max_queue)):
        proc = start_server(args.port, max_queue)
        try:
            for _ in range(3):  # warm up: the first requests pay for lazy initialisation
                httpx.post(f"http://127.0.0.1:{args.port}/v1/completions", timeout=60,
                           json={"model": "tiny-random", "prompt": "warm", "max_tokens": 4})
            res = asyncio.run(load(f"http://127.0.0.1:{args.port}", args.clients,
                                   args.seconds, args.max_tokens))
        finally:
            stop_server(proc)
        print(report(name, res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
