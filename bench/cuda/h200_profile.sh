#!/usr/bin/env bash
# A short device call: per-op-kind GPU time of MarkBase's CUDA backend (MARKBASE_CUDA_PROFILE=1,
# eager launches timed with events) on a 4-layer 26B-A4B-shaped file and the full dense
# comparison model, plus an uncontended decode measurement of the latter.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; M=/tmp/models; mkdir -p $M
export PYTHONUNBUFFERED=1
python3 bench/make_synthetic_gguf.py $M/g4-26b-4L.gguf --preset 26b-a4b --layers 4 --type q4_0 > /dev/null 2>&1 &
python3 bench/make_synthetic_gguf.py $M/dense.gguf --preset 26b-a4b --type q4_0 --dense-equivalent > /dev/null 2>&1 &
CMAKE_BUILD_PARALLEL_LEVEL=14 CMAKE_ARGS="-DMARKBASE_CUDA=ON" python3 -m pip install --no-build-isolation --no-deps -q . > "$OUT/build.log" 2>&1 || tail -30 "$OUT/build.log"
wait
B=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
for f in g4-26b-4L dense; do
  MARKBASE_CUDA_PROFILE=1 $B --model $M/$f.gguf --backend cuda --prompt-tokens 512 --gen-tokens 32 --repeats 1 --json 2>&1 | tee "$OUT/profile_$f.txt"
done
$B --model $M/dense.gguf --backend cuda --prompt-tokens 512 --gen-tokens 128 --repeats 2 --json 2>&1 | tee -a "$OUT/profile_dense.txt"
