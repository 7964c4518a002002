"""Preemption notices in the runtime: the controller drains the noticed instance (no new
request goes to it, the model's other instance takes them), starts its replacement, and
stops it once idle or killed; under load with notices followed by kills (the local
provisioner's `preempt`), no answer is wrong or a client error, only correct or retriable."""

from __future__ import annotations

import os
import random
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("zmq")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from coral.runtime.chaos import ChaosConfig, reference_texts, run_preemptions  # noqa: E402
from coral.runtime.config import ModelConfig, PipelineSpec  # noqa: E402
from coral.runtime.controller import (Controller, LocalProvisioner,  # noqa: E402
                                      RuntimeInstanceSpec)
from coral.runtime.gateway import create_app  # noqa: E402
from coral.runtime.gateway_server import ServerThread  # noqa: E402
from coral.runtime.tokenizer import ByteTokenizer  # noqa: E402

TINY = ModelConfig(num_layers=4, hidden_size=32, ffn_size=64, num_heads=2, num_kv_heads=1,
                   head_dim=16, max_seq_len=64, seed=3)
MAX_TOKENS = 6
PROMPTS = ["alpha", "beta gamma", "delta", "epsilon zeta eta", "theta", "iota kappa"]


def _until(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(condition())


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    return reference_texts(TINY, ByteTokenizer(), PROMPTS, MAX_TOKENS)


def test_a_notice_drains_the_instance_and_starts_its_replacement(expected):
    """In-process instances (fast, no processes): after the notice the instance leaves
    routing at once, requests go to the other one and are answered correctly, the replacement
    comes up under the same name, and the idle noticed instance is stopped ('drained');
    its nodes' kill then finds nothing to fail."""
    provisioner = LocalProvisioner(in_process=True)
    with Controller(provisioner) as controller:
        spec = PipelineSpec.even(TINY, 2)
        controller.deploy([RuntimeInstanceSpec("a", spec), RuntimeInstanceSpec("b", spec)])
        router = controller.models[TINY.name]
        noticed = controller.instances["a"]
        with ServerThread(create_app(controller.models)) as server:
            timer = provisioner.preempt(noticed, notice_s=0.5)
            assert noticed not in router.instances and noticed.state in ("draining", "stopped")
            r = httpx.post(server.url + "/v1/completions", timeout=60,
                           json={"model": TINY.name, "prompt": PROMPTS[0],
                                 "max_tokens": MAX_TOKENS, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == expected[PROMPTS[0]]
            assert _until(lambda: controller.instances.get("a") not in (None, noticed)
                          and controller.instances["a"].state == "active")
            assert _until(lambda: noticed.state == "stopped")
            timer.join(5)
            health = httpx.get(server.url + "/health").json()
    (record,) = controller.preemptions
    assert (record.instance, record.how) == ("a", "drained")
    assert health["status"] == "ok"
    states = {i["name"]: (i["state"], i["restarts"])
              for i in health["models"][TINY.name]["instances"]}
    assert states == {"a": ("ready", 1), "b": ("ready", 0)}


def test_a_notice_for_an_unknown_instance_is_refused():
    with Controller(LocalProvisioner(in_process=True)) as controller:
        with pytest.raises(KeyError, match="no ready instance"):
            controller.notice("nope", 1.0)


@pytest.mark.parametrize("in_process", [
    True,
    pytest.param(False, marks=pytest.mark.skipif(
        not os.environ.get("CORAL_TEST_PREEMPT_PROCESSES"),
        reason="worker processes start in seconds each on a loaded machine (about a minute "
               "in all): opt in with CORAL_TEST_PREEMPT_PROCESSES=1")),
], ids=["in-process", "processes"])
def test_preemptions_under_load_lose_nothing_beyond_retriable(expected, in_process):
    """Two instances under four clients; every ~1.5 s a ready instance gets a notice of 0 or
    0.3 s and is then killed (its worker SIGKILLed; in process, its engine stopped): with no
    notice the kill finds requests in flight. Every answer is correct or retriable, and the
    model answers correctly after the last preemption."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    provisioner = LocalProvisioner(in_process=in_process)
    config = ChaosConfig(clients=4, chaos_s=6.0 if in_process else 12.0,
                         kill_every_s=1.5 if in_process else 3.0, max_tokens=MAX_TOKENS,
                         recovery_timeout_s=60.0, seed=2)
    try:
        with Controller(provisioner) as controller:
            spec = PipelineSpec.even(TINY, 1)
            controller.deploy([RuntimeInstanceSpec("a", spec), RuntimeInstanceSpec("b", spec)])

            def preempt(rng: random.Random) -> str | None:
                ready = [i for i in controller.instances.values() if i.state == "active"]
                if not ready:
                    return None
                victim = rng.choice(sorted(ready, key=lambda i: i.name))
                try:
                    provisioner.preempt(victim, notice_s=rng.choice((0.0, 0.3)))
                except KeyError:
                    return None
                return victim.name

            with ServerThread(create_app(controller.models)) as server:
                report = run_preemptions(server.url, TINY.name, expected, preempt, config)
                print(f"\n{report.summary()}; examples {report.examples}; "
                      f"preemptions {controller.preemptions}")
                assert _until(lambda: len([i for i in controller.instances.values()
                                           if i.state == "active"]) == 2, 60)
                health = httpx.get(server.url + "/health").json()
    finally:
        torch.set_num_threads(before)
    assert len(report.kills) >= 2, "too few preemptions to test anything"
    assert len(controller.preemptions) == len(report.kills)
    assert all(p.how in ("drained", "killed", "deadline") for p in controller.preemptions)
    assert report.outcomes["wrong"] == 0, report.examples
    assert report.outcomes["failed"] == 0, report.examples
    assert report.outcomes["correct"] > 0
    assert report.recovery_s is not None
    assert health["status"] == "ok", health


def test_a_notice_over_http_reaches_the_controller():
    """`POST /admin/preempt` (behind the API key) delivers a notice: unknown names get 404,
    the instance is drained and replaced, and it is stopped when the notice runs out."""
    with Controller(LocalProvisioner(in_process=True)) as controller:
        spec = PipelineSpec.even(TINY, 1)
        controller.deploy([RuntimeInstanceSpec("a", spec), RuntimeInstanceSpec("b", spec)])
        app = create_app(controller.models, api_key="k", preempt=controller.notice)
        auth = {"Authorization": "Bearer k"}
        with ServerThread(app) as server:
            url = server.url + "/admin/preempt"
            assert httpx.post(url, json={"instance": "b", "notice_s": 0.2}).status_code == 401
            r = httpx.post(url, json={"instance": "zz", "notice_s": 0.2}, headers=auth)
            assert r.status_code == 404 and "zz" in r.json()["error"]["message"]
            assert httpx.post(url, json={"instance": "b", "notice_s": -1},
                              headers=auth).status_code == 400
            r = httpx.post(url, json={"instance": "b", "notice_s": 0.2}, headers=auth)
            assert r.status_code == 200, r.text
            assert r.json()["instance"] == "b"
            assert _until(lambda: controller.preemptions[0].how != "")
            assert _until(lambda: "b" in controller.instances
                          and controller.instances["b"].state == "active")
    assert [p.instance for p in controller.preemptions] == ["b"]
