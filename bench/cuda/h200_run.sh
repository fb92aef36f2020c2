#!/usr/bin/env bash
# One device call on the H200: builds MarkBase with the CUDA backend, runs the CUDA tests, and
# measures MarkBase (and llama.cpp's CUDA llama-bench, built beside it) on synthetic Gemma 4 GGUFs.
#   STAGES="probe test kern attn tune bench profile ab llama ncu" BUDGET=560 bash bench/cuda/h200_run.sh
# KERN_VARIANTS (kern stage, 6-layer file: decode speed), TRACE_VARIANTS (kern stage: per-op
# critical-path trace) and AB_ENV (bench stage, full file): env settings to A/B against the
# default in the same call. EF_BUILD=1 (kern stage): a second build with the weights read as L2
# evict_first, checked and timed beside the default (~70 s more).
# At most 8 files come back from a device call: the stages test, kern, bench and llama write 8.
# The llama.cpp build takes 270-360 s beside the test and kern stages: with all four, BUDGET=560
# (at 420 the fifteenth session's final call ran out before the dense, E4B and llama rows).
# Carried: .whl (transformers 5.23 for the tiny models), .gpu/llama.cpp-src.tar.gz (trimmed
# llama.cpp of the llama-cpp-python 0.3.36 sdist): `bash bench/cuda/make_carry.sh` makes both. Logs and
# JSON go to $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGES=${STAGES:-"test bench llama"}
BUDGET=${BUDGET:-560}
T0=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - T0))); }
log() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/run.log"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1
M=/tmp/models; mkdir -p $M
# A machine still warm from an earlier call keeps /tmp: its "done" markers would let this call
# read model files that its own generators are rewriting (session 15: "file truncated or
# corrupt" errors) and start llama-bench while ninja relinks it.
rm -f $M/*.done /tmp/llama/done

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$OUT/run.log"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi

# llama.cpp build in the background (about 250 s on 16 cores)
if has llama && [ -f .gpu/llama.cpp-src.tar.gz ]; then
  ( mkdir -p /tmp/llama && tar xzf .gpu/llama.cpp-src.tar.gz -C /tmp/llama &&
    cmake -S /tmp/llama/llama.cpp -B /tmp/llama/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
      > /tmp/llama/cfg.log 2>&1 &&
    nice -n 5 cmake --build /tmp/llama/build --target llama-bench -j12 > /tmp/llama/build.log 2>&1
    echo "llama build rc=$?" > /tmp/llama/done ) &
fi

# QUANT: the files' weight types (quant_args.sh: q4_0, the issue's figures, q4_k_m or q5_k_m).
# VARIANT_ROWS=0 skips the 26B file's switch rows (sampling, host routing, no graph, no PDL, one
# stream).
. bench/cuda/quant_args.sh
F26=$M/g4-26b-$QUANT.gguf FDENSE=$M/g4-26b-dense-$QUANT.gguf FE4B=$M/g4-e4b-$QUANT.gguf

# synthetic models in the background (the generator streams; one core each)
if has bench; then
  ( python3 bench/make_synthetic_gguf.py $F26 --preset 26b-a4b $QARGS > $M/gen26.log 2>&1
    echo done > $M/gen26.done ) &
  ( python3 bench/make_synthetic_gguf.py $FDENSE --preset 26b-a4b $QARGS --dense-equivalent > $M/gendense.log 2>&1
    python3 bench/make_synthetic_gguf.py $FE4B --preset e4b $QARGS > $M/gene4b.log 2>&1
    echo done > $M/gen2.done ) &
fi

log "building markbase (CUDA)"
CMAKE_BUILD_PARALLEL_LEVEL=8 CMAKE_ARGS="-DMARKBASE_CUDA=ON" python3 -m pip install --no-build-isolation --no-deps -q . \
  > "$OUT/build.log" 2>&1 || { log "markbase build FAILED"; tail -50 "$OUT/build.log"; }
BENCH=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
log "built: $(python3 -c 'import markbase,sys;print(markbase.__file__)') bench=$BENCH"

if has probe; then  # what the weight stream evicts from L2, and what that costs (no MarkBase code)
  log "L2 residency probe"
  nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/l2probe bench/cuda/l2_residency_probe.cu > "$OUT/probe.txt" 2>&1 &&
    timeout 90 /tmp/l2probe 256 >> "$OUT/probe.txt" 2>&1
  cat "$OUT/probe.txt"
fi

if has test; then
  log "tests"
  # TEST_TIMEOUT (300 s): the whole file took longer than that in the thirty-sixth session (~124 tests)
  tt=${TEST_TIMEOUT:-300}
  timeout $(( $(left) > tt ? tt : $(left) )) python3 -m pytest -q -p no:cacheprovider --durations=8 tests/test_cuda_backend.py \
    ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$OUT/tests.log" | tail -25
fi

if has kern; then  # decode per op, timed inside the CUDA graph (6-layer 26B-A4B file: one full layer)
  log "kernel table"
  python3 bench/make_synthetic_gguf.py $M/g4-26b-6L.gguf --preset 26b-a4b --layers 6 $QARGS > /dev/null 2>&1
  # the clocks while it decodes (latency-bound kernels run at the SM clock the GPU picks)
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv,noheader -lms 250 \
    > /tmp/clocks.txt 2>&1 & CLK=$!
  python3 bench/make_synthetic_gguf.py $M/g4-26b-dense-6L.gguf --preset 26b-a4b --layers 6 $QARGS \
    --dense-equivalent > /dev/null 2>&1
  # the MoE/dense decode ratio on one layer's worth of difference: the dense equivalent first
  "$BENCH" --model $M/g4-26b-dense-6L.gguf --backend cuda --prompt-tokens 512 --gen-tokens 128 \
    --repeats 3 --json 2>/dev/null | sed "s/^{/{\"name\": \"6L_dense\", /" | tee -a "$OUT/kern_bench.jsonl"
  for pdl in 1 0; do
    MARKBASE_CUDA_PDL=$pdl "$BENCH" --model $M/g4-26b-6L.gguf --backend cuda --prompt-tokens 512 --gen-tokens 128 \
      --repeats 3 --json 2>/dev/null | sed "s/^{/{\"name\": \"6L_pdl$pdl\", /" | tee -a "$OUT/kern_bench.jsonl"
  done
  # A/B of decode switches on the same file: KERN_VARIANTS="VAR=1 VAR2=0,VAR3=5" (commas join
  # several settings of one variant)
  for v in ${KERN_VARIANTS:-}; do
    env ${v//,/ } "$BENCH" --model $M/g4-26b-6L.gguf --backend cuda --prompt-tokens 512 --gen-tokens 128 \
      --repeats 3 --json 2>/dev/null | sed "s/^{/{\"name\": \"6L_$v\", /" | tee -a "$OUT/kern_bench.jsonl"
  done
  # EF_BUILD=1: a second build whose decode products read their weights as L2 evict_first (the
  # CMake option MARKBASE_CUDA_WEIGHTS_EVICT_FIRST, off by default): its logits against the default
  # build's (the same bits expected), its decode speed, its trace.
  BENCH_EF=""
  if [ "${EF_BUILD:-0}" = 1 ]; then
    log "building markbase (CUDA, weights evict_first)"
    CMAKE_BUILD_PARALLEL_LEVEL=8 CMAKE_ARGS="-DMARKBASE_CUDA=ON -DMARKBASE_CUDA_WEIGHTS_EVICT_FIRST=ON" \
      python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/mb_ef --config-settings=build-dir=/tmp/build_ef . \
      > /tmp/build_ef.log 2>&1 || { log "evict_first build FAILED"; tail -30 /tmp/build_ef.log >> "$OUT/run.log"; }
    BENCH_EF=$(find /tmp/mb_ef -name markbase-bench -type f 2>/dev/null | head -1)
    for site in "" /tmp/mb_ef; do
      PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} python3 -c "
import markbase, numpy as np, hashlib
m = markbase.Model.load('$M/g4-26b-6L.gguf', backend='cuda', prefill_chunk=1)
ids = list(range(10, 22))
l = np.asarray(m.logits(ids))
print('logits of', markbase.__file__, hashlib.sha256(l.tobytes()).hexdigest(), list(m.generate_tokens(ids, max_tokens=4, temperature=0.0)))" 2>&1 | tail -1 | tee -a "$OUT/run.log"
    done
    if [ -n "$BENCH_EF" ]; then
      "$BENCH_EF" --model $M/g4-26b-6L.gguf --backend cuda --prompt-tokens 512 --gen-tokens 128 \
        --repeats 3 --json 2>/dev/null | sed "s/^{/{\"name\": \"6L_evict_first_build\", /" | tee -a "$OUT/kern_bench.jsonl"
    fi
  fi
  kill $CLK 2>/dev/null
  { echo "SM clock samples while decoding (count, MHz):"; cut -d, -f2 /tmp/clocks.txt | sort | uniq -c; } >> "$OUT/run.log"
  MARKBASE_CUDA_PROFILE=1 "$BENCH" --model $M/g4-26b-6L.gguf --backend cuda --prompt-tokens 512 --gen-tokens 64 \
    --repeats 1 --json 2>&1 | grep "cuda profile" > "$OUT/kern_profile.txt"
  grep "T=1)" "$OUT/kern_profile.txt"
  # Each decode op's time on the critical path with programmatic launch on (MARKBASE_CUDA_TRACE,
  # one stream), on the 6-layer file and its dense equivalent: the profile above times ops one at
  # a time, which hides how much of each kernel overlaps the one before.
  # and the E4B shape (per-layer embeddings, KV sharing) on 6 layers: where its decode goes
  python3 bench/make_synthetic_gguf.py $M/g4-e4b-6L.gguf --preset e4b --layers 6 $QARGS > /dev/null 2>&1
  for f in g4-26b-6L g4-26b-dense-6L g4-e4b-6L; do
    echo "== $f" >> "$OUT/kern_trace.txt"
    MARKBASE_CUDA_TRACE=1 "$BENCH" --model $M/$f.gguf --backend cuda --prompt-tokens 512 --gen-tokens 64 \
      --repeats 1 --json 2>&1 | grep "cuda trace" | grep -v "T=512" >> "$OUT/kern_trace.txt"
  done
  # TRACE_VARIANTS="VAR=0 VAR2=0,VAR3=1": the same trace of the MoE file with each setting
  for v in ${TRACE_VARIANTS:-}; do
    echo "== g4-26b-6L $v" >> "$OUT/kern_trace.txt"
    env ${v//,/ } MARKBASE_CUDA_TRACE=1 "$BENCH" --model $M/g4-26b-6L.gguf --backend cuda --prompt-tokens 512 \
      --gen-tokens 64 --repeats 1 --json 2>&1 | grep "cuda trace" | grep -v "T=512" >> "$OUT/kern_trace.txt"
  done
  if [ -n "$BENCH_EF" ]; then
    echo "== g4-26b-6L evict_first build" >> "$OUT/kern_trace.txt"
    MARKBASE_CUDA_TRACE=1 "$BENCH_EF" --model $M/g4-26b-6L.gguf --backend cuda --prompt-tokens 512 \
      --gen-tokens 64 --repeats 1 --json 2>&1 | grep "cuda trace" | grep -v "T=512" >> "$OUT/kern_trace.txt"
  fi
  cat "$OUT/kern_trace.txt"
fi

if has attn; then  # the tensor-core prefill attention against the float32 kernel, and its times
  log "attention check"
  nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -I cpp -o /tmp/attn_check bench/cuda/attn_check.cu \
    cpp/backend/cuda/attention.cu cpp/backend/cuda/attention_tc.cu cpp/backend/cuda/matvec_q8.cu > "$OUT/attn_check.log" 2>&1 &&
    timeout $(( $(left) > 180 ? 120 : 30 )) /tmp/attn_check 2>&1 | tee -a "$OUT/attn_check.log"
fi

wait_for() { while [ ! -f "$1" ] && [ "$(left)" -gt 20 ]; do sleep 2; done; [ -f "$1" ]; }

SAMPLED="--temperature 0.8 --top-k 40 --top-p 0.95 --repeat-penalty 1.1"
mb() {  # mb NAME FILE PROMPT GEN [env...]
  local name=$1 file=$2 p=$3 n=$4; shift 4
  [ "$(left)" -gt 40 ] || { log "skip $name (time)"; return; }
  log "markbase $name"
  env "$@" timeout $(( $(left) - 20 )) "$BENCH" --model "$file" --backend cuda --prompt-tokens $p --gen-tokens $n \
    --repeats 3 --json ${BW:+--read-bandwidth-gbs $BW} ${MBARGS:-} 2>>"$OUT/bench.err" | sed "s/^{/{\"name\": \"$name\", /" | tee -a "$OUT/bench.jsonl"
}

if has bench; then  # the GPU's read bandwidth, for the floor: sum of a 4 GiB tensor, best of 10
  python3 -c "
import torch,time
x=torch.ones(1<<30,device='cuda');torch.cuda.synchronize();b=0
for i in range(12):
  torch.cuda.synchronize();t=time.perf_counter();x.sum();torch.cuda.synchronize();b=max(b,4*(1<<30)/(time.perf_counter()-t)/1e9)
print('{\"read_bandwidth_gbs\": %.1f}'%b)" 2>&1 | tee "$OUT/bandwidth.json"
  # the device's bandwidth goes into every MarkBase row: its decode floor
  BW=$(python3 -c "import json;print(json.load(open('$OUT/bandwidth.json'))['read_bandwidth_gbs'])" 2>/dev/null)
fi
# While llama.cpp builds (its compile jobs share the CPU, so only relative figures): the dense
# model with the fusions and batched products off, and on.
if has tune && wait_for $M/gen2.done; then
  mb tune_dense_nofuse $FDENSE 512 64 MARKBASE_CUDA_FUSE=0
  mb tune_dense_default $FDENSE 512 64
fi

# MarkBase is measured after the llama.cpp build, so that its compile jobs do not share the CPU
# with the decode loop's host side.
if has llama && [ -f .gpu/llama.cpp-src.tar.gz ]; then wait_for /tmp/llama/done; log "llama.cpp built"; fi
if has bench && wait_for $M/gen26.done; then
  log "26B file: $(ls -la $F26)"
  mb 26b_p512 $F26 512 128
  mb 26b_p4096 $F26 4096 64
  # decode with sampling (on the device) instead of the arg-max: what a chat user runs; llama-bench
  # does not sample at all, so compare this row with 26b_p512, not with llama.cpp
  if [ "${VARIANT_ROWS:-1}" = 1 ]; then
  MBARGS="$SAMPLED" mb 26b_p512_sampled $F26 512 64
  mb 26b_p512_hostrouting $F26 512 64 MARKBASE_CUDA_HOST_ROUTING=1
  mb 26b_p512_nograph $F26 512 64 MARKBASE_CUDA_GRAPH=0
  mb 26b_p512_nopdl $F26 512 64 MARKBASE_CUDA_PDL=0
  mb 26b_p512_onestream $F26 512 64 MARKBASE_CUDA_STREAMS=0
  fi
  # an A/B switch on the full file, same call: AB_ENV="MARKBASE_CUDA_MOE_STAGED=0"
  [ -n "${AB_ENV:-}" ] && mb 26b_p512_ab $F26 512 128 $AB_ENV
  # per-op-kind GPU time (eager launches timed with events; printed to bench.err)
  has profile && mb 26b_profile $F26 512 32 MARKBASE_CUDA_PROFILE=1
  # A/B of the prefill paths: the f16 tiles instead of the int8 tensor cores, the float32
  # attention kernel instead of the tensor-core one
  if has ab; then
    mb 26b_p512_f16tiles $F26 512 16 MARKBASE_CUDA_INT8_PREFILL=0
    mb 26b_p4096_f16tiles $F26 4096 16 MARKBASE_CUDA_INT8_PREFILL=0
    mb 26b_p4096_attn_f32 $F26 4096 16 MARKBASE_CUDA_ATTN_TC=0
  fi
  if wait_for $M/gen2.done; then
    mb dense_p512 $FDENSE 512 128
    mb e4b_p512 $FE4B 512 128
    mb e4b_p4096 $FE4B 4096 64
    MBARGS="$SAMPLED" mb e4b_p512_sampled $FE4B 512 64
    has profile && mb e4b_profile $FE4B 512 16 MARKBASE_CUDA_PROFILE=1
    for c in ${CHUNKS:-}; do  # prefill chunk sizes other than the backend's (2048)
      MBARGS="--prefill-chunk $c" mb e4b_p4096_chunk$c $FE4B 4096 16
      MBARGS="--prefill-chunk $c" mb 26b_p4096_chunk$c $F26 4096 16
    done
  fi
fi

if has llama && wait_for /tmp/llama/done; then
  cat /tmp/llama/done | tee -a "$OUT/run.log"
  LB=/tmp/llama/build/bin/llama-bench
  for f in g4-26b-$QUANT g4-26b-dense-$QUANT g4-e4b-$QUANT; do
    [ -f $M/$f.gguf ] && [ "$(left)" -gt 60 ] || continue
    log "llama-bench $f"
    timeout $(( $(left) - 10 )) $LB -m $M/$f.gguf -ngl 99 -fa 1 -p 512,4096 -n 128 -d 0,4096 -r 2 -o jsonl \
      2>>"$OUT/llama.err" | tee -a "$OUT/llama.jsonl"
  done
  # llama.cpp with MarkBase's CUDA prefill step (physical batch 2048 instead of its default 512)
  for f in g4-26b-$QUANT g4-e4b-$QUANT; do
    [ -f $M/$f.gguf ] && [ "$(left)" -gt 30 ] || continue
    log "llama-bench $f ubatch 2048"
    timeout $(( $(left) - 10 )) $LB -m $M/$f.gguf -ngl 99 -fa 1 -p 4096 -n 0 -b 2048 -ub 2048 -r 2 -o jsonl \
      2>>"$OUT/llama.err" | tee -a "$OUT/llama.jsonl"
  done
  tail -5 /tmp/llama/build.log >> "$OUT/run.log"
fi
# Nsight Compute on the decode kernels of one token of the 6-layer file (kern stage), with the
# warp stall reasons: what a latency-bound kernel waits on. Into ncu.txt.
if has ncu && [ "$(left)" -gt 60 ] && [ -f $M/g4-26b-6L.gguf ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  # NCU_KERNELS: "name skip count [ENV=value,...]" entries separated by ';' (commas join the
  # settings of that entry's run, e.g. an A/B switch); NCU_ARGS: more ncu options (e.g.
  # "--print-details all" for the warp stall reasons)
  IFS=';' read -ra NCU_LIST <<< "${NCU_KERNELS:-attention_decode_kernel 6 6;attention_combine 6 2;row_chain 9 3;router_kernel 3 1;matvec_q8_kernel 12 4;gate_up_q8 3 1;down_q8 3 1;norm_rope_store 3 1}"
  for k in "${NCU_LIST[@]}"; do
    set -- $k
    e=${4:-}
    [ "$(left)" -gt 30 ] || break
    echo "=== $k" >> "$OUT/ncu.txt"
    env ${e//,/ } MARKBASE_CUDA_GRAPH=0 timeout $(( $(left) > 70 ? 60 : $(left) - 10 )) $NCU --clock-control none \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats ${NCU_ARGS:-} \
      -k "regex:$1" --launch-skip $2 -c $3 $BENCH --model $M/g4-26b-6L.gguf --backend cuda --prompt-tokens 512 \
      --gen-tokens 4 --repeats 1 2>&1 | grep -vE "^==PROF==|^\{|^ *-+ *$|^ *$" >> "$OUT/ncu.txt"
  done
fi
# At most 8 files come back: the build log only on failure, the stderr logs folded into run.log.
[ -s "$OUT/build.log" ] && grep -q FAILED "$OUT/run.log" || rm -f "$OUT/build.log"
for f in bench.err llama.err; do
  [ -f "$OUT/$f" ] && { echo "--- $f" >> "$OUT/run.log"; tail -40 "$OUT/$f" >> "$OUT/run.log"; rm -f "$OUT/$f"; }
done
log "end"
