#!/usr/bin/env bash
# SASS (sm_90a machine code) of one CUDA source file, kernel by kernel; runs without a GPU.
#   bash bench/cuda/sass.sh cpp/backend/cuda/moe.cu > /tmp/moe.sass
#   bash bench/cuda/sass.sh --counts cpp/backend/cuda/moe.cu   (instructions per kernel and opcode)
#   bash bench/cuda/sass.sh --params cpp/backend/cuda/moe.cu   (kernel parameter reads after the
#     programmatic wait: 128-byte lines first read there, and reads by a computed index)
#   bash bench/cuda/sass.sh --lines cpp/backend/cuda/moe.cu    (every kernel's constant-bank lines in
#     the order first read, bank:line@instruction, and where its wait is: each first read of a line
#     is a constant-cache miss that holds its warp, before the wait too when the block starts late;
#     bench/RESULTS.md, twenty-eighth session)
# Why: a refactor of kernel code (a block folded into a shared function, say) should leave the
# machine code alone or change it knowingly; diffing two dumps shows which, before any GPU time.
# cuobjdump and the nvdisasm it calls are not in this machine's CUDA toolkit; NVIDIA's PyPI wheels
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm have them (fetched once into ~/.cache/markbase).
set -euo pipefail
mode=sass
case "${1:-}" in --counts) mode=counts; shift ;; --params) mode=params; shift ;; --lines) mode=lines; shift ;; esac
src=${1:?usage: sass.sh [--counts] FILE.cu}
cd "$(dirname "$0")/../.."
tool=$(command -v cuobjdump || true)
if [ -z "$tool" ]; then
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/markbase/cuobjdump
  if [ ! -x "$cache/nvidia/cu13/bin/nvdisasm" ]; then
    mkdir -p "$cache"
    for w in nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm; do
      python3 -m pip download -q --no-deps "$w" -d "$cache" 2>/dev/null >&2
    done
    for w in "$cache"/*.whl; do python3 -m zipfile -e "$w" "$cache"; done
    chmod +x "$cache"/nvidia/cu13/bin/*
  fi
  tool=$cache/nvidia/cu13/bin/cuobjdump
  export PATH="$cache/nvidia/cu13/bin:$PATH"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -I cpp -cubin "$src" -o "$tmp/k.cubin"
"$tool" -sass "$tmp/k.cubin" > "$tmp/k.sass"
if [ "$mode" = sass ]; then cat "$tmp/k.sass"; exit 0; fi
python3 - "$tmp/k.sass" "$mode" <<'PY'
import collections, re, sys

kernels = {}  # name -> instructions (predicate stripped)
kernel = None
for line in open(sys.argv[1]):
    m = re.match(r"\s+Function : (\S+)", line)
    if m:
        kernel = m.group(1)
        kernels[kernel] = []
        continue
    m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?(.*?)\s*;", line)
    if m and kernel:
        kernels[kernel].append(m.group(1))
if sys.argv[2] == "counts":
    for k, ins in kernels.items():
        c = collections.Counter(i.split()[0] for i in ins)
        print(f"{sum(c.values()):7d}  {k}")
        print("         " + " ".join(f"{op}:{n}" for op, n in sorted(c.items())))
    sys.exit(0)
if sys.argv[2] == "lines":
    for k, ins in kernels.items():
        wait = next((i for i, x in enumerate(ins) if x.startswith("ACQBULK")), None)
        seen = {}
        for i, x in enumerate(ins):
            for m in re.finditer(r"c\[0x(\d)\]\[(?:(?:U?R\d+|U?RZ)\+?)?(0x[0-9a-f]+)?\]", x):
                key = f"{m.group(1)}:{int(m.group(2) or '0', 16) // 128:x}"
                seen.setdefault(key, i)
        print(k)
        print(f"   wait at {wait} of {len(ins)}; lines: " + " ".join(f"{key}@{i}" for key, i in seen.items()))
    sys.exit(0)
# Parameters live in constant bank 0 from 0x210 (sm_90). After the wait (ACQBULK), a first read of
# a line no read before the wait touched, or a read at a computed offset, waits for the constant
# cache on the kernel's critical path.
print("lines  indexed  kernel (parameter reads after the programmatic wait)")
rows = []
for k, ins in kernels.items():
    wait = next((i for i, x in enumerate(ins) if x.startswith("ACQBULK")), None)
    if wait is None:
        continue
    before, after, indexed = set(), set(), 0
    for i, x in enumerate(ins):
        for m in re.finditer(r"c\[0x0\]\[(?:(U?R\d+)\+)?(0x[0-9a-f]+)\]", x):
            off = int(m.group(2), 16)
            if off < 0x210:
                continue
            if m.group(1) not in (None, "RZ", "URZ"):
                indexed += i > wait
                continue
            (before if i < wait else after).add(off // 128)
    rows.append((len(after - before), indexed, k))
for lines, indexed, k in sorted(rows, key=lambda r: (-r[0] - r[1], r[2])):
    print(f"{lines:5d}  {indexed:7d}  {k}")
PY
