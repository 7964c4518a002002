"""Several instances per model, failover, reconciliation to the plan and live reconfiguration
lose no request."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import metric_value

torch = pytest.importorskip("torch")
pytest.importorskip("zmq")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from coral.runtime.config import ModelConfig, PipelineSpec  # noqa: E402
from coral.runtime.controller import (Controller, Instance, RuntimeInstanceSpec,  # noqa: E402
                                      LocalProvisioner, GatewayModelRouter)
from coral.runtime.batching_engine import BatchingEngine  # noqa: E402
from coral.runtime.gateway import create_app  # noqa: E402
from coral.runtime.gateway_server import ServerThread  # noqa: E402
from coral.runtime.openai_api import RETRIABLE_CODE  # noqa: E402
from coral.runtime.messages import SamplingParams  # noqa: E402
from coral.runtime.pipeline import LocalPipeline  # noqa: E402
from coral.runtime.tokenizer import ByteTokenizer  # noqa: E402

TINY = ModelConfig(num_layers=4, hidden_size=32, ffn_size=64, num_heads=2, num_kv_heads=1,
                   head_dim=16, max_seq_len=64, seed=3)
MAX_TOKENS = 6
PROMPTS = ["alpha", "beta gamma", "delta", "epsilon zeta eta", "theta", "iota kappa"]


def _spec(name: str, stages: int, weight: float = 1.0) -> RuntimeInstanceSpec:
    return RuntimeInstanceSpec(name, PipelineSpec.even(TINY, stages), weight)


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    """Greedy output of the unsplit model, as the gateway decodes it."""
    tok = ByteTokenizer()
    out = {}
    for p in PROMPTS:
        engine = BatchingEngine(LocalPipeline(PipelineSpec.even(TINY, 1)),
                                max_seq_len=TINY.max_seq_len)
        ids = engine.generate(tok.encode(p), MAX_TOKENS, SamplingParams(), stop_on_eos=True)
        out[p] = tok.decode(ids)
    return out


class _Fake(Instance):
    def __init__(self, name: str, weight: float):  # no engine: routing only
        self.spec = RuntimeInstanceSpec(name, PipelineSpec.even(TINY, 1), weight)
        self.state, self.in_flight, self.served = "active", 0, 0


def test_router_is_smooth_weighted_and_load_aware():
    a, b = _Fake("a", 3.0), _Fake("b", 1.0)
    router = GatewayModelRouter("m", load_slack=2)
    router.set_active([a, b])
    picks = []
    for _ in range(8):
        inst = router.pick()
        picks.append(inst.name)
        router._done(inst)
    assert picks == ["a", "a", "b", "a"] * 2  # interleaved 3:1, not "aaab" bursts
    a.in_flight = 20  # far above its fair count, 3x b's (which goes 0, 1, 2)
    assert [router.pick().name for _ in range(3)] == ["b", "b", "b"]
    a.in_flight = 8  # within twice its fair count: a takes requests again
    assert "a" in [router.pick().name for _ in range(3)]
    router.drain(a)  # e.g. a preemption notice: a takes no new request
    b.in_flight = 100
    assert [router.pick().name for _ in range(3)] == ["b", "b", "b"]


def test_instance_spec_from_a_plans_template():
    from types import SimpleNamespace

    nodes = (SimpleNamespace(first_layer=0, layers=2, capacity=4.0),
             SimpleNamespace(first_layer=2, layers=2, capacity=4.0))
    template = SimpleNamespace(model="tiny", nodes=nodes, edges=(), throughput_rps=7.5)
    spec = RuntimeInstanceSpec.from_template("x", template, TINY)
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
                        if r.status_code != 200:  # refused before the stream began
                            r.read()
                            error = r.json()["error"]
                            retriable = r.status_code == 503 and "Retry-After" in r.headers
                            outcome = "retriable" if retriable else "failed"
                            return
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
                    elif r.status_code == 503 and "Retry-After" in r.headers:
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
            ready, reconfigured, killed = threading.Event(), threading.Event(), threading.Event()
            # the load waits for each action before it can run past it: on an idle machine it
            # would otherwise finish its requests during the reconfiguration and leave nothing
            # in flight for the kill
            gates = [(100, ready), (140, reconfigured), (185, killed)]
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
            reconfigured.set()
            mid = progress[1]
            assert report.drained_requests > 0, "no request was in flight on the old instance"
            assert report.started == ["c"] and report.kept == ["b"]
            assert report.stopped == ["a"] and old.state == "stopped"
            assert [i.name for i in controller.models[TINY.name].instances] == ["b", "c"]
            assert controller.instances["b"].spec.weight == 2.0
            assert not any(p.is_alive() for p in old.executor.processes)

            wait_for(min(mid + 15, 170))  # well before the gate at 185
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
            # the plan still holds b: a replacement (new worker processes) takes its place
            until(lambda: controller.instances["b"] is not victim
                  and controller.instances["b"].state == "active", 60)
            replacement = controller.instances["b"]
            assert replacement.state == "active" and set(replacement.pids).isdisjoint(
                victim.pids)
            assert sorted(i.name for i in router.instances) == ["b", "c"]
            assert not any(p.is_alive() for p in victim.executor.processes)
            assert router.worker_deaths == 1 and router.restarts == 1
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

            # a hung worker (process alive, no heartbeats) is found by its silence, killed
            # and replaced
            hung = controller.instances["c"]
            os.kill(hung.pids[0], signal.SIGSTOP)
            try:
                until(lambda: hung.state == "dead", 10)
                assert hung.state == "dead" and controller.dead == ["b", "c"]
                until(lambda: not any(p.is_alive() for p in hung.executor.processes), 10)
                assert not any(p.is_alive() for p in hung.executor.processes)
                until(lambda: len(router.instances) == 2, 60)
                assert controller.instances["c"] is not hung
                assert httpx.get(server.url + "/health").json()["models"][TINY.name][
                    "status"] == "ready"
            finally:
                if hung.executor.processes[0].is_alive():
                    os.kill(hung.pids[0], signal.SIGKILL)
    finally:
        controller.close()
        torch.set_num_threads(before)


# ---------------------------------------------------------------- reconciliation, in process
class _Breakable:
    """An in-process executor a test can break as a lost worker would: steps fail and the
    controller's health check reports the node."""

    def __init__(self, inner):
        self.inner = inner
        self.broken = False
        self.hidden = False  # broken, but the health check sees it only once a step failed

    def execute(self, items):
        if self.broken:
            from coral.runtime.worker import WorkerLostError
            self.hidden = False
            raise WorkerLostError("worker(s) s0n0 exited")
        return self.inner.execute(items)

    def failed_nodes(self, timeout_s=None):
        return ["s0n0"] if self.broken and not self.hidden else []

    def close(self):
        self.inner.close()


class _FlakyProvisioner:
    """In-process instances (no worker processes: fast) that break on demand, and starts that
    fail while `fail_starts` is positive."""

    def __init__(self, start_delay_s: float = 0.0):
        self.inner = LocalProvisioner(in_process=True)
        self.start_delay_s = start_delay_s
        self.fail_starts = 0
        self.started_at: list[float] = []

    def start(self, spec: RuntimeInstanceSpec) -> Instance:
        self.started_at.append(time.monotonic())
        time.sleep(self.start_delay_s)
        if self.fail_starts > 0:
            self.fail_starts -= 1
            raise RuntimeError("no capacity left")
        inst = self.inner.start(spec)
        inst.executor = inst.engine.executor = _Breakable(inst.engine.executor)
        return inst

    def stop(self, instance: Instance) -> None:
        self.inner.stop(instance)


def _until(condition, timeout_s: float = 20) -> bool:
    deadline = time.time() + timeout_s
    while not condition() and time.time() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_request_waits_for_the_replacement_of_a_lost_instance(expected):
    """One instance, lost: the request that hits it is not failed but run on the replacement
    the controller starts; /metrics counts the death, the restart and the time without a
    ready instance."""
    provisioner = _FlakyProvisioner(start_delay_s=0.3)
    with Controller(provisioner) as controller:
        controller.deploy([_spec("only", 2)])
        lost = controller.instances["only"]
        with ServerThread(create_app(controller.models)) as server:
            lost.executor.hidden = lost.executor.broken = True  # the request finds it
            r = httpx.post(server.url + "/v1/completions", timeout=60,
                           json={"model": TINY.name, "prompt": PROMPTS[1],
                                 "max_tokens": MAX_TOKENS, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == expected[PROMPTS[1]]
            assert controller.instances["only"] is not lost and lost.state == "dead"
            assert len(provisioner.started_at) == 2
            metrics = httpx.get(server.url + "/metrics").text
            health = httpx.get(server.url + "/health").json()
    model = TINY.name
    assert metric_value(metrics, "coral_worker_deaths_total", model=model) == 1
    assert metric_value(metrics, "coral_instance_restarts_total", model=model) == 1
    assert metric_value(metrics, "coral_request_reruns_total", model=model,
                        stage="before_first_token") == 1
    assert metric_value(metrics, "coral_model_unavailable_seconds_total", model=model) > 0
    assert health["status"] == "ok"
    (only,) = health["models"][TINY.name]["instances"]
    assert (only["name"], only["state"], only["restarts"]) == ("only", "ready", 1)
    assert only["failures"] == 1 and "s0n0" in only["error"]  # forgotten once it is stable


def test_an_instance_failing_again_and_again_backs_off_then_is_reported_failed(expected):
    """Restarts that keep failing are spaced out exponentially and stop after the limit; the
    model then answers 503 with Retry-After (never a client error), /health says so, and a
    reconfiguration brings it back."""
    openai = pytest.importorskip("openai")
    provisioner = _FlakyProvisioner()
    backoff_s = 0.05
    with Controller(provisioner, max_restarts=3, restart_backoff_s=backoff_s,
                    wait_s=1.0) as controller:
        controller.deploy([_spec("only", 1)])
        with ServerThread(create_app(controller.models)) as server:
            provisioner.fail_starts = 100
            controller.instances["only"].executor.broken = True
            assert _until(lambda: controller.status()[0].state == "failed")
            restarts = provisioner.started_at[1:]
            assert len(restarts) == 3, "one restart per failure up to the limit, then none"
            gaps = [b - a for a, b in zip(restarts, restarts[1:])]
            assert gaps[0] >= backoff_s and gaps[1] >= 2 * backoff_s  # doubling delays

            client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0,
                                   timeout=30)
            for stream in (False, True):
                with pytest.raises(openai.APIStatusError) as info:
                    client.completions.create(model=TINY.name, prompt="hello", max_tokens=4,
                                              stream=stream)
                err = info.value
                assert err.status_code == 503 and err.response.headers["Retry-After"] == "60"
                assert err.body["type"] == "service_unavailable"
                assert err.body["code"] == "model_unavailable"
                assert "temporarily unavailable" in err.body["message"]
            # the context is the plan's, not that of the (no) live instances
            with pytest.raises(openai.BadRequestError) as too_long:
                client.completions.create(model=TINY.name, prompt="x" * 80, max_tokens=4)
            assert f"maximum context length is {TINY.max_seq_len} tokens" in \
                too_long.value.body["message"]

            r = httpx.get(server.url + "/health")
            assert r.status_code == 503 and r.json()["status"] == "unavailable"
            (state,) = r.json()["models"][TINY.name]["instances"]
            assert state["state"] == "failed" and "no capacity left" in state["error"]
            metrics = httpx.get(server.url + "/metrics").text
            assert metric_value(metrics, "coral_instance_restart_failures_total",
                                model=TINY.name) == 3

            provisioner.fail_starts = 0
            controller.reconfigure([_spec("only", 1)])  # the plan again: a fresh start
            out = client.completions.create(model=TINY.name, prompt=PROMPTS[0],
                                            max_tokens=MAX_TOKENS, temperature=0)
            assert out.choices[0].text == expected[PROMPTS[0]]
            assert httpx.get(server.url + "/health").json()["status"] == "ok"
