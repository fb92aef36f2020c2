#!/usr/bin/env bash
# Builds bench/cuda/mmq_check.cu for each tuning variant of matmul_q8.cu (in parallel; a variant is
# a name and nvcc flags), runs each (correctness + timing on the 26B-A4B and E4B shapes; the harness
# itself sweeps the tile widths and K splits), then Nsight Compute on the default
# variant's launches NCU_SKIPS (default: E4B's MLP down and the experts' gate+up). On the GPU
# machine, from the repository root; output to $OUT/mmq.txt and $OUT/ncu_mmq.txt.
#   VARIANTS="default:|lineinfo:-lineinfo" bash bench/cuda/mmq_variants.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
VARIANTS=${VARIANTS:-"default:"}
IFS='|' read -ra VS <<< "$VARIANTS"
for v in "${VS[@]}"; do
  name=${v%%:*}; flags=${v#*:}
  nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -lineinfo -I cpp $flags bench/cuda/mmq_check.cu \
    cpp/backend/cuda/matmul_q8.cu cpp/backend/cuda/matvec_q8.cu -o /tmp/mmq_$name > /tmp/mmq_$name.log 2>&1 &
done
wait
for v in "${VS[@]}"; do
  name=${v%%:*}
  [ -x /tmp/mmq_$name ] || { echo "build $name failed"; cat /tmp/mmq_$name.log; continue; }
  /tmp/mmq_$name "$name ${v#*:}" 2>&1 | tee -a "$OUT/mmq.txt"
done
if [ "${NCU:-1}" = 1 ]; then
  N=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  for skip in ${NCU_SKIPS:-447 481}; do  # 34 launches per case: e4b mlp down, then the experts gate+up
    timeout 120 $N --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis -k regex:matmul_q8 --launch-skip $skip -c 1 \
      /tmp/mmq_default ncu 2>&1 | grep -vE "^==PROF==|^  *-+$" | tail -90 >> "$OUT/ncu_mmq.txt"
  done
fi
