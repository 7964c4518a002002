"""Benchmark: the latency the gateway adds, and its request rate, with a trivial echo backend.

Two servers run as separate processes on loopback, both under uvicorn:

- `raw`: a bare ASGI app that reads the JSON body and answers a fixed completion-shaped JSON,
  i.e. calling an echo backend directly over HTTP;
- `gateway`: coral's OpenAI-compatible gateway over `EchoBackend` (validation, tokenisation,
  stop handling, metrics, the OpenAI response body).

Latency: `--requests` sequential POSTs of /v1/completions (max_tokens 16) on one keep-alive
connection, p50/p99 of each server and their difference (the gateway's added latency).
Throughput: `--concurrency` clients posting for `--seconds`, requests/s. The client shares the
machine's cores with the server, so figures are lower bounds on a busy or small machine. Also
prints the in-process cost of one EchoBackend call, for scale.

    python benchmarks/gateway.py
    python benchmarks/gateway.py --requests 2000 --concurrency 64 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

BODY = {"model": "echo", "prompt": "The quick brown fox jumps over the lazy dog",
        "max_tokens": 16, "temperature": 0}


def raw_app():
    reply = json.dumps({"id": "cmpl-0", "object": "text_completion", "choices": [
        {"text": BODY["prompt"][:16], "index": 0, "finish_reason": "length"}]}).encode()

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        more = True
        body = b""
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        json.loads(body)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": reply})
    return app


def serve(kind: str, port: int) -> None:
    import uvicorn

    if kind == "raw":
        app = raw_app()
    else:
        from coral.runtime.backends import EchoBackend
        from coral.runtime.gateway import create_app
        app = create_app({"echo": EchoBackend()})
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False)


def start(kind: str) -> tuple[subprocess.Popen, str]:
    import httpx

    from coral.runtime.worker import free_tcp_port

    port = free_tcp_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            httpx.post(f"{url}/v1/completions", json=BODY, timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{kind} server did not start")


def latencies_s(url: str, n: int) -> list[float]:
    import httpx

    out = []
    with httpx.Client(timeout=10) as client:
        for _ in range(20):  # warm-up
            client.post(f"{url}/v1/completions", json=BODY)
        for _ in range(n):
            t = time.perf_counter()
            r = client.post(f"{url}/v1/completions", json=BODY)
            out.append(time.perf_counter() - t)
            r.raise_for_status()
    return out


async def _throughput(url: str, concurrency: int, seconds: float) -> float:
    import httpx

    done = 0
    stop_at = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        async def one() -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                r = await client.post(f"{url}/v1/completions", json=BODY)
                r.raise_for_status()
                done += 1
        t = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        return done / (time.perf_counter() - t)


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if q < 100 else max(xs)


def in_process_call_s(n: int = 2000) -> float:
    from coral.runtime.backends import EchoBackend
    from coral.runtime.messages import SamplingParams

    backend = EchoBackend()
    ids = list(BODY["prompt"].encode())

    async def run() -> float:
        t = time.perf_counter()
        for _ in range(n):
            async for _tok in backend.generate(ids, 16, SamplingParams()):
                pass
        return (time.perf_counter() - t) / n
    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000, help="sequential requests per server")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=5.0, help="throughput run per server")
    ap.add_argument("--serve", choices=("raw", "gateway"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    results = {}
    for kind in ("raw", "gateway"):
        proc, url = start(kind)
        try:
            lat = latencies_s(url, args.requests)
            rps = asyncio.run(_throughput(url, args.concurrency, args.seconds))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        results[kind] = (pct(lat, 50), pct(lat, 99), rps)
    print(f"in-process EchoBackend call: {in_process_call_s() * 1e6:.1f} us")
    print(f"{'server':<10}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}")
    for kind, (p50, p99, rps) in results.items():
        print(f"{kind:<10}{p50 * 1e3:>10.2f}{p99 * 1e3:>10.2f}{rps:>10.0f}")
    (r50, r99, _), (g50, g99, _) = results["raw"], results["gateway"]
    print(f"gateway added latency: p50 {(g50 - r50) * 1e3:.2f} ms, p99 {(g99 - r99) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
