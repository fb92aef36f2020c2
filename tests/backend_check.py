"""Checks shared by the GPU backend tests (Metal under emulation, CUDA on a GPU): each op and each
fusion of the step graph run on the GPU backend and on the CPU backend's precise mode with the
same storage types, through markbase._core._GraphRunner, so only kernel arithmetic differs.

Inputs reach the op under test through an Embed op over a float32 table (exact on every backend),
so every graph here is: embeds that fill the input slots, then the ops being checked.
"""
from __future__ import annotations

import numpy as np

TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]
# elements and bytes per block, and where each block's fp16 scales live
BLOCK = {"f32": (1, 4, []), "f16": (1, 2, []), "bf16": (1, 2, []),
         "q8_0": (32, 34, [0]), "q4_0": (32, 18, [0]), "q4_1": (32, 20, [0, 2]),
         "q5_0": (32, 22, [0]), "q5_1": (32, 24, [0, 2]), "q4_k": (256, 144, [0, 2]),
         "q5_k": (256, 176, [0, 2]), "q6_k": (256, 210, [208])}


def random_tensor(rng, type_: str, rows: int, cols: int) -> bytes:
    """Raw blocks of a rows x cols tensor: random codes with sane fp16 scales (random bytes
    would give infinities and NaNs), or random floats for the float types."""
    if type_ == "f32":
        return rng.standard_normal((rows, cols)).astype(np.float32).tobytes()
    if type_ == "f16":
        return rng.standard_normal((rows, cols)).astype(np.float16).tobytes()
    if type_ == "bf16":
        f = rng.standard_normal((rows, cols)).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    be, bb, scales = BLOCK[type_]
    assert cols % be == 0
    nb = rows * cols // be
    raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    for off in scales:
        raw[:, off:off + 2] = (rng.uniform(0.002, 0.02, nb).astype(np.float16)
                               .view(np.uint8).reshape(nb, 2))
    return raw.tobytes()


class Runner:
    """One backend's _GraphRunner with float32 input tables registered."""

    def __init__(self, core, backend: str, kv_cache: str = "f32", caches=()):
        self.r = core._GraphRunner(backend, kv_cache=kv_cache, precise=True, threads=2,
                                   caches=list(caches))

    def weight(self, type_: str, shape, raw: bytes) -> int:
        return self.r.add_weight(type_, list(shape), raw)

    def run(self, spec, tokens, pos0=0):
        return self.r.run(spec, list(tokens), pos0)


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def compare(core, gpu: str, build, steps, kv_cache="f32", caches=(), tol=1e-4):
    """Runs build(runner) -> spec on the GPU backend and on the CPU for each (tokens, pos0) of
    steps (sharing one KV cache per backend across steps); returns the worst relative error
    after asserting it is within tol."""
    outs = {}
    for be in (gpu, "cpu"):
        r = Runner(core, be, kv_cache, caches)
        spec = build(r)
        outs[be] = [r.run(spec, toks, pos0) for toks, pos0 in steps]
    worst = 0.0
    for i, (g, c) in enumerate(zip(outs[gpu], outs["cpu"])):
        assert g.shape == c.shape
        assert np.isfinite(g).all(), f"step {i}: non-finite values on {gpu}"
        e = rel_err(g, c)
        worst = max(worst, e)
        assert e <= tol, f"step {i}: relative error {e:.3e} > {tol:.0e}"
    return worst


def embed_table(r: Runner, rng, rows: int, cols: int, scale: float = 1.0) -> int:
    t = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    return r.weight("f32", (rows, cols), t.tobytes())


def embed_op(w: int, out: int, n: int) -> dict:
    return {"kind": "embed", "out": out, "w": w, "n": n, "f": 1.0}


# Tiny models of random shapes (tests/tiny_gemma.py's random_overrides: odd hidden sizes, one KV
# head, head dims 8-64, untied embeddings, 2-16 experts, top-1..4, ...) for the GPU backends'
# whole-model checks against the CPU, as the CPU is checked against transformers on them.
RANDOM_SHAPES = [(kind, seed) for seed in range(4) for kind in ("gemma3", "gemma4", "gemma4_moe")]
RANDOM_SHAPE_IDS = [f"{kind}-{seed}" for kind, seed in RANDOM_SHAPES]


def random_shape_model(tmp_path, kind: str, seed: int, prompt: int = 20, n_new: int = 8):
    """The (kind, seed) random-shape model saved under tmp_path, and a prompt whose greedy
    continuation (n_new tokens) has no near-ties in transformers: (path, ids)."""
    import tiny_gemma as tg

    model = tg.build_model(kind, seed=seed, **tg.random_overrides(kind, seed))
    path = tg.save_model(model, str(tmp_path / f"{kind}-{seed}"))
    ids, _, _ = tg.pick_prompt(model, prompt, n_new, seed=seed, tries=8)
    return path, ids
