"""Kernels and host waits per decoded token of the Metal backend, as the emulated Metal runtime
counts them (a build with CMAKE_ARGS=-DMARKBASE_METAL_EMU=ON), and a greedy check against the CPU.

The count depends on the graph, not on the widths, so the full-width published shapes can be
stood in for by `make_synthetic_gguf.py --narrow` files, which the emulator runs in seconds:

    python bench/make_synthetic_gguf.py --preset 26b-a4b --narrow --vocab 1024 /tmp/n26b.gguf
    python bench/make_synthetic_gguf.py --preset e4b --narrow --vocab 1024 /tmp/ne4b.gguf
    python bench/metal_kernel_count.py /tmp/n26b.gguf /tmp/ne4b.gguf
"""
from __future__ import annotations

import argparse
import json

import markbase


def count(path: str, n_new: int = 3) -> dict:
    ids = [2, 100, 200, 300]
    gpu = markbase.Model.load(path, backend="metal", max_context=64)
    got = list(gpu.generate_tokens(ids, max_tokens=n_new, temperature=0))
    st = gpu.stats()
    cpu = markbase.Model.load(path, backend="cpu", max_context=64, precise=True)
    want = list(cpu.generate_tokens(ids, max_tokens=n_new, temperature=0))
    return {"model": path, "n_layers": gpu.config["n_layers"],
            "metal_kernels_per_token": st["kernels_per_token"],
            "metal_host_waits_per_token": st["host_waits_per_token"],
            "cpu_ops_per_token": cpu.stats()["kernels_per_token"],
            "greedy_equal_to_cpu": got == want}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    for m in a.models:
        print(json.dumps(count(m)))


if __name__ == "__main__":
    main()
