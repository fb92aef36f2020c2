#!/usr/bin/env bash
# Nsight Compute on the decode products of two block types, side by side: why a Q5_K product
# takes ~1.34x a Q4_K one's time for 1.22x the bytes (bench/RESULTS.md, thirty-eighth and
# thirty-ninth sessions). Two 6-layer E4B files, every weight of the first type and of the second
# (the generator's --type), a few decode tokens each without the CUDA graph (so each product is a
# launch of its own); each type's first NCU_COUNT matvec_q8_kernel launches after the prefill:
# time, DRAM and L1 traffic (requests, sectors, wavefronts), issue and stall reasons.
#   TYPES="q4_k q5_k" bash bench/cuda/h200_ncu_units.sh      (on the GPU machine; $OUT/ncu_TYPE.txt)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
TYPES=${TYPES:-"q4_k q5_k"}
for t in $TYPES; do
  python3 bench/make_synthetic_gguf.py $M/e4b-6L-$t.gguf --preset e4b --layers 6 --type $t > /dev/null 2>&1 &
done
CMAKE_BUILD_PARALLEL_LEVEL=14 CMAKE_ARGS="-DMARKBASE_CUDA=ON" python3 -m pip install --no-build-isolation --no-deps -q . \
  > "$OUT/build.log" 2>&1 || tail -30 "$OUT/build.log"
wait
B=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for t in $TYPES; do
  MARKBASE_CUDA_GRAPH=0 timeout 200 $NCU --clock-control none --kernel-name-base demangled -k "regex:matvec_q8_kernel<" \
    --launch-skip ${NCU_SKIP:-40} -c ${NCU_COUNT:-8} --section SpeedOfLight --section LaunchStats --section Occupancy \
    --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section ComputeWorkloadAnalysis \
    $B --model $M/e4b-6L-$t.gguf --backend cuda --prompt-tokens 16 --gen-tokens 4 --repeats 1 > "$OUT/ncu_$t.txt" 2>&1
  echo "$t: $(grep -c 'matvec_q8_kernel<' "$OUT/ncu_$t.txt") launches profiled"
done
