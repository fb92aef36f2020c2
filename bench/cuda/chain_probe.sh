#!/usr/bin/env bash
# One device call: where a decode row chain's time goes (MARKBASE_CUDA_CHAIN_PROBE, row_chain.cuh),
# beside each op's critical-path time (MARKBASE_CUDA_TRACE), on 6-layer synthetic files of the
# 26B-A4B shape, its dense equivalent and E4B. Builds MarkBase with the CUDA backend first.
#   bash bench/cuda/chain_probe.sh            (the H200: ~150 s; output to $OUT/chain_probe.txt)
# CHAIN_VARIANTS="VAR=1 VAR2=0,VAR3=1": decode speed and trace of the 26B-A4B file with each setting too.
# SKIP_BUILD=1: MarkBase is installed already (h200_run.sh earlier in the same call).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
M=/tmp/models; mkdir -p $M
R=$OUT/chain_probe.txt
export PYTHONUNBUFFERED=1
[ "${SKIP_BUILD:-0}" = 1 ] || CMAKE_BUILD_PARALLEL_LEVEL=16 CMAKE_ARGS="-DMARKBASE_CUDA=ON" python3 -m pip install --no-build-isolation --no-deps -q . \
  > /tmp/build.log 2>&1 || { tail -40 /tmp/build.log | tee -a "$R"; exit 1; }
BENCH=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
python3 bench/make_synthetic_gguf.py $M/g4-26b-6L.gguf --preset 26b-a4b --layers 6 --type q4_0 > /dev/null &
python3 bench/make_synthetic_gguf.py $M/g4-26b-dense-6L.gguf --preset 26b-a4b --layers 6 --type q4_0 --dense-equivalent > /dev/null &
python3 bench/make_synthetic_gguf.py $M/g4-e4b-6L.gguf --preset e4b --layers 6 --type q4_0 > /dev/null &
wait
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$R"
run() {  # run LABEL FILE [env...]
  local label=$1 f=$2; shift 2
  echo "== $label" >> "$R"
  env "$@" "$BENCH" --model $M/$f.gguf --backend cuda --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json 2>/dev/null \
    | python3 -c "import json,sys;d=json.loads(sys.stdin.readline());print('decode %.1f tok/s, %.4f ms/token' % (d['decode_tok_s'], 1e3/d['decode_tok_s']))" >> "$R"
  env "$@" MARKBASE_CUDA_CHAIN_PROBE=1 MARKBASE_CUDA_TRACE=1 "$BENCH" --model $M/$f.gguf --backend cuda --prompt-tokens 512 \
    --gen-tokens 64 --repeats 1 --json 2>&1 | grep -E "cuda trace|chain probe" | grep -v "T=512" >> "$R"
}
for f in g4-26b-6L g4-26b-dense-6L g4-e4b-6L; do run "$f" $f; done
for v in ${CHAIN_VARIANTS:-}; do run "g4-26b-6L $v" g4-26b-6L ${v//,/ }; done
cat "$R"
