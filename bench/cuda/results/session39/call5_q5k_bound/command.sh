set -u; M=/tmp/models; mkdir -p $M
python3 bench/make_synthetic_gguf.py $M/e4b5.gguf --preset e4b --layers 6 --mix q5_k_m > /dev/null 2>&1 &
CMAKE_BUILD_PARALLEL_LEVEL=16 CMAKE_ARGS="-DMARKBASE_CUDA=ON" python3 -m pip install --no-build-isolation --no-deps -q . > $OUT/build.log 2>&1 || tail -20 $OUT/build.log
wait; echo "built $(date +%T)"
B=$(python3 -c "import sysconfig;print(sysconfig.get_path('scripts'))")/markbase-bench
for r in 1 2 3; do for v in 1 0; do
  printf "bound=%s " $v; MARKBASE_CUDA_MATVEC_Q5K_BOUND=$v $B --model $M/e4b5.gguf --backend cuda --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json 2>&1 | grep '^{' | python3 -c "import json,sys;d=json.loads(sys.stdin.readline());print('%.4f ms/token' % (1e3/d['decode_tok_s']))"
done; done
for v in 1 0; do MARKBASE_CUDA_MATVEC_Q5K_BOUND=$v python3 -c "
import markbase; m=markbase.Model.load('$M/e4b5.gguf', backend='cuda'); print('bound=$v', list(m.generate_tokens(list(range(2,40)), max_tokens=48, temperature=0)))" 2>&1 | tail -1; done
