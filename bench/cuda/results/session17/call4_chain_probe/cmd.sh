STAGES="none" BUDGET=200 bash bench/cuda/h200_run.sh > $OUT/build.txt 2>&1
M=/tmp/models; B=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
python3 bench/make_synthetic_gguf.py $M/m.gguf --preset 26b-a4b --layers 6 --type q4_0 >/dev/null 2>&1 &
python3 bench/make_synthetic_gguf.py $M/d.gguf --preset 26b-a4b --layers 6 --type q4_0 --dense-equivalent >/dev/null 2>&1 &
python3 bench/make_synthetic_gguf.py $M/e.gguf --preset e4b --layers 6 --type q4_0 >/dev/null 2>&1 &
wait
for f in m d e; do for tr in 0 1; do echo "== $f trace=$tr"
MARKBASE_CUDA_CHAIN_PROBE=1 MARKBASE_CUDA_TRACE=$tr $B --model $M/$f.gguf --backend cuda --prompt-tokens 512 --gen-tokens 64 --repeats 1 --json 2>&1 | grep -E "chain probe|RowChain|total|decode_tok_s" | cut -c1-160
done; done 2>&1 | tee $OUT/probe.txt
