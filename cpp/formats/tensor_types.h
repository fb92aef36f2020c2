// The tensor storage types MarkBase reads (GGUF's names, ids and block layouts). Every backend
// reads all of them straight from their blocks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace markbase {

// Values are GGML's type ids, so a GGUF tensor's type field converts directly.
enum class TensorType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30,
};

struct TypeTraits {
  const char* name;
  int block_elems;   // elements per block (1 for plain floats)
  int block_bytes;   // bytes per block
};

// nullptr when the GGML id is not one of the types above.
const TypeTraits* type_traits(uint32_t ggml_id);
const TypeTraits& traits(TensorType t);
inline const char* type_name(TensorType t) { return traits(t).name; }
// Name of any GGML id, known to MarkBase or not ("IQ2_XXS", "type 99"), for error messages.
std::string ggml_type_name(uint32_t ggml_id);
// Parses "q8_0", "Q4_K", "bf16"...; throws std::invalid_argument on an unknown name.
TensorType type_from_name(const std::string& name);

// Bytes of a row of n elements; n must be a multiple of the block size (checked by the readers).
inline size_t row_bytes(TensorType t, int64_t n) {
  const TypeTraits& tr = traits(t);
  return static_cast<size_t>(n / tr.block_elems) * tr.block_bytes;
}

// Block layouts (GGML's), used by the dequantizers and the CPU kernels.
constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK_K = 256;
constexpr int K_SCALE_SIZE = 12;
#pragma pack(push, 1)
struct block_q4_0 { uint16_t d; uint8_t qs[QK4_0 / 2]; };
struct block_q4_1 { uint16_t d, m; uint8_t qs[QK4_1 / 2]; };
struct block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
struct block_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct block_q8_0 { uint16_t d; int8_t qs[QK8_0]; };
struct block_q4_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct block_q5_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
#pragma pack(pop)
static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22 &&
              sizeof(block_q5_1) == 24 && sizeof(block_q8_0) == 34 && sizeof(block_q4_K) == 144 &&
              sizeof(block_q5_K) == 176 && sizeof(block_q6_K) == 210, "GGML block sizes");

}  // namespace markbase
