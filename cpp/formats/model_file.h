// A model file of either kind, behind one interface: a GGUF file, or a Hugging Face directory
// (config.json + safetensors + tokenizer.json). This is what markbase.open() returns and what
// model loading reads from.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "formats/tensor.h"
#include "formats/value.h"

namespace markbase {

class ModelFile {
 public:
  // A directory opens as a Hugging Face model, a file as GGUF. The first file of a GGUF split
  // into several by llama.cpp's gguf-split or convert_hf_to_gguf.py (<prefix>-00001-of-0000N.gguf,
  // split.count > 1) opens with the others beside it: the first file's metadata, every file's
  // tensors. Throws FileNotFound/FormatError.
  static std::shared_ptr<ModelFile> open(const std::string& path);

  bool is_gguf() const { return gguf_ != nullptr; }
  const std::string& path() const { return path_; }
  // GGUF: every key in file order. Hugging Face: config.json's top-level keys.
  const std::vector<std::pair<std::string, Value>>& metadata() const {
    return gguf_ ? gguf_->metadata() : metadata_;
  }
  const Value* find(const std::string& key) const;
  const std::vector<TensorView>& tensors() const;
  const TensorView* tensor(const std::string& name) const;
  // Dequantized float32 copy of a tensor, row-major in numpy order. Throws std::out_of_range.
  std::vector<float> read(const std::string& name) const;
  const GGUFFile* gguf() const { return gguf_.get(); }
  // Hugging Face directory: the parsed config.json (null Value for GGUF).
  const Value& config() const { return config_; }

 private:
  std::string path_;
  std::unique_ptr<GGUFFile> gguf_;
  // A split GGUF: the other files (gguf_ is the first), and the tensors of all of them.
  std::vector<std::unique_ptr<GGUFFile>> splits_;
  std::vector<TensorView> split_tensors_;
  std::map<std::string, size_t> split_index_;
  void open_splits();
  std::unique_ptr<SafetensorsSet> st_;
  Value config_;
  std::vector<std::pair<std::string, Value>> metadata_;  // Hugging Face: config.json's keys
};

// Dequantizes any tensor view into dst (numel floats).
void dequantize_tensor(const TensorView& t, float* dst);

}  // namespace markbase
