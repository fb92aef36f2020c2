"""An OpenAI-compatible HTTP server for MarkBase models: `markbase serve`.

Endpoints: GET /v1/models, GET /v1/models/{id}, POST /v1/completions, POST /v1/chat/completions,
GET /health. Built on FastAPI/Starlette and run by uvicorn (`pip install 'markbase[server]'`).

Concurrency: the server loads one markbase.Model per slot (`parallel` of them; the model file is
memory-mapped, so the OS shares the weights, and every slot has its own KV cache). A request takes
a free slot or waits, first come first served, for one. Generation runs on a worker thread (the
engine releases the GIL), so the event loop keeps answering while slots are busy. A client that
disconnects stops its generation at the next token and its slot is freed. A greedy request gives
the same text whatever runs beside it: slots share nothing but read-only weights.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import os
import threading
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .model import Model

MAX_BODY_BYTES = 1 << 20          # a request body over this gets 413
_DRAIN_BYTES = 16 << 20           # read (and drop) up to this much of an oversized body first
_MAX_STOPS = 16
_U64 = 1 << 64
_I32_MAX = (1 << 31) - 1


# ---------------------------------------------------------------------------- errors

class APIError(Exception):
    """An error answered with OpenAI's error body: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        # (a message may quote client input: keep it encodable, lone surrogates included)
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def _bad(message: str, param: str | None = None, code: str | None = None, status: int = 400) -> APIError:
    return APIError(status, message, "invalid_request_error", param, code)


# ---------------------------------------------------------------------------- field validation

def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _get_number(body: dict, key: str, default: float, lo: float | None = None,
                lo_open: bool = False, hi: float | None = None) -> float:
    v = body.get(key)
    if v is None:
        return default
    if not _is_number(v) or not math.isfinite(v):
        raise _bad(f"'{key}' must be a finite number, got {json.dumps(v)[:80]}", key, "invalid_type")
    if abs(v) > 1e30:  # the engine takes float32
        raise _bad(f"'{key}' is out of range: {v}", key, "invalid_value")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise _bad(f"'{key}' must be {'>' if lo_open else '>='} {lo:g}, got {v}", key, "invalid_value")
    if hi is not None and v > hi:
        raise _bad(f"'{key}' must be <= {hi:g}, got {v}", key, "invalid_value")
    return float(v)


def _get_int(body: dict, key: str, default: int | None, lo: int | None = None,
             hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise _bad(f"'{key}' must be an integer, got {json.dumps(v)[:80]}", key, "invalid_type")
    if lo is not None and v < lo:
        raise _bad(f"'{key}' must be >= {lo}, got {v}", key, "invalid_value")
    if hi is not None and v > hi:
        raise _bad(f"'{key}' must be <= {hi}, got {v}", key, "invalid_value")
    return v


def _get_bool(body: dict, key: str, default: bool) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(f"'{key}' must be a boolean, got {json.dumps(v)[:80]}", key, "invalid_type")
    return v


def _get_stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise _bad("'stop' must be a string, a list of strings or null", "stop", "invalid_type")
    if len(v) > _MAX_STOPS:
        raise _bad(f"'stop' may hold at most {_MAX_STOPS} strings, got {len(v)}", "stop", "invalid_value")
    return [s for s in v if s]


def _reject_unsupported(body: dict, chat: bool) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad(f"'n' must be 1: this server returns one choice per request, got {json.dumps(n)[:40]}",
                   "n", "unsupported_value")
    if chat:
        if body.get("logprobs") not in (None, False):
            raise _bad("'logprobs' is not supported by this server", "logprobs", "unsupported_parameter")
        if body.get("top_logprobs") not in (None, 0):
            raise _bad("'top_logprobs' is not supported by this server", "top_logprobs", "unsupported_parameter")
        for key in ("tools", "functions"):
            if body.get(key):
                raise _bad(f"'{key}' (tool calling) is not supported by this server", key, "unsupported_parameter")
        rf = body.get("response_format")
        if rf is not None and not (isinstance(rf, dict) and rf.get("type") in (None, "text")):
            raise _bad("'response_format' other than {\"type\": \"text\"} is not supported by this server",
                       "response_format", "unsupported_parameter")
    else:
        if body.get("logprobs") not in (None, False):
            raise _bad("'logprobs' is not supported by this server", "logprobs", "unsupported_parameter")
        best_of = body.get("best_of")
        if best_of is not None and best_of != 1:
            raise _bad("'best_of' must be 1: this server returns one choice per request", "best_of",
                       "unsupported_value")
        if body.get("suffix"):
            raise _bad("'suffix' is not supported by this server", "suffix", "unsupported_parameter")
    if body.get("logit_bias"):
        raise _bad("'logit_bias' is not supported by this server", "logit_bias", "unsupported_parameter")
    for key in ("presence_penalty", "frequency_penalty"):
        v = body.get(key)
        if v is None:
            continue
        if not _is_number(v):
            raise _bad(f"'{key}' must be a number", key, "invalid_type")
        if v != 0:
            raise _bad(f"'{key}' is not supported by this server (use 'repeat_penalty')", key,
                       "unsupported_parameter")


def _sampling(body: dict) -> dict:
    """OpenAI's defaults: temperature 1, top_p 1; no top-k, min-p or repeat penalty."""
    seed = _get_int(body, "seed", None)
    return dict(
        temperature=_get_number(body, "temperature", 1.0, lo=0.0),
        top_p=_get_number(body, "top_p", 1.0, lo=0.0, lo_open=True, hi=1.0),
        top_k=_get_int(body, "top_k", 0, lo=0, hi=_I32_MAX),
        min_p=_get_number(body, "min_p", 0.0, lo=0.0, hi=1.0),
        repeat_penalty=_get_number(body, "repeat_penalty", 1.0, lo=0.0, lo_open=True),
        seed=None if seed is None else seed % _U64,
    )


def _stream_options(body: dict, stream: bool) -> bool:
    so = body.get("stream_options")
    if so is None:
        return False
    if not isinstance(so, dict):
        raise _bad("'stream_options' must be an object", "stream_options", "invalid_type")
    if not stream:
        raise _bad("'stream_options' is only allowed when 'stream' is true", "stream_options", "invalid_value")
    v = so.get("include_usage", False)
    if not isinstance(v, bool):
        raise _bad("'stream_options.include_usage' must be a boolean", "stream_options", "invalid_type")
    return v


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if msgs is None:
        raise _bad("'messages' is required", "messages", "missing_required_parameter")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("'messages' must be a non-empty array of messages", "messages", "invalid_type")
    out = []
    for i, m in enumerate(msgs):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(f"{p} must be an object with 'role' and 'content'", p, "invalid_type")
        role = m.get("role")
        if not isinstance(role, str):
            raise _bad(f"{p}.role must be a string", f"{p}.role", "invalid_type")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise _bad(f"{p}.role {role!r} is not supported (system, developer, user, assistant)",
                       f"{p}.role", "invalid_value")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise _bad(f"{p}.content[{j}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                               "are supported", f"{p}.content", "invalid_value")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise _bad(f"{p}.content must be a string or an array of text parts", f"{p}.content",
                       "invalid_type")
        out.append({"role": role, "content": content})
    return out


def _prompt(body: dict, vocab: int):
    """A completion prompt: a string or token ids (one prompt per request)."""
    p = body.get("prompt")
    if p is None:
        raise _bad("'prompt' is required", "prompt", "missing_required_parameter")
    if isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
        if len(p) != 1:
            raise _bad(f"'prompt' holds {len(p)} prompts; this server takes one prompt per request",
                       "prompt", "unsupported_value")
        p = p[0]
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        for t in p:
            if t < 0 or t >= vocab:
                raise _bad(f"'prompt': token id {t} is outside the vocabulary of {vocab}", "prompt",
                           "invalid_value")
        return list(p)
    raise _bad("'prompt' must be a string, an array of token ids, or an array holding one of those",
               "prompt", "invalid_type")


# ---------------------------------------------------------------------------- jobs and slots

class _Job:
    __slots__ = ("ids", "max_tokens", "sampling", "stop", "cancel")

    def __init__(self, ids: list[int], max_tokens: int, sampling: dict, stop: list[str]):
        self.ids, self.max_tokens, self.sampling, self.stop = ids, max_tokens, sampling, stop
        self.cancel = threading.Event()


class Server:
    """The models (one per slot) and what the HTTP handlers share."""

    def __init__(self, models: list[Model], model_id: str, aliases: list[str] | None = None):
        if not models:
            raise ValueError("need at least one model")
        self.models = models
        self.model_id = model_id
        self.names = {model_id, *(aliases or [])}
        self.max_context = models[0]._e.max_context
        self.vocab = models[0].config["vocab_size"]
        self.created = int(time.time())
        self.parallel = len(models)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._slots: asyncio.Queue | None = None
        self._jobs: set[_Job] = set()
        self.waiting = 0
        self.served = 0

    @classmethod
    def load(cls, path=None, backend: str = "auto", max_context: int = 4096, parallel: int = 1,
             threads: int | None = None, alias: str | None = None, prefill_chunk: int = 32) -> "Server":
        """prefill_chunk: each slot's engine keeps the step graphs and buffers of a full chunk, of
        one token and of the last prompt's shorter tail, so a slot's memory grows with the chunk:
        an engine's default chunk (256 on the CPU) costs hundreds of MiB per slot; 32 bounds it to
        tens of MiB at about the same prefill speed. Results do not depend on it."""
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise ValueError(f"parallel must be an integer >= 1, got {parallel!r}")
        if threads is None:
            try:
                cores = len(os.sched_getaffinity(0))
            except (AttributeError, OSError):
                cores = os.cpu_count() or 1
            threads = max(1, cores // parallel)
        models = [Model.load(path, backend=backend, threads=threads, max_context=max_context,
                             prefill_chunk=prefill_chunk) for _ in range(parallel)]
        base = os.path.basename(os.path.normpath(models[0].path))
        model_id = alias or (base[:-5] if base.endswith(".gguf") else base)
        return cls(models, model_id, aliases=[base, model_id])

    # -- lifecycle (inside the event loop)
    async def start(self) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(self.parallel, thread_name_prefix="markbase-slot")
        self._slots = asyncio.Queue()
        for m in self.models:
            self._slots.put_nowait(m)

    async def stop(self) -> None:
        for job in list(self._jobs):
            job.cancel.set()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    @property
    def idle(self) -> int:
        return self._slots.qsize() if self._slots is not None else 0

    # -- tokenization (any thread: the tokenizer is read-only, so slot 0's serves everyone)
    def tokens_for_chat(self, messages) -> list[int]:
        return self.models[0].chat_tokens(messages)

    def tokens_for_text(self, text: str) -> list[int]:
        return self.models[0].tokenize(text, add_bos=True)

    def detokenize(self, ids) -> str:
        return self.models[0].detokenize(ids)

    # -- generation
    def _work(self, model: Model, job: _Job, loop: asyncio.AbstractEventLoop, q: asyncio.Queue) -> None:
        """Runs on a slot's worker thread: the pieces, then ("done", stats) or ("error", exc)."""
        def put(item):
            try:
                loop.call_soon_threadsafe(q.put_nowait, item)
            except RuntimeError:  # the loop is closed: the server is going away
                pass
        try:
            if job.cancel.is_set():
                put(("done", None))
                return
            it = model.generate(job.ids, max_tokens=job.max_tokens, stop=job.stop or None, stream=True,
                                **job.sampling)
            try:
                for piece in it:
                    if job.cancel.is_set():
                        break
                    put(("piece", piece))
            finally:
                it.close()
            st = model.stats()
            n = int(st.get("generated_tokens", 0))
            fr = st.get("finish_reason") or ("length" if n >= job.max_tokens else "stop")
            put(("done", {"prompt_tokens": len(job.ids), "completion_tokens": n, "finish_reason": fr}))
        except BaseException as e:  # noqa: BLE001 - handed to the request, never kills the thread
            put(("error", e))
        finally:
            try:
                loop.call_soon_threadsafe(self._slots.put_nowait, model)
            except RuntimeError:
                pass

    async def events(self, job: _Job):
        """("piece", text)..., then ("done", info) or ("error", exc). Closing it (or cancelling
        the task that iterates it) stops the generation; the slot is freed when its thread ends."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        self._jobs.add(job)
        try:
            self.waiting += 1
            try:
                model = await self._slots.get()
            finally:
                self.waiting -= 1
            try:
                loop.run_in_executor(self._executor, self._work, model, job, loop, q)
            except BaseException:
                self._slots.put_nowait(model)
                raise
            while True:
                kind, val = await q.get()
                yield kind, val
                if kind != "piece":
                    return
        finally:
            job.cancel.set()
            self._jobs.discard(job)
            self.served += 1


# ---------------------------------------------------------------------------- HTTP helpers

async def _read_json(request: Request) -> dict:
    cl = request.headers.get("content-length")
    declared = None
    if cl is not None:
        try:
            declared = int(cl)
        except ValueError:
            raise _bad("invalid Content-Length header", None, "invalid_request") from None
    chunks, total = [], 0
    try:
        if declared is not None and declared > _DRAIN_BYTES:
            total = declared  # too big even to drain: answer at once
        else:
            async for chunk in request.stream():
                total += len(chunk)
                if total <= MAX_BODY_BYTES:
                    chunks.append(chunk)
                elif total > _DRAIN_BYTES:
                    break
    except ClientDisconnect:
        raise _bad("the client disconnected while sending the body") from None
    if total > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is larger than the limit of {MAX_BODY_BYTES} bytes",
                       "invalid_request_error", None, "request_too_large")
    raw = b"".join(chunks)
    if not raw.strip():
        raise _bad("the request body is empty; send a JSON object", None, "invalid_json")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise _bad(f"the request body is not valid JSON: {e}"[:300], None, "invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_json")
    return body


async def _wait_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg.get("type") == "http.disconnect":
            return


def _usage(info: dict) -> dict:
    return {"prompt_tokens": info["prompt_tokens"], "completion_tokens": info["completion_tokens"],
            "total_tokens": info["prompt_tokens"] + info["completion_tokens"]}


def _error_from_exception(e: BaseException) -> APIError:
    if isinstance(e, APIError):
        return e
    if isinstance(e, (ValueError, TypeError)):
        return _bad(str(e) or type(e).__name__)
    return APIError(500, f"internal error: {type(e).__name__}: {e}"[:500], "server_error", None, None)


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


# ---------------------------------------------------------------------------- the app

def create_app(server: Server) -> FastAPI:
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    app = FastAPI(title="markbase", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return APIError(exc.status_code, str(exc.detail), "invalid_request_error", None, code).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc: RequestValidationError):
        return _bad(f"invalid request: {exc.errors()}"[:500]).response()

    @app.exception_handler(Exception)
    async def _internal_error(request, exc: Exception):
        return _error_from_exception(exc).response()

    def model_card() -> dict:
        return {"id": server.model_id, "object": "model", "created": server.created, "owned_by": "markbase"}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": server.model_id, "slots": server.parallel,
                "slots_idle": server.idle, "requests_waiting": server.waiting,
                "requests_served": server.served}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str):
        if model_id not in server.names:
            raise APIError(404, f"The model '{model_id}' does not exist (this server serves "
                                f"'{server.model_id}')", "invalid_request_error", "model", "model_not_found")
        return model_card()

    def check_model(body: dict) -> str:
        name = body.get("model")
        if name is None:
            raise _bad("'model' is required", "model", "missing_required_parameter")
        if not isinstance(name, str):
            raise _bad("'model' must be a string", "model", "invalid_type")
        if name not in server.names:
            raise APIError(404, f"The model '{name}' does not exist (this server serves "
                                f"'{server.model_id}')", "invalid_request_error", "model", "model_not_found")
        return server.model_id

    async def prepare(request: Request, chat: bool):
        from starlette.concurrency import run_in_threadpool
        body = await _read_json(request)
        model_name = check_model(body)
        _reject_unsupported(body, chat)
        stream = _get_bool(body, "stream", False)
        include_usage = _stream_options(body, stream)
        sampling = _sampling(body)
        stop = _get_stop(body)
        if chat:
            key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
            max_tokens = _get_int(body, key, None, lo=1)
            src, param = _messages(body), "messages"
            echo = False
        else:
            max_tokens = _get_int(body, "max_tokens", 16, lo=1)
            src, param = _prompt(body, server.vocab), "prompt"
            echo = _get_bool(body, "echo", False)
        try:
            if chat:
                ids = await run_in_threadpool(server.tokens_for_chat, src)
            elif isinstance(src, str) and len(src) <= 4096:
                ids = server.tokens_for_text(src)   # microseconds: not worth a thread hop
            elif isinstance(src, str):
                ids = await run_in_threadpool(server.tokens_for_text, src)
            else:
                ids = src
        except (ValueError, TypeError, UnicodeError) as e:
            raise _bad(f"'{param}': {e}"[:500], param, "invalid_value") from None
        if len(ids) >= server.max_context:
            raise _bad(f"This model's maximum context length is {server.max_context} tokens; the "
                       f"{param} has {len(ids)} tokens, which leaves no room to generate. Shorten the "
                       f"{param}.", param, "context_length_exceeded")
        room = server.max_context - len(ids)
        max_tokens = room if max_tokens is None else min(max_tokens, room)
        echo_text = ""
        if echo:
            echo_text = src if isinstance(src, str) else await run_in_threadpool(server.detokenize, src)
        job = _Job(ids, max_tokens, sampling, stop)
        return job, model_name, stream, include_usage, echo_text

    async def run_collect(request: Request, job: _Job):
        """Runs a job to the end; None if the client went away first (the job is then stopped).
        An engine error is raised as an OpenAI error, never a crash."""
        async def collect():
            text, info = [], None
            async for kind, val in server.events(job):
                if kind == "piece":
                    text.append(val)
                elif kind == "done":
                    info = val
                else:
                    raise val
            return "".join(text), info

        work = asyncio.ensure_future(collect())
        watch = asyncio.ensure_future(_wait_disconnect(request))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                job.cancel.set()
                work.cancel()
                await asyncio.wait({work})
        if work.cancelled():
            return None
        try:
            return work.result()
        except Exception as e:  # noqa: BLE001 - answered as an OpenAI error, never a crash
            raise _error_from_exception(e) from None

    def stream_response(job: _Job, first_chunks: list[dict], make_chunk, make_final, include_usage: bool):
        async def gen():
            for c in first_chunks:
                yield _sse(c)
            try:
                async for kind, val in server.events(job):
                    if kind == "piece":
                        if val:
                            yield _sse(make_chunk(val))
                    elif kind == "done":
                        yield _sse(make_final(val["finish_reason"]))
                        if include_usage:
                            u = make_final(None)
                            u["choices"] = []
                            u["usage"] = _usage(val)
                            yield _sse(u)
                    else:
                        yield _sse(_error_from_exception(val).body())
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - reported in the stream
                yield _sse(_error_from_exception(e).body())
            yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/completions")
    async def completions(request: Request):
        job, model_name, stream, include_usage, echo_text = await prepare(request, chat=False)
        cid, created = "cmpl-" + uuid.uuid4().hex, int(time.time())

        def chunk(text, finish=None):
            c = {"id": cid, "object": "text_completion", "created": created, "model": model_name,
                 "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}
            if include_usage:
                c["usage"] = None
            return c

        if stream:
            first = [chunk(echo_text)] if echo_text else []
            return stream_response(job, first, chunk, lambda fr: chunk("", fr), include_usage)
        res = await run_collect(request, job)
        if res is None:
            return Response(status_code=499)
        text, info = res
        return {"id": cid, "object": "text_completion", "created": created, "model": model_name,
                "choices": [{"text": echo_text + text, "index": 0, "logprobs": None,
                             "finish_reason": info["finish_reason"]}],
                "usage": _usage(info)}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        job, model_name, stream, include_usage, _ = await prepare(request, chat=True)
        cid, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())

        def chunk(delta, finish=None):
            c = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model_name,
                 "system_fingerprint": None,
                 "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            if include_usage:
                c["usage"] = None
            return c

        if stream:
            first = [chunk({"role": "assistant", "content": ""})]
            return stream_response(job, first, lambda t: chunk({"content": t}), lambda fr: chunk({}, fr),
                                   include_usage)
        res = await run_collect(request, job)
        if res is None:
            return Response(status_code=499)
        text, info = res
        return {"id": cid, "object": "chat.completion", "created": created, "model": model_name,
                "system_fingerprint": None,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": None, "finish_reason": info["finish_reason"]}],
                "usage": _usage(info)}

    return app


def serve(model=None, host: str = "127.0.0.1", port: int = 8080, backend: str = "auto",
          max_context: int = 4096, parallel: int = 1, threads: int | None = None,
          alias: str | None = None, log_level: str = "info") -> None:
    """Load the model (one instance per slot) and serve it until interrupted."""
    import sys

    import uvicorn
    server = Server.load(model, backend=backend, max_context=max_context, parallel=parallel,
                         threads=threads, alias=alias)
    print(f"markbase serve: {server.model_id} ({server.models[0]._e.backend}, context "
          f"{server.max_context}, {server.parallel} slot(s)) on http://{host}:{port}/v1", file=sys.stderr,
          flush=True)
    uvicorn.run(create_app(server), host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=3)
