STAGES="none" BUDGET=200 bash bench/cuda/h200_run.sh > $OUT/build.txt 2>&1
M=/tmp/models; B=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
python3 bench/make_synthetic_gguf.py $M/m.gguf --layers 6 --type q4_0 --preset 26b-a4b >/dev/null 2>&1 &
MARKBASE_CUDA_DENSE_FIRST=1 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py -k "moe_dense" 2>&1 | tail -2
wait
run() { echo "== $*"; env "$@" $B --model $M/m.gguf --backend cuda --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json 2>&1 \
  | grep -E "decode_tok_s" | sed 's/.*"decode_tok_s": \([0-9.]*\).*/decode \1/'; }
for i in 1 2 3; do run MARKBASE_CUDA_DENSE_FIRST=0; run MARKBASE_CUDA_DENSE_FIRST=1; done
MARKBASE_CUDA_DENSE_FIRST=1 MARKBASE_CUDA_TRACE=1 $B --model $M/m.gguf --backend cuda --prompt-tokens 512 --gen-tokens 64 --repeats 1 --json 2>&1 | grep "gate_inp"
