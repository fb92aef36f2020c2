#!/usr/bin/env bash
# Nsight Compute: where the warps of the decode row-chain kernels stall (no instruction = the
# instruction fetch; long scoreboard = global loads; barrier; ...), per kernel, to compare the
# chain in the chain+router launch (moe.cu's chain_router_kernel, with and without its router
# blocks) with the same chains in the row-chain kernel (norm_rope.cu's fused_chain_kernel).
#   bash bench/cuda/h200_ncu_stalls.sh          (the H200: ~3 min; output to $OUT/ncu_stalls.txt)
#   SOURCE=1 bash bench/cuda/h200_ncu_stalls.sh (also: the chain+router launch's warp-state samples
#     per SASS instruction, $OUT/router_source.csv.gz: which instructions of its router blocks stall, and
#     on what; the default form is the spread one, so these are router blocks only; and the same for
#     the MoE layer's second chain, $OUT/chain2_source.csv.gz; read with bench/cuda/ncu_source_summary.py).
#     STALLS=0: only those.
# Kernels are profiled one at a time (ncu serializes them), so the programmatic wait costs
# nothing here: the figures are each kernel's own execution, not its place in the token's chain.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
R=$OUT/ncu_stalls.txt
python3 bench/make_synthetic_gguf.py $M/g4-26b-4L.gguf --preset 26b-a4b --layers 4 --type q4_0 > /dev/null 2>&1 &
CMAKE_BUILD_PARALLEL_LEVEL=16 CMAKE_ARGS="-DMARKBASE_CUDA=ON" python3 -m pip install --no-build-isolation --no-deps -q . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
wait
B=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu)
run() {  # run LABEL KERNEL_REGEX SKIP [env...]: one launch, in the second decode token
  local label=$1 k=$2 skip=$3; shift 3
  echo "== $label" >> "$R"
  env MARKBASE_CUDA_GRAPH=0 "$@" timeout 90 $NCU --clock-control none --cache-control none \
    --metrics "gpu__time_duration.sum,sm__cycles_elapsed.max,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio" \
    -k "regex:$k" --launch-skip $skip -c 1 $B --model $M/g4-26b-4L.gguf --backend cuda --prompt-tokens 64 \
    --gen-tokens 4 --repeats 1 2>&1 | grep -E "^  [a-z_]+.*\(|gpu__time|sm__cycles|inst_executed|stalled|==ERROR|==WARNING" \
    >> "$R"
}
if [ "${STALLS:-1}" = 1 ]; then
run "MoE chain+router launch (router blocks beside the chain)" chain_router_kernel 4
run "MoE chain+router launch, chain blocks only (PROBE_NO_ROUTER)" chain_router_kernel 4 MARKBASE_CUDA_PROBE_NO_ROUTER=1
run "MoE second chain, row-chain kernel (fused)" fused_chain_kernel 4
run "MoE first chain in the row-chain kernel (CHAIN_ROUTER=0; fused)" fused_chain_kernel 8 MARKBASE_CUDA_CHAIN_ROUTER=0
run "MoE first chain, general loop in the row-chain kernel (CHAIN_ROUTER=0, CHAIN_FUSED=0)" row_chain_kernel 8 \
  MARKBASE_CUDA_CHAIN_ROUTER=0 MARKBASE_CUDA_CHAIN_FUSED=0
fi
# source_samples KERNEL_REGEX NAME: 8 launches' warp-state samples (one every 32 cycles) per SASS instruction, $OUT/NAME_source.csv.gz
source_samples() {
  env MARKBASE_CUDA_GRAPH=0 timeout 120 $NCU --clock-control none --cache-control none --section SourceCounters \
    --section WarpStateStats --warp-sampling-interval 0 -k "regex:$1" --launch-skip 4 -c 8 -f -o /tmp/$2_src $B \
    --model $M/g4-26b-4L.gguf --backend cuda --prompt-tokens 64 --gen-tokens 6 --repeats 1 > "$OUT/$2_src.log" 2>&1
  $NCU -i /tmp/$2_src.ncu-rep --page source --csv --print-source sass 2>>"$OUT/$2_src.log" | gzip > "$OUT/$2_source.csv.gz"
  echo "== $2: warp states" >> "$R"
  $NCU -i /tmp/$2_src.ncu-rep --page details --section WarpStateStats >> "$R" 2>&1
}
if [ "${SOURCE:-0}" = 1 ]; then
  source_samples chain_router_kernel router
  source_samples fused_chain_kernel chain2  # the MoE layer's second chain (norms of both feed-forwards)
fi
cat "$R"
