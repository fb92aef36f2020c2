"""Tiny Gemma 3 / Gemma 4 models converted to GGUF by llama.cpp's own converter, run in MarkBase,
and compared with transformers and (when llama-cpp-python is importable) llama.cpp itself.

The converter is `convert_hf_to_gguf.py` with its `conversion/` package and `gguf-py/`, taken from
the llama-cpp-python source distribution (vendor/llama.cpp), version LLAMA_CPP_PYTHON_VERSION:
  - MARKBASE_LLAMA_CPP_SDIST=<path to the .tar.gz, or to an extracted tree> selects it;
  - otherwise the sdist is looked for in the cache directory (MARKBASE_TEST_CACHE, default
    ~/.cache/markbase-tests) and, if absent, fetched there with `pip download`;
  - the tests skip (saying why) only when neither works.
The converter needs torch, transformers, sentencepiece and protobuf (Gemma 3's tokenizer.model).

Models (tests/tiny_gemma.py):
  - gemma4: dense, PLE, KV sharing (E2B-like layout: the only one llama.cpp accepts),
    double-wide MLP; converted from the published multimodal layout (Gemma4ForConditionalGeneration).
  - gemma4_moe: MoE + attention_k_eq_v + own KV-head count on full layers; published layout.
  - gemma3: Gemma3ForCausalLM in the one shape a Gemma 3 GGUF can describe: llama.cpp stores no
    query_pre_attn_scalar (it uses 1/sqrt(head_dim)) and the converter writes no per-layer
    sliding pattern (llama.cpp assumes 5 sliding : 1 full), so this model has
    query_pre_attn_scalar == head_dim and layers s,s,s,s,s,f. Linear RoPE scaling (x8) on the full
    layer is kept (written as gemma3.rope.scaling.*).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest

import tiny_gemma as tg

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
ENV_SDIST = "MARKBASE_LLAMA_CPP_SDIST"
ENV_CACHE = "MARKBASE_TEST_CACHE"
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")

PROMPT_LEN = 20
N_NEW = 16          # several sliding windows (4..6)
MIN_MARGIN = 0.03   # greedy choices win by >= 0.03 in the logits: llama.cpp's fp16 GELU table and
                    # other approximations move logits by up to ~5e-3, they must not flip a choice
MB_TOL = 1e-4       # MarkBase on the F32 GGUF vs transformers (same weights as the HF directory)
LLAMA_TOL = 5e-3    # llama.cpp vs transformers, F32 KV cache: measured 4.8e-4..7.8e-4 (fp16-table
                    # GELU and other ggml approximations); with llama.cpp's default F16 cache ~3e-3

GGUF_MODELS = {
    # name: (kind, config overrides, layout converted)
    "gemma3": ("gemma3", dict(layer_types=["sliding_attention"] * 5 + ["full_attention"],
                              query_pre_attn_scalar=16), "causal"),
    "gemma4": ("gemma4", {}, "conditional"),
    "gemma4_moe": ("gemma4_moe", {}, "conditional"),
}

# ---------------------------------------------------------------------------------------------
# locating llama.cpp's converter


def _cache_dir() -> str:
    d = os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache",
                                                   "markbase-tests")
    os.makedirs(d, exist_ok=True)
    return d


def _converter_in_tree(d: str) -> str | None:
    for c in (d, os.path.join(d, "vendor", "llama.cpp"),
              os.path.join(d, f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}", "vendor",
                           "llama.cpp")):
        if (os.path.isfile(os.path.join(c, "convert_hf_to_gguf.py"))
                and os.path.isdir(os.path.join(c, "gguf-py"))):
            return c
    return None


def _extract_converter(tar_path: str) -> str:
    """Extract convert_hf_to_gguf.py, conversion/ and gguf-py/ of the sdist's vendor/llama.cpp
    into the cache (once per tarball) and return that llama.cpp directory."""
    st = os.stat(tar_path)
    key = hashlib.sha256(f"{os.path.realpath(tar_path)}:{st.st_size}:{st.st_mtime_ns}".encode())
    dest = os.path.join(_cache_dir(), "converter-" + key.hexdigest()[:16])
    found = _converter_in_tree(dest)
    if found and os.path.exists(os.path.join(dest, ".complete")):
        return found
    tmp = f"{dest}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(tar_path) as tf:
        members = []
        for m in tf.getmembers():
            parts = m.name.split("/")
            if len(parts) < 4 or parts[1:3] != ["vendor", "llama.cpp"]:
                continue
            rest = "/".join(parts[3:])
            if (m.isfile() or m.isdir()) and any(
                    rest == p or (p.endswith("/") and rest.startswith(p)) for p in CONVERTER_PARTS):
                members.append(m)
        if not any(m.name.endswith("/convert_hf_to_gguf.py") for m in members):
            raise FileNotFoundError(f"{tar_path}: no vendor/llama.cpp/convert_hf_to_gguf.py")
        try:
            tf.extractall(tmp, members=members, filter="data")
        except TypeError:  # Python without extraction filters
            tf.extractall(tmp, members=members)
    open(os.path.join(tmp, ".complete"), "w").close()
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return _converter_in_tree(dest)


def _download_sdist() -> str:
    cache = _cache_dir()
    found = glob.glob(os.path.join(cache, SDIST_NAME))
    if found:
        return found[0]
    # --no-binary only for llama-cpp-python: its build dependencies (needed to read the sdist's
    # metadata) may come as wheels; ':all:' would compile cmake from source.
    cmd = [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
           "--no-deps", "--no-binary", "llama-cpp-python", "--retries", "1", "--timeout", "30",
           "-d", cache]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"llama.cpp converter unavailable: `{' '.join(cmd)}` failed ({e}); "
                    f"set {ENV_SDIST}=<{SDIST_NAME} or its extracted tree>")
    found = glob.glob(os.path.join(cache, SDIST_NAME))
    if p.returncode != 0 or not found:
        tail = (p.stdout + p.stderr)[-1500:]
        pytest.skip(f"llama.cpp converter unavailable: `{' '.join(cmd)}` failed "
                    f"(rc={p.returncode}): {tail}\nset {ENV_SDIST}=<{SDIST_NAME} or its extracted tree>")
    return found[0]


@pytest.fixture(scope="module")
def llama_cpp_converter() -> str:
    """Directory holding llama.cpp's convert_hf_to_gguf.py, conversion/ and gguf-py/."""
    src = os.environ.get(ENV_SDIST)
    if src:
        if os.path.isdir(src):
            found = _converter_in_tree(src)
            if not found:
                pytest.fail(f"{ENV_SDIST}={src}: no convert_hf_to_gguf.py + gguf-py/ in it, "
                            "nor under vendor/llama.cpp")
            return found
        if not os.path.isfile(src):
            pytest.fail(f"{ENV_SDIST}={src}: no such file or directory")
        return _extract_converter(src)
    return _extract_converter(_download_sdist())


# ---------------------------------------------------------------------------------------------
# conversion

_DRIVER = r"""
import json, os, runpy, sys
conv, jobs = sys.argv[1], json.load(open(sys.argv[2]))
sys.path.insert(0, os.path.dirname(os.path.abspath(conv)))
for argv in jobs:            # the converter's own command line, once per model, in one process
    sys.argv = [conv] + argv
    runpy.run_path(conv, run_name="__main__")
"""


class GGUFModel:
    def __init__(self, name, kind, hf_dir, gguf):
        self.name, self.kind, self.hf_dir, self.gguf = name, kind, hf_dir, gguf
        self.hf = tg.load_hf(hf_dir)
        self.ids, self.greedy, self.pick_info = tg.pick_prompt(
            self.hf, PROMPT_LEN, N_NEW, seed=PROMPT_LEN + 1, min_margin=MIN_MARGIN)
        self.seq = self.ids + self.greedy          # prompt + greedy continuation
        self.logits = tg.hf_logits(self.hf, self.seq)  # [len(seq), V]

    @property
    def vocab_size(self):
        return tg.text_config(self.hf).vocab_size


@pytest.fixture(scope="module")
def gguf_models(llama_cpp_converter, tmp_path_factory) -> dict[str, GGUFModel]:
    try:
        import sentencepiece  # noqa: F401  (Gemma 3's tokenizer.model, read by the converter)
        from google import protobuf  # noqa: F401
    except ImportError as e:
        pytest.fail(f"llama.cpp's converter needs sentencepiece and protobuf: {e}")
    root = tmp_path_factory.mktemp("tiny_gguf")
    jobs, dirs = [], {}
    for name, (kind, overrides, layout) in GGUF_MODELS.items():
        d = str(root / name)
        tg.save_model(tg.build_model(kind, **overrides), d, layout=layout)
        if kind == "gemma3":  # the converter's Gemma 3 vocabulary path wants tokenizer.model
            with open(os.path.join(d, "tokenizer.model"), "wb") as f:
                f.write(tg.sentencepiece_model(os.path.join(d, "tokenizer.json")))
        out = str(root / f"{name}.gguf")
        jobs.append([d, "--outtype", "f32", "--outfile", out])
        dirs[name] = (kind, d, out)
    with open(root / "jobs.json", "w") as f:
        json.dump(jobs, f)
    with open(root / "driver.py", "w") as f:
        f.write(_DRIVER)
    conv = os.path.join(llama_cpp_converter, "convert_hf_to_gguf.py")
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}  # use its own gguf-py
    p = subprocess.run([sys.executable, str(root / "driver.py"), conv, str(root / "jobs.json")],
                       capture_output=True, text=True, timeout=600, env=env)
    if p.returncode != 0:
        pytest.fail(f"convert_hf_to_gguf.py failed (rc={p.returncode}):\n{(p.stdout + p.stderr)[-4000:]}")
    return {name: GGUFModel(name, kind, d, out) for name, (kind, d, out) in dirs.items()}


# ---------------------------------------------------------------------------------------------
# helpers

def _load_mb(mb, path, **kw):
    kw.setdefault("backend", "cpu")
    kw.setdefault("kv_cache", "f32")
    return mb.Model.load(str(path), **kw)


@pytest.fixture(scope="module")
def llama_cpp():
    return pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")


def _llama(llama_cpp, path, n_ctx=64, **kw):
    args = dict(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=2,
                logits_all=True, verbose=False, seed=0, flash_attn=False,
                type_k=0, type_v=0)  # 0 = GGML_TYPE_F32: F32 K/V cache, as MarkBase's kv_cache="f32"
    args.update(kw)
    return llama_cpp.Llama(**args)


def _llama_run(llm, ids, n_new):
    """llama.cpp logits of the prompt (one batch) and its own greedy decoding with its KV cache."""
    llm.reset()
    llm.eval(ids)
    prompt_logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
    last, toks = prompt_logits[-1], []
    for _ in range(n_new):
        t = int(np.argmax(last))
        toks.append(t)
        llm.eval([t])
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return prompt_logits, toks


NAMES = list(GGUF_MODELS)

# ---------------------------------------------------------------------------------------------
# MarkBase on the converted GGUF vs transformers


@pytest.mark.parametrize("name", NAMES)
def test_markbase_gguf_matches_transformers(gguf_models, markbase_module, name):
    g = gguf_models[name]
    m = _load_mb(markbase_module, g.gguf, prefill_chunk=7)
    got = np.asarray(m.logits(g.seq))
    assert got.dtype == np.float32 and got.shape == g.logits.shape, (got.dtype, got.shape)
    err = tg.rel_err(got, g.logits)
    assert err <= MB_TOL, f"{name}: MarkBase(GGUF) vs transformers relative error {err:.3e}"
    toks = list(m.generate_tokens(g.ids, max_tokens=N_NEW, temperature=0))
    tg.check_greedy(toks, g.greedy, f"{name}: MarkBase(GGUF)")


@pytest.mark.parametrize("name", NAMES)
def test_markbase_gguf_tensors_readable(gguf_models, llama_cpp_converter, markbase_module, name):
    """markbase.open() lists every tensor the converter wrote, with numpy-order shapes, and reads
    the same values as llama.cpp's gguf-py reader."""
    g = gguf_models[name]
    reader = _gguf_reader(g.gguf, llama_cpp_converter)
    f = markbase_module.open(g.gguf)
    assert f.metadata["general.architecture"] == ("gemma3" if g.kind == "gemma3" else "gemma4")
    names = {t.name for t in reader.tensors}
    assert set(f.tensors) == names
    for t in reader.tensors:
        want = np.asarray(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
        assert tuple(f.tensors[t.name].shape) == want.shape, t.name
        np.testing.assert_array_equal(np.asarray(f.read(t.name)), want, err_msg=t.name)


def _gguf_reader(path, converter_dir):
    try:
        from gguf import GGUFReader
    except ImportError:  # the converter's own copy of gguf-py
        sys.path.append(os.path.join(converter_dir, "gguf-py"))
        from gguf import GGUFReader
    return GGUFReader(str(path))


# ---------------------------------------------------------------------------------------------
# llama.cpp itself (oracle check) and MarkBase vs llama.cpp


@pytest.mark.parametrize("name", NAMES)
def test_llama_cpp_matches_transformers(gguf_models, llama_cpp, name):
    """The converted file means what transformers computes, in llama.cpp's own reading."""
    g = gguf_models[name]
    llm = _llama(llama_cpp, g.gguf)
    logits, toks = _llama_run(llm, g.ids, N_NEW)
    err = tg.rel_err(logits, g.logits[: len(g.ids)])
    assert err <= LLAMA_TOL, f"{name}: llama.cpp vs transformers relative error {err:.3e}"
    assert toks == g.greedy, f"{name}: llama.cpp greedy {toks} != transformers {g.greedy}"


@pytest.mark.parametrize("name", NAMES)
def test_markbase_gguf_matches_llama_cpp(gguf_models, llama_cpp, markbase_module, name):
    g = gguf_models[name]
    llm = _llama(llama_cpp, g.gguf)
    ll_logits, ll_toks = _llama_run(llm, g.ids, N_NEW)
    m = _load_mb(markbase_module, g.gguf, prefill_chunk=7)
    got = np.asarray(m.logits(g.ids))
    err = tg.rel_err(got, ll_logits)
    assert err <= LLAMA_TOL, f"{name}: MarkBase vs llama.cpp relative error {err:.3e}"
    toks = list(m.generate_tokens(g.ids, max_tokens=N_NEW, temperature=0))
    tg.check_greedy(toks, ll_toks, f"{name}: MarkBase vs llama.cpp")


TEXTS = ["The capital of France is Paris.", "the model window cache", "  two  spaces ",
         "Sliding expert router, decode; prefill!", "héllo wörld", "<eos> is plain text here"]


@pytest.mark.parametrize("name", NAMES)
def test_tokenize_matches_llama_cpp(gguf_models, llama_cpp, markbase_module, name):
    from tokenizers import Tokenizer

    g = gguf_models[name]
    llm = _llama(llama_cpp, g.gguf, vocab_only=True)
    hf = Tokenizer.from_file(os.path.join(g.hf_dir, "tokenizer.json"))
    m = _load_mb(markbase_module, g.gguf)
    for text in TEXTS:
        want = llm.tokenize(text.encode(), add_bos=True, special=False)
        assert list(m.tokenize(text, add_bos=True, special=False)) == want, text
        if "<" not in text:  # tokenizers' encode always parses special tokens
            assert hf.encode(text).ids == want, text


# ---------------------------------------------------------------------------------------------
# a GGUF split into several files (the converter's --split-max-tensors, as gguf-split writes them)


@pytest.fixture(scope="module")
def split_gguf(gguf_models, llama_cpp_converter, tmp_path_factory):
    """gemma4 converted again, split into files of at most 40 tensors: (first file, all files)."""
    root = tmp_path_factory.mktemp("split_gguf")
    conv = os.path.join(llama_cpp_converter, "convert_hf_to_gguf.py")
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    p = subprocess.run([sys.executable, conv, gguf_models["gemma4"].hf_dir, "--outtype", "f32",
                        "--outfile", str(root / "g4.gguf"), "--split-max-tensors", "40"],
                       capture_output=True, text=True, timeout=600, env=env)
    if p.returncode != 0:
        pytest.fail(f"convert_hf_to_gguf.py --split-max-tensors failed:\n{(p.stdout + p.stderr)[-4000:]}")
    files = sorted(str(f) for f in root.glob("g4-*-of-*.gguf"))
    assert len(files) >= 3 and files[0].endswith("-00001-of-%05d.gguf" % len(files)), files
    return files[0], files


def test_split_gguf_reads_as_the_whole_file(gguf_models, split_gguf, markbase_module):
    """The first file of a split GGUF opens the others: the same tensors and the same logits as the
    unsplit conversion."""
    first, files = split_gguf
    g = gguf_models["gemma4"]
    whole, split = markbase_module.open(g.gguf), markbase_module.open(first)
    assert set(split.tensors) == set(whole.tensors)
    for name in whole.tensors:
        np.testing.assert_array_equal(np.asarray(split.read(name)), np.asarray(whole.read(name)), err_msg=name)
    want = np.asarray(_load_mb(markbase_module, g.gguf).logits(g.ids))
    np.testing.assert_array_equal(np.asarray(_load_mb(markbase_module, first).logits(g.ids)), want)


def test_split_gguf_in_llama_cpp(gguf_models, split_gguf, llama_cpp):
    """The split files are llama.cpp's own: it loads them from the first and computes what it
    computes on the unsplit file."""
    g = gguf_models["gemma4"]
    want, _ = _llama_run(_llama(llama_cpp, g.gguf), g.ids, 0)
    got, _ = _llama_run(_llama(llama_cpp, split_gguf[0]), g.ids, 0)
    np.testing.assert_array_equal(got, want)


def test_split_gguf_errors(split_gguf, markbase_module, tmp_path):
    """Another split than the first, a missing split, and a first split under another name: each
    a clear error naming the file."""
    first, files = split_gguf
    with pytest.raises(markbase_module.FormatError, match="split 2 of .*open the first"):
        markbase_module.Model.load(files[1], backend="cpu")
    d = tmp_path / "missing"
    d.mkdir()
    for f in files[:1] + files[2:]:
        shutil.copy(f, d)
    with pytest.raises(FileNotFoundError, match="split 2 of .* is missing"):
        markbase_module.Model.load(str(d / os.path.basename(first)), backend="cpu")
    renamed = tmp_path / "renamed.gguf"
    shutil.copy(first, renamed)
    with pytest.raises(markbase_module.FormatError, match="cannot be found"):
        markbase_module.open(str(renamed))


def _llama_piece(llama_cpp, vocab, token: int) -> bytes:
    import ctypes
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
    assert n >= 0
    return buf.raw[:n]


@pytest.mark.parametrize("name", NAMES)
def test_generated_text_is_llama_cpp_pieces(gguf_models, llama_cpp, markbase_module, name):
    """Generated text is each token's piece as llama.cpp's programs print it
    (llama_token_to_piece, special=false): for every token of the vocabulary, and the text of a
    greedy generation. Not llama_detokenize's text, which for BPE vocabularies (gemma4) also drops
    the space before punctuation across the whole text (Model.detokenize does that, as it does)."""
    g = gguf_models[name]
    llm = _llama(llama_cpp, g.gguf, vocab_only=True)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    m = _load_mb(markbase_module, g.gguf)
    for t in range(g.vocab_size):
        assert m._e.token_piece_bytes(t) == _llama_piece(llama_cpp, vocab, t), t
    toks = list(m.generate_tokens(g.ids, max_tokens=N_NEW, temperature=0))
    text = m.generate(g.ids, max_tokens=N_NEW, temperature=0)
    want = b"".join(_llama_piece(llama_cpp, vocab, t) for t in toks).decode("utf-8", errors="replace")
    assert text == want
