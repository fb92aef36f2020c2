"""Op-by-op comparison of MarkBase's CPU backend with llama.cpp on one GGUF file: where do the two
first differ, and by how much?

llama.cpp's side: every tensor its graph computes, through the scheduler's eval callback
(llama_context_params.cb_eval via llama-cpp-python's ctypes API). MarkBase's side: every op's
output slot, through MARKBASE_CPU_DUMP (in a subprocess, since the variable is read once). Each
MarkBase op is matched with the llama.cpp tensor of the same size that is closest to it (exactly
equal when the arithmetic is the same), in graph order.

    python bench/compare_ops_llamacpp.py MODEL.gguf [--tokens 16] [--mode exact|default|precise]

llama.cpp computes the LM head for the last token only, so MarkBase's lm_head/softcap rows have no
counterpart. This is how match_llamacpp (cpp/backend/cpu/llamacpp_exact.h) was made bit-identical: the first
line with a nonzero difference names the op to look at in llama.cpp's source.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np


class _Tensor(ctypes.Structure):  # ggml.h's struct ggml_tensor (GGML_MAX_DIMS 4, MAX_SRC 10, MAX_NAME 64)
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def llama_tensors(path, ids, threads):
    import llama_cpp
    out = []

    def cb(tp, ask, _):
        if ask:
            return True
        t = _Tensor.from_address(tp)
        if t.type in (0, 1) and t.data:  # F32, F16 (on the CPU backend the data is host memory)
            es, dt = (4, np.float32) if t.type == 0 else (2, np.float16)
            ne, nb = list(t.ne), list(t.nb)
            n = sum((ne[i] - 1) * nb[i] for i in range(4)) + es
            raw = np.frombuffer((ctypes.c_char * n).from_address(t.data), dtype=dt)
            a = np.lib.stride_tricks.as_strided(raw, shape=ne[::-1], strides=nb[::-1])
            out.append((t.name.decode(), np.array(a, dtype=np.float32)))
        return True

    fn = llama_cpp.ggml_backend_sched_eval_callback(cb)
    quiet = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p())
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 2048, 512, 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.cb_eval = fn
    ctx = llama_cpp.llama_init_from_model(model, cp)
    arr = (llama_cpp.llama_token * len(ids))(*ids)
    if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(ids))) != 0:
        raise RuntimeError("llama_decode failed")
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return out


def markbase_ops(path, ids, mode, threads):
    d = tempfile.mkdtemp(prefix="mb_ops_")
    kw = {"exact": "match_llamacpp=True", "precise": "precise=True", "default": ""}[mode]
    code = (f"import markbase\nm = markbase.Model.load({path!r}, backend='cpu', threads={threads}, {kw})\n"
            f"m.logits({list(ids)!r})\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, MARKBASE_CPU_DUMP=d))
    ops = []
    for f in sorted(glob.glob(f"{d}/*.f32")):
        name = os.path.basename(f)
        r, c = map(int, name.rsplit("_", 1)[1][:-4].split("x"))
        ops.append((name[:-4], np.fromfile(f, np.float32).reshape(r, c)))
        os.unlink(f)
    os.rmdir(d)
    return ops


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--mode", choices=["exact", "default", "precise"], default="exact")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import markbase
    m = markbase.Model.load(args.model, backend="cpu", threads=1)
    rng = np.random.default_rng(0)
    ids = [int(m.tokenize("", add_bos=True)[0])] + [int(x) for x in rng.integers(300, 20000, args.tokens - 1)]
    del m
    ll = [(n, a.ravel()) for n, a in llama_tensors(args.model, ids, args.threads)]
    for name, a in markbase_ops(args.model, ids, args.mode, args.threads):
        rows = a.shape[0]
        best = None
        for n, v in ll:
            if v.size % rows or v.size // rows > a.shape[1]:
                continue
            x = a[:, : v.size // rows].ravel()
            rel = float(np.linalg.norm(x - v) / max(np.linalg.norm(v), 1e-30))
            if best is None or rel < best[1]:
                best = (n, rel, float(np.mean(x == v)))
            if rel == 0.0:
                break
        if best is None:
            print(f"{name:48s} (no llama.cpp tensor of this size)")
        else:
            print(f"{name:48s} {best[0]:40s} rel {best[1]:.3g}  equal {best[2]:.4f}")


if __name__ == "__main__":
    main()
