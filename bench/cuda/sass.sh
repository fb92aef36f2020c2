#!/usr/bin/env bash
# SASS (sm_90a machine code) of one CUDA source file, kernel by kernel; runs without a GPU.
#   bash bench/cuda/sass.sh cpp/backend/cuda/moe.cu > /tmp/moe.sass
#   bash bench/cuda/sass.sh --counts cpp/backend/cuda/moe.cu   (instructions per kernel and opcode)
# Why: a refactor of kernel code (a block folded into a shared function, say) should leave the
# machine code alone or change it knowingly; diffing two dumps shows which, before any GPU time.
# cuobjdump and the nvdisasm it calls are not in this machine's CUDA toolkit; NVIDIA's PyPI wheels
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm have them (fetched once into ~/.cache/markbase).
set -euo pipefail
counts=0
if [ "${1:-}" = "--counts" ]; then counts=1; shift; fi
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
if [ "$counts" = 0 ]; then cat "$tmp/k.sass"; exit 0; fi
python3 - "$tmp/k.sass" <<'PY'
import collections, re, sys
kernel = None
ops = collections.defaultdict(collections.Counter)
for line in open(sys.argv[1]):
    m = re.match(r"\s+Function : (\S+)", line)
    if m:
        kernel = m.group(1)
        continue
    m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)", line)
    if m and kernel:
        ops[kernel][m.group(1)] += 1
for k, c in ops.items():
    print(f"{sum(c.values()):7d}  {k}")
    print("         " + " ".join(f"{op}:{n}" for op, n in sorted(c.items())))
PY
