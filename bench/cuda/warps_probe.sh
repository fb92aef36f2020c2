#!/usr/bin/env bash
# One short device call: the decode products' per-op trace on the 6-layer E4B and 26B-A4B files
# with every matrix-vector product's block forced to 2, 3 and 4 warps (MARKBASE_CUDA_MATVEC_WARPS),
# from an sm_90a-only build (~90 s on 16 cores). Written for the Q6_K attn_v launch's warps
# (bench/RESULTS.md, thirty-sixth session). QUANT as in quant_args.sh; output in $OUT/w.txt.
#   QUANT=q4_k_m bash bench/cuda/warps_probe.sh      (the run tool, ~110 s)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; M=/tmp/models; mkdir -p $M
. bench/cuda/quant_args.sh
( python3 bench/make_synthetic_gguf.py $M/e4b.gguf --preset e4b --layers 6 $QARGS >/dev/null 2>&1 ) &
( python3 bench/make_synthetic_gguf.py $M/26b.gguf --preset 26b-a4b --layers 6 $QARGS >/dev/null 2>&1 ) &
CMAKE_BUILD_PARALLEL_LEVEL=14 CMAKE_ARGS="-DMARKBASE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real" python3 -m pip install --no-build-isolation --no-deps -q . > $OUT/build.log 2>&1 || tail -20 $OUT/build.log
wait
B=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
for f in e4b 26b; do for w in 2 3 4; do
  echo "== $f warps=$w" >> $OUT/w.txt
  MARKBASE_CUDA_MATVEC_WARPS=$w MARKBASE_CUDA_TRACE=1 $B --model $M/$f.gguf --backend cuda --prompt-tokens 512 --gen-tokens 64 --repeats 1 --json 2>&1 | grep -E "attn_q.*T=1|lm_head|total|decode_tok_s" | sed 's/.*"decode_tok_s": \([0-9.]*\).*/decode \1/' >> $OUT/w.txt
done; done
cat $OUT/w.txt
