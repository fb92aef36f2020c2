set -u
OUT=${OUT:-/tmp/out}; M=/tmp/models; mkdir -p $M $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
CMAKE_BUILD_PARALLEL_LEVEL=8 CMAKE_ARGS="-DMARKBASE_CUDA=ON" python3 -m pip install --no-build-isolation --no-deps -q . > $OUT/build.log 2>&1 || tail -30 $OUT/build.log
python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py -k "${PYTEST_K:-cluster or scheduling or default_mode or 26b}" 2>&1 | tail -5
BENCH=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
python3 bench/make_synthetic_gguf.py $M/g4-26b-6L.gguf --preset 26b-a4b --layers 6 --type q4_0 > /dev/null 2>&1
for P in ${PROMPTS:-400 512}; do
 for v in ${VARIANTS:-X=1 MARKBASE_CUDA_ATTN_CLUSTER=0}; do
  echo "== prompt $P $v" | tee -a $OUT/trace.txt
  env ${v//,/ } MARKBASE_CUDA_TRACE=1 "$BENCH" --model $M/g4-26b-6L.gguf --backend cuda --prompt-tokens $P --gen-tokens 64 \
      --repeats 1 --json 2>&1 | grep "cuda trace" | grep -v "T=$P" | grep -i "attention\|attn_output\|total\|q_norm" | tee -a $OUT/trace.txt
  env ${v//,/ } "$BENCH" --model $M/g4-26b-6L.gguf --backend cuda --prompt-tokens $P --gen-tokens 128 --repeats 3 --json 2>/dev/null | tee -a $OUT/bench.jsonl | python3 -c "import json,sys;d=json.loads(sys.stdin.read());print('decode',d['decode_tok_s'],'kernels',d['kernels_per_token'])"
 done
done
