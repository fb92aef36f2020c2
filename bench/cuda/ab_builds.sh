#!/usr/bin/env bash
# One device call: decode speed of the working tree against older commits, built side by side on
# the H200, in one call (machines differ by 2-5 %, so only figures from one call compare), with
# each variant run three times, interleaved, and the chain probe's cycles of each.
# Before the call, here (the device has no git history): one tarball per older commit,
#   git archive --format=tar 66f9460 -o bench/cuda/old.tar     (untracked, so it travels; ~6 MB)
# then, on the device (the run tool), e.g.
#   BUILDS="old=bench/cuda/old.tar" VARIANTS="old:g4-26b-6L new:g4-26b-6L new:g4-26b-6L:MARKBASE_CUDA_CHAIN_SPLIT=0
#     old:g4-26b-dense-6L new:g4-26b-dense-6L" bash bench/cuda/ab_builds.sh
# BUILDS: NAME=TARBALL pairs (the working tree is "new"). VARIANTS: BUILD:FILE[:ENV=VAL,ENV=VAL]
# with FILE one of g4-26b-6L, g4-26b-dense-6L, g4-e4b-6L (6-layer synthetic files, Q4_0 unless
# QUANT says otherwise), g4-26b, g4-26b-dense (the full 30-layer files, ~15 GB each).
# PROBE=0: no chain probe runs; PROBE=trace: the per-op trace without the probe. ROUNDS: rounds of the variants (3). TESTS="chain_router or q8_decode": pytest -k of the new build's CUDA tests too.
# Output: $OUT/ab.txt (~150-250 s with two builds; the builds share the 16 cores), ending with each
# traced pass's per-op sum and the per-op table (us a call, one column a variant); every variant's
# whole per-op trace in $OUT/traces.txt (one file: the run tool brings back only so many files).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$OUT/ab.txt
M=/tmp/models; mkdir -p $M
export PYTHONUNBUFFERED=1
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
n_builds=$((1 + $(echo ${BUILDS:-} | wc -w)))
jobs=$((16 / n_builds))
CMAKE_BUILD_PARALLEL_LEVEL=$jobs CMAKE_ARGS="-DMARKBASE_CUDA=ON" python3 -m pip install --no-build-isolation --no-deps -q . \
  > $OUT/build_new.log 2>&1 &
declare -A BIN PYP
BIN[new]=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
PYP[new]=${PYTHONPATH:-}
for b in ${BUILDS:-}; do
  name=${b%%=*} tar=${b#*=}
  mkdir -p /tmp/src_$name && tar xf "$tar" -C /tmp/src_$name
  (cd /tmp/src_$name && CMAKE_BUILD_PARALLEL_LEVEL=$jobs CMAKE_ARGS="-DMARKBASE_CUDA=ON" \
    python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pkg_$name . > $OUT/build_$name.log 2>&1) &
  BIN[$name]=/tmp/pkg_$name/bin/markbase-bench
  PYP[$name]=/tmp/pkg_$name
done
files=$(for v in ${VARIANTS:?VARIANTS is required}; do f=${v#*:}; echo ${f%%:*}; done | sort -u)
# A file's generator arguments from its name: g4-26b or g4-e4b, -dense (the dense comparison
# model, 26B-A4B only), -one (its one-expert twin: the MoE block kept, one expert, top-1), -6L
# (6 layers, else the full depth). QUANT: the weight types
# (quant_args.sh: q4_0 by default, q4_k_m, q5_k_m); a name ending in @QUANT (g4-26b-6L@q4_k_m)
# takes that one instead, so that one call can compare builds on files of two mixes.
base_quant=${QUANT:-q4_0}
for f in $files; do
  name=${f%%@*}  # the file's shape; the suffix only picks its mix
  [[ $f =~ ^g4-(26b(-dense|-one)?(-6L)?|e4b-6L)(@[a-z0-9_]+)?$ ]] || { echo "unknown file $f" >> "$R"; exit 1; }
  QUANT=$base_quant; [[ $f == *@* ]] && QUANT=${f#*@}
  . bench/cuda/quant_args.sh
  args="--preset $([[ $name == g4-26b* ]] && echo 26b-a4b || echo e4b) $QARGS"
  [[ $name == *-dense* ]] && args+=" --dense-equivalent"
  [[ $name == *-one* ]] && args+=" --one-expert"
  [[ $name == *-6L ]] && args+=" --layers 6"
  python3 bench/make_synthetic_gguf.py $M/$f.gguf $args > /dev/null &
done
wait
for b in new ${BUILDS:-}; do
  name=${b%%=*}
  [ -x "${BIN[$name]}" ] || { echo "build $name failed" >> "$R"; tail -n 30 $OUT/build_$name.log >> "$R"; exit 1; }
done
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$R"
ms_per_token() {  # the decode figure of the JSON line on stdin
  grep '^{' | python3 -c "import json,sys;print('%.4f' % (1e3 / json.loads(sys.stdin.readline())['decode_tok_s']))"
}
run() {  # run BUILD FILE ENVS [extra env...]: one decode figure (or the probe's lines with extra env)
  local b=$1 f=$2 envs=$3; shift 3
  env ${envs//,/ } "$@" PYTHONPATH=${PYP[$b]} ${BIN[$b]} --model $M/$f.gguf --backend cuda --prompt-tokens 512 \
    --gen-tokens 128 --repeats 3 --json 2>&1
}
for round in $(seq 1 ${ROUNDS:-3}); do
  echo "== round $round" >> "$R"
  for v in $VARIANTS; do
    b=${v%%:*} rest=${v#*:}; f=${rest%%:*}; envs=""; [ "$rest" != "$f" ] && envs=${rest#*:}
    printf "%-60s " "$v" >> "$R"
    echo "decode $(run $b $f "X=1,$envs" | ms_per_token) ms/token" >> "$R"
  done
done
if [ "${PROBE:-1}" != 0 ]; then
  probe_env="MARKBASE_CUDA_CHAIN_PROBE=1 MARKBASE_CUDA_TRACE=1"
  [ "${PROBE:-1}" = trace ] && probe_env="MARKBASE_CUDA_TRACE=1"  # the probe's own clock reads cost time
  i=0 T=/tmp/traces; rm -rf $T; mkdir -p $T
  for v in $VARIANTS; do
    b=${v%%:*} rest=${v#*:}; f=${rest%%:*}; envs=""; [ "$rest" != "$f" ] && envs=${rest#*:}
    echo "== probe $v" >> "$R"
    i=$((i + 1)); echo "== probe $v" > $T/trace_$i.txt  # the whole per-op trace
    run $b $f "X=1,$envs" $probe_env | tee -a $T/trace_$i.txt | grep -E "RowChain|chain probe" >> "$R"
  done
  cat $T/trace_*.txt > $OUT/traces.txt
  # One pass over the traces: each variant's per-op sum, the critical-path ms of the decode steps'
  # ops (T=1; a step's parts, "[i/n]", not again) per token (one LM head a step; the traced run's
  # own decode figure is not this: it also holds the host's read of the stamps after every token),
  # then each decode op's us a call (the trace's last column), one column a variant in VARIANTS' order.
  python3 - $T/trace_*.txt >> "$R" <<'PY'
import re, sys
files = sorted(sys.argv[1:], key=lambda f: int(re.search(r"(\d+)\.txt$", f).group(1)))
cols, ops = [], []
for f in files:
    col, ms, steps = {}, 0.0, 0
    lines = open(f).read().splitlines()
    for line in lines:
        m = re.match(r"\[cuda trace\] (.*\(T=1\).*?)\s+([\d.]+)\s+(\d+)\s+([\d.]+)$", line.rstrip())
        if m:
            col[m.group(1)] = m.group(4)
            if m.group(1) not in ops: ops.append(m.group(1))
            if not re.search(r"\[\d+/\d+\]", m.group(1)): ms += float(m.group(2))
            if "lm_head" in m.group(1): steps = int(m.group(3))
    cols.append(col)
    if steps:
        print("trace per-op sum %.4f ms/token (%d steps)  %s" % (ms / steps, steps, lines[0]))
print("per-op us a call, variants 1..%d in VARIANTS' order:" % len(cols))
for op in ops:
    print("  ".join("%8s" % c.get(op, "-") for c in cols), " ", op)
PY
fi
cat "$R"
if [ -n "${TESTS:-}" ]; then
  timeout 300 python3 -m pytest -q tests/test_cuda_backend.py -k "$TESTS" > $OUT/tests.txt 2>&1; tail -n 15 $OUT/tests.txt
fi
