"""Differential fuzzing: driver.cpp (our tokenizer) against llama.cpp (llama-cpp-python).

usage: python fuzz.py VOCAB.gguf N [seed]   (builds /tmp/tokdrv first: see README.md)
"""
import pathlib
import random
import subprocess
import sys
import time
import types

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.modules.setdefault("markbase", types.ModuleType("markbase"))  # the test module imports it
import test_tokenizer as tt  # noqa: E402
from drv import Driver  # noqa: E402


def more_text(rng):
    """Extra shapes beyond tt.random_text: long runs, raw random code points, glued specials."""
    k = rng.random()
    if k < 0.3:
        return tt.random_text(rng)
    if k < 0.45:
        return "".join(tt.random_codepoint(rng) for _ in range(rng.randint(1, 40)))
    if k < 0.6:
        pool = tt.SPECIAL_LOOKING + tt.SPACES
        return "".join(rng.choice(pool) for _ in range(rng.randint(1, 20)))
    if k < 0.75:
        return rng.choice(tt.SPACES) * rng.randint(1, 70) + rng.choice(tt.WORDS + [""])
    if k < 0.9:
        return "".join(tt.random_text(rng) for _ in range(rng.randint(2, 6)))
    return "".join(rng.choice("ab <>/_|\n\t▁é") for _ in range(rng.randint(1, 60)))


def main():
    gguf_path = sys.argv[1]
    n = int(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    vocab = "/tmp/fuzz_%d.vocab" % abs(hash(gguf_path))
    subprocess.check_call([sys.executable, str(HERE / "dump_vocab.py"), gguf_path, vocab])
    ours = Driver("/tmp/tokdrv", vocab)
    ref = tt.Reference(gguf_path)
    rng = random.Random(seed)
    bad = 0
    t_ours = t_ref = 0.0
    for i in range(n):
        text = more_text(rng)
        data = text.encode()
        if rng.random() < 0.1 and b"\xf4" not in data:  # invalid UTF-8 (the C++ API takes bytes)
            # Not C0, C1, E0, F0 (overlong forms can decode to ' ', on which llama.cpp's BPE
            # aborts) nor F4-F7 (may exceed U+10FFFF: llama.cpp's BPE throws, so do we).
            bad_bytes = [*range(0x80, 0xc0), *range(0xc2, 0xe0), *range(0xe1, 0xf0),
                         *range(0xf1, 0xf4), *range(0xf8, 0x100)]
            raw = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                raw.insert(rng.randint(0, len(raw)), rng.choice(bad_bytes))
            data = bytes(raw)
        modes = [(True, False), (False, True), (rng.random() < 0.5, rng.random() < 0.5)]
        for add_bos, special in modes:
            t0 = time.perf_counter()
            want = ref.tokenize_bytes(data, add_bos, special)
            t1 = time.perf_counter()
            got = ours.tokenize(data, add_bos, special)
            t2 = time.perf_counter()
            t_ref += t1 - t0
            t_ours += t2 - t1
            if got != want:
                bad += 1
                if bad <= 10:
                    print("MISMATCH", repr(data), add_bos, special, "\n  ref ", want,
                          "\n  ours", got)
        if i % 3 == 0:
            ids = ref.tokenize(text, True, rng.random() < 0.5)
            if ours.decode(ids) != ref.detokenize(ids):
                bad += 1
                print("DECODE MISMATCH", repr(text), ids, ours.decode(ids),
                      ref.detokenize(ids))
        if i % 3 == 1:  # arbitrary ids: control, byte, unused, user-defined tokens mixed
            ids = [rng.randrange(ref.n_vocab) if rng.random() < 0.6 else rng.randrange(300)
                   for _ in range(rng.randint(1, 20))]
            if ours.decode(ids) != ref.detokenize(ids):
                bad += 1
                print("DECODE MISMATCH (random ids)", ids, ours.decode(ids), ref.detokenize(ids))
    eog_ok = sorted(ours.eog()) == ref.eog_ids()
    pieces_bad = [i for i in range(ref.n_vocab) if ours.piece(i) != ref.piece(i)]
    print(f"{gguf_path}: {n} strings x 3 modes, {bad} mismatches; eog match={eog_ok} "
          f"{sorted(ours.eog())}; piece mismatches={len(pieces_bad)}; "
          f"time ours {t_ours:.2f}s (incl. pipe) ref {t_ref:.2f}s")


if __name__ == "__main__":
    main()
