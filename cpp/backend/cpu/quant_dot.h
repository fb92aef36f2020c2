// The fast path of the CPU backend: activations quantized to 8 bits in blocks of 32 (as
// llama.cpp does), dotted with weight blocks of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 in integer
// arithmetic. AVX2 on x86-64 when the CPU has it, a portable version everywhere else.
#pragma once
#include <cstddef>
#include <cstdint>

#include "formats/tensor_types.h"

namespace markbase::cpu {

// One block of 32 quantized activations: x ~= d * qs; sum = sum of qs (for Q4_1 / Q5_1 mins).
struct BlockQ8 {
  float d;
  int32_t sum;
  int8_t qs[32];
};

// n must be a multiple of 32.
void quantize_act_q8(const float* x, BlockQ8* out, int64_t n);
bool has_q8_dot(TensorType t);
// Dot product of one weight row (nb blocks of type t) with nb activation blocks.
float dot_q8(TensorType t, const void* w, const BlockQ8* a, int64_t nb);
// Four consecutive weight rows (row_bytes apart) against one activation row.
void dot_q8_rows4(TensorType t, const void* w, size_t row_bytes, const BlockQ8* a, int64_t nb, float* out);

}  // namespace markbase::cpu
