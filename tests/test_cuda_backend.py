"""The CUDA backend (cpp/backend/cuda) against the CPU backend.

Both run in precise mode (float32 activations) with the same kv_cache, so only kernel arithmetic
differs: logits must agree within 1e-3 relative error (L2 over all rows) and greedy tokens must be
identical. Covered: tiny Gemma 3, Gemma 4 dense (PLE, KV sharing, double-wide MLP, proportional
RoPE) and Gemma 4 MoE models (tests/tiny_gemma.py) through the prefill kernels (chunks of 16
tokens, ring caches wrapping) and through the decode kernels and graph replay (chunks of 1);
every tensor type on synthetic GGUFs; a Gemma 3 270M-shaped and a Gemma 4 26B-A4B-shaped model
(fewer layers); the decode attention past 2048 positions; on-device sampling; the MoE
host-routing debug switch.

Where there is no usable NVIDIA GPU (or the build has no CUDA backend), backend="cuda" must raise
markbase.BackendError, and every GPU test skips with the reason.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import markbase
from backend_check import RANDOM_SHAPE_IDS, RANDOM_SHAPES, random_shape_model, rel_err

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_REL = 1e-3


def _nvcc():
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")
    if nvcc is None:
        pytest.skip("no nvcc here: the CUDA headers' host checks need it")
    return nvcc


def _host_build(tmp_path_factory, main):
    """tests/<main>.cu built with nvcc as host code (no GPU needed to run it)."""
    exe = tmp_path_factory.mktemp("cuda_host") / main
    subprocess.run([_nvcc(), "-std=c++17", "-O1", "--expt-relaxed-constexpr", "-I", os.path.join(ROOT, "cpp"),
                    os.path.join(ROOT, "tests", main + ".cu"), "-o", str(exe)], check=True)
    return str(exe)


@pytest.fixture(scope="module")
def units_exe(tmp_path_factory):
    return _host_build(tmp_path_factory, "cuda_units_main")


def test_k4_scale_unpacking_against_gguf(tmp_path_factory):
    """The decode units' Q4_K / Q5_K 6-bit scales and minimums (q8.cuh's k4_scale_min, and
    k4_scale_min_pair: the paired units' two sub-blocks at once, branch-free) against the gguf
    package's Q4_K unpacking, on random headers and the all-zero / all-one ones. Host code built
    with nvcc: runs without a GPU (CI), skips where there is no nvcc."""
    gguf_quants = pytest.importorskip("gguf.quants")
    exe = _host_build(tmp_path_factory, "cuda_k4_scales_main")
    rng = np.random.default_rng(7)
    headers = np.concatenate([np.zeros((1, 12), np.uint8), np.full((1, 12), 255, np.uint8),
                              rng.integers(0, 256, (4000, 12), dtype=np.uint8)])
    out = subprocess.run([exe], input=headers.tobytes(), capture_output=True, check=True).stdout
    got = np.array(out.split(), dtype=np.int64).reshape(len(headers), 8, 4)
    want_sc, want_min = (np.asarray(a).reshape(len(headers), 8).astype(np.int64)
                         for a in gguf_quants.Q4_K.get_scale_min(headers))
    for col, want in [(0, want_sc), (1, want_min), (2, want_sc), (3, want_min)]:
        np.testing.assert_array_equal(got[:, :, col], want)


# GGML block layouts for random blocks: (type id, block bytes, weights a block, byte offsets of
# the f16 fields (scales, minimums), the rows' alignment in memory).
UNIT_BLOCKS = {"q4_0": (2, 18, 32, [0], 2), "q4_1": (3, 20, 32, [0, 2], 4), "q5_0": (6, 22, 32, [0], 2),
               "q5_1": (7, 24, 32, [0, 2], 8), "q8_0": (8, 34, 32, [0], 2), "q4_k": (12, 144, 256, [0, 2], 16),
               "q5_k": (13, 176, 256, [0, 2], 16), "q6_k": (14, 210, 256, [208], 2)}


@pytest.mark.parametrize("qtype", list(UNIT_BLOCKS))
def test_q8_units_against_gguf_dequantize(units_exe, qtype):
    """Every block type's decode units (q8.cuh: the weight loads in their widths, the decoding, the
    paired K-quant units, the dp4a dot against the 8-bit activations), built as host code, against
    the gguf package's dequantizer: rows of random blocks (random codes, scales and minimums; sane
    f16 factors) dotted with random 8-bit activations. Rows follow each other as in a weight, so
    their starts take every alignment the block size allows; the staged LM head's loads from
    shared memory run too, with the rows at every offset their alignment allows inside a 16-byte
    line (its copy starts where the row does), and for Q5_0 the MoE down kernel's whole-block loads
    (4-byte words around 2-byte aligned blocks, funnel-shifted), from every row start its
    alignment allows. Runs without a GPU (CI)."""
    gguf = pytest.importorskip("gguf")
    type_id, block, per, f16_at, align = UNIT_BLOCKS[qtype]
    ggml = gguf.GGMLQuantizationType[qtype.upper()]
    rng = np.random.default_rng(type_id)
    K = 768 if per == 256 else 800  # 3 super-blocks / 25 blocks: odd counts, so row starts move
    rows = 6
    blocks = rng.integers(0, 256, (rows * K // per, block), dtype=np.uint8)
    for at in f16_at:
        f = (rng.uniform(0.002, 0.05, len(blocks)) * rng.choice([-1.0, 1.0], len(blocks))).astype(np.float16)
        blocks[:, at:at + 2] = f.view(np.uint8).reshape(-1, 2)
    data = blocks.reshape(rows, -1)
    want_w = np.asarray(gguf.quants.dequantize(data, ggml), dtype=np.float64).reshape(rows, K)
    xq = rng.integers(-127, 128, K, dtype=np.int8)
    xd = rng.uniform(0.001, 0.02, K // 32).astype(np.float32)
    x = xq.astype(np.float64) * np.repeat(xd.astype(np.float64), 32)
    want = want_w @ x
    scale = np.abs(want_w * x).sum(axis=1)
    worst = 0.0
    modes = [(0, [0]), (1, range(0, 16, align))] + ([(2, range(0, 16, align))] if qtype == "q5_0" else [])
    for mode, offsets in modes:
        for off in offsets:
            inp = np.array([type_id, K, rows, data.shape[1], off, mode], np.int32).tobytes() + data.tobytes() + \
                xq.tobytes() + xd.tobytes()
            out = subprocess.run([units_exe], input=inp, capture_output=True, check=True).stdout
            got = np.array(out.split(), dtype=np.float64)
            assert got.shape == (rows,)
            err = np.abs(got - want) / scale
            assert err.max() < 1e-6, (qtype, mode, off, err)  # float32 sums: ~2e-8 measured
            worst = max(worst, float(err.max()))
    print(f"{qtype}: largest error relative to sum |w x| {worst:.2e}")  # bench/RESULTS.md quotes these (-s)


@pytest.fixture(scope="module")
def cuda_error(tiny_models):
    """None when backend='cuda' loads here, else the BackendError's message."""
    try:
        markbase.Model.load(tiny_models["gemma3"].path, backend="cuda")
    except markbase.BackendError as e:
        return str(e)
    return None


@pytest.fixture(scope="module")
def need_cuda(cuda_error):
    if cuda_error is not None:
        pytest.skip(f"no usable CUDA backend here: {cuda_error}")


def test_cuda_unavailable_raises_backend_error(cuda_error):
    if cuda_error is None:
        pytest.skip("a CUDA GPU is present: backend='cuda' loads")
    assert "cuda" in cuda_error.lower(), cuda_error


def _pair(path, kv, chunk=16, precise=True, **kw):
    cpu = markbase.Model.load(path, backend="cpu", precise=True, kv_cache=kv, prefill_chunk=chunk, **kw)
    gpu = markbase.Model.load(path, backend="cuda", precise=precise, kv_cache=kv, prefill_chunk=chunk, **kw)
    return cpu, gpu


def _greedy(m, ids, n):
    return list(m.generate_tokens(ids, max_tokens=n, temperature=0.0))


@pytest.mark.parametrize("kv", ["f16", "f32"])
@pytest.mark.parametrize("chunk", [16, 1], ids=["prefill", "decode"])
@pytest.mark.parametrize("kind", ["gemma3", "gemma4", "gemma4_moe"])
def test_tiny_models_match_cpu(need_cuda, tiny_models, kind, chunk, kv):
    tm = tiny_models[kind]
    ids = tm.prompt(24, 8)  # longer than the sliding windows (4-6): ring caches wrap
    cpu, gpu = _pair(tm.path, kv, chunk)
    want, got = np.asarray(cpu.logits(ids)), np.asarray(gpu.logits(ids))
    assert np.isfinite(got).all()
    err = rel_err(got, want)
    assert err < MAX_REL, f"{kind} chunk={chunk} kv={kv}: relative error {err:.2e}"
    assert _greedy(gpu, ids, 8) == _greedy(cpu, ids, 8)
    st = gpu.stats()
    assert st["host_waits_per_token"] == 1, st
    assert st["kernels_per_token"] > 0, st


@pytest.mark.parametrize("kind,seed", RANDOM_SHAPES, ids=RANDOM_SHAPE_IDS)
def test_random_shape_matches_cpu(need_cuda, tmp_path, kind, seed):
    """Shapes the fixed tiny models do not have (backend_check.RANDOM_SHAPES), through the prefill
    kernels (chunks of 5) and the decode graph."""
    path, ids = random_shape_model(tmp_path, kind, seed)
    cpu, gpu = _pair(path, "f32", 5)
    err = rel_err(np.asarray(gpu.logits(ids)), np.asarray(cpu.logits(ids)))
    assert err < MAX_REL, f"{kind} seed {seed}: relative error {err:.2e}"
    assert _greedy(gpu, ids, 8) == _greedy(cpu, ids, 8)
    assert gpu.stats()["host_waits_per_token"] == 1


@pytest.mark.parametrize("kind", ["gemma3", "gemma4_moe"])
def test_tiny_models_fast_mode(need_cuda, tiny_models, kind):
    """Default (not precise) mode: prefill tiles go through f16 tensor cores; looser bound."""
    tm = tiny_models[kind]
    ids = tm.prompt(24, 8)
    cpu, gpu = _pair(tm.path, "f16", 16, precise=False)
    err = rel_err(np.asarray(gpu.logits(ids)), np.asarray(cpu.logits(ids)))
    assert err < 2e-2, f"{kind}: relative error {err:.2e}"
    assert _greedy(gpu, ids, 8) == _greedy(cpu, ids, 8)


def test_device_sampling(need_cuda, tiny_models):
    """On-device sampling: greedy is the arg-max of the logits (the host sampler's choice);
    seeded draws repeat; the cuts keep the draw among the allowed tokens."""
    tm = tiny_models["gemma4"]
    ids = tm.prompt(24, 8)
    m = markbase.Model.load(tm.path, backend="cuda", precise=True, kv_cache="f32")
    toks = _greedy(m, ids, 6)
    seq = list(ids)
    for t in toks:
        assert int(np.argmax(np.asarray(m.logits(seq))[-1])) == t
        seq.append(t)
    kw = dict(max_tokens=12, temperature=0.9, top_k=5, top_p=0.9, min_p=0.05, repeat_penalty=1.2, seed=7)
    a = list(m.generate_tokens(ids, **kw))
    b = list(m.generate_tokens(ids, **kw))
    assert a == b
    seq = list(ids)
    for t in list(m.generate_tokens(ids, max_tokens=8, temperature=1.0, top_k=3, seed=3)):
        top3 = np.argsort(-np.asarray(m.logits(seq))[-1])[:3]
        assert t in top3
        seq.append(t)
    assert m.stats()["host_waits_per_token"] == 1


def _sampler_expectation(logits, history, temperature, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
    """The token distribution runtime/sampler.cpp defines (the host sampler), from one logits row:
    {token: probability} over the tokens its cuts keep."""
    l = np.asarray(logits, dtype=np.float64).copy()
    if repeat_penalty != 1.0:
        for t in set(history[-64:]):
            l[t] = l[t] / repeat_penalty if l[t] > 0 else l[t] * repeat_penalty
    order = np.lexsort((np.arange(len(l)), -l))  # by logit descending, lower id first on ties
    c = order[:top_k] if 0 < top_k < len(l) else order
    p1 = np.exp(l[c] - l[c[0]])
    n = len(c)
    if top_p < 1.0:
        n = int(np.argmax(np.cumsum(p1 / p1.sum()) >= top_p)) + 1
    if min_p > 0.0:
        keep = 1
        while keep < n and p1[keep] / p1[0] >= min_p:
            keep += 1
        n = keep
    w = np.exp((l[c[:n]] - l[c[0]]) / temperature)
    return {int(t): float(q) for t, q in zip(c[:n], w / w.sum())}


@pytest.mark.parametrize("model", ["tiny", "wide-vocab"])
def test_device_sampling_distribution(need_cuda, tiny_models, tmp_path, model):
    """The device sampler's draws follow the distribution the host sampler defines: the first
    token after a prompt, drawn under 400 seeds, for top-k at temperature 1, top-p with min-p at
    0.7, and top-k with a repeat penalty on the prompt's tokens: no token outside the kept set, and
    each kept token's frequency within 5 standard errors of its probability. The tiny model's
    vocabulary is one block of the sampler's launch; the synthetic file's 65541 tokens are spread
    over 64 blocks (grid-wide histograms and barriers)."""
    import collections
    if model == "tiny":
        tm = tiny_models["gemma4"]
        ids, path = list(tm.prompt(24, 8)), tm.path
    else:
        gguf, summary, rng = _synthetic(tmp_path, "e2b-sampler", preset="e2b", layers=2, vocab=65541, qtype="q8_0")
        ids, path = _ids(summary, 8, rng), str(gguf)
    m = markbase.Model.load(path, backend="cuda", precise=True, kv_cache="f32")
    logits = np.asarray(m.logits(ids))[-1]
    n = 400
    for kw in [dict(temperature=1.0, top_k=4), dict(temperature=0.7, top_p=0.6, min_p=0.05),
               dict(temperature=1.3, top_k=6, repeat_penalty=3.0)]:
        want = _sampler_expectation(logits, ids, **kw)
        got = collections.Counter(next(iter(m.generate_tokens(ids, max_tokens=1, seed=s, **kw))) for s in range(n))
        assert set(got) <= set(want), (kw, sorted(set(got) - set(want)))
        for t, p in want.items():
            assert abs(got[t] / n - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-9, (kw, t, got[t] / n, p)
    assert m.stats()["host_waits_per_token"] == 1


def _run_with_env(code: str, env: dict) -> str:
    e = dict(os.environ, **env)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _json_with_env(code: str, env: dict):
    """The JSON value on the last line that `code` prints, run with `env` added."""
    import json
    return json.loads(_run_with_env(code, env).strip().splitlines()[-1])


def _decode_fingerprint(path, ids, env: dict, n_tokens: int = 4) -> dict:
    """Decodes ids one token at a time (default mode) in a subprocess run with env added: the
    SHA-256 of the logits' bytes, the greedy tokens after them, whether the logits are finite, the
    kernels a token and the model's config."""
    code = (f"import markbase, numpy as np, hashlib, json\n"
            f"m = markbase.Model.load({str(path)!r}, backend='cuda', prefill_chunk=1)\n"
            f"l = np.asarray(m.logits({ids!r}))\n"
            f"t = list(m.generate_tokens({ids!r}, max_tokens={n_tokens}, temperature=0.0))\n"
            "print(json.dumps(dict(sha=hashlib.sha256(l.tobytes()).hexdigest(), tokens=t, "
            "finite=bool(np.isfinite(l).all()), kernels=m.stats()['kernels_per_token'], config=m.config)))")
    return _json_with_env(code, env)


def _fingerprints_match(path, ids, env: dict, base: dict | None = None) -> tuple[dict, dict]:
    """Decode fingerprints of the file at path with the defaults (or the settings base) and with env
    added (the file is deleted after): finite logits, and the same bits and tokens both ways.
    Returns both."""
    base = base or {}
    on = _decode_fingerprint(path, ids, base)
    other = _decode_fingerprint(path, ids, {**base, **env})
    path.unlink(missing_ok=True)
    assert on["finite"]
    assert (on["sha"], on["tokens"]) == (other["sha"], other["tokens"])
    return on, other


def test_host_routing_switch(need_cuda, tiny_models):
    """MARKBASE_CUDA_HOST_ROUTING=1 reads the router's top-k back in every MoE layer: same
    tokens, one extra host wait per MoE layer."""
    tm = tiny_models["gemma4_moe"]
    ids = tm.prompt(24, 8)
    code = (f"import markbase, json\nm = markbase.Model.load({tm.path!r}, backend='cuda', precise=True)\n"
            f"t = list(m.generate_tokens({list(ids)!r}, max_tokens=6, temperature=0.0))\n"
            "print(json.dumps([t, m.stats()['host_waits_per_token'], m.config['n_layers']]))")
    dev = _json_with_env(code, {"MARKBASE_CUDA_HOST_ROUTING": "0"})
    host = _json_with_env(code, {"MARKBASE_CUDA_HOST_ROUTING": "1"})
    assert dev[0] == host[0]
    assert dev[1] == 1
    assert host[1] == 1 + dev[2], (host, dev)


def test_decode_trace(need_cuda, tiny_models):
    """MARKBASE_CUDA_TRACE=1 (common.cuh, cuda_backend.cpp): every kernel stamps the global timer
    as it passes its programmatic wait, and the backend prints each op's time on the critical path
    when it is destroyed. The tokens are those without the trace, and every run's stamps match its
    kernels (none skipped)."""
    import json
    tm = tiny_models["gemma4_moe"]
    ids = tm.prompt(24, 8)
    code = (f"import markbase, json, gc\nm = markbase.Model.load({tm.path!r}, backend='cuda')\n"
            f"t = list(m.generate_tokens({list(ids)!r}, max_tokens=6, temperature=0.0))\n"
            "print(json.dumps(t))\ndel m\ngc.collect()")
    out = {}
    for flag in ("0", "1"):
        r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, MARKBASE_CUDA_TRACE=flag),
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        out[flag] = (json.loads(r.stdout.strip().splitlines()[-1]), r.stderr.splitlines())
    assert out["1"][0] == out["0"][0]
    assert not any(line.startswith("[cuda trace]") for line in out["0"][1])
    head = [line for line in out["1"][1] if line.startswith("[cuda trace] op")]
    assert head and "skipped: 0)" in head[0] and "(runs: 0," not in head[0], out["1"][1]
    total = [line for line in out["1"][1] if line.startswith("[cuda trace] total")]
    assert total and float(total[0].split()[-1]) > 0, out["1"][1]


# ---- synthetic GGUFs: every tensor type, and the published shapes (fewer layers)

def _synthetic(tmp_path, name, **kw):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import make_synthetic_gguf as msg
    path = tmp_path / f"{name}.gguf"
    summary = msg.write_synthetic_gguf(str(path), **kw)
    rng = np.random.default_rng(1)
    return path, summary, rng


def _ids(summary, n, rng):
    return [summary["bos_id"]] + [int(x) for x in rng.integers(summary["first_normal_token"], summary["vocab"], n - 1)]


def _check_gguf(path, summary, rng, n_tok, chunk, kv="f16", n_greedy=4):
    ids = _ids(summary, n_tok, rng)
    cpu, gpu = _pair(str(path), kv, chunk, threads=None)
    want, got = np.asarray(cpu.logits(ids)), np.asarray(gpu.logits(ids))
    err = rel_err(got, want)
    assert err < MAX_REL, f"{path.name}: relative error {err:.2e}"
    assert _greedy(gpu, ids, n_greedy) == _greedy(cpu, ids, n_greedy)
    return err


TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k", "f16", "bf16", "f32"]


@pytest.mark.parametrize("qtype", TYPES)
def test_every_type_e2b(need_cuda, tmp_path, qtype):
    """E2B widths (PLE, KV sharing), 2 layers, every weight type; 20 tokens in chunks of 8 (the
    tiled matmul on 8 and 4 rows), then 6 tokens one at a time (the matrix-vector kernels, with
    the Q4_0 / Q8_0 fast path) and greedy decode."""
    path, summary, rng = _synthetic(tmp_path, f"e2b-{qtype}", preset="e2b", layers=2, vocab=1024, qtype=qtype)
    try:
        _check_gguf(path, summary, rng, 20, 8)
        _check_gguf(path, summary, rng, 6, 1, n_greedy=2)  # logits through the decode kernels
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("qtype", ["q4_0", "q4_k", "q4_k_m", "q5_k_m"])
def test_gemma4_26b_a4b_shape(need_cuda, tmp_path, qtype):
    """26B-A4B widths (128 experts, top 8, head dim 512 on full layers, K-quant fallbacks to
    Q5_0 on the 704- and 2112-wide rows), 2 layers; the prompt goes through the grouped MoE
    matmuls, the generated tokens through the decode expert kernels. q4_k_m: llama-quantize's
    mix (the generator's --mix), whose second layer's down products are Q8_0 and first's Q5_0;
    q5_k_m: the same with Q5_K, whose fallback is Q5_1."""
    kw = dict(mix=qtype) if qtype.endswith("_m") else dict(qtype=qtype)
    path, summary, rng = _synthetic(tmp_path, f"26b-{qtype}", preset="26b-a4b", layers=2, vocab=4096, **kw)
    try:
        _check_gguf(path, summary, rng, 96, 64, kv="f16")
        _check_gguf(path, summary, rng, 12, 1, kv="f32")
    finally:
        path.unlink(missing_ok=True)


def test_gemma4_26b_a4b_one_expert(need_cuda, tmp_path):
    """The one-expert twin of the 26B-A4B shape (the generator's --one-expert: one 5632-wide expert,
    top-1, its MoE block otherwise whole; bench/RESULTS.md measures it against the MoE model), 2
    layers: the router's single block and the experts' launches with k = 1, prompt and decode."""
    path, summary, rng = _synthetic(tmp_path, "26b-one", preset="26b-a4b", layers=2, vocab=4096, qtype="q4_0",
                                    one_expert=True)
    try:
        _check_gguf(path, summary, rng, 96, 64, kv="f16")
        _check_gguf(path, summary, rng, 12, 1, kv="f32")
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("router", ["f32", "q8_0"])
def test_prefill_router_split_k(need_cuda, tmp_path, router):
    """The MoE router's product in prefill (128 outputs: too few for a grid of tiles) runs split
    over runs of its 2816 columns, each run's partial tile summed in order by a second launch
    (matmul.cu's matmul_split_k). A 300-token prompt in one chunk (5 tiles of 64 rows, the last
    part-filled) and in chunks of 7 (one tile, 7 rows), against the CPU's precise mode, with the
    file's F32 router and with a Q8_0 one (a block type through the same tiles). F32 caches: with
    f16 ones, 2 of the 300 rows differ by 7e-2 on the H200 with the split or without it (a value
    rounded to f16 the other way flips a near-tied expert); with F32 caches every row is within
    1e-5 both ways."""
    path, summary, rng = _synthetic(tmp_path, f"26b-router-{router}", preset="26b-a4b", layers=2, vocab=4096,
                                    qtype="q4_0", tensor_types=[f"ffn_gate_inp={router}"])
    try:
        _check_gguf(path, summary, rng, 300, 300, kv="f32")
        _check_gguf(path, summary, rng, 40, 7, kv="f32")
    finally:
        path.unlink(missing_ok=True)


# Default mode decodes on 8-bit activations (cpp/backend/cuda/q8.cuh, as llama.cpp's MMVQ does),
# so its logits differ from the float32 reference by the activations' rounding: a looser bound.
# In the MoE model that rounding also flips a few near-tied expert choices (the H200 measured
# 3.5e-2 overall on 26b-a4b-q4_0), which moves whole rows: there the bound is on the median row,
# and the overall one is wider.
Q8_MAX_REL = 3e-2
# The 26B-A4B file's median row sits at that bound: 0.0301-0.0302 on the H200 since the split-K
# int8 prefill products (2026-11-30), and it moves by ~5e-4 with the float order of their sums
# alone, through near-tied experts. Its median gets its own bound, with that margin.
Q8_MOE_MEDIAN = 3.5e-2


def _check_default_mode(tmp_path, preset, qtype, n_tok, chunk, vocab=4096, tensor_types=None):
    """Default mode (8-bit activations) on a 2-layer synthetic GGUF against the CPU's precise
    mode, in chunks of `chunk` tokens; returns the ids, the GPU model and its logits."""
    path, summary, rng = _synthetic(tmp_path, f"{preset}-{qtype}", preset=preset, layers=2, vocab=vocab, qtype=qtype,
                                    tensor_types=tensor_types)
    try:
        ids = _ids(summary, n_tok, rng)
        cpu, gpu = _pair(str(path), "f16", chunk, precise=False, threads=None)
        want, got = np.asarray(cpu.logits(ids)), np.asarray(gpu.logits(ids))
    finally:
        path.unlink(missing_ok=True)
    assert np.isfinite(got).all()
    err = rel_err(got, want)
    rows = [rel_err(got[i], want[i]) for i in range(len(ids))]
    if preset == "26b-a4b":  # near-tied expert choices may flip (see Q8_MAX_REL)
        assert float(np.median(rows)) < Q8_MOE_MEDIAN, f"{preset} {qtype}: row errors {rows}"
        assert err < 2 * Q8_MAX_REL, f"{preset} {qtype}: relative error {err:.2e}"
    else:
        assert err < Q8_MAX_REL, f"{preset} {qtype}: relative error {err:.2e}, rows {rows}"
    return ids, gpu, got


# Every block type decodes on 8-bit activations (q8.cuh's units). The 26B-A4B files: Q4_K gate/up
# experts with Q5_0 down experts (the 704- and 2112-wide rows fall back, as in llama.cpp's K-quant
# mixes: experts_q8 with two types), Q5_1 throughout, Q6_K with Q8_0 down rows.
Q8_UNIT_TYPES = ["q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]


@pytest.mark.parametrize("preset,qtype", [("e2b", "q4_0"), ("e2b", "q8_0"), ("26b-a4b", "q4_0")] +
                         [("e2b", t) for t in Q8_UNIT_TYPES] + [("26b-a4b", "q4_k"), ("26b-a4b", "q5_1"),
                                                                 ("26b-a4b", "q6_k")])
def test_q8_decode_default_mode(need_cuda, tmp_path, preset, qtype):
    """Decode steps in default mode (one token at a time: the 8-bit products, the quantizing
    norms, GeGLU, attention and residual adds, the batched q/k/v and gate/up products, the expert
    kernels) against the CPU's precise mode; greedy decoding must pick the arg-max of its own logits."""
    ids, gpu, got = _check_default_mode(tmp_path, preset, qtype, 10, 1)
    toks = _greedy(gpu, ids, 3)
    assert toks[0] == int(np.argmax(got[-1])), (toks, int(np.argmax(got[-1])))
    assert gpu.stats()["host_waits_per_token"] == 1


def _decode_kernels(tmp_path, preset, qtype, precise=False, tensor_types=None):
    """Kernels a decode token (from two generated tokens' stats) and the last prompt token's logits
    of a 2-layer synthetic file."""
    path, summary, rng = _synthetic(tmp_path, f"{preset}-{qtype}-k", preset=preset, layers=2, vocab=4096, qtype=qtype,
                                    tensor_types=tensor_types)
    try:
        m = markbase.Model.load(str(path), backend="cuda", precise=precise, prefill_chunk=1)
        ids = _ids(summary, 6, rng)
        logits = np.asarray(m.logits(ids))[-1]
        _greedy(m, ids, 2)
        return m.stats()["kernels_per_token"], logits
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("preset,qtype", [("e2b", t) for t in Q8_UNIT_TYPES] + [("26b-a4b", "q4_k")])
def test_q8_units_take_the_q4_0_plan(need_cuda, tmp_path, preset, qtype):
    """A file of another block type decodes with the same fused plan as its Q4_0 twin (the same
    kernels a token: quantized copies written by the ops before the products, the MoE layer's
    dense MLP in the experts' launches), and on 8-bit activations: its default-mode logits are not
    its precise-mode ones (the float32 kernels would give the same in both modes)."""
    want, _ = _decode_kernels(tmp_path, preset, "q4_0")
    got, default = _decode_kernels(tmp_path, preset, qtype)
    _, precise = _decode_kernels(tmp_path, preset, qtype, precise=True)
    assert got == want, (qtype, got, want)
    assert not np.array_equal(default, precise)
    # the MoE file: near-tied experts may flip (Q8_MAX_REL); the H200 measured 3.1e-2
    assert rel_err(default, precise) < (2 * Q8_MAX_REL if preset == "26b-a4b" else Q8_MAX_REL)


@pytest.mark.parametrize("chunk", [1, 24], ids=["decode", "prefill"])
def test_mixed_types_keep_the_fused_heads(need_cuda, tmp_path, chunk):
    """llama.cpp's K-quant mixes put attn_v in Q6_K beside Q4_K q and k: the three products read
    the same quantized input but cannot share a launch (one weight type a launch). The v product
    runs right after the q/k launch, so that q's and k's norm and RoPE, v's norm and the KV store
    still run as one kernel: a decode token takes one more kernel a layer than the one-type
    (Q4_K) file, not five; and the logits, decode and prefill, stay within the 8-bit bound of the
    CPU's precise mode."""
    mix = ["attn_v=q6_k"]
    one, _ = _decode_kernels(tmp_path, "e2b", "q4_k")
    mixed, _ = _decode_kernels(tmp_path, "e2b", "q4_k", tensor_types=mix)
    assert mixed == one + 2, (mixed, one)  # both layers of the 2-layer file have their own v
    _check_default_mode(tmp_path, "e2b", "q4_k", 30, chunk, tensor_types=mix)


@pytest.mark.parametrize("preset", ["26b-a4b", "e2b"])
def test_decode_side_stream_bit_identical(need_cuda, tmp_path, monkeypatch, preset):
    """Independent steps of a decode graph run on a second stream (plan_streams in
    cuda_backend.cpp): in MoE layers the dense MLP beside the router and experts (when it has its
    own launches: MARKBASE_CUDA_MOE_DENSE=0, set here), in E2B the per-layer embedding's
    projection beside its lookup. The kernels and their inputs are the same, so the logits must
    be bit-identical to one stream's (MARKBASE_CUDA_STREAMS=0), token after token."""
    path, summary, rng = _synthetic(tmp_path, f"{preset}-streams", preset=preset, layers=3, vocab=4096, qtype="q4_0")
    ids = _ids(summary, 12, rng)
    out = {}
    monkeypatch.setenv("MARKBASE_CUDA_MOE_DENSE", "0")
    for flag in ("1", "0"):
        monkeypatch.setenv("MARKBASE_CUDA_STREAMS", flag)
        m = markbase.Model.load(str(path), backend="cuda", prefill_chunk=1)
        out[flag] = (np.asarray(m.logits(ids)), _greedy(m, ids, 6))
        del m
    path.unlink(missing_ok=True)
    assert np.array_equal(out["1"][0], out["0"][0])
    assert out["1"][1] == out["0"][1]


def test_decode_scheduling_switches_bit_identical(need_cuda, tmp_path):
    """Work moved before a kernel's programmatic wait (the decode attention's first chunk of keys
    and values, norm_rope_store's norm weights and RoPE angles, the router's per-expert scales)
    and the decode attention's query rows split over several blocks change when work happens,
    not what is computed: the logits are bit-identical with all four off (MARKBASE_CUDA_ATTN_EARLY,
    _ATTN_GSPLIT, _FINISH_EARLY, _ROUTER_SCALE_EARLY = 0; each is read once per process, hence the
    subprocesses); so are they with the MoE down kernel's loads in flight changed
    (MARKBASE_CUDA_DOWN_FLIGHT=2, 4), with 2 output rows a block instead of 4
    (MARKBASE_CUDA_DOWN_ROWS=2) and with its route and weights read after its wait
    (MARKBASE_CUDA_DOWN_EARLY=0), and with the decode attention combine's loads issued one
    round trip after another (MARKBASE_CUDA_COMBINE_ONE_TRIP=0). Every token goes through the
    decode graph (prefill chunk 1);
    on the 26B-A4B shape with a 512-token context both layer kinds take the split query rows (the
    full layer: 2 KV heads of 8 heads)."""
    path, summary, rng = _synthetic(tmp_path, "26b-sched", preset="26b-a4b", layers=3, vocab=4096, qtype="q4_0")
    ids = _ids(summary, 40, rng)
    code = (f"import markbase, numpy as np, hashlib, json\n"
            f"m = markbase.Model.load({str(path)!r}, backend='cuda', prefill_chunk=1, max_context=512, kv_cache='f16')\n"
            f"l = np.asarray(m.logits({ids!r}))\n"
            f"t = list(m.generate_tokens({ids!r}, max_tokens=6, temperature=0.0))\n"
            "print(json.dumps([hashlib.sha256(l.tobytes()).hexdigest(), t, bool(np.isfinite(l).all())]))")
    on = _json_with_env(code, {})
    switches = {f"MARKBASE_CUDA_{n}": "0" for n in ["ATTN_EARLY", "ATTN_GSPLIT", "FINISH_EARLY", "ROUTER_SCALE_EARLY"]}
    off = _json_with_env(code, switches)
    # the decode attention's combine with its loads one round trip after another
    trips = _json_with_env(code, {"MARKBASE_CUDA_COMBINE_ONE_TRIP": "0"})
    # the MoE down kernel with 2 and 4 units a thread in flight instead of 3: the same sums in the same order
    flight = [_json_with_env(code, {"MARKBASE_CUDA_DOWN_FLIGHT": f}) for f in "24"]
    down = [_json_with_env(code, {f"MARKBASE_CUDA_DOWN_{n}": v}) for n, v in [("EARLY", "0"), ("ROWS", "2")]]
    path.unlink(missing_ok=True)
    assert on[2] and off[2]
    assert on == off
    assert trips == on
    assert flight == [on, on]
    assert down == [on, on]


@pytest.mark.parametrize("qtype", ["q4_0", "q8_0", "q6_k", "q4_k"])
def test_q8_decode_tall_lm_head(need_cuda, tmp_path, qtype):
    """A vocabulary past 65536 rows: the LM head through the staged kernel (rows copied to shared
    memory by cp.async, matvec_q8.cu), with a last block of one row (65541 = 4 * 16385 + 1). Q6_K's
    rows (1260 bytes) are not whole 16-byte lines, so most blocks' copies start inside a line, and
    its 210-byte blocks put the codes' 8-byte windows (q8.cuh) at every offset from 0 to 6; Q4_K's
    units are read 128 bits at a time."""
    ids, gpu, got = _check_default_mode(tmp_path, "e2b", qtype, 6, 1, vocab=65541)
    assert got.shape[1] == 65541
    assert _greedy(gpu, ids, 2)[0] == int(np.argmax(got[-1]))


@pytest.mark.parametrize("qtype", ["q4_0", "q8_0"])
def test_moe_dense_mlp_in_expert_launches_bit_identical(need_cuda, tmp_path, qtype):
    """Default-mode decode of a Gemma 4 MoE layer runs its dense MLP inside the router's and the
    experts' launches (moe_ffn_decode, moe.cu: gate/up beside the router, one quantization of
    both GeGLU outputs, the dense down beside the experts' down), with each part's arithmetic
    unchanged: the logits and tokens must be bit-identical to the dense MLP's own launches
    (MARKBASE_CUDA_MOE_DENSE=0), with 3 kernels a MoE layer fewer."""
    path, summary, rng = _synthetic(tmp_path, f"26b-dense-{qtype}", preset="26b-a4b", layers=2, vocab=4096, qtype=qtype)
    on, apart = _fingerprints_match(path, _ids(summary, 12, rng), {"MARKBASE_CUDA_MOE_DENSE": "0"})
    assert on["kernels"] == apart["kernels"] - 3 * on["config"]["n_layers"], (on["kernels"], apart["kernels"])


@pytest.mark.parametrize("preset", ["26b-a4b", "e2b"])
def test_row_chain_compact_bit_identical(need_cuda, tmp_path, preset):
    """The general decode row chains (MARKBASE_CUDA_CHAIN_FUSED=0: run_chain for every chain) run
    as one copy of the op's code in a loop (row_chain_kernel<true>, the default), not unrolled over
    the plan's ops with constant indices (MARKBASE_CUDA_CHAIN_COMPACT=0). The same ops in the same
    order: the logits and tokens must be bit-identical, in as many kernels. The MoE file has chains
    of 5, 7 and 8 ops with norm groups of 3 and 2; E2B adds the per-layer embedding's chains."""
    path, summary, rng = _synthetic(tmp_path, f"{preset}-chain", preset=preset, layers=3, vocab=4096, qtype="q4_0")
    compact, unrolled = _fingerprints_match(path, _ids(summary, 12, rng), {"MARKBASE_CUDA_CHAIN_COMPACT": "0"},
                                            base={"MARKBASE_CUDA_CHAIN_FUSED": "0"})
    assert compact["kernels"] == unrolled["kernels"]


@pytest.mark.parametrize("preset,dense", [("26b-a4b", False), ("26b-a4b", True), ("e2b", False),
                                          ("gemma3-270m", False)], ids=["26b-a4b", "26b-dense", "e2b", "gemma3"])
def test_row_chain_fused_bit_identical(need_cuda, tmp_path, preset, dense):
    """The decode row chains of Gemma's shape launched on their own run in fused form
    (row_chain.cuh's run_fused_chain: the rows in registers, the ops fixed in the code) instead of
    on the general loop over a plan (MARKBASE_CUDA_CHAIN_FUSED=0). The same arithmetic in the same
    order: the logits and tokens must be bit-identical, in as many kernels, and the probe's report
    must show the fused chains running: the MoE file's 7-op second chain (its chain+router launch
    has no chain block in the default spread form), the dense equivalent's, E2B's per-layer
    embedding chains, Gemma 3's."""
    path, summary, rng = _synthetic(tmp_path, f"{preset}-{dense}-fused", preset=preset, layers=3, vocab=4096,
                                    qtype="q4_0", dense_equivalent=dense)
    ids = _ids(summary, 12, rng)
    report = _probe_report(path, ids, {})
    fused, general = _fingerprints_match(path, ids, {"MARKBASE_CUDA_CHAIN_FUSED": "0"})
    assert fused["kernels"] == general["kernels"]
    assert "fused chain" in report, report
    if preset == "26b-a4b" and not dense:
        assert "fused chain, 7 ops" in report and "chain_router block 0" not in report, report


def _probe_report(path, ids, env: dict) -> str:
    """The chain probe's report (stderr) of a default-mode decode of ids, run with env added."""
    code = (f"import markbase\nm = markbase.Model.load({str(path)!r}, backend='cuda', prefill_chunk=1)\n"
            f"m.logits({ids!r})\ndel m\n")
    e = dict(os.environ, MARKBASE_CUDA_CHAIN_PROBE="1", **env)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stderr


@pytest.mark.parametrize("qtype,narrow,mix", [("q4_0", False, None), ("q8_0", True, None), ("q4_0", True, "q8_0")],
                         ids=["q4_0", "q8_0-narrow", "mixed-types"])
def test_chain_router_bit_identical(need_cuda, tmp_path, qtype, narrow, mix):
    """Default-mode decode of a Gemma 4 MoE layer runs its router beside the row chain before it,
    in one launch (chain_router, moe.cu), and the dense MLP's gate/up in the experts' gate/up
    launch (moe_ffn_decode_routed). With the router blocks replaying the chain's ops that the
    router's input depends on (MARKBASE_CUDA_ROUTER_DIRECT=0), every part's arithmetic is
    unchanged: the logits and tokens must be bit-identical to the router's own launch after the
    chain (MARKBASE_CUDA_CHAIN_ROUTER=0), with one kernel a MoE layer fewer, to the dense blocks
    last in the gate/up launch instead of first (MARKBASE_CUDA_DENSE_GU_FIRST=0), and to the chain
    in block 0 alone instead of its last norms (the dense MLP's and the experts' inputs) spread
    over two chain blocks (MARKBASE_CUDA_CHAIN_SPLIT=0). The probe's report shows the router
    blocks replaying 3 ops and block 0 running 4 (the router-input norm left to the router
    blocks). The default, the direct form, is test_chain_router_direct's. The full width
    (K = 2816: 3 warps a block both for the experts and the dense MLP) and the narrow one (K = 256:
    1 warp and 2, in blocks of 2 warps); with the dense gate/up in another type than the experts
    the pair is not taken (as many kernels, the same bits)."""
    types = [r"blk\.\d+\.ffn_(gate|up)\.weight=" + mix] if mix else None
    path, summary, rng = _synthetic(tmp_path, f"26b-cr-{qtype}", preset="26b-a4b", layers=2, vocab=4096, qtype=qtype,
                                    narrow=narrow, tensor_types=types)
    ids = _ids(summary, 12, rng)
    replay = {"MARKBASE_CUDA_ROUTER_DIRECT": "0", "MARKBASE_CUDA_ROUTER_POLL": "0"}
    on = _decode_fingerprint(path, ids, replay)
    last = _decode_fingerprint(path, ids, {**replay, "MARKBASE_CUDA_DENSE_GU_FIRST": "0"})
    apart = _decode_fingerprint(path, ids, {**replay, "MARKBASE_CUDA_CHAIN_ROUTER": "0"})
    alone = _decode_fingerprint(path, ids, {**replay, "MARKBASE_CUDA_CHAIN_SPLIT": "0"})
    assert on["finite"]
    assert (on["sha"], on["tokens"]) == (apart["sha"], apart["tokens"]) == (last["sha"], last["tokens"])
    assert (alone["sha"], alone["tokens"], alone["kernels"]) == (on["sha"], on["tokens"], on["kernels"])
    fewer = 0 if mix else on["config"]["n_layers"]
    assert on["kernels"] == apart["kernels"] - fewer, (on["kernels"], apart["kernels"])
    if not mix:
        report = _probe_report(path, ids, replay)
        assert "last router block, 3 ops" in report and "chain_router block 0, 4 ops" in report, report
    path.unlink(missing_ok=True)


def _decode_logits(path, ids, env: dict, out) -> dict:
    """Decodes ids one token at a time (default mode, or precise with env's MB_PRECISE=1) in a
    subprocess run with env added; saves the logits to `out` (.npy) and returns the kernels a token."""
    precise = env.get("MB_PRECISE") == "1"
    code = (f"import markbase, numpy as np, json\n"
            f"m = markbase.Model.load({str(path)!r}, backend='cuda', prefill_chunk=1, precise={precise}"
            f"{', kv_cache=' + repr('f32') if precise else ''})\n"
            f"np.save({str(out)!r}, np.asarray(m.logits({ids!r})))\n"
            f"list(m.generate_tokens({ids!r}, max_tokens=2, temperature=0.0))\n"
            "print(json.dumps(dict(kernels=m.stats()['kernels_per_token'])))")
    return _json_with_env(code, env)


def _close_to_variant(path, ids, env: dict, tmp_path) -> None:
    """Decodes ids with the defaults and with env added, in default mode and in precise mode: as
    many kernels; the logits within 1e-4 in precise mode (float activations: rounding only), within
    the 8-bit path's bound in default mode (a rounding flip of one 8-bit activation moves a row by
    ~1e-3), with a median row under 1e-2."""
    for mode in ({}, {"MB_PRECISE": "1"}):
        d = _decode_logits(path, ids, mode, tmp_path / "default.npy")
        r = _decode_logits(path, ids, {**mode, **env}, tmp_path / "variant.npy")
        got, want = np.load(tmp_path / "default.npy"), np.load(tmp_path / "variant.npy")
        assert np.isfinite(got).all()
        assert d["kernels"] == r["kernels"]
        rows = [rel_err(got[i], want[i]) for i in range(len(ids))]
        assert max(rows) < (1e-4 if mode else Q8_MAX_REL), (env, mode, rows)
        if not mode:
            assert float(np.median(rows)) < 1e-2, (env, rows)


@pytest.mark.parametrize("qtype,narrow", [("q4_0", False), ("q8_0", True)], ids=["q4_0", "q8_0-narrow"])
def test_chain_router_direct(need_cuda, tmp_path, qtype, narrow):
    """chain_router's default router blocks compute their logits in direct form (RouterDirect,
    moe.cu): from the residual x and the attention output a as loaded, in one reduction, without
    forming the router's input (the post-attention norm, the residual add and the router norm
    folded into scalars). The same values as the replay's (MARKBASE_CUDA_ROUTER_DIRECT=0) to
    rounding, not the same bits (_close_to_variant's bounds); the probe's report shows the direct
    router blocks. Against the CPU, default mode is test_q8_decode_default_mode's and precise
    mode test_chain_router_precise_mode's."""
    path, summary, rng = _synthetic(tmp_path, f"26b-direct-{qtype}", preset="26b-a4b", layers=2, vocab=4096,
                                    qtype=qtype, narrow=narrow)
    ids = _ids(summary, 12, rng)
    try:
        _close_to_variant(path, ids, {"MARKBASE_CUDA_ROUTER_DIRECT": "0"}, tmp_path)
        report = _probe_report(path, ids, {"MARKBASE_CUDA_CHAIN_SPREAD": "0", "MARKBASE_CUDA_ROUTER_POLL": "0"})
        assert "last direct router block, 3 ops" in report and "chain_router block 0, 4 ops" in report, report
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("qtype,narrow", [("q4_0", False), ("q8_0", True)], ids=["q4_0", "q8_0-narrow"])
def test_chain_router_spread(need_cuda, tmp_path, qtype, narrow):
    """chain_router's default spread form (SpreadChain, moe.cu): no chain blocks; the direct
    router blocks also write the chain's rows (the post-attention norm, the residual, the dense
    MLP's and the experts' inputs with their 8-bit copies), each its share, with the norms of the
    residual scaled from the direct form's expanded sum. The same values as the chain blocks'
    (MARKBASE_CUDA_CHAIN_SPREAD=0) to rounding (_close_to_variant's bounds, default and precise
    mode); the probe's report shows router blocks and no chain block. Against the CPU: default
    mode is test_q8_decode_default_mode's, precise mode test_chain_router_precise_mode's."""
    path, summary, rng = _synthetic(tmp_path, f"26b-spread-{qtype}", preset="26b-a4b", layers=2, vocab=4096,
                                    qtype=qtype, narrow=narrow)
    ids = _ids(summary, 12, rng)
    try:
        _close_to_variant(path, ids, {"MARKBASE_CUDA_CHAIN_SPREAD": "0"}, tmp_path)
        report = _probe_report(path, ids, {})
        assert "polling router block, 3 ops" in report and "chain_router block 0" not in report, report
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("qtype,narrow", [("q4_0", False), ("q8_0", True)], ids=["q4_0", "q8_0-narrow"])
def test_router_vec_rows_bit_identical(need_cuda, tiny_models, tmp_path, qtype, narrow):
    """The direct form's router blocks load aligned float router rows a whole float4 at a time
    (router_row4); MARKBASE_CUDA_ROUTER_VEC_ROWS=0 (an A/B switch) loads them element by element.
    The same values in the same sums: the logits bit for bit and the tokens of the default, as
    many kernels a token, with the F32 router of a GGUF file (two 26B-A4B layers, 2816 and 256
    wide) and the BF16 router of a tiny Hugging Face MoE model (64 wide, 8 experts)."""
    path, summary, rng = _synthetic(tmp_path, f"26b-vecrows-{qtype}", preset="26b-a4b", layers=2, vocab=4096,
                                    qtype=qtype, narrow=narrow)
    ids = _ids(summary, 12, rng)
    on, off = _fingerprints_match(path, ids, {"MARKBASE_CUDA_ROUTER_VEC_ROWS": "0"})
    assert on["kernels"] == off["kernels"]
    tm = tiny_models["gemma4_moe"]
    ids = list(tm.prompt(24, 8))
    on = _decode_fingerprint(tm.path, ids, {})
    off = _decode_fingerprint(tm.path, ids, {"MARKBASE_CUDA_ROUTER_VEC_ROWS": "0"})
    assert on["finite"] and (on["sha"], on["tokens"], on["kernels"]) == (off["sha"], off["tokens"], off["kernels"])


@pytest.mark.parametrize("qtype,narrow", [("q4_0", False), ("q8_0", True)], ids=["q4_0", "q8_0-narrow"])
def test_chain_router_poll_bit_identical(need_cuda, tmp_path, qtype, narrow):
    """chain_router's routing block (the grid's last) polls a buffer of the router blocks' logits
    (moe.cu's poll_logits; the default) instead of the last block to count itself done routing
    (MARKBASE_CUDA_ROUTER_POLL=0). The same logits in the same routing arithmetic: the same bits,
    tokens and kernels, over two layers and 16 one-token steps, which reuse the buffer (emptied
    after each poll), with the router blocks writing the chain's rows (the default spread form) and
    beside chain blocks (MARKBASE_CUDA_CHAIN_SPREAD=0); the probe's report names the polling
    block."""
    path, summary, rng = _synthetic(tmp_path, f"26b-poll-{qtype}", preset="26b-a4b", layers=2, vocab=4096,
                                    qtype=qtype, narrow=narrow)
    ids = _ids(summary, 12, rng)
    count = {"MARKBASE_CUDA_ROUTER_POLL": "0"}
    try:
        for form in ({}, {"MARKBASE_CUDA_CHAIN_SPREAD": "0"}):
            base = _decode_fingerprint(path, ids, {**form, **count})
            poll = _decode_fingerprint(path, ids, form)
            assert base["finite"]
            assert (poll["sha"], poll["tokens"], poll["kernels"]) == (base["sha"], base["tokens"], base["kernels"])
            assert "polling router block, 3 ops" in _probe_report(path, ids, form)
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("qtype", ["q4_0", "q8_0"])
def test_chain_probe_bit_identical(need_cuda, tmp_path, qtype):
    """MARKBASE_CUDA_CHAIN_PROBE=1 runs the row chain kernels' probe instances, which stamp each
    stage's SM cycles (chain_probe.cuh): it observes the work, it does not change it. The logits bit
    for bit and the tokens of the defaults, as many kernels a token: two 26B-A4B layers (chains
    alone and the chain+router launch) and two E2B layers (per-layer embeddings: their chains
    too)."""
    for preset in ("26b-a4b", "e2b"):
        path, summary, rng = _synthetic(tmp_path, f"{preset}-warm-{qtype}", preset=preset, layers=2, vocab=4096,
                                        qtype=qtype)
        ids = _ids(summary, 12, rng)
        on, probed = _fingerprints_match(path, ids, {"MARKBASE_CUDA_CHAIN_PROBE": "1"})
        assert on["kernels"] == probed["kernels"]


@pytest.mark.parametrize("experts,top_k,hidden", [(6, 3, None), (40, 5, None), (6, 2, 4096)])
def test_chain_router_precise_mode(need_cuda, tmp_path, monkeypatch, experts, top_k, hidden):
    """The router beside the row chain (chain_router) in precise mode, where the experts and the
    dense MLP keep their own launches, on tiny Hugging Face MoE models whose expert counts leave
    the last router block part empty (4 experts a block). With the router blocks replaying the
    chain's ops (MARKBASE_CUDA_ROUTER_DIRECT=0): the same logits bit for bit and the same tokens as
    the two launches one after the other (MARKBASE_CUDA_CHAIN_ROUTER=0), one launch a layer fewer,
    and as the chain in block 0 alone (MARKBASE_CUDA_CHAIN_SPLIT=0). The default direct form, with
    the router blocks writing the chain's rows (the spread form) and with chain blocks
    (MARKBASE_CUDA_CHAIN_SPREAD=0): the replay's logits within 1e-5 (float rounding only). All
    against the CPU's precise mode. hidden 4096 with 2 router blocks: the spread form's rows take
    its blocks two passes."""
    import tiny_gemma
    extra = {"hidden_size": hidden} if hidden else {}
    model = tiny_gemma.build_model("gemma4_moe", seed=11, num_experts=experts, top_k_experts=top_k, **extra)
    path = tiny_gemma.save_model(model, str(tmp_path / f"moe-{experts}"))
    rng = np.random.default_rng(experts)
    ids = [2] + [int(x) for x in rng.integers(4, 512, 19)]
    out = {}
    for name, chain, split, direct, spread in (("chained", "1", "1", "0", "1"), ("alone", "1", "0", "0", "1"),
                                               ("apart", "0", "1", "0", "1"), ("direct", "1", "1", "1", "1"),
                                               ("blocks", "1", "1", "1", "0")):
        monkeypatch.setenv("MARKBASE_CUDA_CHAIN_ROUTER", chain)
        monkeypatch.setenv("MARKBASE_CUDA_CHAIN_SPLIT", split)
        monkeypatch.setenv("MARKBASE_CUDA_ROUTER_DIRECT", direct)
        monkeypatch.setenv("MARKBASE_CUDA_CHAIN_SPREAD", spread)
        m = markbase.Model.load(path, backend="cuda", precise=True, kv_cache="f32", prefill_chunk=1)
        out[name] = (np.asarray(m.logits(ids)), _greedy(m, ids, 6), m.stats()["kernels_per_token"])
        del m
    for name in ("alone", "apart"):
        assert np.array_equal(out["chained"][0], out[name][0]), name
        assert out["chained"][1] == out[name][1], name
    assert out["chained"][2] == out["alone"][2] == out["direct"][2] == out["blocks"][2] < out["apart"][2]
    for name in ("direct", "blocks"):
        assert rel_err(out[name][0], out["chained"][0]) < 1e-5, name
    cpu = markbase.Model.load(path, backend="cpu", precise=True, kv_cache="f32", prefill_chunk=1)
    want, toks = np.asarray(cpu.logits(ids)), _greedy(cpu, ids, 6)
    for name in ("chained", "direct", "blocks"):
        assert rel_err(out[name][0], want) < MAX_REL, name
        assert out[name][1] == toks, name


@pytest.mark.parametrize("vocab", [4096, 65541], ids=["rows", "tall"])
def test_lm_head_softcap_bit_identical(need_cuda, tmp_path, vocab):
    """Default-mode decode folds the final softcap into the LM head's product (both of its
    kernels: rows, and the staged one past 65536 rows), in the softcap kernel's arithmetic: the
    logits and tokens must be bit-identical to the separate softcap launch
    (MARKBASE_CUDA_HEAD_SOFTCAP=0), and one kernel a token fewer. (At the synthetic files' logit
    scale a missing or doubled softcap moves the logits by ~0.2 %, inside the CPU comparison's
    bound, so only this test would see it.)"""
    path, summary, rng = _synthetic(tmp_path, f"e2b-cap-{vocab}", preset="e2b", layers=2, vocab=vocab, qtype="q4_0")
    on, apart = _fingerprints_match(path, _ids(summary, 8, rng), {"MARKBASE_CUDA_HEAD_SOFTCAP": "0"})
    assert on["config"]["final_logit_softcapping"] > 0  # the file has a final softcap
    assert on["kernels"] == apart["kernels"] - 1


INT8_MMA_TYPES = ["q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]


@pytest.mark.parametrize("preset,qtype", [("e2b", "q4_0"), ("e2b", "q8_0"), ("26b-a4b", "q4_0")] +
                         [("e2b", t) for t in INT8_MMA_TYPES] + [("26b-a4b", "q4_k")])
def test_int8_prefill_default_mode(need_cuda, tmp_path, preset, qtype):
    """Prefill in default mode: the products on quantized rows and the int8 tensor cores
    (matmul_q8.cu; grouped for the experts: the 26B-A4B Q4_K file's gate/up experts are Q4_K, its
    down experts Q5_0), chunks of 48 rows (tiles of 64 rows partly filled), against the CPU's
    precise mode, with the same bounds as the 8-bit decode path."""
    _check_default_mode(tmp_path, preset, qtype, 80, 48)


@pytest.mark.parametrize("qtype", ["q5_0", "q4_1", "q5_1"])
def test_int8_prefill_odd_block_count(need_cuda, tmp_path, monkeypatch, qtype):
    """Rows of an odd number of 32-weight blocks: E2B's layers with a 1568-wide residual (49
    blocks), so the products that read it take matmul_q8's unpaired path (one block a thread,
    16-bit loads) and the decode units' odd count. Prefill in chunks of 40, then decode, against
    the CPU's precise mode. (First run on the H200 in the thirty-fifth session: passed.)"""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import make_synthetic_gguf as msg
    monkeypatch.setitem(msg.PRESETS, "e2b-odd", dict(msg.PRESETS["e2b"], hidden=1568))
    ids, gpu, got = _check_default_mode(tmp_path, "e2b-odd", qtype, 60, 40)
    assert _greedy(gpu, ids, 2)[0] == int(np.argmax(got[-1]))


def _prefill_logits_by_flag(tmp_path, preset, qtype, flag_name):
    """Logits of 70 tokens prefilled in one chunk on a 2-layer synthetic file, in a subprocess
    with the environment switch flag_name set to "1" and to "0": {"1": logits, "0": logits}."""
    path, summary, rng = _synthetic(tmp_path, f"{preset}-{qtype}-{flag_name}", preset=preset, layers=2,
                                    vocab=4096, qtype=qtype)
    ids = _ids(summary, 70, rng)
    code = (f"import markbase, numpy as np\nm = markbase.Model.load({str(path)!r}, backend='cuda', prefill_chunk=70)\n"
            f"np.save(OUT, np.asarray(m.logits({ids!r})))\n")
    got = {}
    for flag in ("1", "0"):
        out = str(tmp_path / f"logits_{flag}.npy")
        _run_with_env(code.replace("OUT", repr(out)), {flag_name: flag})
        got[flag] = np.load(out)
    path.unlink(missing_ok=True)
    return got


@pytest.mark.parametrize("preset,qtype", [("e2b", t) for t in INT8_MMA_TYPES] + [("26b-a4b", "q4_k")])
def test_int8_prefill_types_against_f16_tiles(need_cuda, tmp_path, preset, qtype):
    """The int8 prefill of the types with a minimum (w = d q + m: Q4_1, Q5_1, the K-quants'
    sub-blocks, whose products add m da sum(qa)), of Q5_0 and of Q6_K (two 16-deep products a
    block, 2-byte aligned super-blocks) runs on the int8 tensor cores: its
    logits are not the f16 tiles' (MARKBASE_CUDA_INT8_PREFILL=0) and are within the 8-bit bound of
    them; 70 tokens in one chunk."""
    got = _prefill_logits_by_flag(tmp_path, preset, qtype, "MARKBASE_CUDA_INT8_PREFILL")
    assert np.isfinite(got["1"]).all()
    assert not np.array_equal(got["1"], got["0"])
    bound = 2 * Q8_MAX_REL if preset == "26b-a4b" else Q8_MAX_REL  # near-tied experts (Q8_MAX_REL)
    assert rel_err(got["1"], got["0"]) < bound


@pytest.mark.parametrize("qtype", ["q4_1", "q5_1", "q4_k", "q5_k"])
def test_int8_prefill_mma_row_sums_bit_identical(need_cuda, tmp_path, qtype):
    """The int8 prefill of the types with a minimum adds m da sum(qa) a block: the activation
    rows' sums come from one more mma against a B of ones (the default) or from dp4a and
    shuffles (MARKBASE_CUDA_MMQ_MMA_SUMS=0): the same integers, so the same logits bit for bit;
    70 tokens in one chunk (the first-row and the +8-row halves of every 16-row tile)."""
    got = _prefill_logits_by_flag(tmp_path, "e2b", qtype, "MARKBASE_CUDA_MMQ_MMA_SUMS")
    assert np.isfinite(got["1"]).all()
    assert np.array_equal(got["1"], got["0"])


def test_int8_prefill_odd_widths(need_cuda, tmp_path):
    """Widths that do not fill the int8 tiles: hidden 160 (5 blocks: a part-filled stage of 4),
    MLP 352 (N not a multiple of 128, K of 11 blocks), 5 query heads of 64 (N = 320); Q8_0 on load. The int8
    path must agree with the CPU's precise mode, and with the f16 tiles it replaces
    (MARKBASE_CUDA_INT8_PREFILL=0), on 100 tokens in chunks of 40."""
    import tiny_gemma
    model = tiny_gemma.build_model("gemma3", hidden_size=160, intermediate_size=352, num_hidden_layers=2,
                                   num_attention_heads=5, num_key_value_heads=1, head_dim=64,
                                   query_pre_attn_scalar=64, sliding_window=32, vocab_size=1000,
                                   layer_types=["sliding_attention", "full_attention"])
    path = tiny_gemma.save_model(model, str(tmp_path / "g3-odd"))
    rng = np.random.default_rng(3)
    ids = [2] + [int(x) for x in rng.integers(10, 1000, 99)]
    cpu, gpu = _pair(path, "f16", 40, precise=False, quant="q8_0")
    want, got = np.asarray(cpu.logits(ids)), np.asarray(gpu.logits(ids))
    err = rel_err(got, want)
    assert err < Q8_MAX_REL, f"relative error {err:.2e}"
    code = (f"import markbase, numpy as np\nm = markbase.Model.load({path!r}, backend='cuda', quant='q8_0', "
            f"prefill_chunk=40)\nnp.save({str(tmp_path / 'f16.npy')!r}, np.asarray(m.logits({ids!r})))\n")
    _run_with_env(code, {"MARKBASE_CUDA_INT8_PREFILL": "0"})
    f16 = np.load(tmp_path / "f16.npy")
    assert rel_err(f16, want) < Q8_MAX_REL
    assert rel_err(got, f16) < Q8_MAX_REL


def test_decode_attention_long_context(need_cuda, tmp_path):
    """The decode attention over f16 caches (attention_decode_kernel: head dims that are multiples
    of 64) past 2048 positions, where a split spans more than one 32-position chunk (the online
    softmax across chunks) and a full layer uses all 64 splits; every token of a 2200-token
    prompt goes through the decode graph (prefill chunk 1), against the CPU's precise mode with
    the same f16 cache. 4 query heads per KV head, a 256-token window beside the full layer."""
    import tiny_gemma
    model = tiny_gemma.build_model("gemma3", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                                   query_pre_attn_scalar=64, sliding_window=256, vocab_size=1000,
                                   max_position_embeddings=8192,
                                   layer_types=["sliding_attention", "full_attention"])
    path = tiny_gemma.save_model(model, str(tmp_path / "g3-long"))
    rng = np.random.default_rng(4)
    ids = [2] + [int(x) for x in rng.integers(10, 1000, 2199)]
    cpu, gpu = _pair(path, "f16", 1, max_context=4096)
    want, got = np.asarray(cpu.logits(ids)), np.asarray(gpu.logits(ids))
    assert np.isfinite(got).all()
    assert rel_err(got, want) < MAX_REL
    assert rel_err(got[2048:], want[2048:]) < MAX_REL  # the rows with multi-chunk splits


def test_cuda_prefill_chunk_default(need_cuda, tiny_models):
    """Left open, the prefill chunk is the backend's choice: 2048 tokens on CUDA (as llama.cpp's
    batch), so that the GPU and the MoE expert tiles fill; results do not depend on it."""
    tm = tiny_models["gemma4_moe"]
    ids = tm.prompt(40, 8)
    auto = markbase.Model.load(tm.path, backend="cuda", precise=True, kv_cache="f32")
    small = markbase.Model.load(tm.path, backend="cuda", precise=True, kv_cache="f32", prefill_chunk=7)
    assert rel_err(np.asarray(auto.logits(ids)), np.asarray(small.logits(ids))) < MAX_REL


def test_gemma3_270m_shape(need_cuda, tmp_path):
    """Gemma 3 270M widths (hidden 640, 4 heads of 256, 1 KV head, MLP 2048, window 512),
    6 of its 18 layers, a 32768-token vocabulary (the real one has 262144), Q8_0 on load."""
    import tiny_gemma
    model = tiny_gemma.build_model("gemma3", hidden_size=640, intermediate_size=2048, num_hidden_layers=6,
                                   num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                   query_pre_attn_scalar=256, sliding_window=512, vocab_size=32768,
                                   max_position_embeddings=32768,
                                   layer_types=["sliding_attention"] * 5 + ["full_attention"])
    path = tiny_gemma.save_model(model, str(tmp_path / "g3-270m"))
    rng = np.random.default_rng(2)
    ids = [2] + [int(x) for x in rng.integers(10, 32768, 599)]  # 600 > the 512 window
    cpu, gpu = _pair(path, "f16", 256, quant="q8_0")
    err = rel_err(np.asarray(gpu.logits(ids)), np.asarray(cpu.logits(ids)))
    assert err < MAX_REL, f"relative error {err:.2e}"
    assert _greedy(gpu, ids[:64], 6) == _greedy(cpu, ids[:64], 6)


def test_gemma3_270m_synthetic_gguf(need_cuda, tmp_path):
    """The whole Gemma 3 270M shape as a GGUF (bench/make_synthetic_gguf.py --preset gemma3-270m:
    18 layers, the 262144-token vocabulary, Q4_K with llama.cpp's Q5_0 fallback on the 640-wide
    rows and a Q8_0 embedding, as in the real Q4_K_M file), which the H200 machine can generate
    where the real file cannot be sent: 600 prompt tokens (> the 512 window), then decode."""
    path, summary, rng = _synthetic(tmp_path, "g3-270m", preset="gemma3-270m", qtype="q4_k",
                                    embd_type="q8_0")
    try:
        _check_gguf(path, summary, rng, 600, 256, kv="f16")
        _check_gguf(path, summary, rng, 8, 1, kv="f32")
    finally:
        path.unlink(missing_ok=True)
