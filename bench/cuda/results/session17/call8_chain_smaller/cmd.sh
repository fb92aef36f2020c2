STAGES="none" BUDGET=200 bash bench/cuda/h200_run.sh > $OUT/build.txt 2>&1
M=/tmp/models; B=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
for a in "m --preset 26b-a4b" "d --preset 26b-a4b --dense-equivalent" "e --preset e4b"; do
  set -- $a; f=$1; shift
  [ -f $M/$f.gguf ] || python3 bench/make_synthetic_gguf.py $M/$f.gguf --layers 6 --type q4_0 "$@" >/dev/null 2>&1 &
done; wait
run() { echo "== $F $*"; env "$@" $B --model $M/$F.gguf --backend cuda --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json 2>&1 \
  | grep -E "decode_tok_s" | sed 's/.*"decode_tok_s": \([0-9.]*\).*/decode \1/'; }
{
for F in m d e; do
  for i in 1 2; do run MARKBASE_CUDA_CHAIN_SMALLER=0; run MARKBASE_CUDA_CHAIN_SMALLER=1; done
done
} 2>&1 | tee $OUT/probe.txt
