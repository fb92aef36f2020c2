# Fortieth session's device calls (run tool, nvidia-h200; carry .whl, call 4 .gpu). Raw output beside.
# call 1 (a build where every Q5_K block size took the register cap: 64, 96 and 128 threads)
QUANT=q5_k_m PROBE=trace ROUNDS=3 TESTS="every_type or q8_decode or int8_prefill or 26b_a4b_shape" \
  VARIANTS="new:g4-e4b-6L new:g4-e4b-6L:MARKBASE_CUDA_MATVEC_Q5K_BOUND=0 new:g4-26b-6L new:g4-26b-6L:MARKBASE_CUDA_MATVEC_Q5K_BOUND=0" \
  bash bench/cuda/ab_builds.sh
# call 2 (MARKBASE_CUDA_MATVEC_Q5K_BOUND a mask of the capped block sizes; unset: all)
QUANT=q4_0 PROBE=trace ROUNDS=3 TESTS="one_expert or 26b_a4b_shape" VARIANTS="new:g4-26b-6L new:g4-26b-one-6L \
  new:g4-26b-dense-6L new:g4-e4b-6L@q5_k_m new:g4-e4b-6L@q5_k_m:MARKBASE_CUDA_MATVEC_Q5K_BOUND=2 \
  new:g4-e4b-6L@q5_k_m:MARKBASE_CUDA_MATVEC_Q5K_BOUND=0 new:g4-26b-6L@q5_k_m \
  new:g4-26b-6L@q5_k_m:MARKBASE_CUDA_MATVEC_Q5K_BOUND=2" bash bench/cuda/ab_builds.sh
# call 3 (the committed rule: unset = use_capped's choice)
QUANT=q4_0 PROBE=0 ROUNDS=3 TESTS="every_type or 26b_a4b_shape or one_expert" VARIANTS="new:g4-26b new:g4-26b-one \
  new:g4-26b-dense new:g4-e4b-6L@q5_k_m new:g4-e4b-6L@q5_k_m:MARKBASE_CUDA_MATVEC_Q5K_BOUND=2 \
  new:g4-e4b-6L@q5_k_m:MARKBASE_CUDA_MATVEC_Q5K_BOUND=0 new:g4-26b-6L@q5_k_m \
  new:g4-26b-6L@q5_k_m:MARKBASE_CUDA_MATVEC_Q5K_BOUND=7 new:g4-26b-6L@q5_k_m:MARKBASE_CUDA_MATVEC_Q5K_BOUND=0" \
  bash bench/cuda/ab_builds.sh
# call 4 (llama.cpp alone)
QUANT=q4_0 bash bench/cuda/h200_llama_twin.sh
