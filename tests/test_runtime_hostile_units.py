"""The pieces behind the hostile-input suite, one at a time: the sampler for any seed and
temperature, a request that crashes workers
refused after its second crash (counted against its instance once), the admission limit, and
the API key on every path."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from coral.runtime.backends import EchoBackend  # noqa: E402
from coral.runtime.config import ModelConfig, PipelineSpec  # noqa: E402
from coral.runtime.controller import (Controller, Instance, LocalProvisioner,  # noqa: E402
                                      RuntimeInstanceSpec)
from coral.runtime.gateway import create_app  # noqa: E402
from coral.runtime.gateway_server import ServerThread  # noqa: E402
from coral.runtime.http_guard import (GatewayLimits, bearer_token,  # noqa: E402
                                      default_allowed_hosts, host_name)
from coral.runtime.messages import SamplingParams, WorkItem  # noqa: E402
from coral.runtime.model import sample  # noqa: E402

TINY = ModelConfig(num_layers=2, hidden_size=32, ffn_size=64, num_heads=2, num_kv_heads=1,
                   head_dim=16, max_seq_len=64, seed=5)


# ---------------------------------------------------------------- sampler
@pytest.mark.parametrize("temperature", [1e-38, 5e-324, 1e-6, 1e-5, 0.7, 2.0])
@pytest.mark.parametrize("seed", [0, 4611686018427387904, 2 ** 63 - 1, -(2 ** 63)])
def test_the_sampler_takes_any_seed_and_temperature(temperature, seed):
    logits = torch.randn(300, generator=torch.Generator().manual_seed(1)) * 30
    item = WorkItem("r", 0, (1,), SamplingParams(temperature, seed), step=7)
    token = sample(logits, item)
    assert 0 <= token < 300
    if temperature < 1e-5:
        assert token == int(torch.argmax(logits))
    assert sample(logits, item) == token  # reproducible


def test_top_p_keeps_the_smallest_set_holding_its_mass():
    logits = torch.tensor([5.0, 4.0, -20.0, -20.0])
    drawn = {sample(logits, WorkItem("r", 0, (1,), SamplingParams(1.0, s, 0.5)))
             for s in range(40)}
    assert drawn == {0}
    drawn = {sample(logits, WorkItem("r", 0, (1,), SamplingParams(1.0, s, 0.99)))
             for s in range(40)}
    assert drawn == {0, 1}


def test_non_finite_logits_fail_the_request_not_the_stage():
    from coral.runtime.model import Stage

    stage = Stage(TINY, 0, TINY.num_layers)
    stage.lm_head = stage.lm_head.clone()
    stage.lm_head[3] = float("nan")
    good = WorkItem("good", 0, (1, 2, 3), SamplingParams(0.0), step=0)
    bad = WorkItem("bad", 0, (1, 2, 3), SamplingParams(0.8, 1), step=0)
    out = {r.request_id: r for r in stage.forward([good, bad])}
    assert out["bad"].error and "non-finite" in out["bad"].error and not out["bad"].retry
    assert out["good"].error is None and out["good"].token_id >= 0


# ---------------------------------------------------------------- poison requests
class _Crashy:
    """An in-process executor whose worker 'crashes' (exits on its own, as on SIGSEGV) on
    any step holding the poison prompt."""

    def __init__(self, inner, poison: tuple[int, ...]):
        self.inner, self.poison, self.crashed = inner, poison, False

    def execute(self, items):
        if self.crashed or any(tuple(i.token_ids) == self.poison for i in items):
            from coral.runtime.worker import WorkerLostError
            self.crashed = True
            raise WorkerLostError("worker(s) s0n0 exited")
        return self.inner.execute(items)

    def failed_nodes(self, timeout_s=None):
        return ["s0n0"] if self.crashed else []

    def crashed_nodes(self):
        return ["s0n0"] if self.crashed else []

    def close(self):
        self.inner.close()


class _CrashyProvisioner:
    def __init__(self, poison: tuple[int, ...]):
        self.inner, self.poison, self.starts = LocalProvisioner(in_process=True), poison, 0

    def start(self, spec: RuntimeInstanceSpec) -> Instance:
        self.starts += 1
        inst = self.inner.start(spec)
        inst.executor = inst.engine.executor = _Crashy(inst.engine.executor, self.poison)
        return inst

    def stop(self, instance: Instance) -> None:
        self.inner.stop(instance)


def test_a_request_that_crashes_workers_twice_is_refused_and_counted_once():
    from coral.runtime.tokenizer import ByteTokenizer

    poison_prompt = "crash me"
    provisioner = _CrashyProvisioner(tuple(ByteTokenizer().encode(poison_prompt)))
    with Controller(provisioner, max_restarts=3) as controller:
        controller.deploy([RuntimeInstanceSpec("only", PipelineSpec.even(TINY, 1))])
        with ServerThread(create_app(controller.models)) as server:
            body = {"model": TINY.name, "prompt": poison_prompt, "max_tokens": 3}
            t0 = time.monotonic()
            r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 422, r.text
            assert r.json()["error"]["code"] == "poison_request"
            assert time.monotonic() - t0 < 10
            assert provisioner.starts == 3  # the first, and one replacement per crash
            # sent again: refused at once, nothing crashes
            r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 422 and provisioner.starts == 3
            deadline = time.monotonic() + 20
            while controller.status()[0].state != "ready" and time.monotonic() < deadline:
                time.sleep(0.05)
            (status,) = controller.status()
            assert status.state == "ready" and status.failures == 1, status
            ok = httpx.post(server.url + "/v1/completions", timeout=60,
                            json={"model": TINY.name, "prompt": "fine", "max_tokens": 3})
            assert ok.status_code == 200, ok.text
            assert httpx.get(server.url + "/health").json()["status"] == "ok"
            metrics = httpx.get(server.url + "/metrics").text
    assert "coral_requests_poison_total" in metrics


def test_a_kill_from_outside_is_never_put_on_a_request():
    from coral.runtime.model_router import GatewayModelRouter

    class _Inst:
        state, name = "active", "a"

    router, inst, key = GatewayModelRouter("m"), _Inst(), "k"
    for _ in range(3):
        router._track(inst, key, 1)
        assert router.blame(inst, crashed=False) is False
    assert router._poisoned(key) == 0


# ---------------------------------------------------------------- admission
class _Slow:
    max_context_tokens = 64

    async def generate(self, prompt_ids, max_tokens, sampling):
        import asyncio

        for i in range(max_tokens):
            await asyncio.sleep(0.05)
            yield prompt_ids[i % len(prompt_ids)]


def test_past_the_queue_depth_requests_get_429_with_retry_after():
    app = create_app({"slow": _Slow()}, limits=GatewayLimits(max_queue=2))
    with ServerThread(app) as server:
        results: list[httpx.Response] = []

        def ask(stream: bool) -> None:
            results.append(httpx.post(server.url + "/v1/completions", timeout=30, json={
                "model": "slow", "prompt": "abc", "max_tokens": 10, "stream": stream}))

        threads = [threading.Thread(target=ask, args=(k % 2 == 0,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = sorted(r.status_code for r in results)
        assert codes.count(200) >= 2 and codes.count(429) >= 1, codes
        refused = next(r for r in results if r.status_code == 429)
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["code"] == "queue_full"
        # a client that leaves a stream early frees its place
        with httpx.stream("POST", server.url + "/v1/completions", timeout=30, json={
                "model": "slow", "prompt": "abc", "max_tokens": 40, "stream": True}) as r:
            next(r.iter_lines())
        time.sleep(0.3)
        for _ in range(2):  # both places are free again
            r = httpx.post(server.url + "/v1/completions", timeout=30,
                           json={"model": "slow", "prompt": "abc", "max_tokens": 2})
            assert r.status_code == 200, r.text


# ---------------------------------------------------------------- the key and the schema
def test_the_api_key_guards_the_schema_and_admin_and_takes_any_scheme_case():
    app = create_app({"echo": EchoBackend(64)}, api_key="sekrit",
                     preempt=lambda name, s: None)
    with ServerThread(app) as server:
        url = server.url
        assert httpx.get(url + "/openapi.json").status_code == 401
        assert httpx.post(url + "/admin/preempt", json={"instance": "x"}).status_code == 401
        assert httpx.get(url + "/docs").status_code == 401
        for scheme in ("Bearer", "bearer", "BEARER"):
            r = httpx.get(url + "/openapi.json", headers={"Authorization": f"{scheme} sekrit"})
            assert r.status_code == 200
            assert "/admin/preempt" not in r.json()["paths"]
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Basic sekrit"}
                         ).status_code == 401
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer sekrit2"}
                         ).status_code == 401
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.get(url + "/metrics").status_code == 200


def test_header_helpers():
    assert bearer_token("bEaReR  tok ") == "tok" and bearer_token("Token tok") is None
    assert host_name("[::1]:8000") == "::1" and host_name("Example.COM.:80") == "example.com"
    assert set(default_allowed_hosts("127.0.0.1")) == {"127.0.0.1", "localhost", "::1"}
    assert default_allowed_hosts("0.0.0.0") is None
    assert default_allowed_hosts("0.0.0.0", ["api.example"]) == ("api.example",)
    assert default_allowed_hosts("10.0.0.5") == ("10.0.0.5",)
    with pytest.raises(ValueError, match="max_queue"):
        GatewayLimits(max_queue=0)
