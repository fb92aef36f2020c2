#!/usr/bin/env python3
"""Tiny random-weight Gemma 3 / Gemma 4 models built with transformers' own classes.

The models are the oracle side of MarkBase's parity tests: transformers computes the reference
logits and greedy tokens, MarkBase loads the saved directory (or a GGUF converted from it) and must
reproduce them. Everything is float32 and deterministic from a seed.

Kinds (``KINDS``), defaults (every size is a config override, see build_model):
  gemma3       Gemma3ForCausalLM: layers s,s,f,s,s,f, window 6, query_pre_attn_scalar 24 !=
               head_dim 16, linear RoPE scaling (x8) on the full layers.
  gemma4       Gemma4ForCausalLM, dense, E2B-like, 8 layers s,s,s,f,s,s,s,f, window 5: per-layer
               embeddings (PLE, 8 per layer), KV sharing of the last 4 layers (the last non-shared
               layer is full and the one before it sliding, as in E2B/E4B; the only layout
               llama.cpp accepts), double-wide MLP on the KV-shared layers, head_dim 16 (sliding)
               / 32 (full), proportional partial RoPE (0.25) on full layers, final softcap 30.
  gemma4_moe   Gemma4ForCausalLM, 26B-A4B-like, 6 layers s,s,f,s,s,f, window 4: MoE block (8
               experts, top 2) beside the dense MLP, attention_k_eq_v, num_global_key_value_heads
               1 != num_key_value_heads 2, no PLE, no KV sharing.
All: vocab 512, hidden 64, 4 query heads, 2 KV heads, max_position_embeddings 256, tied embeddings.
Every kind also has a "published multimodal" layout (``layout="conditional"``): the same weights
saved as Gemma4ForConditionalGeneration (tensors under ``model.language_model.``, config.json with
``text_config``; that config is written the way published checkpoints write it, with
``global_head_dim`` / ``num_global_key_value_heads`` instead of transformers' re-serialised
``per_layer_config``), or as Gemma3ForConditionalGeneration (tensors under ``language_model.model.``
beside a tiny vision tower, and the minimal text_config of the published gemma-3-4b/12b/27b
checkpoints: only the keys that differ from transformers' defaults).

Every 1-D norm weight, ``layer_scalar``, ``router.scale`` and ``router.per_expert_scale`` is
perturbed away from its initial value so that every scale matters (see perturb_; Gemma 4 q/k norm
weights are also scaled down and router projections up so that the random models are not chaotic).

Transformers 5.23 limitation: Gemma 4 with KV sharing but without PLE crashes in transformers'
forward, so gemma4_config refuses num_kv_shared_layers > 0 with hidden_size_per_layer_input = 0.

Each saved directory holds config.json, generation_config.json, model.safetensors, tokenizer.json
(a Gemma-style BPE with byte fallback built with the ``tokenizers`` library; ids <pad>=0 <eos>=1
<bos>=2 <unk>=3) and tokenizer_config.json.

Library use::

    import tiny_gemma as tg
    model = tg.build_model("gemma4", seed=1, hidden_size=128)   # overrides go to the config
    tg.save_model(model, "/tmp/g4")                             # HF directory
    tg.save_model(model, "/tmp/g4_cg", layout="conditional")    # published multimodal layout
    ref = tg.load_hf("/tmp/g4_cg")                              # transformers model back
    tg.hf_logits(ref, ids); tg.hf_greedy(ref, ids, 20)

Command line::

    python tests/tiny_gemma.py OUT_DIR [--kinds gemma3,gemma4,gemma4_moe] [--seed S]
                                       [--set key=value ...] [--check]

writes OUT_DIR/<kind> and OUT_DIR/<kind>_cg. ``--set`` overrides config
fields of every kind built (values parsed as JSON, e.g. ``--set sliding_window=7``).
``--check`` reloads each directory and prints cache-vs-no-cache and reload differences.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
from typing import Any, Sequence

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer
from transformers import (
    Gemma3Config,
    Gemma3ForCausalLM,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
)

# The models are tiny: one intra-op thread is faster than several, and idle torch worker threads
# spinning in the background would steal cores from the engine under test in the same process.
torch.set_num_threads(1)

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]
SPECIAL_IDS = frozenset(range(len(SPECIAL_TOKENS)))
KINDS = ("gemma3", "gemma4", "gemma4_moe")
DEFAULT_SEEDS = {"gemma3": 1234, "gemma4": 2345, "gemma4_moe": 3456}
ATTN_IMPL = "eager"

# --------------------------------------------------------------------------------------------
# configs


def e2b_layer_types(num_layers: int, num_kv_shared: int, period: int = 4) -> list[str]:
    """Sliding/full pattern with a full layer every `period` layers, the last layer full, and, if
    KV sharing is on, the last non-shared layer full and the one before it sliding (E2B/E4B)."""
    types = ["full_attention" if (i + 1) % period == 0 else "sliding_attention"
             for i in range(num_layers)]
    types[-1] = "full_attention"
    if num_kv_shared:
        first_shared = num_layers - num_kv_shared
        if first_shared < 2:
            raise ValueError("KV sharing needs at least two non-shared layers")
        types[first_shared - 1] = "full_attention"
        types[first_shared - 2] = "sliding_attention"
    return types


def _common(overrides: dict[str, Any]) -> dict[str, Any]:
    base = dict(
        max_position_embeddings=256,
        initializer_range=0.1,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=True,
    )
    base.update(overrides)
    return base


def gemma3_config(**overrides) -> Gemma3TextConfig:
    kw = _common(dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,  # != head_dim: the scale is query_pre_attn_scalar**-0.5
        sliding_window=6,
        layer_types=["sliding_attention"] * 2 + ["full_attention"]
        + ["sliding_attention"] * 2 + ["full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        },
        final_logit_softcapping=None,
    ))
    kw.update(overrides)
    if "num_hidden_layers" in overrides and "layer_types" not in overrides:
        kw["layer_types"] = e2b_layer_types(kw["num_hidden_layers"], 0, period=3)
    return Gemma3TextConfig(**kw)


def gemma4_config(**overrides) -> Gemma4TextConfig:
    kw = _common(dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        sliding_window=5,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1_000_000.0},
        },
        num_kv_shared_layers=4,
        use_double_wide_mlp=True,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=None,  # = vocab_size unless overridden
        attention_k_eq_v=False,
        enable_moe_block=False,
        final_logit_softcapping=30.0,
    ))
    kw.update(overrides)
    if kw.get("vocab_size_per_layer_input") is None:
        kw["vocab_size_per_layer_input"] = kw["vocab_size"]
    if kw.get("layer_types") is None:
        kw["layer_types"] = e2b_layer_types(kw["num_hidden_layers"], kw["num_kv_shared_layers"])
    if kw["num_kv_shared_layers"] and not kw["hidden_size_per_layer_input"]:
        # Gemma4TextModel._maybe_slice_kv_shared_inputs indexes per_layer_inputs, None without PLE
        raise ValueError("transformers 5.23 cannot run KV sharing without PLE "
                         "(hidden_size_per_layer_input > 0 needed)")
    return Gemma4TextConfig(**kw)


def gemma4_moe_config(**overrides) -> Gemma4TextConfig:
    kw = dict(
        intermediate_size=48,
        num_hidden_layers=6,
        num_global_key_value_heads=1,  # honoured only with attention_k_eq_v
        sliding_window=4,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        hidden_size_per_layer_input=0,
        attention_k_eq_v=True,
        enable_moe_block=True,
        num_experts=8,
        top_k_experts=2,
        moe_intermediate_size=32,
    )
    kw.update(overrides)
    if "layer_types" not in kw:
        kw["layer_types"] = e2b_layer_types(kw["num_hidden_layers"], kw["num_kv_shared_layers"],
                                            period=3)
    return gemma4_config(**kw)


CONFIG_BUILDERS = {"gemma3": gemma3_config, "gemma4": gemma4_config,
                   "gemma4_moe": gemma4_moe_config}
MODEL_CLASSES = {"gemma3": Gemma3ForCausalLM, "gemma4": Gemma4ForCausalLM,
                 "gemma4_moe": Gemma4ForCausalLM}


def random_overrides(kind: str, seed: int) -> dict[str, Any]:
    """Config overrides for a model of `kind` with a random shape (deterministic in seed): hidden
    sizes 32..160 (48, 96 and 160 not multiples of 64), 1-8 query heads and any KV grouping, head dims
    8..64, 1-7 layers in a random sliding/full order (Gemma 3) or an E2B-like order of random
    period (Gemma 4), windows 2..9, vocabularies that are not powers of two, tied or untied
    embeddings, with or without the final softcap, two epsilons; Gemma 4: full-layer head dim equal
    to or twice the sliding one, partial RoPE factors 0.25 / 0.5 / 1, PLE widths 0..16, KV sharing
    of up to all but two layers, double-wide MLPs, attention_k_eq_v with its own KV-head count;
    MoE: 2-16 experts, top-1..4, odd expert widths."""
    rng = random.Random(f"{kind}-{seed}")  # a str seed is hashed by sha512: stable across runs
    heads = rng.choice([1, 2, 4, 8])
    hd = rng.choice([8, 16, 32, 64])
    nl = rng.randint(1, 7)
    kw: dict[str, Any] = dict(
        hidden_size=rng.choice([32, 48, 64, 96, 128, 160]), num_attention_heads=heads,
        num_key_value_heads=rng.choice([d for d in (1, 2, 4, 8) if heads % d == 0]), head_dim=hd,
        num_hidden_layers=nl, sliding_window=rng.randint(2, 9),
        vocab_size=rng.choice([300, 512, 777]), tie_word_embeddings=rng.random() < 0.7,
        rms_norm_eps=rng.choice([1e-6, 1e-5]), final_logit_softcapping=rng.choice([None, 30.0]))
    if kind == "gemma3":
        kw["intermediate_size"] = rng.choice([32, 72, 128, 200])
        kw["query_pre_attn_scalar"] = rng.choice([hd, 24, 256])
        kw["layer_types"] = [rng.choice(["sliding_attention", "full_attention"]) for _ in range(nl)]
        kw["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": rng.choice([10_000.0, 500.0])},
            "full_attention": rng.choice([
                {"rope_type": "linear", "factor": rng.choice([1.0, 8.0]), "rope_theta": 1_000_000.0},
                {"rope_type": "default", "rope_theta": 1_000_000.0}]),
        }
        return kw
    if kind not in ("gemma4", "gemma4_moe"):
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
    moe = kind == "gemma4_moe"
    ple = rng.choice([0, 0, 8]) if moe else rng.choice([0, 4, 8, 16])
    shared = rng.randint(1, nl - 2) if ple and nl >= 3 and rng.random() < 0.6 else 0
    kw.update(intermediate_size=rng.choice([32, 48, 96, 128]), global_head_dim=rng.choice([hd, 2 * hd]),
              hidden_size_per_layer_input=ple, num_kv_shared_layers=shared,
              use_double_wide_mlp=shared > 0 and rng.random() < 0.5,
              attention_k_eq_v=rng.random() < 0.5)
    if kw["attention_k_eq_v"]:
        kw["num_global_key_value_heads"] = rng.choice([d for d in (1, 2, 4) if heads % d == 0])
    kw["rope_parameters"] = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "rope_theta": 1_000_000.0,
                           "partial_rotary_factor": rng.choice([0.25, 0.5, 1.0])},
    }
    kw["layer_types"] = e2b_layer_types(nl, shared, period=rng.choice([2, 3, 4]))
    if moe:
        ne = rng.choice([2, 4, 8, 16])
        kw.update(enable_moe_block=True, num_experts=ne, top_k_experts=rng.randint(1, min(ne, 4)),
                  moe_intermediate_size=rng.choice([16, 32, 40]))
    return kw

# --------------------------------------------------------------------------------------------
# models


def perturb_(model: torch.nn.Module, seed: int) -> None:
    """Move every 1-D parameter (norm weights, router.scale, per_expert_scale) and every
    layer_scalar buffer away from its initial value. Matrices keep transformers' init, except:
    - Gemma 4 q_norm/k_norm weights are scaled by head_dim**-0.25: Gemma 4's attention scale is
      1.0, so with unit norms the scores of random q/k would have std sqrt(head_dim) and saturate
      the softmax; that makes the model chaotic (tiny weight or arithmetic differences amplified
      ~50x in the logits). Trained checkpoints carry the temperature in these weights too.
    - router.proj is scaled by 10 so that router logits have std ~1 instead of ~0.1 (decisive
      top-k routing, few near-ties)."""
    is_gemma4 = "gemma4" in getattr(text_config(model), "model_type", "")
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("router.proj.weight"):
                p.mul_(10.0)
            if p.ndim != 1:
                continue
            if name.endswith("per_expert_scale"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            else:
                # Gemma 3 norms start at 0 (used as 1+w); Gemma 4 norms/scales at 1 (used as w)
                p.add_(0.3 * torch.randn(p.shape, generator=g))
                if is_gemma4 and name.endswith(("q_norm.weight", "k_norm.weight")):
                    p.mul_(p.numel() ** -0.25)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))


def _set_impl(cfg) -> None:
    cfg._attn_implementation = ATTN_IMPL
    # the plain per-expert loop: the default grouped_mm kernel is not bit-reproducible
    cfg._experts_implementation = "eager"
    for sub in ("text_config",):
        c = getattr(cfg, sub, None)
        if c is not None:
            c._attn_implementation = ATTN_IMPL
            c._experts_implementation = "eager"


def build_model(kind: str, seed: int | None = None, **overrides) -> torch.nn.Module:
    """A freshly initialised, perturbed float32 causal LM of the given kind (eval mode)."""
    if kind not in CONFIG_BUILDERS:
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
    seed = DEFAULT_SEEDS[kind] if seed is None else seed
    cfg = CONFIG_BUILDERS[kind](**overrides)
    _set_impl(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MODEL_CLASSES[kind](cfg)
    model = model.to(torch.float32).eval()
    perturb_(model, seed)
    return model


def _published_text_config(tc: dict[str, Any]) -> dict[str, Any]:
    """transformers re-serialises global_head_dim / num_global_key_value_heads as
    per_layer_config; published Gemma 4 configs carry the original keys. Put them back."""
    tc = dict(tc)
    plc = tc.pop("per_layer_config", None) or {}
    types = tc["layer_types"]
    full = [v for k, v in plc.items() if types[int(k)] == "full_attention"]
    # an entry (or a key of it) is left out where it equals the sliding layers' value
    entry = full[0] if full else {}
    tc["global_head_dim"] = entry.get("head_dim", tc["head_dim"])
    if entry.get("num_key_value_heads") is not None:
        tc["num_global_key_value_heads"] = entry["num_key_value_heads"]
    return tc


def _gemma3_published_text_config(tc: dict[str, Any]) -> dict[str, Any]:
    """A Gemma 3 text_config written as the published multimodal checkpoints (gemma-3-4b/12b/27b,
    saved by transformers 4.50) have it: only the keys that differ from Gemma3TextConfig's
    defaults, layer_types left to the default pattern (when it is that), RoPE as the flat
    rope_scaling of a linear factor with the default bases."""
    defaults = Gemma3TextConfig().to_dict()
    out = {k: v for k, v in tc.items()
           if k == "model_type" or k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size",
                    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                    "rms_norm_eps", "query_pre_attn_scalar", "sliding_window", "final_logit_softcapping")
           and v != defaults.get(k)}
    n = tc["num_hidden_layers"]
    if tc["layer_types"] != ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]:
        out["layer_types"] = tc["layer_types"]
    rp = tc["rope_parameters"]
    if (rp["sliding_attention"].get("rope_theta") != 10_000.0 or rp["full_attention"].get("rope_theta") != 1_000_000.0
            or rp["full_attention"]["rope_type"] not in ("default", "linear")):
        raise ValueError("the published Gemma 3 layout has the default RoPE bases and linear scaling only")
    if rp["full_attention"]["rope_type"] == "linear":
        out["rope_scaling"] = {"factor": rp["full_attention"]["factor"], "rope_type": "linear"}
    return out


def _save_conditional(model, cfg, cls, out_dir: str, text_config_as_published, unused=()) -> None:
    """model's weights saved as cls (a ...ForConditionalGeneration of config cfg, its decoder under
    model.language_model; transformers writes the names its checkpoints use), the config's
    text_config rewritten as published checkpoints have it. `unused`: name prefixes of the
    multimodal parts, left at their random init."""
    _set_impl(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        cg = cls(cfg).to(torch.float32).eval()
    tied = model.config.tie_word_embeddings
    sd = {"model.language_model." + k[len("model."):]: v
          for k, v in model.state_dict().items() if k.startswith("model.")}
    if not tied:  # an untied output projection of its own
        sd["lm_head.weight"] = model.state_dict()["lm_head.weight"]
    missing, unexpected = cg.load_state_dict(sd, strict=False)
    allowed = {"lm_head.weight"} if tied else set()
    if unexpected or any(k not in allowed and not k.startswith(tuple(unused)) for k in missing):
        raise RuntimeError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    cg.tie_weights()
    cg.save_pretrained(out_dir)
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        c = json.load(f)
    c["text_config"] = text_config_as_published(c["text_config"])
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)


def save_model(model: torch.nn.Module, out_dir: str, layout: str = "causal",
               tokenizer: bool = True) -> str:
    """Save as a Hugging Face directory. layout="conditional" writes the published multimodal
    layout: Gemma4ForConditionalGeneration with tensors under model.language_model, or
    Gemma3ForConditionalGeneration with tensors under language_model.model and the minimal
    text_config of the published Gemma 3 checkpoints (a tiny vision tower beside, unused)."""
    os.makedirs(out_dir, exist_ok=True)
    if layout == "causal":
        model.save_pretrained(out_dir)
    elif layout == "conditional":
        if isinstance(model, Gemma3ForCausalLM):
            vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          image_size=28, patch_size=14)
            cfg = Gemma3Config(text_config=model.config.to_dict(), vision_config=vision, mm_tokens_per_image=4,
                               tie_word_embeddings=model.config.tie_word_embeddings)
            _save_conditional(model, cfg, Gemma3ForConditionalGeneration, out_dir, _gemma3_published_text_config,
                              unused=("model.vision_tower.", "model.multi_modal_projector."))
        elif isinstance(model, Gemma4ForCausalLM):
            cfg = Gemma4Config(text_config=model.config.to_dict(), vision_config=None, audio_config=None,
                               tie_word_embeddings=model.config.tie_word_embeddings)
            _save_conditional(model, cfg, Gemma4ForConditionalGeneration, out_dir, _published_text_config)
        else:
            raise ValueError(f"no conditional layout for {type(model).__name__}")
    else:
        raise ValueError(f"layout must be 'causal' or 'conditional', not {layout!r}")
    if tokenizer:
        save_tokenizer(out_dir, model.config.vocab_size)
    return out_dir


def load_hf(path: str) -> torch.nn.Module:
    """Load a directory written by save_model with the matching transformers class."""
    with open(os.path.join(path, "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    cls = {"Gemma3ForCausalLM": Gemma3ForCausalLM, "Gemma4ForCausalLM": Gemma4ForCausalLM,
           "Gemma3ForConditionalGeneration": Gemma3ForConditionalGeneration,
           "Gemma4ForConditionalGeneration": Gemma4ForConditionalGeneration}[arch]
    m = cls.from_pretrained(path, attn_implementation=ATTN_IMPL, experts_implementation="eager",
                            dtype=torch.float32)
    return m.eval()


def text_config(model: torch.nn.Module):
    cfg = model.config
    return getattr(cfg, "text_config", None) or cfg


# --------------------------------------------------------------------------------------------
# reference computations


@torch.no_grad()
def hf_logits(model: torch.nn.Module, ids: Sequence[int]) -> np.ndarray:
    """float32 [len(ids), vocab] logits of one forward without cache (after the final softcap)."""
    x = torch.tensor([list(ids)], dtype=torch.long)
    return model(input_ids=x, use_cache=False).logits[0].float().numpy()


@torch.no_grad()
def hf_greedy(model: torch.nn.Module, ids: Sequence[int], n: int,
              return_logits: bool = False):
    """n greedy tokens with transformers' KV cache: an explicit argmax loop (no eos stopping, no
    logits processors). With return_logits also the [n, vocab] logits that chose each token."""
    out = model(input_ids=torch.tensor([list(ids)], dtype=torch.long), use_cache=True)
    past = out.past_key_values
    last = out.logits[0, -1].float()
    toks, rows = [], []
    for k in range(n):
        rows.append(last.numpy().copy())
        nxt = int(torch.argmax(last))
        toks.append(nxt)
        if k == n - 1:
            break
        out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        last = out.logits[0, -1].float()
    if return_logits:
        return toks, np.stack(rows)
    return toks


def random_prompt(length: int, vocab_size: int, seed: int, bos: bool = True) -> list[int]:
    """Deterministic random token ids in [4, vocab) (no special ids), BOS first."""
    rng = random.Random(seed)
    ids = [rng.randrange(len(SPECIAL_TOKENS), vocab_size) for _ in range(length - int(bos))]
    return ([BOS_ID] if bos else []) + ids


class RouterMonitor:
    """Context manager recording, over every MoE router call, the smallest gap between the K-th
    and (K+1)-th largest router logits (log-probabilities): how close a top-k choice came to
    flipping. inf when the model has no router."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.min_gap = float("inf")
        self._handles = []

    def _hook(self, module, inputs, output):
        probs = output[0].detach().float().reshape(-1, output[0].shape[-1])
        k = module.config.top_k_experts
        if probs.shape[-1] > k:
            top = torch.topk(torch.log(probs.clamp_min(1e-38)), k + 1, dim=-1).values
            self.min_gap = min(self.min_gap, float((top[:, k - 1] - top[:, k]).min()))

    def __enter__(self):
        for m in self.model.modules():
            if type(m).__name__.endswith("TextRouter"):
                self._handles.append(m.register_forward_hook(self._hook))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()


def top2_margin(logits: np.ndarray) -> np.ndarray:
    """Per row: largest minus second largest logit."""
    s = np.sort(np.asarray(logits), axis=-1)
    return s[..., -1] - s[..., -2]


def pick_prompt(model: torch.nn.Module, length: int, n_new: int, seed: int, tries: int = 40,
                min_margin: float = 1e-3, min_router_gap: float = 1e-3):
    """A random prompt (BOS + length-1 ids) that makes a robust reference:
      - its greedy continuation of n_new tokens contains no special id (an engine that stops at
        end-of-generation tokens then yields all n_new),
      - every greedy choice wins by at least min_margin in the logits (no near-ties that float
        rounding could flip),
      - every MoE top-k choice (prompt forward and greedy steps) wins by min_router_gap.
    Returns (ids, greedy_tokens, info). Falls back to the best candidate after `tries`."""
    vocab = text_config(model).vocab_size
    best = None
    for t in range(tries):
        ids = random_prompt(length, vocab, seed * 1000 + t)
        with RouterMonitor(model) as mon:
            hf_logits(model, ids)
            toks, rows = hf_greedy(model, ids, n_new, return_logits=True)
        info = {"try": t, "has_special": bool(SPECIAL_IDS.intersection(toks)),
                "min_margin": float(top2_margin(rows).min()), "router_gap": mon.min_gap}
        ok = (not info["has_special"], info["min_margin"] >= min_margin,
              info["router_gap"] >= min_router_gap)
        if all(ok):
            return ids, toks, info
        key = (sum(ok), min(info["min_margin"], info["router_gap"]))
        if best is None or key > best[0]:
            best = (key, ids, toks, info)
    return best[1], best[2], best[3]


def check_greedy(got, want, what):
    """MarkBase stops at an end-of-generation token (and may or may not yield it); the reference
    never stops. Equal, or equal up to (and possibly including) the first special id."""
    got = [int(t) for t in got]
    if got == want:
        return
    k = next((i for i, t in enumerate(want) if t in SPECIAL_IDS), None)
    if k is not None and got in (want[:k], want[:k + 1]):
        return
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    raise AssertionError(f"{what}: greedy tokens differ from transformers at step {first}:\n"
                         f"  markbase     {got}\n  transformers {want}")


def rel_err(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def q8_0_roundtrip(w: torch.Tensor) -> torch.Tensor:
    """w quantized to GGUF Q8_0 and back, along its last axis (blocks of 32, as ggml's
    quantize_row_q8_0_ref: d = amax/127, q = roundf(x/d), d stored as fp16)."""
    if w.shape[-1] % 32:
        raise ValueError("Q8_0 needs rows that are a multiple of 32")
    x = w.detach().reshape(-1, 32).float()
    d = x.abs().amax(dim=1, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    y = x * inv
    q = torch.sign(y) * torch.floor(y.abs() + 0.5)  # roundf: half away from zero
    return (q * d.half().float()).reshape(w.shape).to(w.dtype)


def quantize_q8_0_(model: torch.nn.Module) -> torch.nn.Module:
    """Round-trip every parameter of >= 2 dims whose rows are whole Q8_0 blocks through Q8_0 (in
    place): what quantizing the float weights on load does. 1-D tensors stay as they are."""
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim >= 2 and p.shape[-1] % 32 == 0:
                p.copy_(q8_0_roundtrip(p))
    return model


# --------------------------------------------------------------------------------------------
# tokenizer

_WORDS = (
    "the of and to in is was that for it as with be on not he by are this at from his but have an "
    "they which one you were her all she there would their we him been has when who will more no "
    "if out so said what up its about into than them can only other new some could time these two "
    "may then do first any my now such like our over man me even most made after also did many "
    "before must through back years where much your way well down should because each just those "
    "people how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might us great old year off come "
    "since against go came right used take three model token gemma layer window cache prefill "
    "decode sliding expert router paris france capital metal kernel tensor matrix vector").split()


def make_tokenizer(vocab_size: int = 512, seed: int = 0) -> Tokenizer:
    """A Gemma-style tokenizer with exactly vocab_size ids: BPE with byte fallback, spaces
    normalised to '▁', no prefix space, BOS added by the post-processor. Ids: 0..3 the specials,
    then the 256 byte tokens <0x00>..<0xFF> (if vocab_size >= 384), then learned pieces."""
    with_bytes = vocab_size >= 384
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)] if with_bytes else []
    n_fixed = len(SPECIAL_TOKENS) + len(byte_tokens)
    alphabet = sorted(set("▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-"))
    if vocab_size < n_fixed + len(alphabet) + 8:
        raise ValueError(f"vocab_size {vocab_size} too small for the tokenizer")

    rng = random.Random(seed)
    corpus = []
    for _ in range(3000):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        corpus.append("▁" + "▁".join(words) + rng.choice([".", ",", "!", "?", ""]))

    trainer = BpeTrainer(vocab_size=vocab_size - len(byte_tokens), special_tokens=SPECIAL_TOKENS,
                         initial_alphabet=alphabet, min_frequency=1, show_progress=False)
    t = Tokenizer(BPE(unk_token="<unk>"))
    # learn pieces inside '▁word' units (SentencePiece style: the space starts a piece)
    t.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    t.train_from_iterator(corpus, trainer)
    learned = json.loads(t.to_str())["model"]
    order = sorted(learned["vocab"].items(), key=lambda kv: kv[1])
    pieces = [p for p, _ in order if p not in SPECIAL_TOKENS]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in learned["merges"]]

    tokens = SPECIAL_TOKENS + byte_tokens + pieces
    i = 0
    while len(tokens) < vocab_size:  # the corpus ran out of merges: pad with unused pieces
        tokens.append(f"<unused{i}>")
        i += 1
    tokens = tokens[:vocab_size]
    vocab = {p: k for k, p in enumerate(tokens)}
    merges = [m for m in merges if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]

    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                        byte_fallback=with_bytes))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.add_special_tokens(SPECIAL_TOKENS + [p for p in tokens if p.startswith("<unused")])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)])
    assert tok.get_vocab_size() == vocab_size, (tok.get_vocab_size(), vocab_size)
    return tok


def save_tokenizer(out_dir: str, vocab_size: int) -> None:
    tok = make_tokenizer(vocab_size)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True}
             for i, s in enumerate(SPECIAL_TOKENS)}
    cfg = {
        # not "GemmaTokenizer": transformers' GemmaTokenizer appends a '<mask>' token (id = vocab)
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False,
        "added_tokens_decoder": added,
        "model_max_length": 1_000_000,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def sentencepiece_model(tokenizer_json_path: str) -> bytes:
    """A serialized SentencePiece BPE model (tokenizer.model) with the same pieces, ids and merge
    order as a tokenizer.json written by save_tokenizer. llama.cpp's converter needs one for
    Gemma 3. Needs the sentencepiece and protobuf packages."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    with open(tokenizer_json_path, encoding="utf-8") as f:
        tj = json.load(f)
    vocab = tj["model"]["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in tj["model"]["merges"]]
    specials = {a["content"] for a in tj["added_tokens"]}
    rank = {a + b: r for r, (a, b) in enumerate(merges)}
    n_merges = len(merges)

    m = pb.ModelProto()
    ts = m.trainer_spec
    ts.model_type = pb.TrainerSpec.BPE
    ts.vocab_size = len(vocab)
    ts.byte_fallback = bool(tj["model"].get("byte_fallback"))
    ts.pad_id, ts.eos_id, ts.bos_id, ts.unk_id = PAD_ID, EOS_ID, BOS_ID, UNK_ID
    ts.pad_piece, ts.eos_piece, ts.bos_piece, ts.unk_piece = SPECIAL_TOKENS
    ns = m.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = False
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    for i, (piece, idx) in enumerate(sorted(vocab.items(), key=lambda kv: kv[1])):
        assert idx == i, (piece, idx)
        p = m.pieces.add()
        p.piece = piece
        if piece == "<unk>":
            p.type, p.score = pb.ModelProto.SentencePiece.UNKNOWN, 0.0
        elif piece in specials:
            p.type, p.score = pb.ModelProto.SentencePiece.CONTROL, 0.0
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            p.type, p.score = pb.ModelProto.SentencePiece.BYTE, 0.0
        else:  # a merge result scores by its merge rank (earlier = higher); characters lowest
            p.type = pb.ModelProto.SentencePiece.NORMAL
            p.score = -float(rank[piece]) if piece in rank else -float(n_merges + i)
    return m.SerializeToString()


# --------------------------------------------------------------------------------------------
# convenience


def build_all(out_dir: str, kinds: Sequence[str] = KINDS, seed: int | None = None,
              **overrides) -> dict[str, str]:
    """Build and save every kind, also in the published multimodal layout as '<kind>_cg'.
    Returns name -> path."""
    paths = {}
    for kind in kinds:
        s = None if seed is None else seed + KINDS.index(kind)
        model = build_model(kind, s, **overrides)
        paths[kind] = save_model(model, os.path.join(out_dir, kind))
        paths[kind + "_cg"] = save_model(model, os.path.join(out_dir, kind + "_cg"), layout="conditional")
    return paths


def _parse_set(items: Sequence[str]) -> dict[str, Any]:
    out = {}
    for it in items:
        k, _, v = it.partition("=")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    paths = build_all(a.out_dir, kinds, a.seed, **_parse_set(a.set))
    print(f"torch {torch.__version__}  transformers {transformers.__version__}", file=sys.stderr)
    for name, path in paths.items():
        line = {"name": name, "path": path}
        if a.check:
            m = load_hf(path)
            tc = text_config(m)
            ids = random_prompt(20, tc.vocab_size, 7)
            full = hf_logits(m, ids)
            toks, rows = hf_greedy(m, ids[:12], 8, return_logits=True)
            line["greedy"] = toks
            line["rel|cached-nocache|"] = rel_err(rows[0], full[11])
            line["logits_absmax"] = float(np.abs(full).max())
        print(json.dumps(line))


if __name__ == "__main__":
    main()
