"""Corrupt and hostile model files: each must raise markbase.FormatError naming the file, and the
process reading them must never die by a signal. The files are read in a subprocess so that a
crash fails the test instead of killing pytest."""
import json
import struct
import subprocess
import sys

import numpy as np

from gguf_builder import ARRAY, U32, build, enc_str, sample_file

READER = r"""
import json, sys, markbase
out = []
for p in sys.argv[1:]:
    try:
        f = markbase.open(p)
        f.metadata
        for name in f.tensors:
            f.read(name)
        out.append(["ok", ""])
    except markbase.FormatError as e:
        out.append(["FormatError", str(e)])
    except FileNotFoundError as e:
        out.append(["FileNotFoundError", str(e)])
    except Exception as e:
        out.append([type(e).__name__, str(e)])
print(json.dumps(out))
"""


def read_all(paths):
    r = subprocess.run([sys.executable, "-c", READER, *map(str, paths)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"reader died (rc={r.returncode}): {r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def expect_format_errors(paths):
    results = read_all(paths)
    bad = [(str(p), r) for p, r in zip(paths, results) if r[0] != "FormatError" or str(p) not in r[1]]
    assert not bad, bad[:5]
    return results


def test_truncated_gguf_at_many_offsets(tmp_path):
    blob, _ = sample_file()
    cuts = sorted(set(list(range(0, 64)) + list(range(64, len(blob), 7)) + [len(blob) - 1]))
    paths = []
    for c in cuts:
        p = tmp_path / f"cut{c}.gguf"
        p.write_bytes(blob[:c])
        paths.append(p)
    expect_format_errors(paths)


def hdr(n_tensors, n_kv, version=3):
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def tensor_info(name, ne, ttype, offset):
    return enc_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) + \
        struct.pack("<IQ", ttype, offset)


def corrupt_files():
    blob, _ = sample_file()
    w = np.zeros(32, np.float32).tobytes()
    one = [dict(name="w", ne=[32], type=0, data=w)]
    cases = {
        "bad_magic": b"GGUX" + blob[4:],
        "version_1": blob[:4] + struct.pack("<I", 1) + blob[8:],
        "version_99": blob[:4] + struct.pack("<I", 99) + blob[8:],
        "huge_tensor_count": hdr(2**62, 0) + b"\0" * 64,
        "huge_kv_count": hdr(0, 2**60) + b"\0" * 64,
        "huge_string_length": hdr(0, 1) + struct.pack("<Q", 2**63) + b"abc" * 10,
        "huge_array_count": hdr(0, 1) + enc_str("k") + struct.pack("<IIQ", ARRAY, U32, 2**61) + b"\0" * 32,
        "unknown_value_type": hdr(0, 1) + enc_str("k") + struct.pack("<I", 77) + b"\0" * 32,
        "unknown_array_type": hdr(0, 1) + enc_str("k") + struct.pack("<IIQ", ARRAY, 55, 2) + b"\0" * 32,
        "deep_nested_arrays": hdr(0, 1) + enc_str("k") + struct.pack("<I", ARRAY) +
            struct.pack("<IQ", ARRAY, 1) * 40 + struct.pack("<IQ", U32, 0),
        "bad_bool": hdr(0, 1) + enc_str("k") + struct.pack("<IB", 7, 9) + b"\0" * 8,
        "zero_dims": hdr(1, 0) + tensor_info("t", [], 0, 0) + b"\0" * 64,
        "five_dims": hdr(1, 0) + tensor_info("t", [1, 1, 1, 1, 1], 0, 0) + b"\0" * 64,
        "zero_dim": hdr(1, 0) + tensor_info("t", [32, 0], 0, 0) + b"\0" * 64,
        "overflowing_dims": hdr(1, 0) + tensor_info("t", [2**40, 2**40], 0, 0) + b"\0" * 64,
        "unknown_type_id": build([], [dict(name="w", ne=[32], type=99, data=w)]),
        "unsupported_iq_type": build([], [dict(name="w", ne=[256], type=16, data=b"\0" * 66)]),
        "partial_block_row": build([], [dict(name="w", ne=[31], type=8, data=b"\0" * 64)]),
        "offset_past_end": build([], [dict(name="w", ne=[32], type=0, data=w, offset=1 << 40)]),
        "offset_unaligned": build([], [dict(name="w", ne=[32], type=0, data=w, offset=4)]),
        "data_missing": build([], one)[:-64],
        "bad_alignment": build([("general.alignment", U32, 48)], one),
        "alignment_zero": build([("general.alignment", U32, 0)], one),
        "duplicate_tensor": build([], [dict(name="w", ne=[32], type=0, data=w),
                                       dict(name="w", ne=[32], type=0, data=w)]),
        "empty_file": b"",
        "tiny_file": b"GG",
    }
    return cases


def test_corrupt_gguf_files(tmp_path):
    paths = []
    for name, data in corrupt_files().items():
        p = tmp_path / f"{name}.gguf"
        p.write_bytes(data)
        paths.append(p)
    results = expect_format_errors(paths)
    msgs = dict(zip([p.stem for p in paths], [r[1] for r in results]))
    assert "magic" in msgs["bad_magic"]
    assert "version" in msgs["version_99"]
    assert "tensor count" in msgs["huge_tensor_count"]
    assert "'t'" in msgs["zero_dim"] and "dimension" in msgs["zero_dim"]
    assert "overflow" in msgs["overflowing_dims"]
    assert "type id 99" in msgs["unknown_type_id"] and "'w'" in msgs["unknown_type_id"]
    assert "IQ2_XXS" in msgs["unsupported_iq_type"]
    assert "outside" in msgs["offset_past_end"] and "'w'" in msgs["offset_past_end"]
    assert "aligned" in msgs["offset_unaligned"]
    assert "general.alignment" in msgs["bad_alignment"]


def test_random_byte_flips_never_crash(tmp_path):
    blob, _ = sample_file()
    rng = np.random.default_rng(7)
    paths = []
    for i in range(150):
        b = bytearray(blob)
        for _ in range(rng.integers(1, 6)):
            pos = int(rng.integers(0, 200))  # the header region, where counts and lengths live
            b[pos] = int(rng.integers(0, 256))
        p = tmp_path / f"flip{i}.gguf"
        p.write_bytes(bytes(b))
        paths.append(p)
    for r in read_all(paths):  # either still valid or a FormatError: never anything else
        assert r[0] in ("ok", "FormatError"), r


def st_file(path, header: bytes, data: bytes = b"", hlen: int | None = None):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header) if hlen is None else hlen) + header + data)


def test_bad_safetensors(tmp_path):
    good = json.dumps({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    cases = {
        "short": None,
        "huge_header_len": (good, b"\0" * 16, 2**62),
        "bad_json": (b"{\"a\": [1, 2", b""),
        "not_object": (b"[1, 2, 3]", b""),
        "bad_dtype": (json.dumps({"a": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}).encode(), b"\0" * 16),
        "offsets_past_end": (good, b"\0" * 8),
        "size_mismatch": (json.dumps({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}).encode(), b"\0" * 16),
        "negative_dim": (json.dumps({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}).encode(), b"\0" * 4),
        "missing_fields": (json.dumps({"a": {"dtype": "F32"}}).encode(), b""),
        "deep_json": (b"[" * 5000 + b"]" * 5000, b""),
    }
    paths = []
    for name, spec in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text("{}")
        if spec is None:
            (d / "model.safetensors").write_bytes(b"\1\2\3")
        else:
            st_file(d / "model.safetensors", *spec)
        paths.append(d)
    bad_cfg = tmp_path / "bad_config"
    bad_cfg.mkdir()
    (bad_cfg / "config.json").write_text("{not json")
    st_file(bad_cfg / "model.safetensors", good, b"\0" * 16)
    paths.append(bad_cfg)
    bad_index = tmp_path / "bad_index"
    bad_index.mkdir()
    (bad_index / "config.json").write_text("{}")
    (bad_index / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "missing.safetensors"}}))
    paths.append(bad_index)
    results = read_all(paths)
    for p, r in zip(paths, results):
        assert r[0] == "FormatError", (p.name, r)
        assert p.name in r[1], (p.name, r)


# --- Model configurations whose values are out of range: a FormatError naming the key when the
# model is loaded, never a crash (a negative or truncated size once slipped past the weight shape
# checks as a wildcard) and never a model that computes NaN (a zero RoPE base, a negative epsilon).
LOADER = r"""
import json, sys, markbase
out = []
for p in sys.argv[1:]:
    try:
        markbase.Model.load(p, backend="cpu")
        out.append(["ok", ""])
    except markbase.FormatError as e:
        out.append(["FormatError", str(e)])
    except Exception as e:
        out.append([type(e).__name__, str(e)])
print(json.dumps(out))
"""


def load_all(paths):
    r = subprocess.run([sys.executable, "-c", LOADER, *map(str, paths)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"loader died (rc={r.returncode}): {r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _set(cfg: dict, path: str, value):
    *parents, last = path.split(".")
    for p in parents:
        cfg = cfg[p]
    cfg[last] = value


HF_BAD_VALUES = {
    "gemma3": [("intermediate_size", -1), ("intermediate_size", 2**31), ("intermediate_size", 10**12),
               ("hidden_size", 2**32 + 64), ("num_key_value_heads", -1), ("rms_norm_eps", -1.0),
               ("rms_norm_eps", float("nan")), ("query_pre_attn_scalar", 0), ("final_logit_softcapping", -30.0),
               ("max_position_embeddings", -5), ("sliding_window", 2**40)],
    "gemma4_moe": [("intermediate_size", -1), ("moe_intermediate_size", 2**40), ("num_experts", -3),
                   ("top_k_experts", 2**33), ("hidden_size_per_layer_input", -1), ("num_kv_shared_layers", -2)],
}


def test_out_of_range_config_values(tmp_path, tiny_models):
    import shutil
    paths, keys = [], []
    for kind, cases in HF_BAD_VALUES.items():
        src = tiny_models[kind].path
        cfg = json.load(open(f"{src}/config.json"))
        rope = cfg.get("rope_parameters") or {}
        extra = [(f"rope_parameters.{t}.rope_theta", v) for t in ("full_attention", "sliding_attention")
                 if isinstance(rope.get(t), dict) for v in (0.0, -1.0, float("nan"))]
        for n, (key, value) in enumerate(cases + extra):
            d = tmp_path / f"{kind}-{n}"
            shutil.copytree(src, d)
            c = json.loads(json.dumps(cfg))
            _set(c, key, value)
            (d / "config.json").write_text(json.dumps(c))
            paths.append(d)
            keys.append(key)
    assert len(paths) > len(HF_BAD_VALUES["gemma3"]) + len(HF_BAD_VALUES["gemma4_moe"])  # the RoPE cases too
    for p, key, r in zip(paths, keys, load_all(paths)):
        assert r[0] == "FormatError", (p.name, key, r)
        assert key in r[1] and str(p) in r[1], (p.name, key, r)


def _patch_gguf_value(blob: bytes, key: str, fmt: str, value) -> bytes:
    """The file with the scalar value of metadata key `key` overwritten (struct format fmt)."""
    k = enc_str(key)
    i = blob.index(k) + len(k) + 4  # the key, then its 4-byte type id, then the value
    out = bytearray(blob)
    struct.pack_into(fmt, out, i, value)
    return bytes(out)


def test_out_of_range_gguf_config_values(tmp_path):
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    import make_synthetic_gguf as msg
    src = tmp_path / "g3.gguf"
    msg.write_synthetic_gguf(str(src), preset="gemma3-270m", layers=2, vocab=1024, qtype="q8_0", narrow=True)
    blob = src.read_bytes()
    cases = [("gemma3.rope.freq_base", "<f", float("nan")), ("gemma3.rope.freq_base", "<f", 0.0),
             ("gemma3.attention.layer_norm_rms_epsilon", "<f", -1.0),
             ("gemma3.feed_forward_length", "<I", 2**32 - 1), ("gemma3.embedding_length", "<I", 2**31 + 8),
             ("gemma3.context_length", "<I", 2**31)]
    paths = []
    for n, (key, fmt, value) in enumerate(cases):
        p = tmp_path / f"bad{n}.gguf"
        p.write_bytes(_patch_gguf_value(blob, key, fmt, value))
        paths.append(p)
    results = load_all([src] + paths)
    assert results[0][0] == "ok", results[0]
    for (key, _, value), p, r in zip(cases, paths, results[1:]):
        assert r[0] == "FormatError", (key, value, r)
        assert key in r[1] and str(p) in r[1], (key, value, r)


def test_metadata_that_leaves_tensors_unread(tmp_path, tiny_models):
    """Metadata that describes less than the file holds would leave tensors unread and run another
    model without a word: a layer count below the file's layers (GGUF block_count, config.json
    num_hidden_layers), and no per-layer input width in a file with per-layer embeddings. Each is a
    FormatError naming the file and the first such tensor (llama.cpp refuses such GGUFs too)."""
    import os
    import shutil
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    import make_synthetic_gguf as msg
    paths, want = [], []
    # (a Gemma 4 GGUF's smaller block_count is caught earlier: its per-layer arrays are longer)
    for preset, arch, key in [("gemma3-270m", "gemma3", "block_count"),
                              ("e2b", "gemma4", "embedding_length_per_layer_input")]:
        src = tmp_path / f"{preset}.gguf"
        if not src.exists():
            msg.write_synthetic_gguf(str(src), preset=preset, layers=4, vocab=1024, qtype="q8_0", narrow=True)
        p = tmp_path / f"{preset}-{key}.gguf"
        p.write_bytes(_patch_gguf_value(src.read_bytes(), f"{arch}.{key}", "<I",
                                        2 if key == "block_count" else 0))
        paths.append(p)
        want.append("'blk.2." if key == "block_count" else "per-layer")
    for name, key, value, what in [("gemma3", "num_hidden_layers", 4, "'blk.4."),
                                   ("gemma4_cg", "text_config.num_hidden_layers", 5, "'blk.5."),
                                   ("gemma4_cg", "text_config.hidden_size_per_layer_input", 0, "per-layer")]:
        d = tmp_path / f"hf-{name}-{key}"
        shutil.copytree(tiny_models[name].path, d)
        cfg = json.loads((d / "config.json").read_text())
        _set(cfg, key, value)
        if key.endswith("num_hidden_layers"):  # the layer list and the KV sharing follow the count
            tc = cfg.get("text_config", cfg)
            tc["layer_types"] = tc["layer_types"][:value]
            if tc.get("num_kv_shared_layers"):
                tc["num_kv_shared_layers"] = 1
        (d / "config.json").write_text(json.dumps(cfg))
        paths.append(d)
        want.append(what)
    for p, w, r in zip(paths, want, load_all(paths)):
        assert r[0] == "FormatError" and str(p) in r[1] and w in r[1], (p, r)


# --- A Hugging Face directory whose tokenizer.json is corrupt: a FormatError naming the file at
# load (the tokenizers library's own message after it), never a crash; a token id the tokenizer
# knows but the model's vocabulary does not have: a ValueError naming the id when it is used.
def _tokenizer_cases(tok: dict, raw: bytes) -> dict:
    import copy
    cases = {f"truncated{n}": raw[: len(raw) * n // 10] for n in (0, 3, 9)}
    cases.update({"not_json": b"{not json", "a_list": b"[1, 2]", "null": b"null"})

    def mutated(f):
        t = copy.deepcopy(tok)
        f(t)
        return json.dumps(t).encode()

    first = next(iter(tok["model"]["vocab"]))
    cases.update({
        "no_model": mutated(lambda t: t.pop("model")),
        "unknown_model_type": mutated(lambda t: t["model"].__setitem__("type", "NoSuchModel")),
        "vocab_a_list": mutated(lambda t: t["model"].__setitem__("vocab", [1, 2])),
        "negative_id": mutated(lambda t: t["model"]["vocab"].__setitem__(first, -3)),
        "id_past_32_bits": mutated(lambda t: t["model"]["vocab"].__setitem__(first, 2**40)),
        "id_a_string": mutated(lambda t: t["model"]["vocab"].__setitem__(first, "5")),
        "merges_of_ints": mutated(lambda t: t["model"].__setitem__("merges", [[1, 2], 3])),
        "added_token_without_content": mutated(lambda t: t["added_tokens"][0].pop("content")),
        "unknown_normalizer": mutated(lambda t: t.__setitem__("normalizer", {"type": "NoSuch"})),
        "bad_split_regex": mutated(lambda t: t.__setitem__("pre_tokenizer",
                                                             {"type": "Split", "pattern": {"Regex": "(("},
                                                              "behavior": "Isolated", "invert": False})),
    })
    return cases


def test_corrupt_tokenizer_json(tmp_path, tiny_models):
    import shutil
    src = tiny_models["gemma3"].path
    raw = open(f"{src}/tokenizer.json", "rb").read()
    tok = json.loads(raw)
    paths = []
    for name, blob in _tokenizer_cases(tok, raw).items():
        d = tmp_path / name
        shutil.copytree(src, d)
        (d / "tokenizer.json").write_bytes(blob)
        paths.append(d)
    for p, r in zip(paths, load_all(paths)):
        assert r[0] == "FormatError", (p.name, r)
        assert f"{p}/tokenizer.json" in r[1], (p.name, r)

    # a vocabulary entry moved past the model's embedding rows: the tokenizer loads (the library
    # accepts gaps), the id is refused when a prompt produces it
    piece, _ = max(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    t = json.loads(raw)
    t["model"]["vocab"][piece] = 100000
    d = tmp_path / "id_past_the_model"
    shutil.copytree(src, d)
    (d / "tokenizer.json").write_text(json.dumps(t))
    code = ("import markbase, json\n"
            f"m = markbase.Model.load({str(d)!r}, backend='cpu')\n"
            f"ids = m.tokenize({piece.replace(chr(0x2581), ' ')!r})\n"
            "try:\n"
            "    m.generate_tokens(ids, max_tokens=1)\n"
            "    r = ['ok', str(ids)]\n"
            "except ValueError as e:\n"
            "    r = ['ValueError', str(e)]\n"
            "print(json.dumps(r))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r[0] == "ValueError" and "100000" in r[1], r
