"""A minimal GGUF writer for tests: every metadata value type (nested arrays included) and raw
control over offsets, counts and type ids, so that corrupt files can be built byte by byte."""
from __future__ import annotations

import struct

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
        U64: "<Q", I64: "<q", F64: "<d"}


def enc_str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def enc_value(vtype: int, v) -> bytes:
    if vtype == STRING:
        return enc_str(v)
    if vtype == ARRAY:
        etype, items = v
        out = struct.pack("<IQ", etype, len(items))
        return out + b"".join(enc_value(etype, x) for x in items)
    return struct.pack(_FMT[vtype], v)


def build(kv: list[tuple[str, int, object]], tensors: list[dict], alignment: int = 32,
          version: int = 3, magic: bytes = b"GGUF", n_tensors: int | None = None,
          n_kv: int | None = None) -> bytes:
    """tensors: dicts with name, ne (ggml order), type (id), data (bytes), optional offset."""
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kv) if n_kv is None else n_kv)
    body = b"".join(enc_str(k) + struct.pack("<I", t) + enc_value(t, v) for k, t, v in kv)
    offsets, off = [], 0
    for t in tensors:
        offsets.append(t.get("offset", off))
        off += len(t["data"])
        off = (off + alignment - 1) // alignment * alignment
    infos = b""
    for t, o in zip(tensors, offsets):
        infos += enc_str(t["name"]) + struct.pack("<I", len(t["ne"]))
        infos += b"".join(struct.pack("<Q", d) for d in t["ne"])
        infos += struct.pack("<IQ", t["type"], o)
    blob = head + body + infos
    pad = (-len(blob)) % alignment
    blob += b"\0" * pad
    data = b""
    for t in tensors:
        data += t["data"]
        data += b"\0" * ((-len(data)) % alignment)
    return blob + data


def sample_file() -> tuple[bytes, dict]:
    """A valid GGUF with every metadata type and a few tensors; returns (bytes, expected)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 32)).astype(np.float32)
    h = rng.standard_normal((3, 64)).astype(np.float16)
    kv = [
        ("general.architecture", STRING, "gemma3"),
        ("general.alignment", U32, 32),
        ("t.u8", U8, 200), ("t.i8", I8, -5), ("t.u16", U16, 60000), ("t.i16", I16, -300),
        ("t.u32", U32, 4000000000), ("t.i32", I32, -7), ("t.f32", F32, 0.5), ("t.bool", BOOL, True),
        ("t.u64", U64, 2**63 + 5), ("t.i64", I64, -2**40), ("t.f64", F64, 2.25),
        ("t.strs", ARRAY, (STRING, ["a", "bé", "<eos>"])),
        ("t.nested", ARRAY, (ARRAY, [(I32, [1, 2]), (I32, [3])])),
        ("t.floats", ARRAY, (F32, [1.0, -2.5])),
    ]
    tensors = [
        dict(name="w", ne=[32, 4], type=0, data=w.tobytes()),
        dict(name="h", ne=[64, 3], type=1, data=h.tobytes()),
    ]
    expected = {"w": w, "h": h.astype(np.float32)}
    return build(kv, tensors), expected
