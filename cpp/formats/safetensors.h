// Safetensors reader: one file (model.safetensors) or a sharded set listed by
// model.safetensors.index.json. Header length and JSON are validated; F32, F16 and BF16 tensors
// are views into the mapped shards.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formats/mapped_file.h"
#include "formats/tensor.h"

namespace markbase {

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::vector<TensorView>& tensors() const { return tensors_; }
  std::shared_ptr<const MappedFile> mapping() const { return file_; }

 private:
  std::shared_ptr<MappedFile> file_;
  std::vector<TensorView> tensors_;
};

// All tensors of a Hugging Face directory's safetensors shard(s), by name.
class SafetensorsSet {
 public:
  explicit SafetensorsSet(const std::string& dir);
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* tensor(const std::string& name) const;

 private:
  std::vector<SafetensorsFile> shards_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace markbase
