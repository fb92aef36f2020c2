# Sourced by the device scripts (h200_run.sh, ab_builds.sh): QARGS, the synthetic generator's
# weight-type arguments for QUANT. q4_0 (the default, the figures), or q4_k_m: llama-quantize's
# Q4_K_M mix as the generator approximates it (Q4_K; Q6_K for attn_v and the tied embedding/head;
# Q5_0 where a row's length is not a multiple of 256, as llama.cpp falls back). Any other
# generator --type name works too.
QUANT=${QUANT:-q4_0}
case $QUANT in
  q4_k_m) QARGS="--type q4_k --embd-type q6_k --tensor-type attn_v=q6_k" ;;
  *) QARGS="--type $QUANT" ;;
esac
