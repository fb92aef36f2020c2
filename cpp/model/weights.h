// The weights of one model under llama.cpp's GGUF tensor names, whatever the file: GGUF tensors
// are used as they are; Hugging Face tensors are renamed, Gemma 3's (1 + w) norms are folded into
// float copies, and float matrices are optionally quantized to Q8_0 / Q4_0 on load.
#pragma once
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "formats/model_file.h"
#include "model/config.h"

namespace markbase {

class WeightSet {
 public:
  // quant: "" (keep the file's types), "q8_0" or "q4_0" (float matrices of Hugging Face files).
  WeightSet(const ModelFile& f, const ModelConfig& c, const std::string& quant);

  const TensorView* find(const std::string& name) const;
  // Throws FormatError naming the tensor when absent or when its shape is not `shape` (numpy
  // order; exactly: no wildcard, so that a size read wrongly from a config cannot match anything).
  const TensorView& get(const std::string& name, std::vector<int64_t> shape) const;
  const std::string& path() const { return path_; }
  size_t bytes() const;  // bytes of every tensor the model uses

 private:
  const TensorView& own(TensorView t, std::vector<uint8_t> data);
  std::string path_;
  std::map<std::string, TensorView> tensors_;
  std::deque<std::vector<uint8_t>> owned_;
};

// "blk.<i>.<name>"
inline std::string blk(int i, const std::string& name) {
  return "blk." + std::to_string(i) + "." + name;
}

}  // namespace markbase
