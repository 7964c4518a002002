"""Hostile and careless input against the tiny deployment (real worker processes behind the
gateway, as `coral serve --tiny` runs them): every case is answered 4xx quickly or served
safely, no worker dies, and afterwards a greedy completion answers as before and /health is
ok. Then the same properties for any JSON body (hypothesis)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("zmq")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from coral.runtime.chaos import reference_texts  # noqa: E402
from coral.runtime.controller import Controller, RuntimeInstanceSpec  # noqa: E402
from coral.runtime.gateway import create_app  # noqa: E402
from coral.runtime.gateway_server import ServerThread  # noqa: E402
from coral.runtime.http_guard import GatewayLimits, default_allowed_hosts  # noqa: E402
from coral.runtime.messages import SamplingParams  # noqa: E402
from coral.runtime.tiny import TinyDeployment  # noqa: E402
from coral.runtime.tokenizer import ByteTokenizer  # noqa: E402

MAX_TOKENS = 6
PROMPT = "Hello"
LIMITS = GatewayLimits(max_body_bytes=64 * 1024, max_header_bytes=8 * 1024,
                       header_timeout_s=1.0, body_timeout_s=1.0,
                       allowed_hosts=default_allowed_hosts("127.0.0.1"))
#: The issue's bound: each hostile case is answered within this.
ANSWER_S = 10.0


@pytest.fixture(scope="module")
def tiny():
    """The tiny random-weight deployment behind a gateway with tight limits; yields (server,
    controller, model, worker pids at the start)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    deployment = TinyDeployment(random_weights=True)
    model, _ = deployment.model()
    try:
        with Controller("local") as controller:
            controller.deploy([RuntimeInstanceSpec(deployment.instance(model).name,
                                                   deployment.spec(model))])
            pids = sorted(p for i in controller.instances.values() for p in i.pids)
            with ServerThread(create_app(controller.models, limits=LIMITS)) as server:
                yield server, controller, model, pids
    finally:
        torch.set_num_threads(before)


def post(server, body: bytes | dict, **kw) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    t0 = time.monotonic()
    r = httpx.post(server.url + "/v1/completions", content=content,
                   headers={"content-type": "application/json", **kw.pop("headers", {})},
                   timeout=ANSWER_S, **kw)
    assert time.monotonic() - t0 < ANSWER_S
    return r


def ok_body(**fields) -> dict:
    return {"model": "tiny-random", "prompt": PROMPT, "max_tokens": 3, **fields}


# ---------------------------------------------------------------- the cases
@pytest.mark.parametrize("fields, status", [
    ({"seed": 4611686018427387904}, 200),  # overflowed the sampler's seeding, killed workers
    ({"seed": 2 ** 63 - 1, "temperature": 2.0}, 200),
    ({"seed": -(2 ** 63)}, 200),
    ({"seed": 2 ** 64}, 400),  # past 64 bits: refused, not wrapped
    ({"temperature": 1e-38}, 200),  # made the probabilities inf/NaN, killed workers
    ({"temperature": 5e-324, "seed": 3}, 200),
    ({"temperature": 2.5}, 400),
    ({"temperature": -0.1}, 400),
    ({"top_p": 0.0}, 400),
    ({"top_p": 0.5, "temperature": 1.0, "seed": 1}, 200),
    ({"top_p": 1.5}, 400),
    ({"max_tokens": "3"}, 400),  # was coerced
    ({"max_tokens": 0}, 400),
    ({"max_tokens": 3.0}, 400),
    ({"max_tokens": True}, 400),
    ({"stream": "yes"}, 400),  # was coerced
    ({"stream": 1}, 400),
    ({"prompt": ""}, 400),  # was 500
    ({"prompt": [""]}, 400),
    ({"prompt": 7}, 400),
    ({"model": ""}, 400),
    ({"model": 3}, 400),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400),
    ({"stop": 5}, 400),
    ({"n": 2}, 400),
    ({"frequency_penalty": 3}, 400),
    ({"temperature": "0.5"}, 400),
])
def test_sampling_and_typing_cases(tiny, fields, status):
    server, *_ = tiny
    r = post(server, ok_body(**fields))
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_seeded_sampling_reproduces_past_the_old_seed_limit(tiny):
    server, *_ = tiny
    body = ok_body(seed=4611686018427387904, temperature=0.9)
    assert post(server, body).json()["choices"][0]["text"] == \
        post(server, body).json()["choices"][0]["text"]


def test_five_huge_seeds_then_health_is_ok(tiny):
    """The issue's repro: five seeds of 2**62, then /health (was: the instance failed)."""
    server, controller, _, pids = tiny
    for _ in range(5):
        assert post(server, ok_body(seed=4611686018427387904)).status_code == 200
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert sorted(p for i in controller.instances.values() for p in i.pids) == pids


@pytest.mark.parametrize("raw", [
    b'{"model": "tiny-random", "prompt": "x\\ud800y", "max_tokens": 2}',  # was 500
    b'{"model": "tiny-random", "prompt": "ok", "stop": "\\udfff", "max_tokens": 2}',
    b'{"model": "tiny-random\\ud800", "prompt": "ok"}',
])
def test_lone_surrogates_are_client_errors(tiny, raw):
    server, *_ = tiny
    r = post(server, raw)
    assert r.status_code == 400, r.text
    assert any(w in r.json()["error"]["message"] for w in ("surrogate", "unicode"))


def test_lone_surrogate_in_a_chat_message(tiny):
    server, *_ = tiny
    raw = (b'{"model": "tiny-random", "max_tokens": 2, "messages": '
           b'[{"role": "user", "content": [{"type": "text", "text": "a\\ud83d"}]}]}')
    r = httpx.post(server.url + "/v1/chat/completions", content=raw, timeout=ANSWER_S)
    assert r.status_code == 400


@pytest.mark.parametrize("raw", [b"", b"[]", b"null", b"3", b'"x"', b"{", b"[" * 100_000,
                                 b'{"model": "tiny-random", "prompt": "a", "max_tokens": 1e999}'])
def test_malformed_bodies_are_client_errors(tiny, raw):
    server, *_ = tiny
    assert 400 <= post(server, raw).status_code < 500


def test_a_body_over_the_limit_is_413_at_once(tiny):
    server, *_ = tiny
    t0 = time.monotonic()
    r = post(server, ok_body(prompt="x" * (2 * LIMITS.max_body_bytes)))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert time.monotonic() - t0 < 5


def test_a_prompt_past_the_context_is_refused_before_tokenizing(tiny, monkeypatch):
    server, *_ = tiny
    calls = []
    monkeypatch.setattr(ByteTokenizer, "encode", lambda *a, **k: calls.append(a) or [1])
    r = post(server, ok_body(prompt="y" * 60_000))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "at least 60000" in r.json()["error"]["message"]
    assert not calls, "the prompt was tokenized"


def test_a_header_over_the_limit_is_431(tiny):
    server, *_ = tiny
    r = httpx.get(server.url + "/health", headers={"x-big": "a" * 1_000_000}, timeout=ANSWER_S)
    assert r.status_code == 431


def test_a_slow_head_is_cut_off(tiny):
    """Slow loris: a head that trickles in is answered 408 and the connection closed."""
    server, *_ = tiny
    with socket.create_connection((server.host, server.port), timeout=ANSWER_S) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        t0 = time.monotonic()
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 408")
    assert time.monotonic() - t0 < LIMITS.header_timeout_s + 3


def test_a_slow_body_is_cut_off(tiny):
    server, *_ = tiny
    with socket.create_connection((server.host, server.port), timeout=ANSWER_S) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"content-type: application/json\r\ncontent-length: 100\r\n\r\n{")
        data = sock.recv(4096)
    assert data.startswith(b"HTTP/1.1 408")


@pytest.mark.parametrize("host, status", [("evil.example", 400), ("127.0.0.1.evil.io", 400),
                                          ("localhost", 200), ("127.0.0.1", 200),
                                          ("[::1]:9", 200), ("LOCALHOST.", 200)])
def test_the_host_header_is_checked(tiny, host, status):
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1."""
    server, *_ = tiny
    r = httpx.get(server.url + "/v1/models", headers={"host": host})
    assert r.status_code == status
    if status == 400:
        assert r.json()["error"]["code"] == "invalid_host"


def test_a_step_that_raises_fails_its_request_and_the_worker_lives_on(tiny):
    """A token id past the vocabulary (the gateway's tokenizers never send one) makes the
    first stage's step raise inside its worker process: the request ends with the error, the
    workers stay, and the next request runs."""
    server, controller, _, pids = tiny
    (inst,) = controller.instances.values()
    done = threading.Event()
    ended: list = []

    def on_token(token, finished, error):
        if finished:
            ended.append(error)
            done.set()

    inst.engine.submit([1, 10 ** 6, 2], 2, on_token, SamplingParams(), stop_on_eos=False)
    assert done.wait(ANSWER_S)
    assert ended[0] is not None and "IndexError" in str(ended[0]), ended
    assert post(server, ok_body()).status_code == 200
    assert sorted(p for i in controller.instances.values() for p in i.pids) == pids
    assert inst.failed_nodes() == []


def test_a_stalled_driver_does_not_make_its_workers_look_lost(tiny):
    """The engine's thread held up past the heartbeat timeout (as a long tokenization once
    held up the gateway): heartbeats are read by a thread of their own, so no worker is
    declared lost."""
    from coral.runtime.worker import HEARTBEAT_TIMEOUT_S

    server, controller, _, pids = tiny
    (inst,) = controller.instances.values()
    with inst.engine._lock:  # the engine's loop cannot read anything meanwhile
        time.sleep(HEARTBEAT_TIMEOUT_S + 1.0)
        assert inst.failed_nodes() == []
    assert controller.dead == []


def test_after_the_hostile_cases_the_model_answers_as_before(tiny):
    """Runs last in this module (pytest keeps file order): nothing above broke anything."""
    server, controller, model, pids = tiny
    expected = reference_texts(model, ByteTokenizer(), [PROMPT], MAX_TOKENS)[PROMPT]
    r = post(server, ok_body(max_tokens=MAX_TOKENS, temperature=0))
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert sorted(p for i in controller.instances.values() for p in i.pids) == pids, \
        "a worker was replaced"
    assert controller.dead == []


# ---------------------------------------------------------------- any body
_FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stream", "stop",
           "n", "messages", "user", "presence_penalty"]
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(max_size=20), lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
_plausible = {
    "model": st.sampled_from(["tiny-random", "tiny", ""]) | _json,
    "prompt": st.text(max_size=40) | st.lists(st.text(max_size=10), max_size=2) | _json,
    "max_tokens": st.integers(-2, 8) | _json,
    "temperature": st.floats(-1, 3) | st.sampled_from([0, 1e-300, 2]) | _json,
    "top_p": st.floats(-0.5, 1.5) | _json,
    "seed": st.integers(-(2 ** 70), 2 ** 70) | _json,
    "stream": st.booleans() | _json,
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=6) | _json,
    "messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "robot"]) | _json},
        optional={"content": st.text(max_size=20) | st.lists(st.fixed_dictionaries(
            {"type": st.just("text") | _json, "text": st.text(max_size=8) | _json}),
            max_size=2) | _json}), max_size=3) | _json,
}
_bodies = st.fixed_dictionaries({}, optional=_plausible) | st.dictionaries(
    st.sampled_from(_FIELDS), _json, max_size=5) | _json


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=_bodies)
def test_any_json_body_gets_2xx_or_4xx(tiny, body):
    server, controller, _, pids = tiny
    if isinstance(body, dict) and isinstance(body.get("max_tokens"), int):
        body["max_tokens"] = min(body["max_tokens"], 8)  # keep each example quick
    for path in ("/v1/completions", "/v1/chat/completions"):
        r = httpx.post(server.url + path, content=json.dumps(body).encode(),
                       headers={"content-type": "application/json"}, timeout=ANSWER_S)
        assert r.status_code < 500, (path, body, r.text)
        assert r.status_code < 300 or "error" in r.json()


def test_no_worker_died_during_the_properties(tiny):
    server, controller, _, pids = tiny
    assert sorted(p for i in controller.instances.values() for p in i.pids) == pids
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
