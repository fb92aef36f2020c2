// Kernels that compute what llama.cpp's CPU backend computes on x86-64 with AVX2 bit for bit:
// the same 8-bit activation blocks, the same per-lane float accumulation orders of its matrix
// products (llamafile's tinyBLAS and ggml's vec_dot for Q8_0/Q5_0/Q4_0 and F16, the repacked
// Q4_K gemm/gemv, the tiled and vec_dot Q6_K), float16 rounding of the attention's queries and
// weights, its SIMD exp in the softmax, GELU through a float16 table and RoPE angles by repeated
// multiplication.
//
// Why: a model with 8-bit activations is chaotic at the rounding level. Any 1-ulp difference flips
// some activation roundings, and the flips grow layer by layer to the noise of the quantization
// itself (Gemma 3 270M: top-1 agreement ~95% between two correct engines, or between llama.cpp's
// own variants). Only the same arithmetic agrees with llama.cpp token for token. Used by the CPU
// backend when BackendOptions::llamacpp_exact is set; the results of each op do not depend on the
// thread count. Requires AVX2, FMA and F16C (available()).
#pragma once
#include <cstdint>

#include "backend/cpu/attention.h"
#include "backend/cpu/thread_pool.h"
#include "formats/tensor.h"

namespace markbase::cpu::llx {

bool available();
bool matmul_supported(TensorType t);  // Q8_0, Q5_0, Q4_0, Q4_K, Q6_K, F16, F32

// out[t, n] = W[n] . a[t] for a step of T tokens; as llama.cpp for a micro-batch of T rows (the
// Q4_K and Q6_K paths depend on T, as llama.cpp's do).
void matmul(ThreadPool& pool, const TensorView& w, const float* a, int a_stride, int T, float* out,
            int out_stride, int N);

// Causal / sliding attention over float16 caches, as llama.cpp without flash attention: q scaled
// then rounded to float16, scores in float32 (tinyBLAS order for T > 1, vec_dot_f16 for T == 1),
// softmax with ggml's SIMD exp, weights rounded to float16, weighted sum of float16 values.
void attention(ThreadPool& pool, const AttentionArgs& a);

// Mixture of experts as llama.cpp's build_moe_ffn (softmax gating, normalised weights):
// route[2j], route[2j+1] = weight and id of the j-th selected expert, in llama.cpp's order (by
// falling probability); the per-expert output scale is not folded in.
void moe_route(const float* logits, int n_experts, int k, float* route);
bool moe_supported(TensorType gate_up, TensorType down);
// out[t] = sum over j in order of (down_e(geglu(gate_up_e x_t)) * scale[e]) * weight_j, with
// llama.cpp's mul_mat_id kernels; scale may be null.
void moe_experts(ThreadPool& pool, const TensorView& gate_up, const TensorView& down, int ffn, const float* x,
                 int x_stride, const float* route, int route_stride, int k, const float* scale, int T,
                 float* out, int out_stride, int H);

// y = gelu_tanh(x) * g with the GELU looked up in llama.cpp's float16 table.
void geglu(const float* x, const float* g, float* y, int n);

// NeoX rotation of `heads` heads of head_dim d at position pos: theta_i = pos * s^i by repeated
// float multiplication (s = theta_scale), angle_i = freq_scale * (theta_i / factors[i]) (factors
// may be null), libm's cosf/sinf, and the rotation's products as llama.cpp's compiled code
// rounds them (one fused multiply-add each).
void rope(const float* x, float* y, int heads, int d, int pos, float theta_scale, float freq_scale,
          const float* factors);

}  // namespace markbase::cpu::llx
