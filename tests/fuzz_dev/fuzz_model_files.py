"""Fuzz of model configuration values (not part of the test suite): every value of the tiny
Hugging Face models' config.json (tests/tiny_gemma.py) and every scalar of the GGUF metadata of
three synthetic files (bench/make_synthetic_gguf.py), set to values out of range (0, -1, 2^31,
2^32 - 1, 10^12, NaN, inf, wrong types, deleted), every metadata array's element type and count,
and every tensor's type id of a GGUF file. Each
file is loaded and run in a subprocess; a case fails when the process dies by a signal, hangs,
returns NaN logits (except for a tensor read as another type: its bytes are then other numbers),
or raises anything but markbase.FormatError / ValueError / TypeError. The
tests of tests/test_bad_files.py keep the cases this found (nineteenth session).

    python tests/fuzz_dev/fuzz_model_files.py OUT_DIR [hf|gguf|arrays|types ...]   (minutes each)
"""
import copy
import json
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))

RUN = r"""
import sys, numpy as np, markbase
try:
    m = markbase.Model.load(sys.argv[1], backend="cpu")
    l = np.asarray(m.logits([2, 5, 7, 9]))
    list(m.generate_tokens([2, 5, 7], max_tokens=2, temperature=0.0))
    print("OK" if np.isfinite(l).all() else "NONFINITE")
except (markbase.FormatError, ValueError, TypeError) as e:
    print("ERROR", type(e).__name__, str(e)[:160])
except Exception as e:
    print("OTHER", type(e).__name__, str(e)[:160])
"""


def run(path: str) -> str:
    try:
        r = subprocess.run([sys.executable, "-c", RUN, path], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "HANG"
    if r.returncode != 0 or not r.stdout.strip():
        return f"CRASH rc={r.returncode} {r.stderr[-300:]}"
    return r.stdout.strip().splitlines()[-1]


def report(label: str, res: str, bad: list, nan_ok: bool = False) -> None:
    if not res.startswith(("OK", "ERROR")) and not (nan_ok and res == "NONFINITE"):
        bad.append((label, res))
        print("BAD", label, res, flush=True)


def leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, path + (k,))
    elif isinstance(obj, list) and obj and not all(isinstance(x, (int, float, str, bool)) for x in obj):
        for i, v in enumerate(obj[:3]):
            yield from leaves(v, path + (i,))
    else:
        yield path, obj


def mutations(v):
    if isinstance(v, bool):
        return [None, "x"]
    if isinstance(v, int):
        return [0, -1, 2**31, 10**12, 1.5, "7", None]
    if isinstance(v, float):
        return [0.0, -1.0, float("nan"), 1e38, "x", None]
    if isinstance(v, str):
        return ["", "nonsense", 3, None]
    if isinstance(v, list):
        return [[], [0], "x", None]
    return [0, "x"]


def fuzz_hf(out: str, bad: list) -> int:
    import tiny_gemma
    n = 0
    for kind in ("gemma3", "gemma4", "gemma4_moe"):
        src = os.path.join(out, kind)
        if not os.path.exists(src):
            tiny_gemma.save_model(tiny_gemma.build_model(kind), src)
        cfg = json.load(open(os.path.join(src, "config.json")))
        for path, v in list(leaves(cfg)):
            for m in mutations(v) + ["<delete>"]:
                c = copy.deepcopy(cfg)
                node = c
                for p in path[:-1]:
                    node = node[p]
                if m == "<delete>" and isinstance(node, dict):
                    del node[path[-1]]
                else:
                    node[path[-1]] = None if m == "<delete>" else m
                w = os.path.join(out, "hf-case")
                shutil.rmtree(w, ignore_errors=True)
                shutil.copytree(src, w)
                with open(os.path.join(w, "config.json"), "w") as f:
                    f.write(json.dumps(c, allow_nan=True))
                n += 1
                report(f"{kind} {'.'.join(map(str, path))}={m!r}", run(w), bad)
    return n


def synthetic_files(out: str) -> dict:
    import make_synthetic_gguf as msg
    files = {}
    for preset, layers in (("gemma3-270m", 2), ("e2b", 3), ("26b-a4b", 2)):
        p = os.path.join(out, f"{preset}.gguf")
        if not os.path.exists(p):
            msg.write_synthetic_gguf(p, preset=preset, layers=layers, vocab=1024, qtype="q8_0", narrow=True)
        files[preset] = p
    return files


def metadata_entries(out: str):
    """(preset, file bytes, key, offset of its 4-byte type id) for every metadata key."""
    import gguf
    from gguf_builder import enc_str
    for preset, p in synthetic_files(out).items():
        blob = open(p, "rb").read()
        for name in gguf.GGUFReader(p).fields:
            k = enc_str(name)
            i = blob.find(k)
            if i >= 0:
                yield preset, blob, name, i + len(k)


def try_patch(out: str, blob: bytes, fmt: str, at: int, value, label: str, bad: list, nan_ok: bool = False) -> None:
    """Loads and runs the file with `value` packed (struct format fmt) at byte `at`."""
    b = bytearray(blob)
    struct.pack_into(fmt, b, at, value)
    w = os.path.join(out, "case.gguf")
    with open(w, "wb") as f:
        f.write(bytes(b))
    report(label, run(w), bad, nan_ok)


def fuzz_gguf(out: str, bad: list) -> int:
    fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 10: "<Q", 11: "<q", 12: "<d"}
    vals = {"<I": [0, 1, 2**31, 2**32 - 1], "<i": [0, -1, 2**31 - 1, -2**31],
            "<f": [0.0, -1.0, float("nan"), float("inf"), 1e30], "<Q": [0, 2**63], "<q": [-1, 2**62],
            "<d": [float("nan"), -1.0], "<B": [0, 255], "<b": [-1], "<H": [0, 65535], "<h": [-1]}
    n = 0
    for preset, blob, name, at in metadata_entries(out):
        if name.startswith("general."):
            continue
        f = fmt.get(struct.unpack_from("<I", blob, at)[0])
        for v in vals.get(f, []):
            n += 1
            try_patch(out, blob, f, at + 4, v, f"{preset} {name}={v!r}", bad)
    return n


def fuzz_arrays(out: str, bad: list) -> int:
    """Every metadata array (the tokenizer's tokens, scores, types, merges; per-layer values):
    another element type id, or another count."""
    n = 0
    for preset, blob, name, at in metadata_entries(out):
        if struct.unpack_from("<I", blob, at)[0] != 9:  # arrays: element type u32, count u64
            continue
        for fmt, off, what, values in (("<I", 4, "type", (0, 4, 5, 6, 7, 8, 10, 12, 9, 99)),
                                       ("<Q", 8, "count", (0, 1, 2**40, 2**63))):
            for v in values:
                n += 1
                try_patch(out, blob, fmt, at + off, v, f"{preset} {name} {what}={v}", bad)
    return n


def fuzz_types(out: str, bad: list) -> int:
    import gguf
    p = synthetic_files(out)["gemma3-270m"]
    blob = open(p, "rb").read()
    n = 0
    for t in gguf.GGUFReader(p).tensors:
        key = struct.pack("<Q", len(t.name)) + t.name.encode()
        i = blob.find(key) + len(key)
        type_at = i + 4 + 8 * struct.unpack_from("<I", blob, i)[0]  # after n_dims and the dims
        for ty in (0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 16, 30, 99):
            n += 1
            # the bytes read as another type are other numbers, possibly NaN: only a crash counts
            try_patch(out, blob, "<I", type_at, ty, f"{t.name} type={ty}", bad, nan_ok=True)
    return n


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    parts = sys.argv[2:] or ["hf", "gguf", "arrays", "types"]
    bad: list = []
    total = sum({"hf": fuzz_hf, "gguf": fuzz_gguf, "arrays": fuzz_arrays, "types": fuzz_types}[p](out, bad)
                for p in parts)
    print(f"{total} cases, {len(bad)} bad")
    sys.exit(1 if bad else 0)
