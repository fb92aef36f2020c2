# device call 5 (session 18), the final code (HEAD f84acde: chain_router, dense gate/up first, the multi-block sampler), llama.cpp in the same run
AB_ENV="MARKBASE_CUDA_CHAIN_ROUTER=0" STAGES="test bench llama" BUDGET=560 bash bench/cuda/h200_run.sh
