# device call 1 (session 18), code: chain_router + gate_up_dense with the dense blocks last (then the default)
KERN_VARIANTS="MARKBASE_CUDA_CHAIN_ROUTER=0 MARKBASE_CUDA_DENSE_GU_FIRST=1" TRACE_VARIANTS="MARKBASE_CUDA_CHAIN_ROUTER=0" AB_ENV="MARKBASE_CUDA_CHAIN_ROUTER=0" STAGES="test kern bench" BUDGET=480 bash bench/cuda/h200_run.sh
