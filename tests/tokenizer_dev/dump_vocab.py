"""Dump a GGUF file's tokenizer metadata to a flat binary file that driver.cpp reads.

Defaults mirror what a GGUF loader should put in markbase::VocabData when a key is absent:
ids -1, add_bos_token true, add_space_prefix true for 'llama' (llama.cpp's SPM default) else false.
"""
import struct
import sys

from gguf import GGUFReader


def field_value(r, key):
    f = r.fields.get(key)
    if f is None:
        return None
    if len(f.types) == 1:
        v = f.parts[f.data[0]]
        if f.types[0].name == "STRING":
            return bytes(v)
        return v[0].item()
    return [f.parts[i] for i in f.data]


def main(src, dst):
    r = GGUFReader(src)
    model = field_value(r, "tokenizer.ggml.model") or b""
    pre = field_value(r, "tokenizer.ggml.pre") or b""
    toks = [bytes(p) for p in field_value(r, "tokenizer.ggml.tokens")]
    scores = field_value(r, "tokenizer.ggml.scores") or []
    types = field_value(r, "tokenizer.ggml.token_type") or []
    merges = [bytes(p) for p in (field_value(r, "tokenizer.ggml.merges") or [])]

    def idv(key):
        v = field_value(r, "tokenizer.ggml." + key)
        return -1 if v is None else int(v)

    add_bos = field_value(r, "tokenizer.ggml.add_bos_token")
    add_sp = field_value(r, "tokenizer.ggml.add_space_prefix")
    if add_bos is None:
        add_bos = True
    if add_sp is None:
        add_sp = model == b"llama"
    out = bytearray(b"MBVOCAB1")

    def s(b):
        out.extend(struct.pack("<I", len(b)))
        out.extend(b)

    s(model)
    s(pre)
    out.extend(struct.pack("<I", len(toks)))
    for t in toks:
        s(t)
    out.extend(struct.pack("<I", len(scores)))
    for x in scores:
        out.extend(struct.pack("<f", float(x[0])))
    out.extend(struct.pack("<I", len(types)))
    for x in types:
        out.extend(struct.pack("<i", int(x[0])))
    out.extend(struct.pack("<I", len(merges)))
    for m in merges:
        s(m)
    for k in ["bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id",
              "eot_token_id", "eom_token_id"]:
        out.extend(struct.pack("<i", idv(k)))
    out.extend(struct.pack("<BB", bool(add_bos), bool(add_sp)))
    with open(dst, "wb") as fh:
        fh.write(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
