"""The OpenAI client talks to the gateway; bad requests get OpenAI-style errors."""

from __future__ import annotations

import pytest
from conftest import metric_value

torch = pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from coral.plans.file import PlanFile  # noqa: E402
from coral.runtime.backends import EchoBackend, EngineBackend  # noqa: E402
from coral.runtime.config import ModelConfig, PipelineSpec  # noqa: E402
from coral.runtime.batching_engine import BatchingEngine  # noqa: E402
from coral.runtime.gateway import create_app  # noqa: E402
from coral.runtime.gateway_server import ServerThread  # noqa: E402
from coral.runtime.messages import SamplingParams  # noqa: E402
from coral.runtime.pipeline import LocalPipeline  # noqa: E402
from coral.runtime.tokenizer import ByteTokenizer  # noqa: E402

TINY = ModelConfig(num_layers=4, max_seq_len=96, seed=1)
API_KEY = "test-key"


@pytest.fixture(scope="module")
def server():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = BatchingEngine(LocalPipeline(PipelineSpec.even(TINY, 2)), max_seq_len=TINY.max_seq_len)
    engine.start()
    app = create_app({"tiny-random": EngineBackend(engine), "echo": EchoBackend(64)},
                     api_key=API_KEY)
    with ServerThread(app) as srv:
        srv.engine = engine
        yield srv
    engine.stop()
    torch.set_num_threads(before)


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0,
                         timeout=30)


def expected_text(prompt: str, max_tokens: int) -> str:
    """Greedy output of the unsplit model for the same prompt, as the gateway decodes it."""
    tok = ByteTokenizer()
    engine = BatchingEngine(LocalPipeline(PipelineSpec.even(TINY, 1)), max_seq_len=TINY.max_seq_len)
    ids = engine.generate(tok.encode(prompt), max_tokens, SamplingParams(), stop_on_eos=True)
    return tok.decode(ids)


def test_models_listed(client):
    assert sorted(m.id for m in client.models.list()) == ["echo", "tiny-random"]


def test_completion_is_the_models_greedy_output(client):
    out = client.completions.create(model="tiny-random", prompt="Hello", max_tokens=10,
                                    temperature=0)
    assert out.choices[0].text == expected_text("Hello", 10)
    assert out.usage.prompt_tokens == 6 and out.usage.completion_tokens <= 10
    assert out.choices[0].finish_reason in ("length", "stop")


def test_chat_and_streaming_agree(client):
    messages = [{"role": "user", "content": "hi"}]
    full = client.chat.completions.create(model="tiny-random", messages=messages, max_tokens=8,
                                          temperature=0)
    stream = client.chat.completions.create(model="tiny-random", messages=messages,
                                            max_tokens=8, temperature=0, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert full.choices[0].message.role == "assistant"


def test_completion_stream_and_stop_sequence(client):
    stream = client.completions.create(model="echo", prompt="abc,def", max_tokens=20,
                                       stream=True, stop=[","])
    chunks = list(stream)
    # The echo backend returns BOS (not text) then the prompt's bytes; "," stops it.
    assert "".join(c.choices[0].text for c in chunks) == "abc"
    assert chunks[-1].choices[0].finish_reason == "stop"
    out = client.completions.create(model="echo", prompt="xy", max_tokens=5)
    assert out.choices[0].text == "xyx"  # BOS x y BOS x
    assert out.choices[0].finish_reason == "length"


def test_seeded_temperature_sampling_is_reproducible(client):
    kw = dict(model="tiny-random", prompt="seed", max_tokens=6, temperature=0.9, seed=11)
    assert client.completions.create(**kw).choices[0].text == \
        client.completions.create(**kw).choices[0].text


@pytest.mark.parametrize("kwargs, status, code, param", [
    (dict(model="tiny-randm", prompt="x"), 404, "model_not_found", "model"),
    (dict(model="tiny-random", prompt="x", temperature=5), 400, "invalid_value", "temperature"),
    (dict(model="tiny-random", prompt="x", max_tokens=0), 400, "invalid_value", "max_tokens"),
    (dict(model="tiny-random", prompt="x" * 200), 400, "context_length_exceeded", "prompt"),
    (dict(model="tiny-random", prompt="x", max_tokens=500), 400, "context_length_exceeded",
     "prompt"),
])
def test_bad_requests_get_openai_errors(client, kwargs, status, code, param):
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(**kwargs)
    err = info.value
    assert err.status_code == status
    assert err.body["code"] == code and err.body["param"] == param
    assert err.body["message"]
    if code == "model_not_found":
        assert "Did you mean 'tiny-random'?" in err.body["message"]
    # and the gateway is still up
    assert client.models.list().data


def test_raw_http_errors(server):
    url = server.url
    auth = {"Authorization": f"Bearer {API_KEY}"}
    r = httpx.post(f"{url}/v1/completions", content=b"{not json", headers=auth)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "echo", "messages": []},
                   headers=auth)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.get(f"{url}/v1/nowhere", headers=auth)
    assert r.status_code == 404 and "error" in r.json()
    assert httpx.get(f"{url}/health").json()["status"] == "ok"  # no key needed


def test_metrics_count_requests_and_tokens(client, server):
    client.completions.create(model="echo", prompt="metrics", max_tokens=3)
    text = httpx.get(f"{server.url}/metrics").text
    assert metric_value(text, "coral_requests_total", model="echo", endpoint="completions",
                        status="ok") is not None
    assert metric_value(text, "coral_generation_tokens_total", model="echo") is not None
    assert metric_value(text, "coral_ttft_seconds_bucket", model="echo", le="+Inf") >= 1
    assert "# TYPE coral_tpot_seconds histogram" in text


def test_concurrent_requests_are_batched_and_exact(client):
    from concurrent.futures import ThreadPoolExecutor

    prompts = ["one", "two two", "three three three", "four"]

    def ask(prompt: str) -> str:
        return client.completions.create(model="tiny-random", prompt=prompt, max_tokens=8,
                                         temperature=0).choices[0].text

    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(ask, prompts))
    assert answers == [expected_text(p, 8) for p in prompts]


def test_client_leaving_a_stream_cancels_its_request(server, monkeypatch):
    import time

    cancelled: list[str] = []
    original = server.engine.cancel
    monkeypatch.setattr(server.engine, "cancel",
                        lambda rid: (cancelled.append(rid), original(rid)))
    # pace generation (20 ms a step) so the request is still running when the client hangs up,
    # however fast this machine decodes the tiny model
    execute = server.engine.executor.execute
    monkeypatch.setattr(server.engine.executor, "execute",
                        lambda items: (time.sleep(0.02), execute(items))[1])
    body = {"model": "tiny-random", "prompt": "go", "max_tokens": 80, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # first event, then hang up
    deadline = time.time() + 10
    while server.engine.has_work() and time.time() < deadline:
        time.sleep(0.05)
    assert not server.engine.has_work(), "the abandoned request still runs"
    assert cancelled, "the engine was not told to cancel the abandoned request"


# ---------------------------------------------------------------- failures the client sees
class _Failing:
    """A backend that fails as a lost or missing instance would: `unavailable` times with
    ModelUnavailableError, then `cut` times with RetriableBackendError after `after` tokens,
    then it echoes the prompt."""

    max_context_tokens = 64

    def __init__(self, *, unavailable: int = 0, cut: int = 0, after: int = 3,
                 retry_after_s: int = 7):
        self.unavailable, self.cut, self.after = unavailable, cut, after
        self.retry_after_s = retry_after_s
        self.calls = 0

    async def generate(self, prompt_ids, max_tokens, sampling):
        import asyncio

        from coral.runtime.backends import ModelUnavailableError, RetriableBackendError

        self.calls += 1
        if self.unavailable > 0:
            self.unavailable -= 1
            raise ModelUnavailableError("model 'flaky' is temporarily unavailable: no ready "
                                        "instance", retry_after_s=self.retry_after_s)
        cut = self.cut > 0
        self.cut -= cut
        for i in range(max_tokens):
            if cut and i == self.after:
                raise RetriableBackendError("instance x of model 'flaky' failed after "
                                            f"{i} tokens (worker(s) s0n0 exited)")
            await asyncio.sleep(0.01)  # so that the client has the first events meanwhile
            yield prompt_ids[1 + i % (len(prompt_ids) - 1)]


def _serve(backend):
    return ServerThread(create_app({"flaky": backend}))


def _client(srv, retries: int = 0):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=retries,
                         timeout=30)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_no_ready_instance_is_a_retriable_503_not_a_client_error(stream):
    with _serve(_Failing(unavailable=1)) as srv:
        with pytest.raises(openai.APIStatusError) as info:
            _client(srv).completions.create(model="flaky", prompt="abc", max_tokens=4,
                                            stream=stream)
        err = info.value
        assert err.status_code == 503 and err.response.headers["Retry-After"] == "7"
        assert err.body["type"] == "service_unavailable"
        assert err.body["code"] == "model_unavailable"
        assert err.body["message"].startswith("model 'flaky' is temporarily unavailable")
        r = httpx.get(srv.url + "/metrics")
        assert metric_value(r.text, "coral_requests_total", model="flaky",
                            endpoint="completions", status="unavailable") is not None


def test_the_openai_client_retries_a_503_by_itself():
    backend = _Failing(unavailable=1, retry_after_s=1)
    with _serve(backend) as srv:
        out = _client(srv, retries=2).completions.create(model="flaky", prompt="abc",
                                                         max_tokens=4)
    assert out.choices[0].text == "abca" and backend.calls == 2


def test_a_stream_cut_after_its_first_text_ends_with_an_error_the_client_raises():
    with _serve(_Failing(cut=1, after=3)) as srv:
        received = []
        with pytest.raises(openai.APIError) as info:
            for chunk in _client(srv).completions.create(model="flaky", prompt="abcdef",
                                                         max_tokens=8, stream=True):
                received.append(chunk.choices[0].text)
    assert "".join(received) == "abc", "the text before the cut arrives, then the error"
    assert not isinstance(info.value, openai.APIStatusError)  # inside the 200 stream
    assert info.value.body["code"] == "instance_lost"
    assert "retry" in info.value.body["message"].lower()


def test_a_request_cut_before_any_text_reached_the_client_is_rerun():
    """Non-streamed: its tokens were never sent. Streamed: cut before its first text, so the
    response had not started. Both are run again from the prompt and answer in full."""
    for stream in (False, True):
        backend = _Failing(cut=1, after=2)
        with _serve(backend) as srv:
            client = _client(srv)
            if stream:  # a long stop sequence holds the first text back past the cut
                chunks = client.completions.create(model="flaky", prompt="abcdef",
                                                   max_tokens=6, stream=True,
                                                   stop=["zzzzzz"])
                text = "".join(c.choices[0].text for c in chunks)
            else:
                text = client.completions.create(model="flaky", prompt="abcdef",
                                                 max_tokens=6).choices[0].text
            assert text == "abcdef"
            metrics = httpx.get(srv.url + "/metrics").text
        assert backend.calls == 2
        assert metric_value(metrics, "coral_request_reruns_total", model="flaky",
                            stage="after_tokens") == 1


def test_health_reports_each_model():
    with _serve(EchoBackend(16)) as srv:
        r = httpx.get(srv.url + "/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "models": {"flaky": {"status": "ready"}}}


def test_metrics_and_health_report_each_models_slo_attainment():
    """With the plan file's SLOs the gateway judges every answered request against its model's
    TTFT and TPOT bounds: a bound no request can meet gives attainment 0, a loose one 1, and a
    model without an SLO is not judged."""
    plan = PlanFile.from_payload({"scenario": "slo-test", "instances": [], "slos": {
        "loose": {"tpot_s": 60.0, "ttft_s": 600.0},
        "strict": {"tpot_s": 1e-9, "ttft_s": 1e-9}}})
    app = create_app({"loose": EchoBackend(64), "strict": EchoBackend(64),
                      "free": EchoBackend(64)}, slos=plan.slos)
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0,
                               timeout=30)
        for model in ("loose", "strict", "free"):
            for _ in range(3):
                client.completions.create(model=model, prompt="slo", max_tokens=4)
        client.chat.completions.create(model="loose", max_tokens=4, stream=False,
                                       messages=[{"role": "user", "content": "slo"}])
        root = client.with_options(base_url=srv.url)  # /metrics and /health sit beside /v1
        text = root.get("/metrics", cast_to=httpx.Response).text
        health = root.get("/health", cast_to=httpx.Response).json()
    assert metric_value(text, "coral_slo_bound_seconds", model="strict", bound="ttft") == 1e-9
    assert metric_value(text, "coral_slo_bound_seconds", model="loose", bound="ttft") == 600.0
    assert metric_value(text, "coral_slo_bound_seconds", model="loose", bound="tpot") == 60.0
    assert metric_value(text, "coral_slo_requests_total", model="loose") == 4
    assert metric_value(text, "coral_slo_met_total", model="loose") == 4
    assert metric_value(text, "coral_slo_attainment", model="loose") == 1.0
    assert metric_value(text, "coral_slo_requests_total", model="strict") == 3
    assert metric_value(text, "coral_slo_attainment", model="strict") == 0.0
    assert metric_value(text, "coral_slo_requests_total", model="free") is None
    assert health["models"]["loose"]["slo_attainment"] == 1.0
    assert health["models"]["strict"]["slo_attainment"] == 0.0
    assert "slo_attainment" not in health["models"]["free"]
