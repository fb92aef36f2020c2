#!/usr/bin/env bash
# Nsight Compute on the decode kernels (speed of light, occupancy, launch statistics).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
[ -f $M/g4-26b-4L.gguf ] || python3 bench/make_synthetic_gguf.py $M/g4-26b-4L.gguf --preset 26b-a4b --layers 4 --type q4_0 > /dev/null 2>&1 &
CMAKE_BUILD_PARALLEL_LEVEL=14 CMAKE_ARGS="-DMARKBASE_CUDA=ON" python3 -m pip install --no-build-isolation --no-deps -q . > "$OUT/build.log" 2>&1 || tail -30 "$OUT/build.log"
wait
B=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
run() { MARKBASE_CUDA_GRAPH=0 timeout 120 $NCU --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
  -k "regex:$1" --launch-skip $2 -c $3 $B --model $M/g4-26b-4L.gguf --backend cuda --prompt-tokens 64 --gen-tokens 4 --repeats 1 2>&1 \
  | grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Block Size|Grid Size|Theoretical Occ|Dynamic Shared|Elapsed Cycles|SM Frequency|Local" | tee -a "$OUT/ncu.txt"; }
run matvec_q8_kernel 16 3
run attention_kernel 16 2
run gate_up_q8 4 1
run down_q8 4 1
run row_chain 12 1
