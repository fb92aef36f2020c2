# device call 4 (session 18): tried/route_in_experts.diff applied (every expert block routes from the logits)
PYTEST_K="chain_router or moe or 26b or scheduling or side_stream" KERN_VARIANTS="MARKBASE_CUDA_ROUTE_IN_EXPERTS=0" TRACE_VARIANTS="MARKBASE_CUDA_ROUTE_IN_EXPERTS=0" STAGES="test kern" BUDGET=300 bash bench/cuda/h200_run.sh
