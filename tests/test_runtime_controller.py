"""Several instances per model, failover and live reconfiguration lose no request."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("zmq")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from coral.runtime.config import ModelConfig, PipelineSpec  # noqa: E402
from coral.runtime.controller import (Controller, Instance, InstanceSpec,  # noqa: E402
                                      ModelRouter)
from coral.runtime.engine import Engine  # noqa: E402
from coral.runtime.gateway import RETRIABLE_CODE, ServerThread, create_app  # noqa: E402
from coral.runtime.messages import SamplingParams  # noqa: E402
from coral.runtime.pipeline import LocalPipeline  # noqa: E402
from coral.runtime.tokenizer import ByteTokenizer  # noqa: E402

TINY = ModelConfig(num_layers=4, hidden_size=32, ffn_size=64, num_heads=2, num_kv_heads=1,
                   head_dim=16, max_seq_len=64, seed=3)
MAX_TOKENS = 6
PROMPTS = ["alpha", "beta gamma", "delta", "epsilon zeta eta", "theta", "iota kappa"]


def _spec(name: str, stages: int, weight: float = 1.0) -> InstanceSpec:
    return InstanceSpec(name, PipelineSpec.even(TINY, stages), weight)


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    """Greedy output of the unsplit model, as the gateway decodes it."""
    tok = ByteTokenizer()
    out = {}
    for p in PROMPTS:
        engine = Engine(LocalPipeline(PipelineSpec.even(TINY, 1)), max_seq_len=TINY.max_seq_len)
        ids = engine.generate(tok.encode(p), MAX_TOKENS, SamplingParams(), stop_on_eos=True)
        out[p] = tok.decode(ids)
    return out


class _Fake(Instance):
    def __init__(self, name: str, weight: float):  # no engine: routing only
        self.spec = InstanceSpec(name, PipelineSpec.even(TINY, 1), weight)
        self.state, self.in_flight, self.served = "active", 0, 0


def test_router_is_smooth_weighted_and_load_aware():
    a, b = _Fake("a", 3.0), _Fake("b", 1.0)
    router = ModelRouter("m", load_slack=2)
    router.set_active([a, b])
    picks = []
    for _ in range(8):
        inst = router.pick()
        picks.append(inst.name)
        router._done(inst)
    assert picks == ["a", "a", "b", "a"] * 2  # interleaved 3:1, not "aaab" bursts
    a.in_flight = 10  # far above b's
    assert [router.pick().name for _ in range(3)] == ["b", "b", "b"]


def test_instance_spec_from_a_plans_template():
    from types import SimpleNamespace

    nodes = (SimpleNamespace(first_layer=0, layers=2, capacity=4.0),
             SimpleNamespace(first_layer=2, layers=2, capacity=4.0))
    template = SimpleNamespace(model="tiny", nodes=nodes, edges=(), throughput_rps=7.5)
    spec = InstanceSpec.from_template("x", template, TINY)
    assert spec.weight == 7.5 and spec.served_name == TINY.name
    assert [(s.first_layer, s.end_layer) for s in spec.pipeline.stages] == [(0, 2), (2, 4)]


def _load(url: str, n: int, concurrency: int, done: list, gates) -> dict[str, int]:
    """Send n requests (every 4th streamed); returns counts by outcome. Request k first waits
    for every gate (index, event) with index <= k, so the load spans the test's actions."""
    counts = {"ok": 0, "wrong": 0, "retriable": 0, "failed": 0}
    lock = threading.Lock()

    def one(k: int) -> None:
        prompt = PROMPTS[k % len(PROMPTS)]
        body = {"model": TINY.name, "prompt": prompt, "max_tokens": MAX_TOKENS,
                "temperature": 0}
        outcome, text = "failed", None
        for index, event in gates:
            if k >= index:
                event.wait(60)
        try:
            with httpx.Client(base_url=url, timeout=60) as client:
                if k % 4 == 0:
                    body["stream"] = True
                    parts, error = [], None
                    with client.stream("POST", "/v1/completions", json=body) as r:
                        import json
                        for line in r.iter_lines():
                            if not line.startswith("data: ") or line == "data: [DONE]":
                                continue
                            event = json.loads(line[6:])
                            if "error" in event:
                                error = event["error"]
                            else:
                                parts.append(event["choices"][0]["text"])
                    if error is not None:
                        outcome = "retriable" if error["code"] == RETRIABLE_CODE else "failed"
                    else:
                        text = "".join(parts)
                else:
                    r = client.post("/v1/completions", json=body)
                    if r.status_code == 200:
                        text = r.json()["choices"][0]["text"]
                    elif r.json()["error"]["code"] == RETRIABLE_CODE:
                        outcome = "retriable"
            if text is not None:
                outcome = "ok" if text == done[0][prompt] else "wrong"
        finally:
            with lock:
                counts[outcome] += 1
                done[1] += 1

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(n)))
    return counts


def test_reconfiguration_and_a_killed_worker_lose_no_request(expected):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    controller = Controller("local", heartbeat_timeout_s=1.5)
    try:
        controller.deploy([_spec("a", 1, 1.0), _spec("b", 2, 1.0)])
        app = create_app(controller.models)
        with ServerThread(app) as server:
            progress = [expected, 0]
            total = 200
            result: dict = {}
            ready, killed = threading.Event(), threading.Event()
            gates = [(100, ready), (170, killed)]
            t0 = time.time()
            load = threading.Thread(
                target=lambda: result.update(_load(server.url, total, 8, progress, gates)))
            load.start()

            def wait_for(n: int) -> None:
                deadline = time.time() + 30
                while progress[1] < n and time.time() < deadline and load.is_alive():
                    time.sleep(0.01)

            def until(condition, timeout_s: float = 10) -> None:
                deadline = time.time() + timeout_s
                while not condition() and time.time() < deadline:
                    time.sleep(0.002)

            wait_for(20)
            old = controller.instances["a"]
            t1 = time.time()
            # a is replaced by c; b is kept with a new weight
            report = controller.reconfigure(  # the load resumes just before the shift
                [_spec("b", 2, 2.0), _spec("c", 1, 1.0)],
                on_ready=lambda: (ready.set(), until(lambda: old.in_flight > 0)))
            t2 = time.time()
            mid = progress[1]
            assert report.drained_requests > 0, "no request was in flight on the old instance"
            assert report.started == ["c"] and report.kept == ["b"]
            assert report.stopped == ["a"] and old.state == "stopped"
            assert [i.name for i in controller.models[TINY.name].instances] == ["b", "c"]
            assert controller.instances["b"].spec.weight == 2.0
            assert not any(p.is_alive() for p in old.executor.processes)

            wait_for(min(mid + 15, 165))  # before the gate at 170
            victim = controller.instances["b"]
            until(lambda: victim.in_flight > 0)  # a loaded machine may have let b go idle
            os.kill(victim.pids[1], signal.SIGKILL)  # one worker of a running instance
            killed.set()
            load.join(timeout=60)
            assert not load.is_alive()

            router = controller.models[TINY.name]
            print(f"\ncounts {result}, reconfigured at request {mid}, router retries "
                  f"{router.retries}, retriable errors {router.retriable_errors}, "
                  f"dead {controller.dead}, drained {report.drained_requests} requests in "
                  f"{report.drain_s:.2f} s, load {t1 - t0:.1f}+{t2 - t1:.1f}+"
                  f"{time.time() - t2:.1f} s")
            assert controller.dead == ["b"] and victim.state == "dead"
            assert router.retries + router.retriable_errors >= 1, "the kill hit no request"
            assert [i.name for i in router.instances] == ["c"]
            assert result["wrong"] == 0 and result["failed"] == 0
            assert result["ok"] + result["retriable"] == total
            # non-streamed requests are rerun by the gateway, never reported as retriable
            assert result["retriable"] <= total // 4
            assert result["ok"] >= total - total // 4
            # after the failure the model still serves, exactly
            r = httpx.post(server.url + "/v1/completions", timeout=30,
                           json={"model": TINY.name, "prompt": PROMPTS[0],
                                 "max_tokens": MAX_TOKENS, "temperature": 0})
            assert r.json()["choices"][0]["text"] == expected[PROMPTS[0]]

            # a hung worker (process alive, no heartbeats) is found by its silence
            hung = controller.instances["c"]
            os.kill(hung.pids[0], signal.SIGSTOP)
            try:
                deadline = time.time() + 10
                while hung.state != "dead" and time.time() < deadline:
                    time.sleep(0.05)
                assert hung.state == "dead" and controller.dead == ["b", "c"]
            finally:
                os.kill(hung.pids[0], signal.SIGKILL)
    finally:
        controller.close()
        torch.set_num_threads(before)
