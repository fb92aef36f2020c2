#!/usr/bin/env bash
# One device call: llama.cpp's own decode on the 26B-A4B file, its one-expert twin (the MoE block
# kept, one expert of top_k times the width, top-1: make_synthetic_gguf.py --one-expert) and the
# dense comparison model (--dense-equivalent), all full size, in one run: does llama.cpp load the
# twin, and what do routing and Gemma 4's MoE block cost it. MarkBase's figures for the same three
# files: ab_builds.sh with VARIANTS="new:g4-26b new:g4-26b-one new:g4-26b-dense".
#   QUANT=q4_0 bash bench/cuda/h200_llama_twin.sh      (carry .gpu; ~400 s, most of it the build)
# Output: $OUT/twin.txt (llama-bench's JSON lines and any load error).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$OUT/twin.txt
M=/tmp/models; mkdir -p $M
( mkdir -p /tmp/llama && tar xzf .gpu/llama.cpp-src.tar.gz -C /tmp/llama &&
  cmake -S /tmp/llama/llama.cpp -B /tmp/llama/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
    > /tmp/llama/cfg.log 2>&1 && cmake --build /tmp/llama/build --target llama-bench -j14 > /tmp/llama/build.log 2>&1
  echo "llama build rc=$?" >> "$R" ) &
. bench/cuda/quant_args.sh
for kind in moe one dense; do
  extra=""; [ $kind = one ] && extra="--one-expert"; [ $kind = dense ] && extra="--dense-equivalent"
  python3 bench/make_synthetic_gguf.py $M/26b-$kind.gguf --preset 26b-a4b $QARGS $extra > /dev/null 2>&1 &
done
wait
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$R"
LB=/tmp/llama/build/bin/llama-bench
[ -x $LB ] || { tail -n 20 /tmp/llama/build.log >> "$R"; exit 1; }
for round in 1 2; do
  for kind in moe one dense; do
    echo "== round $round $kind" >> "$R"
    timeout 120 $LB -m $M/26b-$kind.gguf -ngl 99 -fa 1 -p 0 -n 128 -r 3 -o jsonl >> "$R" 2> /tmp/lb_$kind.err \
      || tail -n 8 /tmp/lb_$kind.err >> "$R"
  done
done
