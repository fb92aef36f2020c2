// AVX2 helpers that turn GGML block bytes into 32 byte lanes, shared by the decode dot products
// (quant_dot.cpp) and the prefill panel packer (panel_gemm.cpp). x86-64 only; every function is
// compiled for AVX2 whatever the file's flags, and called only after the run-time check.
#pragma once
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace markbase::cpu::avx2 {

#define MB_AVX2_INLINE __attribute__((target("avx2,fma,f16c"))) inline

// 16 bytes of packed nibbles -> 32 bytes: the low nibbles (values 0..15), then the high ones.
// (One broadcast load, one variable shift of the upper half, one mask.)
MB_AVX2_INLINE __m256i nibbles(const uint8_t* qs) {
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0F));
}

// 32 bits -> 32 bytes of 0xFF (bit set) or 0x00.
MB_AVX2_INLINE __m256i bits_to_bytes(const uint8_t* qh) {
  uint32_t x;
  std::memcpy(&x, qh, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                         0x0101010101010101, 0x0000000000000000);
  __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
  b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

// Q5_0 / Q5_1 values 0..31: the nibbles with the fifth bit from qh.
MB_AVX2_INLINE __m256i q5_values(const uint8_t* qs, const uint8_t* qh) {
  return _mm256_or_si256(nibbles(qs), _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)));
}

#undef MB_AVX2_INLINE

}  // namespace markbase::cpu::avx2
#endif
