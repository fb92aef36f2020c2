"""markbase.Model: load a Gemma model and generate from it (API.md is the contract)."""
from __future__ import annotations

import codecs
import json
import operator
import os
import time
from typing import Iterator

import numpy as np

from . import _core, hub
from .chat import render_chat



class Model:
    """A loaded model. Create it with Model.load()."""

    def __init__(self, engine: _core.Engine, path: str, hf_tokenizer=None, hf_dir: str | None = None):
        self._e = engine
        self.path = path
        self._hf_tok = hf_tokenizer
        self._hf_dir = hf_dir
        self._stats: dict = {}
        self._eog = set(self._find_eog_ids())

    # ---- loading
    @classmethod
    def load(cls, path: str | os.PathLike | None = None, backend: str = "auto", threads: int | None = None,
             max_context: int = 4096, quant: str | None = None, kv_cache: str = "f16",
             precise: bool = False, prefill_chunk: int | None = None, progress: bool = False,
             match_llamacpp: bool = False) -> "Model":
        """Load a .gguf file (the first of a split one), a Hugging Face directory or Hub repository
        id ("owner/name", fetched by huggingface_hub), or (path=None) the default model.

        backend: "auto" | "cpu" | "metal" | "cuda"; quant: None | "q8_0" | "q4_0" (Hugging Face
        float weights); kv_cache: "f16" | "f32"; precise: float32 activations everywhere;
        prefill_chunk: tokens per prefill step (None: the backend's choice, 2048 on CUDA and 256
        elsewhere); match_llamacpp (CPU backend, x86-64 with AVX2): compute as llama.cpp's CPU
        backend does, rounding for rounding, so that logits agree with llama.cpp's bit for bit
        on the GGUF tensor types it covers (Q8_0, Q5_0, Q4_0, Q4_K, Q6_K, F16, F32; Gemma 4
        experts Q8_0, Q5_0, Q4_0) and prefill runs in llama.cpp's 512-token micro-batches unless
        prefill_chunk says otherwise."""
        if path is None:
            from .default_model import default_model_path
            path = default_model_path(progress=progress)
        path = os.fspath(path)
        if hub.is_repo_id(path):
            path = hub.snapshot(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"No such file or directory: '{path}'")
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= 1024):
            raise ValueError(f"threads must be an integer in [1, 1024] or None, got {threads!r}")
        if not isinstance(max_context, int) or isinstance(max_context, bool) or not 1 <= max_context < 2**31:
            raise ValueError(f"max_context must be an integer in [1, 2**31), got {max_context!r}")
        if quant is not None and quant not in ("q8_0", "q4_0"):
            raise ValueError(f"quant must be None, 'q8_0' or 'q4_0', got {quant!r}")
        if kv_cache not in ("f16", "f32"):
            raise ValueError(f"kv_cache must be 'f16' or 'f32', got {kv_cache!r}")
        if backend not in ("auto", "cpu", "metal", "cuda"):
            raise ValueError(f"backend must be 'auto', 'cpu', 'metal' or 'cuda', got {backend!r}")
        if prefill_chunk is not None and (not isinstance(prefill_chunk, int) or isinstance(prefill_chunk, bool)
                                          or prefill_chunk < 1):
            raise ValueError(f"prefill_chunk must be a positive integer, got {prefill_chunk!r}")
        engine = _core.Engine(path, backend=backend, threads=threads or 0, max_context=max_context,
                              quant=quant or "", kv_cache=kv_cache, precise=precise,
                              prefill_chunk=prefill_chunk or 0, match_llamacpp=bool(match_llamacpp))
        hf_tok = None
        hf_dir = None
        if os.path.isdir(path):
            hf_dir = path
            tj = os.path.join(path, "tokenizer.json")
            if not os.path.exists(tj):
                raise _core.FormatError(f"{path}: no tokenizer.json")
            from tokenizers import Tokenizer
            try:
                hf_tok = Tokenizer.from_file(tj)
            except Exception as e:
                raise _core.FormatError(f"{tj}: cannot be read by the tokenizers library: {e}") from e
        return cls(engine, path, hf_tok, hf_dir)

    # ---- metadata
    @property
    def config(self) -> dict:
        return self._e.config

    def _hf_json(self, name: str) -> dict:
        p = os.path.join(self._hf_dir, name)
        if not os.path.exists(p):
            return {}
        with open(p, encoding="utf-8") as f:
            try:
                return json.load(f)
            except json.JSONDecodeError as e:
                raise _core.FormatError(f"{p}: invalid JSON: {e}") from e

    def _find_eog_ids(self):
        if self._hf_tok is None:
            return list(self._e.eog_ids())
        ids = set()
        cfg = self._hf_json("config.json")
        for src in (cfg, cfg.get("text_config", {}), self._hf_json("generation_config.json")):
            e = src.get("eos_token_id") if isinstance(src, dict) else None
            if isinstance(e, int):
                ids.add(e)
            elif isinstance(e, list):
                ids.update(x for x in e if isinstance(x, int))
        for text in ("<eos>", "<end_of_turn>", "</s>", "<turn|>"):
            t = self._hf_tok.token_to_id(text)
            if t is not None:
                ids.add(t)
        return sorted(ids)

    @property
    def bos_id(self) -> int | None:
        if self._hf_tok is None:
            return self._e.bos_id()
        for text in ("<bos>", "<s>"):
            t = self._hf_tok.token_to_id(text)
            if t is not None:
                return t
        c = self._hf_json("config.json")
        return c.get("bos_token_id", c.get("text_config", {}).get("bos_token_id"))

    # ---- tokens
    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if self._hf_tok is None:
            return list(self._e.tokenize(text, add_bos, special))
        ids = self._hf_tok.encode(text, add_special_tokens=False).ids
        bos = self.bos_id
        if add_bos and bos is not None:
            ids = [bos] + ids
        return list(ids)

    def _check_ids(self, ids, what: str = "token ids") -> list[int]:
        # Integers only (Python's or numpy's): a float or a bool is a caller's mistake, not an id.
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise TypeError(f"{what} must be a sequence of integer token ids, got {type(ids).__name__}")
        V = self.config["vocab_size"]
        out = []
        for i in ids:
            try:
                if isinstance(i, bool):
                    raise TypeError
                i = operator.index(i)
            except TypeError:
                raise TypeError(f"token ids must be integers, got {i!r}") from None
            if i < 0 or i >= V:
                raise ValueError(f"token id {i} is outside the vocabulary of {V}")
            out.append(i)
        return out

    def _detok_bytes(self, ids) -> bytes:
        if self._hf_tok is None:
            return self._e.detokenize_bytes(ids)
        return self._hf_tok.decode(ids, skip_special_tokens=True).encode("utf-8")

    def detokenize(self, ids) -> str:
        ids = self._check_ids(ids)
        return self._detok_bytes(ids).decode("utf-8", errors="replace")

    # ---- forward
    def logits(self, ids) -> np.ndarray:
        """float32 [len(ids), vocab]: one forward of the whole sequence from an empty cache."""
        ids = self._check_ids(ids)
        if not ids:
            raise ValueError("logits: need at least one token id")
        if len(ids) > self._e.max_context:
            raise ValueError(f"{len(ids)} tokens exceed the context of {self._e.max_context} tokens (max_context)")
        return self._e.logits(ids)

    # ---- generation
    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_bos=True)
        else:
            ids = self._check_ids(prompt, what="the prompt, if not a str,")
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) >= self._e.max_context:
            raise ValueError(f"the prompt has {len(ids)} tokens, which does not leave room in the "
                             f"context of {self._e.max_context} tokens (max_context)")
        return ids

    @staticmethod
    def _check_sampling(max_tokens, kw):
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        seed = kw.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64):
            raise ValueError(f"seed must be an integer in [0, 2**64) or None, got {seed!r}")
        top_k = kw.get("top_k", 0)
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise ValueError(f"top_k must be an integer >= 0, got {top_k!r}")
        for k in ("temperature", "top_p", "min_p", "repeat_penalty"):
            v = kw.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ValueError(f"{k} must be a number, got {v!r}")

    def generate_tokens(self, prompt_ids, max_tokens: int = 128, temperature: float = 0.8, top_k: int = 0,
                        top_p: float = 1.0, min_p: float = 0.0, repeat_penalty: float = 1.0,
                        seed: int | None = None) -> Iterator[int]:
        """Token ids, stopping at max_tokens, an end-of-generation token or a full context."""
        kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repeat_penalty=repeat_penalty, seed=seed)
        self._check_sampling(max_tokens, kw)
        # A top_k beyond the vocabulary keeps every token, as top_k = vocabulary size does (and
        # fits the engine's 32-bit argument).
        kw["top_k"] = min(top_k, self.config["vocab_size"])
        ids = self._prompt_ids(prompt_ids)
        # Validate sampling arguments now, not at the first next().
        _core.check_sampling(float(temperature), int(kw["top_k"]), float(top_p), float(min_p),
                             float(repeat_penalty), seed)
        return self._token_iter(ids, max_tokens, kw)

    def _token_iter(self, ids, max_tokens, kw) -> Iterator[int]:
        t0 = time.perf_counter()
        tok = self._e.begin(ids, float(kw["temperature"]), int(kw["top_k"]), float(kw["top_p"]),
                            float(kw["min_p"]), float(kw["repeat_penalty"]), kw["seed"])
        t1 = time.perf_counter()
        n = 0
        self._stats = dict(prompt_tokens=len(ids), generated_tokens=0,
                           prefill_tok_s=len(ids) / max(t1 - t0, 1e-9), decode_tok_s=0.0,
                           host_waits_per_token=self._e.waits_per_token, kernels_per_token=0,
                           backend=self._e.backend, finish_reason="length")
        while True:
            if tok in self._eog:
                self._stats["finish_reason"] = "stop"
                return
            n += 1
            self._stats["generated_tokens"] = n
            yield tok
            if n >= max_tokens:
                return
            if self._e.position >= self._e.max_context:
                return
            tok = self._e.next()
            dt = time.perf_counter() - t1
            self._stats["decode_tok_s"] = n / max(dt, 1e-9)
            self._stats["kernels_per_token"] = self._e.ops_per_token

    def generate(self, prompt, max_tokens: int = 128, temperature: float = 0.8, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, repeat_penalty: float = 1.0,
                 seed: int | None = None, stop=None, stream: bool = False):
        """The completion text, or with stream=True an iterator of text pieces."""
        if stop is None:
            stops = []
        elif isinstance(stop, str):
            stops = [stop]
        elif isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
            stops = list(stop)
        else:
            raise ValueError(f"stop must be a string, a list of strings or None, got {stop!r}")
        stops = [s for s in stops if s]
        tokens = self.generate_tokens(prompt, max_tokens, temperature, top_k, top_p, min_p,
                                      repeat_penalty, seed)
        it = self._text_iter(tokens, stops)
        return it if stream else "".join(it)

    def _text_iter(self, tokens: Iterator[int], stops: list[str]) -> Iterator[str]:
        """Text pieces that never split a UTF-8 character, cut at the first stop string."""
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        hold = ""            # text held back because it may be the start of a stop string
        keep = max((len(s) for s in stops), default=1) - 1
        gen = []
        prev_text = ""
        for tok in tokens:
            if self._hf_tok is None:  # the token's piece, as llama.cpp's programs print it
                piece = dec.decode(self._e.token_piece_bytes(tok))
            else:
                gen.append(tok)
                full = self._hf_tok.decode(gen, skip_special_tokens=True)
                if full.endswith("\ufffd"):
                    continue
                piece, prev_text = full[len(prev_text):], full
            hold += piece
            for s in stops:
                i = hold.find(s)
                if i >= 0:
                    if hold[:i]:
                        yield hold[:i]
                    self._stats["finish_reason"] = "stop"
                    tokens.close()
                    return
            if len(hold) > keep:
                cut = len(hold) - keep
                yield hold[:cut]
                hold = hold[cut:]
        hold += dec.decode(b"", final=True)
        if hold:
            yield hold

    def chat(self, messages, max_tokens: int = 128, **kw):
        """Reply to a conversation ([{"role": "user", "content": "..."}]) using the model's template."""
        stream = kw.pop("stream", False)
        stop = kw.pop("stop", None)
        ids = self.chat_tokens(messages)
        return self.generate(ids, max_tokens=max_tokens, stop=stop, stream=stream, **kw)

    def chat_template(self) -> str | None:
        if self._hf_tok is None:
            t = self._e.metadata_value("tokenizer.chat_template")
            return t if isinstance(t, str) else None
        tc = self._hf_json("tokenizer_config.json")
        t = tc.get("chat_template")
        if isinstance(t, str):
            return t
        p = os.path.join(self._hf_dir, "chat_template.jinja")
        if os.path.exists(p):
            with open(p, encoding="utf-8") as f:
                return f.read()
        return None

    def chat_tokens(self, messages) -> list[int]:
        text = render_chat(messages, self.chat_template(), bos_text=self._bos_text())
        # The template writes the BOS text itself (or not); never add a second one.
        ids = self.tokenize(text, add_bos=False, special=True)
        bos = self.bos_id
        if bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        return ids

    def _bos_text(self) -> str:
        bos = self.bos_id
        if bos is None:
            return ""
        if self._hf_tok is None:
            return self._e.token_text(bos)
        return self._hf_tok.id_to_token(bos) or ""

    def stats(self) -> dict:
        return dict(self._stats)

    def __repr__(self) -> str:
        c = self.config
        return f"<markbase.Model {c['architecture']} {c['n_layers']} layers on {self._e.backend}: {self.path}>"
