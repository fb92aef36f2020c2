// Dequantization of GGUF blocks, four weights at a time: the one source of this arithmetic for
// the GPU backends. It compiles as Metal Shading Language (metal/*.metal include it; the Linux
// emulator compiles it as C++) and as CUDA (cpp/backend/cuda includes it), so the same block
// decoding runs on Apple GPUs and on the H200.
//
// Every function takes the address of a row's first block and the index i of the first of four
// consecutive weights (i % 4 == 0) and returns them as a float4. Four consecutive weights never
// straddle a block (every block holds a multiple of 32), so one call decodes one block's scales.
// Block layouts are GGML's (cpp/formats/tensor_types.h); all block sizes are even, so the 16-bit
// loads below are aligned whenever the tensor data is (GGUF aligns it to 32 bytes).
#pragma once

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define MB_FN __device__ __forceinline__
#define MB_DEV
typedef unsigned char mb_u8;
typedef signed char mb_i8;
typedef unsigned short mb_u16;
typedef unsigned int mb_u32;
MB_FN float mb_half_bits(mb_u16 h) { return __half2float(__ushort_as_half(h)); }
MB_FN float mb_bf16_bits(mb_u16 h) { return __uint_as_float(static_cast<mb_u32>(h) << 16); }
MB_FN float4 mb_f4(float a, float b, float c, float d) { return make_float4(a, b, c, d); }
#else  // Metal Shading Language
#include <metal_stdlib>
using namespace metal;
#define MB_FN inline
#define MB_DEV device
typedef uchar mb_u8;
typedef char mb_i8;
typedef ushort mb_u16;
typedef uint mb_u32;
MB_FN float mb_half_bits(mb_u16 h) { return float(as_type<half>(h)); }
MB_FN float mb_bf16_bits(mb_u16 h) { return as_type<float>(uint(h) << 16); }
MB_FN float4 mb_f4(float a, float b, float c, float d) { return float4(a, b, c, d); }
#endif

// GGML type ids (the values of cpp/formats/tensor_types.h's TensorType).
#define MB_F32 0
#define MB_F16 1
#define MB_Q4_0 2
#define MB_Q4_1 3
#define MB_Q5_0 6
#define MB_Q5_1 7
#define MB_Q8_0 8
#define MB_Q4_K 12
#define MB_Q5_K 13
#define MB_Q6_K 14
#define MB_BF16 30

MB_FN mb_u16 mb_ld16(MB_DEV const mb_u8* p) { return *(MB_DEV const mb_u16*)p; }
MB_FN mb_u32 mb_ld32_bytes(MB_DEV const mb_u8* p) {
  return mb_u32(p[0]) | (mb_u32(p[1]) << 8) | (mb_u32(p[2]) << 16) | (mb_u32(p[3]) << 24);
}

MB_FN float4 dequant4_f32(MB_DEV const mb_u8* row, int i) {
  MB_DEV const float* p = (MB_DEV const float*)row + i;
  return mb_f4(p[0], p[1], p[2], p[3]);
}

MB_FN float4 dequant4_f16(MB_DEV const mb_u8* row, int i) {
  MB_DEV const mb_u16* p = (MB_DEV const mb_u16*)row + i;
  return mb_f4(mb_half_bits(p[0]), mb_half_bits(p[1]), mb_half_bits(p[2]), mb_half_bits(p[3]));
}

MB_FN float4 dequant4_bf16(MB_DEV const mb_u8* row, int i) {
  MB_DEV const mb_u16* p = (MB_DEV const mb_u16*)row + i;
  return mb_f4(mb_bf16_bits(p[0]), mb_bf16_bits(p[1]), mb_bf16_bits(p[2]), mb_bf16_bits(p[3]));
}

// Q8_0: {half d; int8 qs[32]}, w = d * q.
MB_FN float4 dequant4_q8_0(MB_DEV const mb_u8* row, int i) {
  MB_DEV const mb_u8* b = row + (i / 32) * 34;
  const int j = i % 32;
  const float d = mb_half_bits(mb_ld16(b));
  MB_DEV const mb_i8* q = (MB_DEV const mb_i8*)(b + 2) + j;
  return mb_f4(d * float(q[0]), d * float(q[1]), d * float(q[2]), d * float(q[3]));
}

// The 4-bit codes of weights j..j+3 of a 32-weight block whose 16 bytes start at qs: weight j < 16
// is the low nibble of qs[j], weight j >= 16 the high nibble of qs[j - 16].
#define MB_NIBBLES4(qs, j, out0, out1, out2, out3)                      \
  {                                                                   \
    const int jj_ = (j) & 15, sh_ = (j) >= 16 ? 4 : 0;                \
    out0 = ((qs)[jj_ + 0] >> sh_) & 15;                               \
    out1 = ((qs)[jj_ + 1] >> sh_) & 15;                               \
    out2 = ((qs)[jj_ + 2] >> sh_) & 15;                               \
    out3 = ((qs)[jj_ + 3] >> sh_) & 15;                               \
  }

// Q4_0: {half d; u8 qs[16]}, w = d * (q - 8).
MB_FN float4 dequant4_q4_0(MB_DEV const mb_u8* row, int i) {
  MB_DEV const mb_u8* b = row + (i / 32) * 18;
  const float d = mb_half_bits(mb_ld16(b));
  int q0, q1, q2, q3;
  MB_NIBBLES4(b + 2, i % 32, q0, q1, q2, q3);
  return mb_f4(d * float(q0 - 8), d * float(q1 - 8), d * float(q2 - 8), d * float(q3 - 8));
}

// Q4_1: {half d, m; u8 qs[16]}, w = d * q + m.
MB_FN float4 dequant4_q4_1(MB_DEV const mb_u8* row, int i) {
  MB_DEV const mb_u8* b = row + (i / 32) * 20;
  const float d = mb_half_bits(mb_ld16(b)), m = mb_half_bits(mb_ld16(b + 2));
  int q0, q1, q2, q3;
  MB_NIBBLES4(b + 4, i % 32, q0, q1, q2, q3);
  return mb_f4(d * float(q0) + m, d * float(q1) + m, d * float(q2) + m, d * float(q3) + m);
}

// Q5_0: {half d; u8 qh[4]; u8 qs[16]}: bit j of qh is weight j's fifth bit; w = d * (q - 16).
MB_FN float4 dequant4_q5_0(MB_DEV const mb_u8* row, int i) {
  MB_DEV const mb_u8* b = row + (i / 32) * 22;
  const int j = i % 32;
  const float d = mb_half_bits(mb_ld16(b));
  const mb_u32 qh = mb_ld32_bytes(b + 2) >> j;
  int q0, q1, q2, q3;
  MB_NIBBLES4(b + 6, j, q0, q1, q2, q3);
  q0 |= int((qh << 4) & 16); q1 |= int((qh << 3) & 16); q2 |= int((qh << 2) & 16); q3 |= int((qh << 1) & 16);
  return mb_f4(d * float(q0 - 16), d * float(q1 - 16), d * float(q2 - 16), d * float(q3 - 16));
}

// Q5_1: {half d, m; u8 qh[4]; u8 qs[16]}, w = d * q + m.
MB_FN float4 dequant4_q5_1(MB_DEV const mb_u8* row, int i) {
  MB_DEV const mb_u8* b = row + (i / 32) * 24;
  const int j = i % 32;
  const float d = mb_half_bits(mb_ld16(b)), m = mb_half_bits(mb_ld16(b + 2));
  const mb_u32 qh = mb_ld32_bytes(b + 4) >> j;
  int q0, q1, q2, q3;
  MB_NIBBLES4(b + 8, j, q0, q1, q2, q3);
  q0 |= int((qh << 4) & 16); q1 |= int((qh << 3) & 16); q2 |= int((qh << 2) & 16); q3 |= int((qh << 1) & 16);
  return mb_f4(d * float(q0) + m, d * float(q1) + m, d * float(q2) + m, d * float(q3) + m);
}

// The 6-bit scale (low byte) and min (second byte) of sub-block s (0..7) of a Q4_K / Q5_K
// super-block, packed in its 12 scale bytes.
MB_FN mb_u32 mb_k_scale_min(MB_DEV const mb_u8* sc, int s) {
  if (s < 4) return mb_u32(sc[s] & 63) | (mb_u32(sc[s + 4] & 63) << 8);
  return mb_u32((sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4)) |
         (mb_u32((sc[s + 4] >> 4) | ((sc[s] >> 6) << 4)) << 8);
}

// Q4_K: {half d, dmin; u8 scales[12]; u8 qs[128]} over 256 weights in 8 sub-blocks of 32.
// Sub-blocks 2p and 2p+1 share qs[32p..32p+32), low and high nibbles; w = d*sc*q - dmin*m.
MB_FN float4 dequant4_q4_k(MB_DEV const mb_u8* row, int i) {
  MB_DEV const mb_u8* b = row + (i / 256) * 144;
  const int r = i % 256, s = r / 32, l = r % 32;
  const mb_u32 sm = mb_k_scale_min(b + 4, s);
  const float d = mb_half_bits(mb_ld16(b)) * float(sm & 255);
  const float m = mb_half_bits(mb_ld16(b + 2)) * float(sm >> 8);
  MB_DEV const mb_u8* q = b + 16 + (s / 2) * 32 + l;
  const int sh = (s & 1) * 4;
  return mb_f4(d * float((q[0] >> sh) & 15) - m, d * float((q[1] >> sh) & 15) - m,
               d * float((q[2] >> sh) & 15) - m, d * float((q[3] >> sh) & 15) - m);
}

// Q5_K: {half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: as Q4_K, plus bit s of qh[l] as
// the fifth bit of weight l of sub-block s.
MB_FN float4 dequant4_q5_k(MB_DEV const mb_u8* row, int i) {
  MB_DEV const mb_u8* b = row + (i / 256) * 176;
  const int r = i % 256, s = r / 32, l = r % 32;
  const mb_u32 sm = mb_k_scale_min(b + 4, s);
  const float d = mb_half_bits(mb_ld16(b)) * float(sm & 255);
  const float m = mb_half_bits(mb_ld16(b + 2)) * float(sm >> 8);
  MB_DEV const mb_u8* qh = b + 16 + l;
  MB_DEV const mb_u8* q = b + 48 + (s / 2) * 32 + l;
  const int sh = (s & 1) * 4;
  return mb_f4(d * float(((q[0] >> sh) & 15) | (((qh[0] >> s) & 1) << 4)) - m,
               d * float(((q[1] >> sh) & 15) | (((qh[1] >> s) & 1) << 4)) - m,
               d * float(((q[2] >> sh) & 15) | (((qh[2] >> s) & 1) << 4)) - m,
               d * float(((q[3] >> sh) & 15) | (((qh[3] >> s) & 1) << 4)) - m);
}

// Q6_K: {u8 ql[128]; u8 qh[64]; i8 scales[16]; half d} over 256 weights. Each half n of 128
// weights has four quarters qq of 32: low 4 bits from ql[64n + l + 32*(qq&1)] (high nibble for
// qq >= 2), top 2 bits from qh[32n + l] >> 2qq; scale scales[8n + l/16 + 2qq]; w = d*sc*(q - 32).
MB_FN float4 dequant4_q6_k(MB_DEV const mb_u8* row, int i) {
  MB_DEV const mb_u8* b = row + (i / 256) * 210;
  const int r = i % 256, n = r / 128, qq = (r % 128) / 32, l = r % 32;
  MB_DEV const mb_u8* ql = b + 64 * n + 32 * (qq & 1) + l;
  MB_DEV const mb_u8* qh = b + 128 + 32 * n + l;
  const int shl = qq >= 2 ? 4 : 0, shh = 2 * qq;
  const float d = mb_half_bits(mb_ld16(b + 208)) * float(((MB_DEV const mb_i8*)(b + 192))[8 * n + l / 16 + 2 * qq]);
  return mb_f4(d * float((((ql[0] >> shl) & 15) | (((qh[0] >> shh) & 3) << 4)) - 32),
               d * float((((ql[1] >> shl) & 15) | (((qh[1] >> shh) & 3) << 4)) - 32),
               d * float((((ql[2] >> shl) & 15) | (((qh[2] >> shh) & 3) << 4)) - 32),
               d * float((((ql[3] >> shl) & 15) | (((qh[3] >> shh) & 3) << 4)) - 32));
}

// Any type by its GGML id: for kernels that take the type as an argument (it is uniform across a
// dispatch, so the switch does not diverge).
MB_FN float4 dequant4(int type, MB_DEV const mb_u8* row, int i) {
  switch (type) {
    case MB_F16: return dequant4_f16(row, i);
    case MB_BF16: return dequant4_bf16(row, i);
    case MB_Q8_0: return dequant4_q8_0(row, i);
    case MB_Q4_0: return dequant4_q4_0(row, i);
    case MB_Q4_1: return dequant4_q4_1(row, i);
    case MB_Q5_0: return dequant4_q5_0(row, i);
    case MB_Q5_1: return dequant4_q5_1(row, i);
    case MB_Q4_K: return dequant4_q4_k(row, i);
    case MB_Q5_K: return dequant4_q5_k(row, i);
    case MB_Q6_K: return dequant4_q6_k(row, i);
    default: return dequant4_f32(row, i);
  }
}

// Bytes of a row of n weights of the given type.
MB_FN mb_u32 mb_row_bytes(int type, mb_u32 n) {
  switch (type) {
    case MB_F16: case MB_BF16: return n * 2;
    case MB_Q8_0: return n / 32 * 34;
    case MB_Q4_0: return n / 32 * 18;
    case MB_Q4_1: return n / 32 * 20;
    case MB_Q5_0: return n / 32 * 22;
    case MB_Q5_1: return n / 32 * 24;
    case MB_Q4_K: return n / 256 * 144;
    case MB_Q5_K: return n / 256 * 176;
    case MB_Q6_K: return n / 256 * 210;
    default: return n * 4;
  }
}

// The tanh approximation of GELU that Gemma uses (gelu_pytorch_tanh).
MB_FN float mb_gelu_tanh(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanh(c * (x + 0.044715f * x * x * x)));
}
