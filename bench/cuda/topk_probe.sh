#!/usr/bin/env bash
# Is the MoE layer's expert time set by bytes or by latency? Decodes the 6-layer 26B-A4B file
# with its expert_used_count patched to 4, 8 and 16 (the route picks that many experts; the
# expert kernels read k / 8 of the usual bytes) and prints the trace's expert lines for each.
#   OUT=... bash bench/cuda/topk_probe.sh     (after h200_run.sh's kern stage built and generated)
set -u
OUT=${OUT:-/tmp/out}; M=/tmp/models; F=$M/g4-26b-6L.gguf
BENCH=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
patch_k() {  # rewrite the u32 value of gemma4.expert_used_count in the header; prints the old one
  python3 - "$F" "$1" <<'PY'
import struct, sys
path, k = sys.argv[1], int(sys.argv[2])
key = b"gemma4.expert_used_count"
with open(path, "r+b") as f:
    head = f.read(1 << 20)
    i = head.find(struct.pack("<Q", len(key)) + key)
    assert i >= 0, "key not found"
    j = i + 8 + len(key)
    assert struct.unpack("<I", head[j:j + 4])[0] == 4, "not a u32"
    print(struct.unpack("<I", head[j + 4:j + 8])[0])
    f.seek(j + 4); f.write(struct.pack("<I", k))
PY
}
K0=$(patch_k 8)  # the file's own count, restored at the end
for k in 4 8 16; do
  patch_k $k > /dev/null
  echo "== top-k $k" | tee -a "$OUT/topk.txt"
  "$BENCH" --model $F --backend cuda --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json 2>/dev/null \
    | python3 -c "import json,sys;d=json.load(sys.stdin);print('decode tok/s %.1f'%d['decode_tok_s'])" | tee -a "$OUT/topk.txt"
  MARKBASE_CUDA_TRACE=1 "$BENCH" --model $F --backend cuda --prompt-tokens 512 --gen-tokens 64 --repeats 1 --json 2>&1 \
    | grep "cuda trace" | grep -E "Moe|ffn_gate_inp|total" | tee -a "$OUT/topk.txt"
done
patch_k "$K0" > /dev/null
