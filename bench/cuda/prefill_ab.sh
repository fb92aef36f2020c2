#!/usr/bin/env bash
# One device call: prefill speed of the working tree under A/B environment settings, on the
# full-size 26B-A4B file (Q4_0; QUANT=q4_k_m: quant_args.sh), rounds interleaved (machines differ
# by a few %, so only figures from one call compare), with the per-op trace of the prefill steps
# for each setting.
#   TESTS="prefill_router" VARIANTS="MARKBASE_CUDA_SPLIT_K=1 MARKBASE_CUDA_SPLIT_K=0" bash bench/cuda/prefill_ab.sh
# VARIANTS: ENV=VAL[,ENV=VAL] settings, one a variant. PROMPTS: prompt lengths (512 4096). ROUNDS (2).
# TESTS: pytest -k of the CUDA tests too. Output: $OUT/prefill.txt (carry .whl for the test deps).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$OUT/prefill.txt
M=/tmp/models; mkdir -p $M
export PYTHONUNBUFFERED=1
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
CMAKE_BUILD_PARALLEL_LEVEL=16 CMAKE_ARGS="-DMARKBASE_CUDA=ON" python3 -m pip install --no-build-isolation --no-deps -q . \
  > $OUT/build.log 2>&1 &
. bench/cuda/quant_args.sh
python3 bench/make_synthetic_gguf.py $M/g4-26b.gguf --preset 26b-a4b $QARGS > /dev/null &
wait
BIN=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
[ -x "$BIN" ] || { echo "build failed" >> "$R"; tail -n 30 $OUT/build.log >> "$R"; cat "$R"; exit 1; }
if [ -n "${TESTS:-}" ]; then
  timeout 400 python3 -m pytest -q tests/test_cuda_backend.py -k "$TESTS" > $OUT/tests.txt 2>&1; tail -n 15 $OUT/tests.txt
fi
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$R"
prefill() {  # prefill ENVS PROMPT: prefill tok/s
  env ${1//,/ } $BIN --model $M/g4-26b.gguf --backend cuda --prompt-tokens $2 --gen-tokens 4 --repeats 3 --json 2>/dev/null |
    grep '^{' | python3 -c "import json,sys;print('%.0f' % json.loads(sys.stdin.readline())['prefill_tok_s'])"
}
for round in $(seq 1 ${ROUNDS:-2}); do
  for v in ${VARIANTS:?VARIANTS is required}; do
    for p in ${PROMPTS:-512 4096}; do
      printf "round %d  %-40s prefill %5d: %s tok/s\n" $round "$v" $p "$(prefill $v $p)" >> "$R"
    done
  done
done
for v in $VARIANTS; do  # the prefill steps' ops (T > 1), us a call
  echo "== trace $v (prompt 512)" >> "$R"
  env ${v//,/ } MARKBASE_CUDA_TRACE=1 $BIN --model $M/g4-26b.gguf --backend cuda --prompt-tokens 512 --gen-tokens 4 \
    --repeats 1 2>&1 | grep -E "^\[cuda trace\] .*\(T=[0-9]{2,}\)" >> "$R"
done
cat "$R"
