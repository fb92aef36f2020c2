"""Synthetic Gemma 4 GGUFs of the published shapes (bench/make_synthetic_gguf.py), scaled down to a
few layers and a small vocabulary, loaded by MarkBase and by llama.cpp (llama-cpp-python).

For each case the file is generated into tmp_path (and deleted after), then:
  - markbase.open lists exactly the tensors the generator wrote, with numpy-order shapes and the
    expected types (including llama.cpp's K-quant shape fallback, e.g. Q4_K -> Q5_0 for
    ffn_down of 26B-A4B, ne0 = 2112), and the Gemma 4 metadata keys;
  - llama.cpp loads it (its Gemma 4 loader is the oracle for "llama.cpp-compatible": per-layer
    arrays, KV-sharing producer rule, MoE tensor layouts, the "gemma4" tokenizer vocabulary);
  - both engines run the same teacher-forced random token sequence (F32 KV cache on both); the
    argmax of the logits must agree at >= 98 % of the positions, the mean KL(llama.cpp || MarkBase)
    must be <= 0.01, and no logit may be NaN/inf.
The generator makes the random models confident (see its docstring: the input token's own logit
stands ~6.6 logit stds above the mean, so the argmax is mostly the input token, while the rest of
the distribution, which the layers determine, is checked by the KL and relative-error bounds),
because with quantized weights the two engines differ by
~2-5 % in the logits (activation quantization turns their tiny float differences, e.g. llama.cpp's
fp16 GELU table, into whole quantization steps), which on an i.i.d.-random model flips the argmax
at several % of the positions.

Measured on 2 busy cores: the whole file takes ~45 s (generation ~7 s, the rest is the two
engines' prefill; the MoE and the 576-token E2B cases dominate); the files written (up to 0.9 GB)
are deleted as soon as both engines are done with them.
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

import markbase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import make_synthetic_gguf as msg  # noqa: E402

VOCAB = 4096
MIN_TOP1 = 0.98
MAX_KL = 0.01
MAX_REL = 0.10   # measured 1.4e-2..2.4e-2 (quantized activations; see the module docstring)

CASES = {
    # id: (preset, layers, type, extra kwargs, n_tokens)
    # E2B: PLE, KV sharing (layers 2,3 reuse 0 (sliding) and 1 (full)), double-wide MLP on the
    # shared layers; 576 tokens > the 512-token sliding window
    "e2b-4L-q4_0": ("e2b", 4, "q4_0", {}, 576),
    # E4B: KV sharing with only a full consumer (types s,F,F), Q8_0
    "e4b-3L-q8_0": ("e4b", 3, "q8_0", {}, 256),
    # 26B-A4B: MoE (128 experts, top 8), attention_k_eq_v, per-layer KV-head counts, Q4_K with the
    # Q5_0 fallback on ffn_down (2112) and ffn_down_exps (704)
    "26b-2L-q4_k": ("26b-a4b", 2, "q4_k", {}, 256),
    # llama-quantize's Q4_K_M choices (--mix): layer 0's attn_v Q6_K (the only attn_v of two
    # layers), layer 1's ffn_down and ffn_down_exps Q6_K -> Q8_0 (704 and 2112 wide), layer 0's
    # Q5_0: down products of two types in one file
    "26b-2L-q4_k_m": ("26b-a4b", 2, None, {"mix": "q4_k_m"}, 256),
    # 26B-A4B dense-equivalent (experts replaced by one 7744-wide MLP)
    "26b-dense-eq-2L-q4_0": ("26b-a4b", 2, "q4_0", {"dense_equivalent": True}, 256),
    # Gemma 3 270M shape (llama.cpp's gemma3, "llama" vocabulary): 5 sliding layers and a full one,
    # Q4_K with the Q5_0 fallback on the 640-wide rows (as in the real Q4_K_M file); 576 tokens
    "gemma3-270m-6L-q4_k": ("gemma3-270m", 6, "q4_k", {}, 576),
}


@pytest.fixture(scope="module")
def llama_cpp():
    return pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")


def _token_ids(summary, n, seed=1):
    rng = np.random.default_rng(seed)
    lo = summary["first_normal_token"]
    return [summary["bos_id"]] + [int(x) for x in rng.integers(lo, summary["vocab"], n - 1)]


def _log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _check_file(path, summary):
    f = markbase.open(str(path))
    want = summary["tensors"]
    assert set(f.tensors) == set(want), (set(f.tensors) ^ set(want))
    for name, info in want.items():
        t = f.tensors[name]
        assert tuple(t.shape) == tuple(info["shape"]), (name, t.shape, info["shape"])
        assert t.type == info["type"], (name, t.type, info["type"])
    md = f.metadata
    L = summary["n_layers"]
    assert len(md["tokenizer.ggml.tokens"]) == summary["vocab"]
    if summary["preset"].startswith("gemma3"):
        assert md["general.architecture"] == "gemma3" and md["tokenizer.ggml.model"] == "llama"
        assert md["gemma3.block_count"] == L and "rope_freqs.weight" not in f.tensors
    else:
        assert md["general.architecture"] == "gemma4"
        assert md["tokenizer.ggml.model"] == "gemma4"
        assert md["gemma4.block_count"] == L
        assert list(md["gemma4.attention.sliding_window_pattern"]) == summary["sliding"]
        assert md["gemma4.attention.shared_kv_layers"] == summary["shared_kv_layers"]
        # rope_freqs as the converter writes it
        rf = np.asarray(f.read("rope_freqs.weight"))
        assert rf.shape == (256,) and np.all(rf[:64] == 1.0) and np.all(rf[64:] == np.float32(1e30))
    # a quantized matrix of the requested spread
    w = np.asarray(f.read("blk.0.attn_q.weight"))
    assert np.isfinite(w).all() and 0.015 < w.std() < 0.025 and abs(w.mean()) < 1e-3, w.std()
    n = np.asarray(f.read("blk.0.attn_norm.weight"))
    assert abs(float(n.mean()) - 1.0) < 0.05


@pytest.mark.parametrize("case", list(CASES))
def test_synthetic_gguf_llama_cpp_vs_markbase(case, tmp_path, llama_cpp):
    preset, layers, qtype, extra, n_tok = CASES[case]
    path = tmp_path / f"{case}.gguf"
    summary = msg.write_synthetic_gguf(str(path), preset=preset, layers=layers, vocab=VOCAB,
                                       qtype=qtype, **extra)
    try:
        assert os.path.getsize(path) == summary["file_bytes"]
        _check_file(path, summary)
        ids = _token_ids(summary, n_tok)

        llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_tok + 8, n_batch=n_tok + 8,
                              n_ubatch=n_tok + 8, n_threads=2, n_threads_batch=2,
                              logits_all=True, verbose=False, flash_attn=False,
                              type_k=0, type_v=0)  # F32 K/V cache, as kv_cache="f32"
        assert llm.n_vocab() == VOCAB
        text = "the model window cache"
        want_tok = llm.tokenize(text.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(ids)
        ref = np.array(llm.scores[:n_tok], dtype=np.float32)
        del llm

        m = markbase.Model.load(str(path), backend="cpu", kv_cache="f32", threads=2)
        assert list(m.tokenize(text, add_bos=True, special=False)) == want_tok
        got = np.asarray(m.logits(ids))
        del m
    finally:
        path.unlink(missing_ok=True)

    assert got.shape == ref.shape == (n_tok, VOCAB)
    assert np.isfinite(ref).all(), "llama.cpp produced NaN/inf"
    assert np.isfinite(got).all(), "MarkBase produced NaN/inf"
    lr, lg = _log_softmax(ref), _log_softmax(got)
    kl = (np.exp(lr) * (lr - lg)).sum(-1)
    agree = ref.argmax(-1) == got.argmax(-1)
    top2 = np.sort(ref, -1)[:, -2:]
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    report = (f"{case}: top-1 agreement {agree.mean():.4f}, mean KL {kl.mean():.2e} "
              f"(max {kl.max():.2e}), relative error {rel:.3e}, llama.cpp logit std "
              f"{ref.std(-1).mean():.2f}, mean top-1 prob {np.exp(lr.max(-1)).mean():.2f}, "
              f"margins at disagreements {(top2[:, 1] - top2[:, 0])[~agree][:8]}")
    print(report)
    # the next-token distribution is not flat and the logits have a real spread
    assert ref.std(-1).mean() > 1.0, report
    assert np.exp(lr.max(-1)).mean() > 0.2, report
    assert agree.mean() >= MIN_TOP1, report
    # The argmax is mostly the input token (by design), so the argmax check alone would miss a
    # wrong layer (one wrong ffn_down in the last layer of e2b-4L: top-1 still 99.6 %), the
    # distribution checks do not (that same error: mean KL 0.14, relative error 0.51).
    assert kl.mean() <= MAX_KL, report
    assert rel <= MAX_REL, report


# ---------------------------------------------------------------------------------------------
# shapes, layer patterns and types without writing files (dry runs)


def _llama_producer(summary, i):
    """llama.cpp's hard-coded KV-sharing producer of layer i (src/llama-model.cpp)."""
    first = summary["n_layers"] - summary["shared_kv_layers"]
    return first - (2 if summary["sliding"][i] else 1)


@pytest.mark.parametrize("preset", list(msg.PRESETS))
@pytest.mark.parametrize("layers", [None, 2, 3, 4, 5, 7, 12])
def test_layer_pattern_and_kv_sharing(preset, layers):
    s = msg.write_synthetic_gguf("unused.gguf", preset=preset, layers=layers, vocab=1024,
                                 dry_run=True)
    L = s["n_layers"]
    if preset.startswith("gemma3"):  # llama.cpp's gemma3: full exactly when (i + 1) % 6 == 0
        assert s["sliding"] == [(i + 1) % 6 != 0 for i in range(L)]
        assert s["shared_kv_layers"] == 0
        return
    assert not s["sliding"][-1], "the last layer is full"
    if s["shared_kv_layers"]:
        first = L - s["shared_kv_layers"]
        assert first >= 2
        for i in range(first, L):
            p = _llama_producer(s, i)
            # llama.cpp's rule picks the last non-shared layer of the same type (transformers')
            same = [j for j in range(first) if s["sliding"][j] == s["sliding"][i]]
            assert p == max(same), (i, p, same)
            # consumers have no K/V weights
            assert f"blk.{i}.attn_k.weight" not in s["tensors"]
            assert f"blk.{i}.attn_q.weight" in s["tensors"]
    if layers is None:  # the published layouts (gemma4-arch.md section 3)
        full = [i for i, sw in enumerate(s["sliding"]) if not sw]
        pub = {"e2b": (list(range(4, 35, 5)), 20), "e4b": (list(range(5, 42, 6)), 18),
               "26b-a4b": (list(range(5, 30, 6)), 0), "31b": (list(range(5, 60, 6)), 0)}
        assert (full, s["shared_kv_layers"]) == pub[preset]


def test_published_shapes():
    s = msg.write_synthetic_gguf("unused.gguf", preset="26b-a4b", qtype="q4_k", dry_run=True)
    t = s["tensors"]
    assert s["vocab"] == 262144 and t["token_embd.weight"]["shape"] == [262144, 2816]
    assert t["blk.5.attn_q.weight"]["shape"] == [8192, 2816]
    assert t["blk.5.attn_k.weight"]["shape"] == [1024, 2816]
    assert "blk.5.attn_v.weight" not in t                  # attention_k_eq_v on full layers
    assert t["blk.0.attn_v.weight"]["shape"] == [2048, 2816]
    assert t["blk.0.ffn_gate_up_exps.weight"]["shape"] == [128, 1408, 2816]
    assert t["blk.0.ffn_down_exps.weight"]["shape"] == [128, 2816, 704]
    assert t["blk.0.ffn_gate_inp.weight"] == {"shape": [128, 2816], "type": "F32"}
    assert t["blk.0.ffn_down_exps.scale"] == {"shape": [128], "type": "F32"}
    assert t["blk.0.ffn_gate_inp.scale"] == {"shape": [2816], "type": "F32"}
    # llama.cpp's fallback: ne0 2112 and 704 are not multiples of 256
    assert t["blk.0.ffn_down.weight"]["type"] == "Q5_0"
    assert t["blk.0.ffn_down_exps.weight"]["type"] == "Q5_0"
    assert t["blk.0.ffn_gate.weight"]["type"] == "Q4_K"
    assert abs(s["params"] / 1e9 - 25.2) < 0.1

    e2b = msg.write_synthetic_gguf("unused.gguf", preset="e2b", dry_run=True)
    t = e2b["tensors"]
    assert t["per_layer_token_embd.weight"]["shape"] == [262144, 35 * 256]
    assert t["per_layer_model_proj.weight"] == {"shape": [35 * 256, 1536], "type": "F16"}
    assert t["blk.4.attn_q.weight"]["shape"] == [4096, 1536]
    assert t["blk.0.attn_k.weight"]["shape"] == [256, 1536]
    assert t["blk.14.ffn_gate.weight"]["shape"] == [6144, 1536]
    assert t["blk.15.ffn_gate.weight"]["shape"] == [12288, 1536]   # double-wide on shared layers
    assert "blk.15.attn_k.weight" not in t


def _tensor_bytes(t, name):
    """Bytes of tensor `name` in a summary's tensors dict: its rows of its type."""
    shape, ty = t[name]["shape"], t[name]["type"].lower()
    return math.prod(shape[:-1]) * msg.row_bytes(ty, shape[-1])


@pytest.mark.parametrize("qtype", ["q4_0", "q4_k", "q8_0", "q6_k"])
def test_dense_equivalent_bytes(qtype):
    moe = msg.write_synthetic_gguf("unused.gguf", preset="26b-a4b", qtype=qtype, dry_run=True)
    dense = msg.write_synthetic_gguf("unused.gguf", preset="26b-a4b", qtype=qtype,
                                     dense_equivalent=True, dry_run=True)
    info = dense["dense_equivalent_info"]
    assert info["width"] == 2112 + 8 * 704 == 7744
    tm, td = moe["tensors"], dense["tensors"]
    assert td["blk.0.ffn_gate.weight"]["shape"] == [7744, 2816]
    assert not any("exps" in k or "gate_inp" in k for k in td)

    mlp = sum(_tensor_bytes(tm, f"blk.0.ffn_{k}.weight") for k in ("gate", "up", "down"))
    experts = (_tensor_bytes(tm, "blk.0.ffn_gate_up_exps.weight")
               + _tensor_bytes(tm, "blk.0.ffn_down_exps.weight")) // 128
    dense_mlp = sum(_tensor_bytes(td, f"blk.0.ffn_{k}.weight") for k in ("gate", "up", "down"))
    assert dense_mlp == mlp + 8 * experts == info["target_bytes_per_layer"]


@pytest.mark.parametrize("qtype", ["q4_0", "q8_0"])
def test_one_expert_twin_bytes(qtype):
    """--one-expert keeps the MoE block whole, with one expert of top_k times the width taken by
    every token: the experts' bytes a token are the top-k experts' of the MoE model."""
    moe = msg.write_synthetic_gguf("unused.gguf", preset="26b-a4b", qtype=qtype, dry_run=True)
    one = msg.write_synthetic_gguf("unused.gguf", preset="26b-a4b", qtype=qtype, one_expert=True,
                                   dry_run=True)
    assert (one["experts"], one["top_k"], one["expert_ffn"]) == (1, 1, 8 * 704)
    tm, to = moe["tensors"], one["tensors"]
    assert to["blk.0.ffn_gate_up_exps.weight"]["shape"] == [1, 2 * 5632, 2816]
    assert to["blk.0.ffn_gate_inp.weight"]["shape"] == [1, 2816]
    assert set(tm) == set(to)  # the same tensors: router, norms, dense MLP, experts

    for name in ("blk.0.ffn_gate_up_exps.weight", "blk.0.ffn_down_exps.weight"):
        assert _tensor_bytes(to, name) == _tensor_bytes(tm, name) // 128 * 8
    with pytest.raises(ValueError, match="one-expert"):
        msg.write_synthetic_gguf("unused.gguf", preset="e4b", one_expert=True, dry_run=True)


def test_use_more_bits_rule():
    """llama-quantize's use_more_bits, written out for 30 and 42 layers (first and last eighth,
    every third layer between)."""
    assert [i for i in range(30) if msg.use_more_bits(i, 30)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    assert [i for i in range(42) if msg.use_more_bits(i, 42)] == \
        [0, 1, 2, 3, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 36, 37, 38, 39, 40, 41]


def _check_mix_layers(t, base, down, n_layers, more_bits_down, experts=True):
    """A K-quant mix's per-layer types in the tensors t: ffn_down (and ffn_down_exps) more_bits_down
    on llama-quantize's use_more_bits layers, else `down` (the base type, or its fallback where the
    row is not whole 256-blocks); attn_q (and the experts' gate/up) the base type."""
    for i in range(n_layers):
        d = more_bits_down if msg.use_more_bits(i, n_layers) else down
        assert t[f"blk.{i}.ffn_down.weight"]["type"] == d, i
        assert t[f"blk.{i}.attn_q.weight"]["type"] == base, i
        if experts:
            assert t[f"blk.{i}.ffn_down_exps.weight"]["type"] == d, i
            assert t[f"blk.{i}.ffn_gate_up_exps.weight"]["type"] == base, i


def test_mix_q4_k_m_types():
    """--mix q4_k_m on the published 26B-A4B and E4B shapes: Q4_K, a Q6_K tied embedding, Q6_K
    attn_v on the use_more_bits positions among the layers that have one, Q6_K ffn_down on the
    use_more_bits layers (Q8_0 where the row is not whole 256-blocks); the dense-equivalent keeps
    every layer's bytes."""
    s = msg.write_synthetic_gguf("unused.gguf", preset="26b-a4b", mix="q4_k_m", dry_run=True)
    t = s["tensors"]
    assert s["type"] == "q4_k" and t["token_embd.weight"]["type"] == "Q6_K"
    v_layers = [i for i in range(30) if f"blk.{i}.attn_v.weight" in t]
    assert len(v_layers) == 25                      # none on the 5 full (k = v) layers
    for j, i in enumerate(v_layers):
        assert t[f"blk.{i}.attn_v.weight"]["type"] == ("Q6_K" if msg.use_more_bits(j, 25) else "Q4_K"), i
    _check_mix_layers(t, "Q4_K", "Q5_0", 30, "Q8_0")
    assert t["blk.0.ffn_gate_inp.weight"]["type"] == "F32"
    # --tensor-type still wins over the mix
    s2 = msg.write_synthetic_gguf("unused.gguf", preset="26b-a4b", mix="q4_k_m", dry_run=True,
                                  tensor_types=["attn_v=q8_0"])
    assert s2["tensors"]["blk.0.attn_v.weight"]["type"] == "Q8_0"

    e4b = msg.write_synthetic_gguf("unused.gguf", preset="e4b", mix="q4_k_m", dry_run=True)["tensors"]
    _check_mix_layers(e4b, "Q4_K", "Q4_K", 42, "Q6_K", experts=False)
    assert sum(f"blk.{i}.attn_v.weight" in e4b for i in range(42)) == 24   # 18 KV-shared layers

    dense = msg.write_synthetic_gguf("unused.gguf", preset="26b-a4b", mix="q4_k_m", dense_equivalent=True,
                                     dry_run=True)
    info = dense["dense_equivalent_info"]
    assert info["dense_bytes"] == info["target_bytes"]
    td = dense["tensors"]
    for i in (0, 3):  # a Q8_0-down layer and a Q5_0-down one
        assert td[f"blk.{i}.ffn_down.weight"]["type"] == t[f"blk.{i}.ffn_down.weight"]["type"]
    with pytest.raises(ValueError, match="unknown mix"):
        msg.write_synthetic_gguf("unused.gguf", preset="26b-a4b", mix="q3_k_m", dry_run=True)


def test_mix_q5_k_m_types():
    """--mix q5_k_m: the same choices with Q5_K, whose fallback for rows that are not whole
    256-blocks is Q5_1 (26B-A4B's 2112- and 704-wide down rows off the use_more_bits layers)."""
    t = msg.write_synthetic_gguf("unused.gguf", preset="26b-a4b", mix="q5_k_m", dry_run=True)["tensors"]
    assert t["token_embd.weight"]["type"] == "Q6_K"
    _check_mix_layers(t, "Q5_K", "Q5_1", 30, "Q8_0")
    e4b = msg.write_synthetic_gguf("unused.gguf", preset="e4b", mix="q5_k_m", dry_run=True)["tensors"]
    _check_mix_layers(e4b, "Q5_K", "Q5_K", 42, "Q6_K", experts=False)


def test_fallback_rule():
    assert msg.fallback_type("q4_k", 2112) == "q5_0"
    assert msg.fallback_type("q5_k", 704) == "q5_1"
    assert msg.fallback_type("q6_k", 704) == "q8_0"
    assert msg.fallback_type("q4_k", 2816) == "q4_k"
    assert msg.fallback_type("q4_0", 48) == "f16"
    assert msg.fallback_type("q4_k", 48) == "f16"


def test_cpu_dump_env(tmp_path):
    """MARKBASE_CPU_DUMP=DIR (the op-by-op debugging aid): one float32 file per op of every step,
    named <op index>_<label>_<rows>x<cols>.f32, whose bytes are the op's output slot; the last
    op of a prefill holds the logits the API returns."""
    import subprocess
    path = tmp_path / "e2b.gguf"
    summary = msg.write_synthetic_gguf(str(path), preset="e2b", layers=2, vocab=1024, qtype="q8_0", narrow=True)
    dump = tmp_path / "dump"
    dump.mkdir()
    ids = _token_ids(summary, 5)
    code = ("import sys, numpy as np, markbase\n"
            "m = markbase.Model.load(sys.argv[1], backend='cpu', threads=1)\n"
            "np.save(sys.argv[2], np.asarray(m.logits([int(x) for x in sys.argv[3].split(',')])))\n")
    env = dict(os.environ, MARKBASE_CPU_DUMP=str(dump))
    subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "logits.npy"), ",".join(map(str, ids))],
                   check=True, env=env, timeout=300)
    files = sorted(os.listdir(dump))
    assert any("attn_q.weight" in f for f in files), files
    for f in files:
        r, c = map(int, f.rsplit("_", 1)[1][:-4].split("x"))
        assert os.path.getsize(dump / f) == 4 * r * c, f
    logits = np.load(tmp_path / "logits.npy")
    last = [f for f in files if f.rsplit("_", 1)[1][:-4] == f"{len(ids)}x{summary['vocab']}"]
    assert last, files
    got = np.fromfile(dump / last[-1], np.float32).reshape(len(ids), -1)
    np.testing.assert_array_equal(got, logits)
