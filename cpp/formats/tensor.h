// A tensor as the formats layer sees it: a typed view into a mapped file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "formats/tensor_types.h"

namespace markbase {

struct TensorView {
  std::string name;
  TensorType type = TensorType::F32;
  std::vector<int64_t> shape;   // numpy order: shape.back() is the contiguous (row) dimension
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  // The whole file mapping `data` lies in (null when the data is in heap memory): GPU backends on
  // unified memory wrap it without a copy.
  const uint8_t* mapping = nullptr;
  size_t mapping_bytes = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  int64_t rows() const { return shape.empty() ? 1 : shape.back() == 0 ? 0 : numel() / shape.back(); }
  size_t row_stride() const { return row_bytes(type, cols()); }
};

}  // namespace markbase
