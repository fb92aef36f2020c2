"""Every Metal kernel (and each fusion the Metal backend makes) against the CPU backend's op, on
small shapes, in three thread orders of the emulator (forward, reverse, seeded shuffle: a missing
barrier shows up in at least one of them as NaN-poisoned threadgroup memory).

Runs where the Metal backend is built: on Linux with CMAKE_ARGS=-DMARKBASE_METAL_EMU=ON (what
.ci/run builds), or on a Mac.
"""
from __future__ import annotations

import numpy as np
import pytest

import markbase
from backend_check import TYPES, compare, embed_op, embed_table, random_tensor

core = markbase._core


def _metal_available() -> str | None:
    try:
        core._GraphRunner("metal")
    except markbase.BackendError as e:
        return str(e)
    return None


_why = _metal_available()
pytestmark = pytest.mark.skipif(_why is not None, reason=f"no Metal backend in this build: {_why}")
ORDERS = ["forward", "reverse", "shuffle"]


@pytest.fixture(params=ORDERS)
def order(request):
    if getattr(core, "_has_metal_emu", False):
        core._metal_emu_set_order(request.param, 7)
        yield request.param
        core._metal_emu_set_order("forward", 1)
    else:
        yield request.param


def tokens(n, vocab=16, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


# ---------------------------------------------------------------------------------------------
# matrix products: every tensor type, decode (mul_mv) and prefill (mul_mm) sizes


@pytest.mark.parametrize("T", [1, 3, 8, 9, 37])
@pytest.mark.parametrize("type_", TYPES)
def test_matmul(order, type_, T):
    N, K = 40, 512  # 40 rows: a partial simdgroup-matrix tile and a partial matvec threadgroup

    def build(r):
        rng = np.random.default_rng(1)
        x = embed_table(r, rng, 16, K)
        w = r.weight(type_, (N, K), random_tensor(rng, type_, N, K))
        return {"slots": [(K, False, 1), (N, False, 1)], "result": 1,
                "ops": [embed_op(x, 0, K), {"kind": "matmul", "out": 1, "a": 0, "w": w, "n": N}]}

    compare(core, "metal", build, [(tokens(T), 0)], tol=1e-5)


@pytest.mark.parametrize("T", [1, 4, 12])
@pytest.mark.parametrize("type_", ["f16", "q4_0", "q6_k"])
def test_geglu_fused_gate_up(order, type_, T):
    """matmul(gate) + matmul(up) + gelu_mul: one mul_mv_geglu kernel for short steps."""
    N, K = 24, 256

    def build(r):
        rng = np.random.default_rng(2)
        x = embed_table(r, rng, 16, K)
        wg = r.weight(type_, (N, K), random_tensor(rng, type_, N, K))
        wu = r.weight(type_, (N, K), random_tensor(rng, type_, N, K))
        return {"slots": [(K, False, 1), (N, False, 1), (N, False, 1)], "result": 1,
                "ops": [embed_op(x, 0, K),
                        {"kind": "matmul", "out": 1, "a": 0, "w": wg, "n": N},
                        {"kind": "matmul", "out": 2, "a": 0, "w": wu, "n": N},
                        {"kind": "gelu_mul", "out": 1, "a": 1, "b": 2, "n": N}]}

    compare(core, "metal", build, [(tokens(T), 0)])


@pytest.mark.parametrize("T", [1, 10])
def test_head_softcap(order, T):
    """The lm head with the final softcap fused (decode), or separate (prefill of all rows)."""
    V, K = 100, 64

    def build(r):
        rng = np.random.default_rng(3)
        x = embed_table(r, rng, 16, K, scale=4.0)
        w = r.weight("q8_0", (V, K), random_tensor(rng, "q8_0", V, K))
        return {"slots": [(K, False, 1), (V, False, 1)], "result": 1,
                "ops": [embed_op(x, 0, K), {"kind": "matmul", "out": 1, "a": 0, "w": w, "n": V},
                        {"kind": "softcap", "out": 1, "a": 1, "n": V, "f": 0.5}]}

    compare(core, "metal", build, [(tokens(T), 0)])


@pytest.mark.parametrize("type_", TYPES)
def test_embed(order, type_):
    K = 256

    def build(r):
        rng = np.random.default_rng(4)
        w = r.weight(type_, (20, K), random_tensor(rng, type_, 20, K))
        return {"slots": [(K + 8, False, 1)], "result": 0,
                "ops": [{"kind": "embed", "out": 0, "w": w, "n": K, "f": 1.5}]}

    compare(core, "metal", build, [(tokens(7, 20), 0)], tol=1e-6)


# ---------------------------------------------------------------------------------------------
# norms, elementwise ops, RoPE


@pytest.mark.parametrize("group,weighted", [(64, True), (16, False), (16, True)])
def test_rms_norm(order, group, weighted):
    n = 64

    def build(r):
        rng = np.random.default_rng(5)
        x = embed_table(r, rng, 16, n, scale=3.0)
        w = r.weight("f32", (group,), rng.standard_normal(group).astype(np.float32).tobytes())
        op = {"kind": "rms_norm", "out": 1, "a": 0, "n": n, "group": group, "f": 1e-6}
        if weighted:
            op["w"] = w
        return {"slots": [(n, False, 1), (n + 4, False, 1)], "result": 1,
                "ops": [embed_op(x, 0, n), op]}

    compare(core, "metal", build, [(tokens(5), 0)])


@pytest.mark.parametrize("inplace", [True, False])
@pytest.mark.parametrize("n", [64, 640])
def test_norm_add_fused(order, n, inplace):
    """post-norm + residual add: one rms_norm_add kernel; every slot is checked. The add in place
    (x = x + norm(y)) or into a row of its own (z = x + norm(y): Gemma's mid-layer residual)."""
    def build(r, result):
        rng = np.random.default_rng(6)
        x = embed_table(r, rng, 16, n)
        y = embed_table(r, rng, 16, n, scale=5.0)
        w = r.weight("bf16", (n,), (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16)
                     .astype(np.uint16).tobytes())
        return {"slots": [(n, False, 1), (n, False, 1), (n, False, 1)], "result": result,
                "ops": [embed_op(x, 0, n), embed_op(y, 1, n),
                        {"kind": "rms_norm", "out": 1, "a": 1, "n": n, "group": n, "w": w, "f": 1e-6},
                        {"kind": "add", "out": 0 if inplace else 2, "a": 0, "b": 1, "n": n}]}

    for result in (0, 1) if inplace else (0, 1, 2):
        compare(core, "metal", lambda r: build(r, result), [(tokens(3), 0)])


@pytest.mark.parametrize("kind", ["add", "scale", "softcap", "gelu_mul", "last_row"])
def test_elementwise(order, kind):
    n = 300  # not a multiple of the 256-thread threadgroups

    def build(r):
        rng = np.random.default_rng(7)
        a = embed_table(r, rng, 16, n, scale=2.0)
        b = embed_table(r, rng, 16, n + 20)
        op = {"kind": kind, "out": 2, "a": 0, "b": 1, "n": n, "f": 0.7}
        if kind == "gelu_mul":
            op["b_col"] = 20
        slots = [(n, False, 1), (n + 20, False, 1), (n, kind == "last_row", 1)]
        return {"slots": slots, "result": 2,
                "ops": [embed_op(a, 0, n), embed_op(b, 1, n + 20), op]}

    compare(core, "metal", build, [(tokens(6), 0)])


@pytest.mark.parametrize("normed", [False, True])
@pytest.mark.parametrize("head_dim", [16, 256])
def test_rope(order, normed, head_dim):
    heads = 3

    def build(r):
        rng = np.random.default_rng(8)
        n = heads * head_dim
        x = embed_table(r, rng, 16, n)
        w = r.weight("f32", (head_dim,), rng.standard_normal(head_dim).astype(np.float32).tobytes())
        inv = (1.0 / 10000 ** (np.arange(head_dim // 2) * 2 / head_dim)).astype(np.float32)
        inv[head_dim // 4:] *= 0.0 if head_dim > 16 else 1.0  # partial rotation on the wide heads
        ops = [embed_op(x, 0, n)]
        if normed:
            ops.append({"kind": "rms_norm", "out": 0, "a": 0, "n": n, "group": head_dim, "w": w,
                        "f": 1e-6})
        ops.append({"kind": "rope", "out": 0, "a": 0, "n": n, "group": head_dim, "heads": heads,
                    "table": 0})
        return {"slots": [(n, False, 1)], "result": 0, "ops": ops, "rope_tables": [inv.tolist()]}

    compare(core, "metal", build, [(tokens(4), 1000)])


# ---------------------------------------------------------------------------------------------
# KV cache and attention: several steps over one cache, ring buffers, head dim 512


@pytest.mark.parametrize("kv_cache", ["f32", "f16"])
@pytest.mark.parametrize("head_dim,window,fused,v_norm", [
    (16, 4, True, True),     # sliding layer, ring cache, K path fused with V's norm
    (16, 4, False, False),   # the same with single kernels
    (512, 0, True, False),   # Gemma 4 full layer: head_dim 512
    (64, 0, False, True),
])
def test_attention_steps(order, kv_cache, head_dim, window, fused, v_norm):
    heads, kvh, chunk = 4, 2, 5
    capacity = window - 1 + chunk if window else 32
    ring = window > 0
    nq, nkv = heads * head_dim, kvh * head_dim

    def build(r):
        rng = np.random.default_rng(9)
        q = embed_table(r, rng, 32, nq)
        kr = embed_table(r, rng, 32, nkv)
        vr = embed_table(r, rng, 32, nkv)
        kw = r.weight("f32", (head_dim,), rng.uniform(0.5, 1.5, head_dim).astype(np.float32).tobytes())
        inv = (1.0 / 10000 ** (np.arange(head_dim // 2) * 2 / head_dim)).astype(np.float32)
        # slots: 0 q, 1 k raw, 2 v raw, 3 k, 4 v, 5 out
        ops = [embed_op(q, 0, nq), embed_op(kr, 1, nkv), embed_op(vr, 2, nkv),
               {"kind": "rms_norm", "out": 3, "a": 1, "n": nkv, "group": head_dim, "w": kw, "f": 1e-6},
               {"kind": "rope", "out": 3, "a": 3, "n": nkv, "group": head_dim, "heads": kvh, "table": 0}]
        vslot = 2
        if v_norm:
            ops.append({"kind": "rms_norm", "out": 4, "a": 2, "n": nkv, "group": head_dim, "f": 1e-6})
            vslot = 4
        if not fused:  # an op between the K norm/RoPE and the store keeps them unfused
            ops.insert(4, {"kind": "scale", "out": 5, "a": 0, "n": 1, "f": 1.0})
        ops.append({"kind": "store_kv", "a": 3, "b": vslot, "n": nkv, "layer": 0, "group": head_dim,
                    "kv_heads": kvh})
        ops.append({"kind": "attention", "out": 5, "a": 0, "n": nq, "layer": 0, "group": head_dim,
                    "heads": heads, "kv_heads": kvh, "f": head_dim ** -0.5, "window": window})
        slots = [(nq, False, 1), (nkv, False, 1), (nkv, False, 1), (nkv, False, 1), (nkv, False, 1),
                 (nq, False, 1)]
        return {"slots": slots, "result": 5, "ops": ops, "rope_tables": [inv.tolist()]}

    caches = [(kvh, head_dim, capacity, ring)]
    steps = [(tokens(chunk, 32, 1), 0), (tokens(1, 32, 2), chunk), (tokens(1, 32, 3), chunk + 1),
             (tokens(chunk, 32, 4), chunk + 2), (tokens(1, 32, 5), 2 * chunk + 2)]
    compare(core, "metal", build, steps, kv_cache=kv_cache, caches=caches,
            tol=1e-4 if kv_cache == "f32" else 1e-3)


# ---------------------------------------------------------------------------------------------
# MoE: routing on the GPU, decode expert kernels, prefill per-expert tiles by indirect dispatch


@pytest.mark.parametrize("T", [1, 3, 40])
@pytest.mark.parametrize("type_gu,type_dn", [("q4_0", "q8_0"), ("q4_k", "q6_k"), ("f16", "bf16")])
def test_moe(order, T, type_gu, type_dn):
    H, E, K, F = 256, 8, 3, 256

    def build(r):
        rng = np.random.default_rng(10)
        x = embed_table(r, rng, 64, H)
        logits = embed_table(r, rng, 64, E, scale=2.0)
        scale = r.weight("f32", (E,), rng.uniform(0.5, 2, E).astype(np.float32).tobytes())
        gu = r.weight(type_gu, (E, 2 * F, H), random_tensor(rng, type_gu, E * 2 * F, H))
        dn = r.weight(type_dn, (E, H, F), random_tensor(rng, type_dn, E * H, F))
        ops = [embed_op(x, 0, H), embed_op(logits, 1, E),
               {"kind": "moe_route", "out": 2, "a": 1, "n": 2 * K, "k": K, "group": E, "w2": scale},
               {"kind": "moe_experts", "out": 3, "a": 0, "b": 2, "n": H, "w": gu, "w2": dn,
                "k": F, "heads": K}]
        return {"slots": [(H, False, 1), (E, False, 1), (2 * K, False, 1), (H, False, 1)],
                "result": 3, "ops": ops}

    compare(core, "metal", build, [(tokens(T, 64, T), 0)])


def test_moe_route_ties_and_weights(order):
    """The route slot itself: expert ids and renormalised, scaled weights (ties to the lower id)."""
    E, K = 12, 4

    def build(r):
        rng = np.random.default_rng(11)
        t = np.round(rng.standard_normal((16, E)), 1).astype(np.float32)  # many exact ties
        logits = r.weight("f32", (16, E), t.tobytes())
        return {"slots": [(E, False, 1), (2 * K, False, 1)], "result": 1,
                "ops": [embed_op(logits, 0, E),
                        {"kind": "moe_route", "out": 1, "a": 0, "n": 2 * K, "k": K, "group": E}]}

    compare(core, "metal", build, [(tokens(16, 16, 3), 0)], tol=1e-6)


def test_one_command_buffer_per_step():
    """However many ops a step has, the fake Metal runtime sees one wait."""
    n = 64

    def build(r):
        rng = np.random.default_rng(12)
        x = embed_table(r, rng, 16, n)
        ops = [embed_op(x, 0, n)] + [{"kind": "scale", "out": 0, "a": 0, "n": n, "f": 1.01}] * 10
        return {"slots": [(n, False, 1)], "result": 0, "ops": ops}

    from backend_check import Runner
    r = Runner(core, "metal")
    r.run(build(r), tokens(2))
    assert r.r.waits == 1
    assert r.r.kernels == 11


@pytest.mark.parametrize("T", [1, 3, 12])
@pytest.mark.parametrize("read_later", [False, True])
def test_norm_fused_into_products(order, T, read_later):
    """attn_norm feeding three products (fused into each matvec when nothing reads the normed
    slot later), and ffn_norm feeding the gate/up pair; with read_later the normed slot is read
    after the products, so the norm must run on its own."""
    H, N = 256, 40

    def build(r):
        rng = np.random.default_rng(13)
        x = embed_table(r, rng, 16, H, scale=3.0)
        nw = r.weight("f32", (H,), rng.uniform(0.5, 1.5, H).astype(np.float32).tobytes())
        ws = [r.weight("q4_k", (N, H), random_tensor(rng, "q4_k", N, H)) for _ in range(5)]
        # slots: 0 x, 1 h (normed), 2..4 products, 5 gate, 6 up
        ops = [embed_op(x, 0, H),
               {"kind": "rms_norm", "out": 1, "a": 0, "n": H, "group": H, "w": nw, "f": 1e-6}]
        ops += [{"kind": "matmul", "out": 2 + j, "a": 1, "w": ws[j], "n": N} for j in range(3)]
        if read_later:
            ops.append({"kind": "add", "out": 2, "a": 2, "b": 1, "n": N})
        ops += [{"kind": "rms_norm", "out": 1, "a": 0, "n": H, "group": H, "w": nw, "f": 1e-6},
                {"kind": "matmul", "out": 5, "a": 1, "w": ws[3], "n": N},
                {"kind": "matmul", "out": 6, "a": 1, "w": ws[4], "n": N},
                {"kind": "gelu_mul", "out": 5, "a": 5, "b": 6, "n": N},
                {"kind": "add", "out": 5, "a": 5, "b": 2, "n": N},
                {"kind": "add", "out": 5, "a": 5, "b": 3, "n": N},
                {"kind": "add", "out": 5, "a": 5, "b": 4, "n": N},
                {"kind": "scale", "out": 1, "a": 0, "n": H, "f": 1.0}]  # h overwritten: dead
        slots = [(H, False, 1), (H, False, 1)] + [(N, False, 1)] * 5
        return {"slots": slots, "result": 5, "ops": ops}

    compare(core, "metal", build, [(tokens(T), 0)])


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("case", ["apart", "input_changed", "read_between"])
def test_norm_fused_into_products_apart(order, T, case):
    """Products of one norm that are not adjacent (Gemma's q, then q's norm and RoPE, then k and
    v): fused when nothing else reads the normed slot; not when the norm's input changes before
    the last product, or when another op reads the normed slot in between."""
    H, N = 256, 32

    def build(r):
        rng = np.random.default_rng(14)
        x = embed_table(r, rng, 16, H, scale=2.0)
        nw = r.weight("f32", (H,), rng.uniform(0.5, 1.5, H).astype(np.float32).tobytes())
        ws = [r.weight("q8_0", (N, H), random_tensor(rng, "q8_0", N, H)) for _ in range(2)]
        # slots: 0 x, 1 h, 2 p0, 3 p1
        between = {"apart": {"kind": "scale", "out": 2, "a": 2, "n": N, "f": 0.5},
                   "input_changed": {"kind": "scale", "out": 0, "a": 0, "n": H, "f": 2.0},
                   "read_between": {"kind": "add", "out": 2, "a": 2, "b": 1, "n": N}}[case]
        ops = [embed_op(x, 0, H),
               {"kind": "rms_norm", "out": 1, "a": 0, "n": H, "group": H, "w": nw, "f": 1e-6},
               {"kind": "matmul", "out": 2, "a": 1, "w": ws[0], "n": N},
               between,
               {"kind": "matmul", "out": 3, "a": 1, "w": ws[1], "n": N},
               {"kind": "add", "out": 3, "a": 3, "b": 2, "n": N}]
        slots = [(H, False, 1), (H, False, 1), (N, False, 1), (N, False, 1)]
        return {"slots": slots, "result": 3, "ops": ops}

    compare(core, "metal", build, [(tokens(T), 0)])
