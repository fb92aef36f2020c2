# device call 3 (session 18): chain_router with tried/chain_router_probe.diff applied (timing-only switches)
TRACE_VARIANTS="MARKBASE_CUDA_CR_PROBE=2 MARKBASE_CUDA_CR_PROBE=8 MARKBASE_CUDA_CR_PROBE=4 MARKBASE_CUDA_CR_PROBE=1" STAGES="kern" BUDGET=300 bash bench/cuda/h200_run.sh
