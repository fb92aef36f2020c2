#!/usr/bin/env bash
# Instruction bytes (SASS .text) of every CUDA kernel, largest first, for sm_90a; runs without a GPU.
#   bash bench/cuda/kernel_sizes.sh [N]     (N: how many to list, default 25)
# Why: a kernel run as one block fetches its instructions cold at every launch. The decode row
# chain unrolled over its ops was 66 KB; as a loop over one copy (18 KB), decode went +2.8 % on the
# H200 (bench/RESULTS.md, seventeenth session). Kernels of many blocks pay the fetch once an SM.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in cpp/backend/cuda/*.cu; do
  b=$(basename "$f" .cu)
  nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -I cpp -cubin "$f" -o "$tmp/$b.cubin" &
done
wait
for c in "$tmp"/*.cubin; do
  b=$(basename "$c" .cubin)
  readelf -S -W "$c" 2>/dev/null | awk -v f="$b" '$2 ~ /^\.text\./ {print f, $2, $6}'
done | while read -r f sec size; do
  name=$(echo "${sec#.text.}" | c++filt 2>/dev/null || echo "${sec#.text.}")
  printf '%8d  %-12s %s\n' "$((16#$size))" "$f" "$(echo "$name" | sed 's/markbase::cuda:://g; s/(anonymous namespace):://g' | cut -c1-110)"
done | sort -rn | head -n "${1:-25}"
