# device call 2 (session 18), code: the multi-block sampler, dense gate/up blocks first (default)
KERN_VARIANTS="MARKBASE_CUDA_DENSE_GU_FIRST=0 MARKBASE_CUDA_CHAIN_ROUTER=0" TRACE_VARIANTS="MARKBASE_CUDA_DENSE_GU_FIRST=0" AB_ENV="MARKBASE_CUDA_CHAIN_ROUTER=0" STAGES="test kern bench" BUDGET=480 bash bench/cuda/h200_run.sh
