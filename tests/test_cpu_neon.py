"""The CPU backend's NEON paths (AArch64), on an x86 machine: the engine's C++ core (the
markbase_core sources of CMakeLists.txt) and tests/cpu_kernels_main.cpp are cross-compiled for
AArch64, once without and once with the SDOT instruction (-march=armv8-a, -march=armv8.2-a+dotprod),
and run under qemu-user.
- Kernels: the matrix products of every tensor type (precise and 8-bit-activation paths, decode
  and prefill shapes) and the vector kernels against numpy on the gguf package's dequantized
  weights, the same bars as tests/test_cpu_kernels.py, on the NEON path and on the portable one
  (MARKBASE_SIMD=portable).
- The whole engine on synthetic Gemma 4 GGUFs (MoE; PLE and KV sharing; mixed tensor types):
  logits and greedy tokens against this machine's build of the same engine (Python).

Needs aarch64-linux-gnu-g++ and qemu-aarch64 (Debian: g++-aarch64-linux-gnu, qemu-user; .ci/run
installs them); skips with that reason when they are missing. On an AArch64 machine the normal
tests already run the NEON path natively."""
import os
import re
import shutil
import sys
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")

from test_cpu_kernels import FAST_32, FAST_256, fast_act, weights  # noqa: E402
from test_formats import TYPES  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CXX = shutil.which("aarch64-linux-gnu-g++")
QEMU = shutil.which("qemu-aarch64")
pytestmark = pytest.mark.skipif(not (CXX and QEMU), reason="needs aarch64-linux-gnu-g++ and qemu-aarch64")

VARIANTS = {"neon": "-march=armv8-a", "neon+dotprod": "-march=armv8.2-a+dotprod"}


def _sources():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    core = re.search(r"add_library\(markbase_core STATIC(.*?)\)", cmake, re.S).group(1).split()
    return [ROOT / "tests/cpu_kernels_main.cpp", *(ROOT / c for c in core)]


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    out = tmp_path_factory.mktemp("neon")

    def build(item):
        name, march = item
        exe = out / name.replace("+", "_")
        r = subprocess.run([CXX, "-std=c++17", "-O2", "-static", "-pthread", "-Wall", "-Werror",
                            f"-I{ROOT / 'cpp'}", march, *map(str, _sources()), "-o", str(exe)],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        return name, exe

    # about a minute each on 2 cores
    with ThreadPoolExecutor(2) as ex:
        return dict(ex.map(build, VARIANTS.items()))


def _run(exe, args, simd):
    env = dict(os.environ)
    env.pop("MARKBASE_SIMD", None)
    if simd == "portable":
        env["MARKBASE_SIMD"] = "portable"
    r = subprocess.run([QEMU, "-cpu", "max", str(exe), *map(str, args)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _check_matmul(binaries, variant, tmp_path, name, raw, W, T_values, precise_modes, seed):
    raw.tofile(tmp_path / "raw.bin")
    rows, cols = W.shape
    rng = np.random.default_rng(seed)
    for T in T_values:
        x = rng.standard_normal((T, cols)).astype(np.float32)
        x.tofile(tmp_path / "x.bin")
        for precise in precise_modes:
            ref = (x if precise else fast_act(name, x)).astype(np.float64) @ W.T
            for simd in ("auto", "portable"):
                path = _run(binaries[variant], ["matmul", name, rows, cols, T, int(precise), tmp_path / "raw.bin",
                                  tmp_path / "x.bin", tmp_path / "out.bin"], simd)
                assert path == (variant if simd == "auto" else "portable")
                got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(T, rows)
                err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
                assert err < 1e-5, (name, T, simd, precise, err)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", list(TYPES))
def test_neon_matmul_every_type(binaries, tmp_path, variant, name):
    cols = 512 if TYPES[name][1] == 256 else 256
    raw, W = weights(name, rows=13, cols=cols, seed=11)  # 13 rows: 4-row kernels and a remainder
    _check_matmul(binaries, variant, tmp_path, name, raw, W, (1, 4, 7), (True, False), seed=5)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", sorted(FAST_32 | FAST_256))
def test_neon_prefill_panels_tails(binaries, tmp_path, variant, name):
    """Several 8-row panels with a partial last one (37 rows) and token counts around the
    kernels' groups."""
    raw, W = weights(name, rows=37, cols=512, seed=23)
    _check_matmul(binaries, variant, tmp_path, name, raw, W, (2, 5, 9, 16), (False,), seed=9)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_neon_vector_kernels(binaries, tmp_path, variant):
    rng = np.random.default_rng(7)
    for n in (1, 7, 256, 1003):  # tails shorter than a vector, and long rows
        a = (rng.standard_normal(n) * 3).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        h = rng.standard_normal(n).astype(np.float16)
        s, cap = 0.37, 30.0
        for arr, f in ((a, "a"), (b, "b"), (h, "h")):
            arr.tofile(tmp_path / f"{f}.bin")
        a64, b64, h64 = a.astype(np.float64), b.astype(np.float64), h.astype(np.float64)
        u = np.sqrt(2 / np.pi) * (a64 + 0.044715 * a64 ** 3)
        want = [np.array([a64 @ b64]), np.array([a64 @ h64]), a64 + s * h64, a64 + s * b64,
                0.5 * a64 * (1 + np.tanh(u)) * b64, cap * np.tanh(a64 / cap)]
        for simd in ("auto", "portable"):
            path = _run(binaries[variant], ["vec", n, s, cap, *(tmp_path / f"{f}.bin" for f in "abh"),
                                            tmp_path / "out.bin"], simd)
            assert path == (variant if simd == "auto" else "portable")
            got = np.fromfile(tmp_path / "out.bin", np.float32)
            parts = np.split(got, [1, 2, 2 + n, 2 + 2 * n, 2 + 3 * n])
            for k, (g, w) in enumerate(zip(parts, want)):
                scale = max(np.abs(w).max(), 1.0) if k >= 2 else np.abs(a64) @ np.abs(b64 if k == 0 else h64)
                assert np.abs(g - w).max() <= 2e-6 * scale * (1 if k >= 2 else 4), (n, simd, k, g[:4], w[:4])


# -------------------------------------------------------------------------------------------------
# the whole engine

MODELS = {
    # 26B-A4B layout (MoE with 128 experts, top 8, beside the dense MLP), narrow widths, 3 layers;
    # K-quant, Q5_0, Q8_0 and Q4_0 products
    "moe": ["--preset", "26b-a4b", "--layers", "3", "--type", "q4_k", "--tensor-type", "attn_q=q5_0",
            "--tensor-type", "attn_k=q8_0", "--tensor-type", "ffn_gate_up_exps=q4_0"],
    # E2B layout (per-layer embeddings, KV sharing), 4 layers; Q6_K, Q4_1 and Q5_1 products
    "e2b": ["--preset", "e2b", "--layers", "4", "--type", "q6_k", "--tensor-type", "ffn=q4_1",
            "--tensor-type", "attn_v=q5_1"],
}
N_IDS, N_GEN = 40, 8


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("neon_models")
    paths = {}
    for name, args in MODELS.items():
        paths[name] = out / f"{name}.gguf"
        r = subprocess.run([sys.executable, str(ROOT / "bench/make_synthetic_gguf.py"), str(paths[name]),
                            "--narrow", "--vocab", "1024", *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    return paths


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_neon_engine_matches_x86(binaries, models, tmp_path, variant, model):
    """Precise mode (float32 activations) agrees with this machine's to 1e-4 and decodes the same
    greedy tokens. The 8-bit-activation mode is held to 5e-2: a last-bit difference in any float
    sum flips some activation roundings, and the flips spread layer by layer (NEON and this
    machine's portable path differ by ~1.5e-2 on these files, as do NEON and the portable path
    on the same Arm machine)."""
    import markbase

    ids = np.random.default_rng(1).integers(5, 1000, N_IDS).astype(np.int32)
    ids.tofile(tmp_path / "ids.bin")
    for precise in (True, False):
        assert _run(binaries[variant], ["engine", models[model], int(precise), N_GEN, tmp_path / "ids.bin",
                                        tmp_path / "logits.bin", tmp_path / "gen.bin"], "auto") == variant
        got = np.fromfile(tmp_path / "logits.bin", np.float32).reshape(N_IDS, -1)
        gen = np.fromfile(tmp_path / "gen.bin", np.int32).tolist()
        m = markbase.Model.load(str(models[model]), backend="cpu", threads=2, kv_cache="f32", precise=precise)
        want = m.logits(ids.tolist())
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < (1e-4 if precise else 5e-2), (model, precise, err)
        if precise:
            assert gen == list(m.generate_tokens(ids.tolist(), max_tokens=N_GEN, temperature=0)), model
