#!/usr/bin/env bash
# Registers, stack frame and spills of every CUDA kernel (ptxas -v, sm_90a); runs without a GPU.
#   bash bench/cuda/kernel_resources.sh           (every kernel: regs, stack bytes, spill bytes, name)
#   bash bench/cuda/kernel_resources.sh --stack   (only kernels with a stack frame or spills)
# Why: a kernel's registers set how many of its blocks share an SM (gate_up_dense_kernel at 56
# registers fits 12 blocks of 3 warps, at 66 only 9), and a stack frame means local memory. In the
# thirty-second session a build whose gate/up kernels had a never-entered stack frame ran every
# decode op slower; the thirty-third measured such a stack frame alone and found it costs nothing
# measurable (bench/RESULTS.md), so that build's slowness had another cause.
set -euo pipefail
only_stack=0
[ "${1:-}" = --stack ] && only_stack=1
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in cpp/backend/cuda/*.cu; do
  b=$(basename "$f" .cu)
  nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -I cpp -Xptxas -v -c "$f" -o "$tmp/$b.o" \
    2> "$tmp/$b.ptxas" &
done
wait
# ptxas prints, per function: "Function properties for NAME", then "N bytes stack frame, S bytes
# spill stores, L bytes spill loads", then (kernels) "Used R registers, ...".
cat "$tmp"/*.ptxas | awk -v only="$only_stack" '
  /Function properties for/ { name = $NF; stack = -1; next }
  /bytes stack frame/ { stack = $1; spill = $5 + $9; next }
  /Used [0-9]+ registers/ && stack >= 0 {
    for (i = 1; i <= NF; ++i) if ($i == "Used") regs = $(i + 1)
    if (!only || stack > 0 || spill > 0) print regs, stack, spill, name
    stack = -1
  }' | c++filt | awk '{ printf "%4s regs %4s B stack %4s B spill  ", $1, $2, $3; $1 = $2 = $3 = ""; print substr($0, 4) }' \
  | sort -k9
