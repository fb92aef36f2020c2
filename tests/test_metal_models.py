"""Whole models through Model.load(..., backend="metal") against the CPU backend's precise mode
with the same KV-cache type, so only kernel arithmetic differs: logits within 1e-3 relative
error, greedy tokens identical, one host wait per token and the kernels per token counted by the
(fake, in the emulated build) Metal runtime.

Plus a text-level check that runs in every build: the kernel each tensor type uses exists in the
.metal sources for every product the backend dispatches.
"""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

import markbase
from backend_check import RANDOM_SHAPE_IDS, RANDOM_SHAPES, TYPES, random_shape_model, rel_err

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METAL_DIR = os.path.join(ROOT, "metal")


def _kernel_names() -> set[str]:
    names = set()
    for f in os.listdir(METAL_DIR):
        if f.endswith(".metal"):
            src = open(os.path.join(METAL_DIR, f)).read()
            names |= set(re.findall(r'host_name\("([a-z0-9_]+)"\)', src))
            names |= set(re.findall(r'^kernel void ([a-z0-9_]+)\(', src, re.M))
    return names


# The kernel each tensor type is read by, per product: decode matvec, fused gate/up matvec,
# prefill simdgroup-matrix matmul, MoE expert tiles. (Embedding rows and the decode MoE kernels
# take the type as an argument and decode it with metal/dequant.h's dequant4.)
KERNEL_OF_TYPE = {t: [f"mul_mv_{t}", f"mul_mv_geglu_{t}", f"mul_mm_{t}", f"moe_mm_{t}"] for t in TYPES}


@pytest.mark.parametrize("type_", TYPES)
def test_every_type_has_its_kernels(type_):
    names = _kernel_names()
    missing = [k for k in KERNEL_OF_TYPE[type_] if k not in names]
    assert not missing, f"{type_}: no kernel named {missing} in metal/*.metal"


def test_host_uses_only_existing_kernels():
    src = open(os.path.join(ROOT, "cpp", "backend", "metal", "metal_backend.cpp")).read()
    used = set(re.findall(r'use\(enc, "([a-z0-9_]+)"\)', src))
    assert used, "no kernel names found in the host code"
    missing = used - _kernel_names()
    assert not missing, f"host code dispatches kernels that no .metal file defines: {missing}"


def _metal_or_skip():
    try:
        markbase._core._GraphRunner("metal")
    except markbase.BackendError as e:
        pytest.skip(f"no Metal backend in this build: {e}")


PROMPT = 20   # two prefill chunks of 16 and 4: the simdgroup-matrix and the matvec paths
N_NEW = 10
CHUNK = 16


@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("name", ["gemma3", "gemma4", "gemma4_moe"])
def test_tiny_model_matches_cpu(tiny_models, name, kv):
    _metal_or_skip()
    tm = tiny_models[name]
    ids = tm.prompt(PROMPT, N_NEW)
    cpu = markbase.Model.load(tm.path, backend="cpu", kv_cache=kv, precise=True, prefill_chunk=CHUNK)
    gpu = markbase.Model.load(tm.path, backend="metal", kv_cache=kv, prefill_chunk=CHUNK)
    want, got = np.asarray(cpu.logits(ids)), np.asarray(gpu.logits(ids))
    assert np.isfinite(got).all()
    err = rel_err(got, want)
    assert err <= 1e-3, f"{name} kv={kv}: relative error {err:.3e}"
    g_cpu = list(cpu.generate_tokens(ids, max_tokens=N_NEW, temperature=0))
    g_gpu = list(gpu.generate_tokens(ids, max_tokens=N_NEW, temperature=0))
    assert g_gpu == g_cpu
    st, st_cpu = gpu.stats(), cpu.stats()
    assert st["backend"] == "metal"
    assert st["host_waits_per_token"] == 1
    # Fusion makes fewer kernels than the CPU's ops, and every layer needs a few.
    n_layers = gpu.config["n_layers"]
    assert 4 * n_layers < st["kernels_per_token"] < st_cpu["kernels_per_token"], (st, st_cpu)


@pytest.mark.parametrize("kind,seed", RANDOM_SHAPES, ids=RANDOM_SHAPE_IDS)
def test_random_shape_matches_cpu(tmp_path, kind, seed):
    """Shapes the fixed tiny models do not have (backend_check.RANDOM_SHAPES): logits through the
    prefill chunks (16 + 4) and greedy decoding."""
    _metal_or_skip()
    path, ids = random_shape_model(tmp_path, kind, seed, PROMPT, N_NEW)
    cpu = markbase.Model.load(path, backend="cpu", kv_cache="f32", precise=True, prefill_chunk=CHUNK)
    gpu = markbase.Model.load(path, backend="metal", kv_cache="f32", prefill_chunk=CHUNK)
    err = rel_err(gpu.logits(ids), cpu.logits(ids))
    assert err <= 1e-3, f"{kind} seed {seed}: relative error {err:.3e}"
    assert (list(gpu.generate_tokens(ids, max_tokens=N_NEW, temperature=0))
            == list(cpu.generate_tokens(ids, max_tokens=N_NEW, temperature=0)))


def test_tiny_model_q4_0_matches_cpu(tiny_models):
    """quant="q4_0" on load: the quantized kernels through a whole model (the MoE one)."""
    _metal_or_skip()
    tm = tiny_models["gemma4_moe"]
    ids = tm.prompt(PROMPT, N_NEW)
    cpu = markbase.Model.load(tm.path, backend="cpu", kv_cache="f32", precise=True, quant="q4_0",
                              prefill_chunk=CHUNK)
    gpu = markbase.Model.load(tm.path, backend="metal", kv_cache="f32", quant="q4_0", prefill_chunk=CHUNK)
    assert rel_err(gpu.logits(ids), cpu.logits(ids)) <= 1e-3
    assert (list(gpu.generate_tokens(ids, max_tokens=6, temperature=0))
            == list(cpu.generate_tokens(ids, max_tokens=6, temperature=0)))


def test_real_gemma3_270m_few_tokens():
    """A few tokens of the real Gemma 3 270M Q4_K_M file (Q5_0/Q8_0/Q4_K/Q6_K tensors, 262k vocab)."""
    _metal_or_skip()
    from markbase.default_model import default_model_path

    path = default_model_path()
    cpu = markbase.Model.load(path, backend="cpu", kv_cache="f16", precise=True, max_context=64)
    gpu = markbase.Model.load(path, backend="metal", kv_cache="f16", max_context=64)
    ids = cpu.tokenize("The capital of France is")
    assert rel_err(gpu.logits(ids), cpu.logits(ids)) <= 1e-3
    g_cpu = list(cpu.generate_tokens(ids, max_tokens=3, temperature=0))
    assert list(gpu.generate_tokens(ids, max_tokens=3, temperature=0)) == g_cpu
    assert gpu.stats()["host_waits_per_token"] == 1


def test_one_expert_moe_matches_cpu(tmp_path):
    """A Gemma 4 MoE with one expert, top-1 (the shape of bench/make_synthetic_gguf.py's
    --one-expert twin): the routing kernels with E = k = 1, prompt (16 + 4 tokens) and decode."""
    _metal_or_skip()
    import tiny_gemma as tg
    path = tg.save_model(tg.build_model("gemma4_moe", seed=5, num_experts=1, top_k_experts=1),
                         str(tmp_path / "moe-one"))
    ids = tg.random_prompt(PROMPT, 512, seed=3)
    cpu = markbase.Model.load(path, backend="cpu", kv_cache="f32", precise=True, prefill_chunk=CHUNK)
    gpu = markbase.Model.load(path, backend="metal", kv_cache="f32", prefill_chunk=CHUNK)
    assert rel_err(gpu.logits(ids), cpu.logits(ids)) <= 1e-3
    assert (list(gpu.generate_tokens(ids, max_tokens=6, temperature=0))
            == list(cpu.generate_tokens(ids, max_tokens=6, temperature=0)))
