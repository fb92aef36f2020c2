#!/usr/bin/env python3
"""Write a llama.cpp-compatible Gemma 4 GGUF of a published shape with random weights.

(Also the Gemma 3 270M shape, `--preset gemma3-270m`: llama.cpp's "gemma3" architecture and keys,
a "llama" SentencePiece-style vocabulary, no rope_freqs or layer scalars; for checks of the GPU
backends against the CPU where the real 270M file cannot be sent.)

    python bench/make_synthetic_gguf.py OUT.gguf [--preset e2b|e4b|26b-a4b|31b|gemma3-270m] [--layers N]
        [--vocab N] [--type q4_0|q4_1|q5_0|q5_1|q8_0|q4_k|q5_k|q6_k|f16|bf16|f32]
        [--mix q4_k_m|q5_k_m] [--embd-type TYPE] [--tensor-type REGEX=TYPE ...] [--dense-equivalent | --one-expert]
        [--shared-kv N]
        [--seed S] [--std 0.02] [--logit-std 2] [--copy-boost B] [--dry-run] [--json]

Examples:
    # the full 26B-A4B in Q4_0 (14.2 GB, ~70 s on this machine) and its dense-equivalent (2.2 GB)
    python bench/make_synthetic_gguf.py /tmp/g4-26b-q4_0.gguf --preset 26b-a4b --type q4_0
    python bench/make_synthetic_gguf.py /tmp/g4-26b-dense.gguf --preset 26b-a4b --type q4_0 \
        --dense-equivalent
    # llama-quantize's Q4_K_M mix (Q4_K; Q6_K tied embedding, and Q6_K attn_v / ffn_down on its
    # use_more_bits layers; the shape fallbacks): 16.8 GB for the 26B-A4B
    python bench/make_synthetic_gguf.py /tmp/e4b.gguf --preset e4b --mix q4_k_m
    # small: 4 layers of E2B, 4096-token vocabulary (129 MB, ~1 s); sizes only: --dry-run
    python bench/make_synthetic_gguf.py /tmp/e2b4.gguf --preset e2b --layers 4 --vocab 4096

What it writes
--------------
The tensors, metadata keys and layouts of llama.cpp's own converter (convert_hf_to_gguf.py,
conversion/gemma.py, Gemma4Model) for the published Gemma 4 text decoders, as tabulated in
shared/research/gemma4-arch.md section 3 (E2B, E4B, 26B-A4B, 31B):
  - tokenizer.ggml.model "gemma4": a small deterministic BPE vocabulary (Gemma 4's first special
    tokens, the 256 byte tokens, printable ASCII, '\\n', U+2581 and merges building ~200 common
    English words), padded to the vocabulary size with unreachable NORMAL tokens "<unusedN>".
  - token_embd (tied output), rope_freqs ([1]*64 + [1e30]*192: proportional partial RoPE 0.25 on
    the full layers), per-layer arrays (sliding_window_pattern, head_count_kv when the full layers
    have their own KV-head count, feed_forward_length with the double-wide MLP), PLE tensors,
    KV sharing, attention_k_eq_v (no attn_v on full layers), the MoE block (ffn_gate_inp F32,
    ffn_gate_inp.scale, ffn_gate_up_exps ne={H, 2*Ie, E}, ffn_down_exps ne={Ie, H, E},
    ffn_down_exps.scale [E]), layer_output_scale.
  - --layers N keeps every width and the layer-type pattern (full every 5th layer on E2B, every
    6th elsewhere, the last layer full) and, on E2B/E4B, scales the number of KV-shared layers
    (round(N * S / L), or --shared-kv) so that llama.cpp's hard-coded producer rule holds: the
    last non-shared layer is full and the one before it sliding (llama.cpp uses layer
    n_layer_kv_from_start - 2 for sliding consumers and - 1 for full ones).

Tensor types (as `llama-quantize --pure`, then llama.cpp's own shape fallback)
---------------------------------------------------------------------------------
Every 2-D/3-D weight whose name ends in ".weight" gets --type, except what llama.cpp never
quantizes: norms, rope_freqs, layer_output_scale, ffn_gate_inp.scale, ffn_down_exps.scale (F32),
ffn_gate_inp.weight (the router, F32 unless a --tensor-type names it) and per_layer_model_proj (F16; F32/BF16 when --type is).
token_embd (also the output matrix) and per_layer_token_embd get --embd-type (default: --type;
llama.cpp's non-pure mixes would use Q6_K for the tied token_embd).
When a row length (ne0) is not a multiple of the type's block size, the type falls back exactly as
llama.cpp's tensor_type_fallback (src/llama-quant.cpp) does:
    Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0,
    and F16 if the fallback's 32-block does not fit either.
For the published shapes that hits ffn_down of 26B-A4B (ne0 = 2112 = 8*256 + 64) and
ffn_down_exps (ne0 = 704) with K-quants.
--mix q4_k_m / q5_k_m: llama-quantize's non-pure Q4_K_M / Q5_K_M choices for the tensors a
Gemma 4 file has (llama_tensor_get_type_impl, src/llama-quant.cpp): --type q4_k / q5_k, the tied
token_embd Q6_K (--embd-type, so per_layer_token_embd too: llama-quantize's choice for that one
is not checked here), and Q6_K for attn_v and ffn_down where use_more_bits(i, n) holds (i < n/8, or
i >= 7n/8, or (i - n/8) % 3 == 2): for attn_v, i counts the attn_v tensors (layers without one,
KV-shared or k = v, are skipped) and n is their number; for ffn_down and ffn_down_exps, i is the
layer and n the layer count. --type and --embd-type may still be given; --tensor-type wins over
the mix, and the shape fallback applies last (the 26B-A4B's Q6_K downs become Q8_0).

Weights
-------
Quantized tensors are random quantized BLOCKS generated directly (random nibbles / bytes, fp16
scales chosen so that the dequantized values have standard deviation --std, 0.02 by default, and
zero mean; K-quant sub-block scales and mins random and consistent), no float quantization.
That makes full-size files fast to write: the file is streamed tensor by tensor, in chunks of at
most 64 MiB, so memory stays bounded whatever the size.
To keep the random model numerically tame and its next-token choice decisive (so that two engines
computing the same file agree on the argmax):
  - norm weights are 1 + N(0, 0.1); layer_output_scale U(0.8, 1.0);
  - attention q_norm/k_norm weights are sqrt(1.5 / sqrt(head_dim)) * (1 + N(0, 0.05)): Gemma 4's
    attention scale is 1.0, so these weights set the temperature; with them the attention scores
    of random q/k have std ~1.5 (unit weights would give std sqrt(head_dim) = 16..23, a saturated,
    chaotic softmax);
  - the MoE router (F32) has std 2.5 / |router input| so router logits have std ~2.5, router scale
    1 + N(0, 0.1), per-expert scales U(0.7, 1.3);
  - output_norm weights are sized so that the logits (before the softcap of 30) have std
    --logit-std (2 by default): not a flat next-token distribution;
  - the block post-norms (post_attention_norm, post_ffw_norm, PLE post_norm) share one scale w
    chosen so that the input token's embedding, which stays in the residual stream (tied
    embeddings), raises that token's own logit by --copy-boost logit stds (default
    sqrt(2 ln V) + 2.5 = 6.6 for V = 4096, 7.5 for 262144): the argmax is then the input token at
    ~98-100 % of positions with a margin of several logits, and the rest of the distribution
    (mean top-1 probability 0.4-0.8) is what the layers compute. w comes out 1-8 for models of
    2-4 layers, 0.01-0.12 for the full depths (0.9^L of layer scales shrink the embedding).
    Why: with quantized weights llama.cpp and MarkBase differ by ~2-5 % in the logits (activation
    quantization turns tiny float differences, e.g. llama.cpp's fp16 GELU table, into whole
    quantization steps), which on an i.i.d.-random model (--copy-boost 0: unit post norms, no
    copy) flips the argmax at 3-9 % of positions (near-ties among V random logits). Checks on
    these files should therefore also compare the distributions (KL, relative error): a wrong
    layer leaves the argmax (mostly the copy) intact but not the KL.
  - Q4_0/Q5_0 block scales and Q6_K sub-block scales have random signs (as ggml's quantizers
    produce): with positive scales the -0.5 mean of q-8 etc. adds up to a rank-1 all-ones
    component that dominates every random matrix.

Dense-equivalent comparison model (--dense-equivalent, 26B-A4B only)
---------------------------------------------------------------------
The 26B-A4B shape with the MoE block removed (no router, no experts, no pre_ffw_norm_2 /
post_ffw_norm_1/2) and the dense MLP widened to I_eq, chosen so that the FFN bytes read per token
are the same as the MoE model's:
    bytes(ffn_gate + ffn_up + ffn_down at width I_eq)
      = bytes(ffn_gate + ffn_up + ffn_down at width I)                       (the dense MLP)
      + K * (bytes(ffn_gate_up_exps) + bytes(ffn_down_exps)) / E              (top-k experts)
With one bytes-per-element for all three matrices this is I_eq = I + K * Ie = 2112 + 8 * 704 =
7744 (and stays exact for K-quants: 7744 % 256 = 64, so ffn_down falls back to the same type as
the 2112/704 ones). In general I_eq is the multiple of 32 that minimises the difference (printed).
Not counted: the MoE model also reads its F32 router (H * E * 4 bytes = 1.44 MB per layer on
26B-A4B) and the two extra norms; the dense-equivalent has neither.

One-expert twin (--one-expert, 26B-A4B only)
--------------------------------------------
The 26B-A4B shape with its MoE block kept whole (router, per-expert scale, pre_ffw_norm_2,
post_ffw_norm_1/2, the dense MLP beside) but one expert of width K * Ie (5632) instead of E = 128
of width Ie, and top-1: every token takes the same expert, with weight 1 times its scale. The
experts' bytes read per token are the top-k experts' (exact for one bytes-per-element type; a
K-quant mix's 704-wide down rows fall back to a 32-block type where 5632 does not). The router is
one F32 row. So against the MoE model it differs in the routing alone: the 128-row router product,
the top-k and the eight experts' scattered rows; against --dense-equivalent in Gemma 4's MoE block
(two MLPs, three post-norms). Both engines load it as an ordinary MoE model (llama.cpp's CUDA
build on the H200, bench/RESULTS.md, fortieth session).

Library use: `write_synthetic_gguf(path, preset="e2b", layers=4, vocab=4096, qtype="q4_0")`
returns a summary dict (shapes, types, bytes, token ids, dense-equivalent width).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import struct
import sys
import time
import zlib
from dataclasses import dataclass, field

import numpy as np

try:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT
except ImportError:  # pragma: no cover - the numbers below are ggml's, the package only names them
    GGML_QUANT_SIZES = None
    QT = None

# --------------------------------------------------------------------------------------------
# ggml types

TYPE_IDS = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
            "q2_k": 10, "q3_k": 11, "q4_k": 12, "q5_k": 13, "q6_k": 14, "bf16": 30}
BLOCK = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q4_0": (32, 18), "q4_1": (32, 20),
         "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34), "q2_k": (256, 84),
         "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210)}
WRITABLE = ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0", "q2_k": "q4_0", "q3_k": "q4_0"}
FLOAT_TYPES = ("f32", "f16", "bf16")
FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9,
             "q4_k": 14, "q5_k": 16, "q6_k": 18, "bf16": 32}  # llama_ftype (K: the "_S" ids)

if GGML_QUANT_SIZES is not None:  # cross-check against the gguf package's table
    for _n, _bs in BLOCK.items():
        assert tuple(GGML_QUANT_SIZES[QT(TYPE_IDS[_n])]) == _bs, _n


def row_bytes(t: str, ne0: int) -> int:
    bs, ts = BLOCK[t]
    assert ne0 % bs == 0, (t, ne0)
    return ne0 // bs * ts


def fallback_type(t: str, ne0: int) -> str:
    """llama.cpp's tensor_type_fallback (src/llama-quant.cpp)."""
    bs = BLOCK[t][0]
    if ne0 % bs == 0:
        return t
    r = FALLBACK.get(t, t)
    if ne0 % BLOCK[r][0] != 0:
        r = "f16"
    return r


MIXES = {"q4_k_m": "q4_k", "q5_k_m": "q5_k"}  # --mix: the mix's base type


def use_more_bits(i: int, n: int) -> bool:
    """llama-quantize's layers that get more bits in the _M mixes (src/llama-quant.cpp)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def mix_type(mix: str | None, name: str, layer: int | None, v_index: dict, n_layers: int) -> str | None:
    """The type --mix gives tensor `name` (of block `layer`), or None for the base type."""
    if not mix:
        return None
    if name.endswith("attn_v.weight"):
        return "q6_k" if use_more_bits(v_index[layer], len(v_index)) else None
    if name.endswith("ffn_down.weight") or name.endswith("ffn_down_exps.weight"):
        return "q6_k" if use_more_bits(layer, n_layers) else None
    return None


# --------------------------------------------------------------------------------------------
# shapes

PRESETS = {
    # gemma4-arch.md section 3 (published configs, text_config)
    "e2b": dict(n_layers=35, hidden=1536, n_heads=8, kv_swa=1, kv_full=None, hd_swa=256,
                hd_full=512, k_eq_v=False, ffn=6144, double_wide=True, n_experts=0, top_k=0,
                expert_ffn=0, window=512, period=5, shared=20, ple=256, ctx=131072),
    "e4b": dict(n_layers=42, hidden=2560, n_heads=8, kv_swa=2, kv_full=None, hd_swa=256,
                hd_full=512, k_eq_v=False, ffn=10240, double_wide=False, n_experts=0, top_k=0,
                expert_ffn=0, window=512, period=6, shared=18, ple=256, ctx=131072),
    "26b-a4b": dict(n_layers=30, hidden=2816, n_heads=16, kv_swa=8, kv_full=2, hd_swa=256,
                    hd_full=512, k_eq_v=True, ffn=2112, double_wide=False, n_experts=128,
                    top_k=8, expert_ffn=704, window=1024, period=6, shared=0, ple=0,
                    ctx=262144),
    "31b": dict(n_layers=60, hidden=5376, n_heads=32, kv_swa=16, kv_full=4, hd_swa=256,
                hd_full=512, k_eq_v=True, ffn=21504, double_wide=False, n_experts=0, top_k=0,
                expert_ffn=0, window=1024, period=6, shared=0, ple=0, ctx=262144),
    # Gemma 3 270M (shared/research/gemma3-270m-gguf.md): llama.cpp's "gemma3" architecture, every
    # 6th layer full, one head dim, no softcap, a SentencePiece-style ("llama") vocabulary
    "gemma3-270m": dict(n_layers=18, hidden=640, n_heads=4, kv_swa=1, kv_full=None, hd_swa=256,
                        hd_full=256, k_eq_v=False, ffn=2048, double_wide=False, n_experts=0,
                        top_k=0, expert_ffn=0, window=512, period=6, shared=0, ple=0, ctx=32768,
                        arch="gemma3"),
}
THETA_GEMMA3 = 1_000_000.0  # global layers; llama.cpp fixes the sliding layers' base at 10000
VOCAB = 262144
NARROW = 256  # --narrow: the width of the residual stream and every MLP
ROPE_PARTIAL_FULL = 0.25
THETA_FULL, THETA_SWA = 1_000_000.0, 10_000.0
SOFTCAP = 30.0
RMS_EPS = 1e-6


def layer_types(n_layers: int, period: int, n_shared: int) -> list[bool]:
    """is_swa per layer: full every `period` layers, the last layer full; with KV sharing the last
    non-shared layer full and the one before it sliding (llama.cpp's producer rule)."""
    swa = [(i + 1) % period != 0 for i in range(n_layers)]
    swa[-1] = False
    if n_shared:
        first = n_layers - n_shared
        if first < 2:
            raise ValueError(f"KV sharing of {n_shared} of {n_layers} layers leaves fewer than two "
                             "non-shared layers (llama.cpp needs the last two to be sliding, full)")
        swa[first - 1] = False
        swa[first - 2] = True
    return swa


@dataclass
class Shape:
    preset: str
    n_layers: int
    hidden: int
    n_heads: int
    kv_swa: int
    kv_full: int | None
    hd_swa: int
    hd_full: int
    k_eq_v: bool
    ffn: int
    double_wide: bool
    n_experts: int
    top_k: int
    expert_ffn: int
    window: int
    period: int
    shared: int
    ple: int
    ctx: int
    vocab: int
    dense_equivalent: bool = False
    arch: str = "gemma4"
    swa: list = field(default_factory=list)
    ffn_per_layer: list = field(default_factory=list)

    @property
    def first_shared(self) -> int:
        return self.n_layers - self.shared

    def kv_heads(self, i: int) -> int:
        return self.kv_swa if self.swa[i] or self.kv_full is None else self.kv_full

    def head_dim(self, i: int) -> int:
        return self.hd_swa if self.swa[i] else self.hd_full

    def has_kv(self, i: int) -> bool:
        """Layer i has its own K (and V) projections: not a KV-shared layer."""
        return i < self.first_shared

    def has_v(self, i: int) -> bool:
        """Layer i has an attn_v: its own KV, and not a full layer with attention_k_eq_v."""
        return self.has_kv(i) and not (self.k_eq_v and not self.swa[i])


def make_shape(preset: str, layers: int | None = None, vocab: int | None = None,
               shared_kv: int | None = None, dense_equivalent: bool = False,
               one_expert: bool = False) -> Shape:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; one of {', '.join(PRESETS)}")
    p = dict(PRESETS[preset])
    L_pub = p["n_layers"]
    n = L_pub if layers is None else int(layers)
    if n < 1:
        raise ValueError("--layers must be >= 1")
    if shared_kv is None:
        shared_kv = p["shared"] if n == L_pub else int(round(n * p["shared"] / L_pub))
        if shared_kv and n - shared_kv < 2:
            shared_kv = max(0, n - 2)
    p.update(n_layers=n, shared=int(shared_kv), vocab=VOCAB if vocab is None else int(vocab))
    s = Shape(preset=preset, **p)
    if s.arch == "gemma3":  # llama.cpp's gemma3: layer i is full when (i + 1) % 6 == 0, nothing else
        s.swa = [(i + 1) % s.period != 0 for i in range(n)]
    else:
        s.swa = layer_types(n, s.period, s.shared)
    s.ffn_per_layer = [s.ffn * 2 if (s.double_wide and i >= s.first_shared) else s.ffn
                       for i in range(n)]
    s.dense_equivalent = bool(dense_equivalent)
    if one_expert:
        if not s.n_experts or dense_equivalent:
            raise ValueError("--one-expert needs an MoE preset (26b-a4b) and no --dense-equivalent")
        s.n_experts, s.top_k, s.expert_ffn = 1, 1, s.top_k * s.expert_ffn
    return s


# --------------------------------------------------------------------------------------------
# tokenizer: a minimal deterministic "gemma4" BPE vocabulary

SPECIALS = [  # (text, token type) as the start of Gemma 4's vocabulary
    ("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 2), ("<mask>", 3), ("[multimodal]", 4),
    ("<|tool>", 4), ("<tool|>", 4), ("<|tool_call>", 4), ("<tool_call|>", 4),
    ("<|tool_response>", 4), ("<tool_response|>", 4), ('<|"|>', 4), ("<|think|>", 3),
    ("<|channel>", 4), ("<channel|>", 4), ("<|turn>", 3), ("<turn|>", 3), ("<|image|>", 3),
]
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
_WORDS = (
    "the of and to in is was that for it as with be on not he by are this at from his but have an "
    "they which one you were her all she there would their we him been has when who will more no "
    "if out so said what up its about into than them can only other new some could time these two "
    "may then do first any my now such like our over man me even most made after also did many "
    "before must through back years where much your way well down should because each just those "
    "people how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might us great old year off come "
    "since against go came right used take three model token gemma layer window cache prefill "
    "decode sliding expert router paris france capital metal kernel tensor matrix vector The It "
    "In This A He We They").split()


def build_vocab(vocab_size: int):
    """(tokens, token types, merges, first id of the unreachable padding)."""
    tokens = [t for t, _ in SPECIALS]
    types = [ty for _, ty in SPECIALS]
    tokens += ["<0x%02X>" % b for b in range(256)]
    types += [6] * 256
    chars = ["\n", "\u2581"] + [chr(c) for c in range(33, 127)]
    seen = set(tokens)
    for c in chars:
        if c not in seen:
            seen.add(c)
            tokens.append(c)
            types.append(1)
    merges, mseen = [], set()
    for w in _WORDS:
        cur = "\u2581"
        for ch in w:
            m = f"{cur} {ch}"
            cur = cur + ch
            if m not in mseen:
                mseen.add(m)
                merges.append(m)
            if cur not in seen:
                seen.add(cur)
                tokens.append(cur)
                types.append(1)
    if vocab_size < len(tokens) + 1:
        raise ValueError(f"vocab size {vocab_size} too small: the base vocabulary has "
                         f"{len(tokens)} tokens (use >= {len(tokens) + 1})")
    first_pad = len(tokens)
    tokens += [f"<unused{i}>" for i in range(vocab_size - first_pad)]
    types += [1] * (vocab_size - first_pad)
    return tokens, types, merges, first_pad


# --------------------------------------------------------------------------------------------
# GGUF writing (streamed)

GT_U32, GT_I32, GT_F32, GT_BOOL, GT_STR, GT_ARR = 4, 5, 6, 7, 8, 9
ALIGN = 32


def _s(x: str) -> bytes:
    b = x.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, vtype: int, value) -> bytes:
    out = _s(key) + struct.pack("<I", vtype)
    if vtype == GT_ARR:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        if etype == GT_STR:
            out += b"".join(_s(x) for x in items)
        elif etype == GT_I32:
            out += np.asarray(items, dtype="<i4").tobytes()
        elif etype == GT_F32:
            out += np.asarray(items, dtype="<f4").tobytes()
        elif etype == GT_BOOL:
            out += np.asarray(items, dtype=np.uint8).tobytes()
        else:
            raise ValueError(etype)
        return out
    if vtype == GT_STR:
        return out + _s(value)
    return out + struct.pack({GT_U32: "<I", GT_I32: "<i", GT_F32: "<f", GT_BOOL: "<?"}[vtype], value)


@dataclass
class TensorSpec:
    name: str
    shape: tuple            # numpy order (rows..., ne0)
    qtype: str
    kind: str               # how the values are made: matrix | norm | ones | const | router | ...
    std: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def ne0(self) -> int:
        return self.shape[-1]

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def nbytes(self) -> int:
        return self.n_rows * row_bytes(self.qtype, self.ne0)


# ---- random quantized blocks ----------------------------------------------------------------
# Each generator returns uint8 [n_blocks, type_size] whose dequantized values have mean ~0 and
# standard deviation ~std (per-block scale jitter +-20 %).

def _f16(x) -> np.ndarray:
    return np.asarray(x, dtype="<f2").view(np.uint8).reshape(-1, 2)


_TABLES: dict = {}


def _scale_table(key: str, unit: float, signed: bool) -> np.ndarray:
    """65536 fp16 block scales (as uint16) of magnitude unit * U(0.8, 1.2), of random sign if
    `signed`. A block picks its scale by the random 16 bits already in its scale field: one
    gather instead of per-block float work, which keeps full-size files fast to write.
    Signed scales: ggml's Q4_0/Q5_0 (d = max/-8, max the signed element of largest magnitude)
    and Q6_K (signed sub-block scales) have scales of either sign, so the -0.5 offset of
    q-8 / q-16 / q-32 does not add up to a coherent bias (a rank-1 all-ones component that would
    dominate every random matrix)."""
    k = (key, unit, signed)
    if k not in _TABLES:
        r = np.random.default_rng(zlib.crc32(key.encode()))
        v = unit * r.uniform(0.8, 1.2, 65536)
        if signed:
            v *= np.where(r.integers(0, 2, 65536) == 1, 1.0, -1.0)
        _TABLES[k] = v.astype("<f2").view("<u2")
    return _TABLES[k]


def _u16(b: np.ndarray, col: int) -> np.ndarray:
    """View of bytes col, col+1 of every block as one little-endian uint16 (writable)."""
    return b[:, col:col + 2].view("<u2")


def _set_scale(b, col, table, src_col=None):
    v = _u16(b, col)
    v[...] = table[v if src_col is None else _u16(b, src_col)]


# Each generator returns uint8 [n_blocks, type_size] of random quants with block scales such that
# the dequantized values have mean ~0 and standard deviation ~std (scale jitter +-20 %).

def _blocks_q4_0(rng, nb, std):
    b = rng.integers(0, 256, (nb, 18), dtype=np.uint8)
    _set_scale(b, 0, _scale_table("q4_0", std / 4.637, True))   # q-8, q uniform 0..15
    return b


def _blocks_q4_1(rng, nb, std):
    b = rng.integers(0, 256, (nb, 20), dtype=np.uint8)
    d = _scale_table("q4_1", std / 4.610, False)
    m = (-7.5 * d.view("<f2").astype(np.float32)).astype("<f2").view("<u2")
    _set_scale(b, 2, m, src_col=0)       # m = -7.5 d: zero mean (same index as d)
    _set_scale(b, 0, d)
    return b


def _blocks_q5_0(rng, nb, std):
    b = rng.integers(0, 256, (nb, 22), dtype=np.uint8)
    _set_scale(b, 0, _scale_table("q5_0", std / 9.247, True))   # q-16, q uniform 0..31
    return b


def _blocks_q5_1(rng, nb, std):
    b = rng.integers(0, 256, (nb, 24), dtype=np.uint8)
    d = _scale_table("q5_1", std / 9.233, False)
    m = (-15.5 * d.view("<f2").astype(np.float32)).astype("<f2").view("<u2")
    _set_scale(b, 2, m, src_col=0)
    _set_scale(b, 0, d)
    return b


def _blocks_q8_0(rng, nb, std):
    b = rng.integers(0, 256, (nb, 34), dtype=np.uint8)
    q = b.view(np.int8)
    np.maximum(q, -127, out=q)          # int8 in [-127, 127] as ggml writes (scale bytes: harmless)
    _set_scale(b, 0, _scale_table("q8_0", std / 73.3, False))
    return b


def _pack_k_scales(sc, m):
    """ggml's 12-byte 6-bit scale/min packing of Q4_K/Q5_K (get_scale_min_k4 inverse)."""
    out = np.empty((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return out


def _k_scale_table(nbits: int) -> np.ndarray:
    """4096 packed 12-byte scale fields: sub-block scales sc in [40, 63] and mins m chosen so that
    each sub-block has mean ~0 (dmin = 8 d resp. 16 d, m = round(sc * 7.5 / 8) resp. 15.5/16)."""
    k = ("kscales", nbits)
    if k not in _TABLES:
        r = np.random.default_rng(1234 + nbits)
        zero, ratio = (7.5, 8.0) if nbits == 4 else (15.5, 16.0)
        sc = r.integers(40, 64, (4096, 8), dtype=np.uint8)
        m = np.clip(np.rint(sc * (zero / ratio)), 0, 63).astype(np.uint8)
        _TABLES[k] = _pack_k_scales(sc, m)
    return _TABLES[k]


def _blocks_qk(rng, nb, std, nbits):
    size, qstd, ratio = (144, 4.610, 8.0) if nbits == 4 else (176, 9.233, 16.0)
    b = rng.integers(0, 256, (nb, size), dtype=np.uint8)
    idx = _u16(b, 4)[:, 0] & 4095                 # random bits of the scale field pick a row
    b[:, 4:16] = _k_scale_table(nbits)[idx]
    d = _scale_table(f"q{nbits}_k", std / (51.5 * qstd), False)
    dmin = (ratio * d.view("<f2").astype(np.float32)).astype("<f2").view("<u2")
    _set_scale(b, 2, dmin, src_col=0)
    _set_scale(b, 0, d)
    return b


def _blocks_q6_k(rng, nb, std):
    b = rng.integers(0, 256, (nb, 210), dtype=np.uint8)
    sc = b[:, 192:208]                             # int8 sub-block scales, |sc| in [64, 127]
    mag = ((sc & 63) | 64).view(np.int8)           # random sign from the byte's top bit
    sc[...] = np.where(sc >= 128, -mag, mag).view(np.uint8)
    _set_scale(b, 208, _scale_table("q6_k", std / (95.5 * 18.47), False))   # q-32, q 0..63
    return b


BLOCK_GEN = {"q4_0": _blocks_q4_0, "q4_1": _blocks_q4_1, "q5_0": _blocks_q5_0,
             "q5_1": _blocks_q5_1, "q8_0": _blocks_q8_0,
             "q4_k": lambda r, n, s: _blocks_qk(r, n, s, 4),
             "q5_k": lambda r, n, s: _blocks_qk(r, n, s, 5), "q6_k": _blocks_q6_k}


def _float_bytes(x: np.ndarray, t: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if t == "f32":
        return x.astype("<f4").view(np.uint8)
    if t == "f16":
        return x.astype("<f2").view(np.uint8)
    u = x.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")   # bf16, round to nearest even
    return u.view(np.uint8)


CHUNK_BYTES = 64 << 20


def _rng(seed: int, name: str):
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _small_values(t: TensorSpec, rng) -> np.ndarray:
    """Float values of a small (vector-like) tensor."""
    n = int(np.prod(t.shape))
    k = t.kind
    if k == "norm":
        return (t.extra.get("scale", 1.0) * (1.0 + 0.1 * rng.standard_normal(n))).astype(np.float32)
    if k == "qknorm":
        return (t.extra["scale"] * (1.0 + 0.05 * rng.standard_normal(n))).astype(np.float32)
    if k == "uniform":
        lo, hi = t.extra["range"]
        return rng.uniform(lo, hi, n).astype(np.float32)
    if k == "const":
        return np.asarray(t.extra["values"], dtype=np.float32)
    raise ValueError(k)


def _write_tensor(f, t: TensorSpec, seed: int) -> None:
    rng = _rng(seed, t.name)
    if t.kind != "matrix":
        f.write(_float_bytes(_small_values(t, rng), t.qtype).tobytes())
        return
    rows_per_chunk = max(1, CHUNK_BYTES // row_bytes(t.qtype, t.ne0))
    bs = BLOCK[t.qtype][0]
    done = 0
    while done < t.n_rows:
        n = min(rows_per_chunk, t.n_rows - done)
        if t.qtype in FLOAT_TYPES:
            x = rng.standard_normal((n, t.ne0), dtype=np.float32)
            x *= t.std
            f.write(_float_bytes(x, t.qtype).data)
        else:
            f.write(BLOCK_GEN[t.qtype](rng, n * (t.ne0 // bs), t.std).data)
        done += n


# --------------------------------------------------------------------------------------------
# the model


def _dense_equivalent_width(s: Shape, wtype: str, down: str | None = None) -> tuple[int, dict]:
    """I_eq with bytes(gate+up+down @ I_eq) closest to bytes(dense MLP) + K * bytes(expert), the
    down products of type `down` (default wtype; --mix raises some layers' to Q6_K)."""
    H, I, E, K, Ie = s.hidden, s.ffn, s.n_experts, s.top_k, s.expert_ffn
    down = down or wtype

    def mlp_bytes(width):
        return (2 * width * row_bytes(fallback_type(wtype, H), H)
                + H * row_bytes(fallback_type(down, width), width))

    expert = (2 * Ie * row_bytes(fallback_type(wtype, H), H)
              + H * row_bytes(fallback_type(down, Ie), Ie))
    target = mlp_bytes(I) + K * expert
    guess = I + K * Ie
    best = min(range(max(32, guess - 4096) // 32 * 32, guess + 4096, 32),
               key=lambda w: (abs(mlp_bytes(w) - target), abs(w - guess)))
    info = dict(dense_mlp_bytes=mlp_bytes(I), expert_bytes=expert, top_k=K,
                target_bytes_per_layer=target, width=best, width_bytes=mlp_bytes(best),
                router_bytes_per_layer_not_counted=H * E * 4)
    return best, info


def _post_norm_scale(s: Shape, std: float, copy_boost: float, scalars: list) -> float:
    """Scale of the block post-norm weights (post_attention_norm, post_ffw_norm, PLE post_norm).

    Every block adds a post-normed vector of RMS ~w to the residual stream, the embedding enters
    with RMS std*sqrt(H), and layer_output_scale (mean ~0.9) shrinks everything before it. The
    final hidden state then holds a fraction f of the input token's embedding, which raises that
    token's own logit by ~f*sqrt(H) logit standard deviations (tied embeddings). With unit post
    norms a scaled-down model (few layers) has f*sqrt(H) ~ 15: it just copies its input, and an
    argmax check says nothing about the layers, while a full-depth model (30+ layers of scale ~0.9)
    keeps almost nothing of it. Choose w so that f*sqrt(H) = copy_boost: the input token's own
    logit then stands ~copy_boost standard deviations above the mean logit, which with the default
    (sqrt(2 ln V) + 2.5, ~2.5 above the expected maximum of V random logits) makes the input token
    the argmax at most positions with a margin of several logit standard deviations, so that two
    engines computing the same file agree on the argmax despite their ~1-3 % rounding differences
    (activation quantization amplifies float differences), while the remaining logits, which
    the layers determine, keep a broad distribution (top probability ~0.5) for KL checks."""
    if not copy_boost:
        return 1.0
    H = s.hidden
    blocks = 2 + (1 if s.ple else 0)
    g = [float(x) ** 2 for x in scalars]
    after = [math.prod(g[l:]) for l in range(s.n_layers)]      # block of layer l: scalars l..L-1
    emb = std * std * H * after[0]
    acc = blocks * sum(after)
    w2 = emb * (H / copy_boost ** 2 - 1.0) / acc
    return min(1e3, max(1e-2, math.sqrt(max(w2, 1e-4))))


def build_specs(s: Shape, wtype: str, embd_type: str, std: float, logit_std: float,
                copy_boost: float | None = None, overrides: list | None = None, seed: int = 0,
                mix: str | None = None) -> tuple[list[TensorSpec], dict]:
    H = s.hidden
    overrides = list(overrides or [])
    specs: list[TensorSpec] = []
    ptype = wtype if wtype in FLOAT_TYPES else "f16"  # per_layer_model_proj (never quantized)
    # --mix: the attn_v tensors' order (the layers that have one)
    v_index = {layer: j for j, layer in enumerate(i for i in range(s.n_layers) if s.has_v(i))}

    def mat(name, shape, t=wtype, kind="matrix", sd=std):
        for pat, tt in overrides:
            if re.search(pat, name):
                t = tt
                break
        else:
            m = re.match(r"blk\.(\d+)\.", name)
            t = mix_type(mix, name, int(m.group(1)) if m else None, v_index, s.n_layers) or t
        specs.append(TensorSpec(name, tuple(shape), fallback_type(t, shape[-1]), kind, sd))

    def vec(name, n, kind="norm", **extra):
        specs.append(TensorSpec(name, (n,), "f32", kind, 0.0, extra))

    dense_eq = None
    if s.dense_equivalent:
        if not s.n_experts:
            raise ValueError("--dense-equivalent needs an MoE preset (26b-a4b)")
        # a width a layer: with --mix the layers' down products differ in type
        per_layer = [_dense_equivalent_width(
            s, wtype, mix_type(mix, "ffn_down.weight", i, v_index, s.n_layers)) for i in range(s.n_layers)]
        s.ffn_per_layer = [w for w, _ in per_layer]
        dense_eq = dict(per_layer[0][1], widths=s.ffn_per_layer,
                        target_bytes=sum(inf["target_bytes_per_layer"] for _, inf in per_layer),
                        dense_bytes=sum(inf["width_bytes"] for _, inf in per_layer))

    g3 = s.arch == "gemma3"
    if not g3:  # Gemma 4's proportional partial RoPE on the full layers
        n_rot = int(s.hd_full * ROPE_PARTIAL_FULL / 2)
        vec("rope_freqs.weight", s.hd_full // 2, "const",
            values=[1.0] * n_rot + [1e30] * (s.hd_full // 2 - n_rot))
    # with embedding rows of std `std` and a unit-RMS final hidden state h*w_out, the logits
    # h . e have std sqrt(H) * std * w_out: size w_out for the requested logit spread
    out_norm_scale = logit_std / (math.sqrt(H) * std)
    if copy_boost is None:
        copy_boost = math.sqrt(2.0 * math.log(s.vocab)) + 2.5
    scalars = [1.0 if g3 else
               float(_rng(seed, f"blk.{i}.layer_output_scale.weight").uniform(0.8, 1.0, 1)[0])
               for i in range(s.n_layers)]
    post = _post_norm_scale(s, std, copy_boost, scalars)
    mat("token_embd.weight", (s.vocab, H), embd_type)
    if s.ple:
        mat("per_layer_token_embd.weight", (s.vocab, s.n_layers * s.ple), embd_type)
    for i in range(s.n_layers):
        p = f"blk.{i}."
        hd, nkv = s.head_dim(i), s.kv_heads(i)
        has_kv = s.has_kv(i)
        # Gemma 4 attends with scale 1, so its q/k norms carry the 1/sqrt(hd); Gemma 3 scales by
        # 1/sqrt(hd) itself (query_pre_attn_scalar = head_dim on the 270M)
        qk = math.sqrt(1.5) if g3 else math.sqrt(1.5 / math.sqrt(hd))
        vec(p + "attn_norm.weight", H)
        mat(p + "attn_q.weight", (s.n_heads * hd, H))
        if has_kv:
            mat(p + "attn_k.weight", (nkv * hd, H))
            if s.has_v(i):
                mat(p + "attn_v.weight", (nkv * hd, H))
        vec(p + "attn_q_norm.weight", hd, "qknorm", scale=qk)
        if has_kv:
            vec(p + "attn_k_norm.weight", hd, "qknorm", scale=qk)
        mat(p + "attn_output.weight", (H, s.n_heads * hd))
        vec(p + "post_attention_norm.weight", H, scale=post)
        I = s.ffn_per_layer[i]
        vec(p + "ffn_norm.weight", H)
        mat(p + "ffn_gate.weight", (I, H))
        mat(p + "ffn_up.weight", (I, H))
        mat(p + "ffn_down.weight", (H, I))
        vec(p + "post_ffw_norm.weight", H, scale=post)
        if s.n_experts and not s.dense_equivalent:
            E, Ie = s.n_experts, s.expert_ffn
            # router input: rmsnorm(r) * scale / sqrt(H), norm ~1 -> logits std = weight std
            mat(p + "ffn_gate_inp.weight", (E, H), t="f32", sd=2.5)  # F32 unless --tensor-type says
            vec(p + "ffn_gate_inp.scale", H)
            vec(p + "pre_ffw_norm_2.weight", H)
            vec(p + "post_ffw_norm_1.weight", H)
            vec(p + "post_ffw_norm_2.weight", H)
            mat(p + "ffn_gate_up_exps.weight", (E, 2 * Ie, H))
            mat(p + "ffn_down_exps.weight", (E, H, Ie))
            vec(p + "ffn_down_exps.scale", E, "uniform", range=(0.7, 1.3))
        if s.ple:
            mat(p + "inp_gate.weight", (s.ple, H))
            mat(p + "proj.weight", (H, s.ple))
            vec(p + "post_norm.weight", H, scale=post)
        if not g3:
            vec(p + "layer_output_scale.weight", 1, "const", values=[scalars[i]])
    vec("output_norm.weight", H, "norm", scale=out_norm_scale)
    if s.ple:
        mat("per_layer_model_proj.weight", (s.n_layers * s.ple, H), ptype)
        vec("per_layer_proj_norm.weight", s.ple)
    return specs, {"dense_equivalent_info": dense_eq, "output_norm_scale": out_norm_scale,
                   "post_norm_scale": post, "copy_boost": copy_boost}


def _special_token_kvs() -> list[bytes]:
    """The special token ids and BOS/EOS/space flags, the same in both vocabularies."""
    return [
        _kv("tokenizer.ggml.bos_token_id", GT_U32, BOS_ID),
        _kv("tokenizer.ggml.eos_token_id", GT_U32, EOS_ID),
        _kv("tokenizer.ggml.unknown_token_id", GT_U32, UNK_ID),
        _kv("tokenizer.ggml.padding_token_id", GT_U32, PAD_ID),
        _kv("tokenizer.ggml.add_bos_token", GT_BOOL, True),
        _kv("tokenizer.ggml.add_eos_token", GT_BOOL, False),
        _kv("tokenizer.ggml.add_space_prefix", GT_BOOL, False),
    ]


def build_metadata_gemma3(s: Shape, wtype: str, name: str, tok) -> list[bytes]:
    """llama.cpp's gemma3 keys (those of the real 270M file) and a "llama" (SentencePiece-style)
    vocabulary: the same tokens, scored so that longer pieces win, no merges."""
    tokens, types, _, _ = tok
    a = "gemma3."
    return [
        _kv("general.architecture", GT_STR, "gemma3"),
        _kv("general.type", GT_STR, "model"),
        _kv("general.name", GT_STR, name),
        _kv(a + "context_length", GT_U32, s.ctx),
        _kv(a + "embedding_length", GT_U32, s.hidden),
        _kv(a + "block_count", GT_U32, s.n_layers),
        _kv(a + "feed_forward_length", GT_U32, s.ffn_per_layer[0]),
        _kv(a + "attention.head_count", GT_U32, s.n_heads),
        _kv(a + "attention.layer_norm_rms_epsilon", GT_F32, RMS_EPS),
        _kv(a + "attention.key_length", GT_U32, s.hd_full),
        _kv(a + "attention.value_length", GT_U32, s.hd_full),
        _kv(a + "rope.freq_base", GT_F32, THETA_GEMMA3),
        _kv(a + "attention.sliding_window", GT_U32, s.window),
        _kv(a + "attention.head_count_kv", GT_U32, s.kv_swa),
        _kv("general.file_type", GT_U32, FILE_TYPE[wtype]),
        _kv("general.quantization_version", GT_U32, 2),
        _kv("tokenizer.ggml.model", GT_STR, "llama"),
        _kv("tokenizer.ggml.pre", GT_STR, "default"),
        _kv("tokenizer.ggml.tokens", GT_ARR, (GT_STR, tokens)),
        _kv("tokenizer.ggml.scores", GT_ARR, (GT_F32, [float(len(t)) if ty == 1 else 0.0
                                                       for t, ty in zip(tokens, types)])),
        _kv("tokenizer.ggml.token_type", GT_ARR, (GT_I32, types)),
        *_special_token_kvs(),
    ]


def build_metadata(s: Shape, wtype: str, name: str, tok) -> list[bytes]:
    if s.arch == "gemma3":
        return build_metadata_gemma3(s, wtype, name, tok)
    tokens, types, merges, _ = tok
    a = "gemma4."
    kv = [
        _kv("general.architecture", GT_STR, "gemma4"),
        _kv("general.type", GT_STR, "model"),
        _kv("general.name", GT_STR, name),
        _kv(a + "block_count", GT_U32, s.n_layers),
        _kv(a + "context_length", GT_U32, s.ctx),
        _kv(a + "embedding_length", GT_U32, s.hidden),
    ]
    ffn = s.ffn_per_layer
    if len(set(ffn)) == 1:
        kv.append(_kv(a + "feed_forward_length", GT_U32, ffn[0]))
    else:
        kv.append(_kv(a + "feed_forward_length", GT_ARR, (GT_I32, ffn)))
    kv.append(_kv(a + "attention.head_count", GT_U32, s.n_heads))
    if s.kv_full is None:
        kv.append(_kv(a + "attention.head_count_kv", GT_U32, s.kv_swa))
    else:
        kv.append(_kv(a + "attention.head_count_kv", GT_ARR,
                      (GT_I32, [s.kv_heads(i) for i in range(s.n_layers)])))
    kv += [
        _kv(a + "rope.freq_base", GT_F32, THETA_FULL),
        _kv(a + "rope.freq_base_swa", GT_F32, THETA_SWA),
        _kv(a + "attention.layer_norm_rms_epsilon", GT_F32, RMS_EPS),
    ]
    if s.n_experts and not s.dense_equivalent:
        kv += [_kv(a + "expert_count", GT_U32, s.n_experts),
               _kv(a + "expert_used_count", GT_U32, s.top_k)]
    kv += [
        _kv(a + "attention.key_length", GT_U32, s.hd_full),
        _kv(a + "attention.value_length", GT_U32, s.hd_full),
        _kv("general.file_type", GT_U32, FILE_TYPE[wtype]),
        _kv(a + "final_logit_softcapping", GT_F32, SOFTCAP),
        _kv(a + "attention.sliding_window", GT_U32, s.window),
        _kv(a + "attention.shared_kv_layers", GT_U32, s.shared),
        _kv(a + "embedding_length_per_layer_input", GT_U32, s.ple),
        _kv(a + "attention.sliding_window_pattern", GT_ARR, (GT_BOOL, [bool(x) for x in s.swa])),
        _kv(a + "attention.key_length_swa", GT_U32, s.hd_swa),
        _kv(a + "attention.value_length_swa", GT_U32, s.hd_swa),
    ]
    if s.n_experts and not s.dense_equivalent:
        kv.append(_kv(a + "expert_feed_forward_length", GT_U32, s.expert_ffn))
    kv += [
        _kv(a + "rope.dimension_count", GT_U32, s.hd_full),
        _kv(a + "rope.dimension_count_swa", GT_U32, s.hd_swa),
        _kv("general.quantization_version", GT_U32, 2),
        _kv("tokenizer.ggml.model", GT_STR, "gemma4"),
        _kv("tokenizer.ggml.tokens", GT_ARR, (GT_STR, tokens)),
        _kv("tokenizer.ggml.scores", GT_ARR, (GT_F32, [-float(i) for i in range(len(tokens))])),
        _kv("tokenizer.ggml.token_type", GT_ARR, (GT_I32, types)),
        _kv("tokenizer.ggml.merges", GT_ARR, (GT_STR, merges)),
        *_special_token_kvs(),
    ]
    return kv


def write_synthetic_gguf(path: str, preset: str = "26b-a4b", layers: int | None = None,
                         vocab: int | None = None, qtype: str | None = None,
                         embd_type: str | None = None, dense_equivalent: bool = False,
                         shared_kv: int | None = None, seed: int = 0, std: float = 0.02,
                         logit_std: float = 2.0, copy_boost: float | None = None,
                         tensor_types: list | None = None, dry_run: bool = False,
                         progress: bool = False, narrow: bool = False, mix: str | None = None,
                         one_expert: bool = False) -> dict:
    if mix is not None:
        mix = mix.lower()
        if mix not in MIXES:
            raise ValueError(f"unknown mix {mix!r}; one of {', '.join(MIXES)}")
        embd_type = embd_type or "q6_k"  # the tied token_embd, as the output matrix
    qtype = (qtype or (MIXES[mix] if mix else "q4_0")).lower()
    embd_type = (embd_type or qtype).lower()
    for t in (qtype, embd_type):
        if t not in WRITABLE:
            raise ValueError(f"unsupported type {t!r}; one of {', '.join(WRITABLE)}")
    s = make_shape(preset, layers, vocab, shared_kv, dense_equivalent, one_expert)
    if narrow:  # same layers, heads, head dims, experts and routing; 256-wide residual and MLPs
        s.hidden, s.ffn = NARROW, NARROW
        s.expert_ffn = NARROW if s.n_experts else 0
        s.ple = min(s.ple, NARROW)
        s.ffn_per_layer = [NARROW * 2 if (s.double_wide and i >= s.first_shared) else NARROW
                           for i in range(s.n_layers)]
    ovr = []
    for item in tensor_types or []:
        pat, _, tt = item.rpartition("=")
        if not pat or tt.lower() not in WRITABLE:
            raise ValueError(f"--tensor-type {item!r}: want REGEX=TYPE, TYPE one of {WRITABLE}")
        ovr.append((pat, tt.lower()))
    specs, info = build_specs(s, qtype, embd_type, std, logit_std, copy_boost, ovr, seed, mix)
    tok = build_vocab(s.vocab)
    label = f"synthetic {s.arch} {preset}" + (f" {s.n_layers}L" if layers else "") + \
        (" dense-equivalent" if dense_equivalent else "") + (" one-expert" if one_expert else "") + \
        f" {(mix or qtype).upper()}"
    total = sum(t.nbytes for t in specs)
    by_type: dict[str, int] = {}
    for t in specs:
        by_type[t.qtype.upper()] = by_type.get(t.qtype.upper(), 0) + t.nbytes
    summary = dict(
        path=path, preset=preset, n_layers=s.n_layers, vocab=s.vocab, type=qtype,
        embd_type=embd_type, mix=mix, dense_equivalent=dense_equivalent, one_expert=one_expert,
        experts=s.n_experts, top_k=s.top_k, expert_ffn=s.expert_ffn, shared_kv_layers=s.shared,
        sliding=[bool(x) for x in s.swa], ffn=s.ffn_per_layer, n_tensors=len(specs),
        tensor_bytes=total, bytes_by_type=by_type,
        params=sum(int(np.prod(t.shape)) for t in specs),
        tensors={t.name: dict(shape=list(t.shape), type=t.qtype.upper()) for t in specs},
        first_normal_token=len(SPECIALS), first_unused_token=tok[3],
        bos_id=BOS_ID, eos_id=EOS_ID, **info)
    if dry_run:
        return summary
    t0 = time.perf_counter()
    kv = build_metadata(s, qtype, label, tok)
    infos, off = [], 0
    for t in specs:
        ne = list(reversed(t.shape))
        infos.append(_s(t.name) + struct.pack("<I", len(ne)) +
                     b"".join(struct.pack("<Q", d) for d in ne) +
                     struct.pack("<IQ", TYPE_IDS[t.qtype], off))
        off += (t.nbytes + ALIGN - 1) // ALIGN * ALIGN
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(specs), len(kv)))
        for k in kv:
            f.write(k)
        for x in infos:
            f.write(x)
        f.write(b"\0" * ((-f.tell()) % ALIGN))
        base = f.tell()
        written = 0
        for t in specs:
            start = f.tell()
            _write_tensor(f, t, seed)
            assert f.tell() - start == t.nbytes, (t.name, f.tell() - start, t.nbytes)
            f.write(b"\0" * ((-(f.tell() - base)) % ALIGN))
            written += t.nbytes
            if progress and t.nbytes > (256 << 20):
                el = time.perf_counter() - t0
                print(f"  {t.name}: {written / 2**30:.2f}/{total / 2**30:.2f} GiB "
                      f"({el:.0f} s)", file=sys.stderr, flush=True)
    summary["seconds"] = time.perf_counter() - t0
    summary["file_bytes"] = base + off
    return summary


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring for details.")
    ap.add_argument("out", help="output .gguf path")
    ap.add_argument("--preset", default="26b-a4b", choices=list(PRESETS))
    ap.add_argument("--layers", type=int, default=None, help="fewer layers, same widths")
    ap.add_argument("--vocab", type=int, default=None, help=f"vocabulary size (default {VOCAB})")
    ap.add_argument("--type", default=None, choices=WRITABLE,
                    help="weight type (default q4_0, or the --mix's base type)")
    ap.add_argument("--mix", default=None, choices=list(MIXES),
                    help="llama-quantize's non-pure mix of that name (see the docstring)")
    ap.add_argument("--embd-type", default=None, choices=WRITABLE,
                    help="token_embd / per_layer_token_embd type (default: --type)")
    ap.add_argument("--tensor-type", action="append", default=[], metavar="REGEX=TYPE",
                    help="type of the weight matrices whose name matches REGEX (first match wins; "
                         "as llama-quantize --tensor-type; the shape fallback still applies)")
    ap.add_argument("--dense-equivalent", action="store_true",
                    help="26b-a4b with the experts replaced by a dense MLP of equal bytes/token")
    ap.add_argument("--one-expert", action="store_true",
                    help="26b-a4b with one expert of top_k times the width, top-1")
    ap.add_argument("--shared-kv", type=int, default=None,
                    help="number of KV-shared layers (default: the preset's, scaled with --layers)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=0.02, help="std of the weight matrices")
    ap.add_argument("--logit-std", type=float, default=2.0,
                    help="target std of the logits before the softcap")
    ap.add_argument("--copy-boost", type=float, default=None,
                    help="how far (in logit stds) the input token's own logit is raised by the "
                         "embedding left in the residual stream (sets the post-norm scale; "
                         "default sqrt(2 ln vocab) + 2.5; 0: unit post norms)")
    ap.add_argument("--narrow", action="store_true",
                    help=f"residual and MLP widths of {NARROW}, all else as the preset (the same "
                         "graph, small enough for the Metal emulator: for counting kernels)")
    ap.add_argument("--dry-run", action="store_true", help="print the summary, write nothing")
    ap.add_argument("--json", action="store_true", help="print the full summary as JSON")
    a = ap.parse_args(argv)
    summ = write_synthetic_gguf(a.out, a.preset, a.layers, a.vocab, a.type, a.embd_type,
                                a.dense_equivalent, a.shared_kv, a.seed, a.std, a.logit_std,
                                a.copy_boost, a.tensor_type, a.dry_run, progress=True,
                                narrow=a.narrow, mix=a.mix, one_expert=a.one_expert)
    if a.json:
        print(json.dumps(summ, indent=1))
        return
    short = {k: v for k, v in summ.items() if k not in ("tensors", "sliding", "ffn")}
    short["ffn"] = sorted(set(summ["ffn"]))
    short["layer_types"] = "".join("s" if x else "F" for x in summ["sliding"])
    print(json.dumps(short, indent=1))


if __name__ == "__main__":
    main()
