# Sourced by the device scripts (h200_run.sh, ab_builds.sh): QARGS, the synthetic generator's
# weight-type arguments for QUANT. q4_0 (the default, the figures); q4_k_m: llama-quantize's
# Q4_K_M mix (the generator's --mix q4_k_m: Q4_K, a Q6_K tied embedding/head, Q6_K attn_v and
# ffn_down on llama.cpp's use_more_bits layers, and its shape fallbacks: Q5_0 / Q8_0 where a row is
# not whole 256-blocks); q5_k_m: the same with Q5_K (whose fallback is Q5_1); q4_k_m_approx: the
# thirty-fourth to thirty-sixth sessions' approximation of the Q4_K_M mix (Q6_K attn_v on every
# layer, no Q6_K ffn_down), to reproduce their figures. Any other generator --type name works too.
QUANT=${QUANT:-q4_0}
case $QUANT in
  q4_k_m|q5_k_m) QARGS="--mix $QUANT" ;;
  q4_k_m_approx) QARGS="--type q4_k --embd-type q6_k --tensor-type attn_v=q6_k" ;;
  *) QARGS="--type $QUANT" ;;
esac
