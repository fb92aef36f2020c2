#!/usr/bin/env python3
"""MarkBase vs llama.cpp (llama-cpp-python) on the same GGUF, same thread count, same machine,
alternating runs in one script. Each run is a fresh subprocess so peak memory is per engine.

    python bench/compare_llamacpp.py [MODEL.gguf] [--threads 2] [--prompt-tokens 512]
                                     [--gen-tokens 128] [--repeats 5] [--warmup 1] [--json OUT]

Prints medians and the ratio MarkBase / llama.cpp for prefill tok/s, decode tok/s, peak RSS.
The prompt is the same kind of random token ids for both; MarkBase decodes greedily,
llama.cpp feeds a fixed token (decode cost does not depend on the token).
Before the timed repeats each engine runs --warmup times untimed: on this machine the file's
pages leave the page cache when idle, and the first run after that reads them from disk.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

LLAMA = r"""
import json, random, resource, sys, time
import llama_cpp
path, threads, n_prompt, n_gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = llama_cpp.Llama(path, n_ctx=n_prompt + n_gen + 8, n_batch=512, n_ubatch=512, n_threads=threads,
                      n_threads_batch=threads, verbose=False)
rng = random.Random(0)
V = llm.n_vocab()
ids = [llm.token_bos()] + [rng.randrange(10, V) for _ in range(n_prompt - 1)]
llm.reset()
t0 = time.perf_counter(); llm.eval(ids); t1 = time.perf_counter()
tok = ids[-1]  # decode speed does not depend on which token is fed
for _ in range(n_gen - 1):
    llm.eval([tok])
t2 = time.perf_counter()
print(json.dumps(dict(prefill_tok_s=n_prompt / (t1 - t0), decode_tok_s=(n_gen - 1) / (t2 - t1),
                      peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""


def run_markbase(bench, model, threads, n_prompt, n_gen):
    out = subprocess.run([bench, "--model", model, "--backend", "cpu", "--threads", str(threads),
                          "--prompt-tokens", str(n_prompt), "--gen-tokens", str(n_gen),
                          "--repeats", "1", "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def run_llama(model, threads, n_prompt, n_gen):
    out = subprocess.run([sys.executable, "-c", LLAMA, model, str(threads), str(n_prompt), str(n_gen)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.model is None:
        from markbase.default_model import default_model_path
        a.model = default_model_path(progress=False)
    bench = shutil.which("markbase-bench")
    if not bench:
        sys.exit("markbase-bench is not on PATH: pip install . first")
    for _ in range(a.warmup):
        run_markbase(bench, a.model, a.threads, a.prompt_tokens, a.gen_tokens)
        run_llama(a.model, a.threads, a.prompt_tokens, a.gen_tokens)
    mb, ll = [], []
    for r in range(a.repeats):  # interleaved: noise of the machine hits both engines alike
        mb.append(run_markbase(bench, a.model, a.threads, a.prompt_tokens, a.gen_tokens))
        ll.append(run_llama(a.model, a.threads, a.prompt_tokens, a.gen_tokens))
        print(f"repeat {r}: markbase {mb[-1]['prefill_tok_s']:.1f}/{mb[-1]['decode_tok_s']:.1f} tok/s, "
              f"llama.cpp {ll[-1]['prefill_tok_s']:.1f}/{ll[-1]['decode_tok_s']:.1f} tok/s", file=sys.stderr)
    med = lambda rows, k: statistics.median(x[k] for x in rows)
    res = {"model": os.path.basename(a.model), "threads": a.threads, "prompt_tokens": a.prompt_tokens,
           "gen_tokens": a.gen_tokens, "repeats": a.repeats, "warmup": a.warmup}
    for k in ("prefill_tok_s", "decode_tok_s", "peak_rss_mib"):
        res[f"markbase_{k}"] = round(med(mb, k), 2)
        res[f"llama_cpp_{k}"] = round(med(ll, k), 2)
        res[f"ratio_{k}"] = round(med(mb, k) / med(ll, k), 3)
    res["markbase_kernels_per_token"] = mb[-1]["kernels_per_token"]
    res["markbase_host_waits_per_token"] = mb[-1]["host_waits_per_token"]
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
