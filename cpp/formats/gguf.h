// GGUF v2/v3 reader. The file is memory-mapped and validated before anything is trusted: every
// count, length, dimension, offset and type is checked against the file's size, so a corrupt or
// hostile file raises FormatError and nothing reads outside the mapping.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formats/mapped_file.h"
#include "formats/tensor.h"
#include "formats/value.h"

namespace markbase {

class GGUFFile {
 public:
  explicit GGUFFile(const std::string& path);

  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  // Every key-value pair, in file order (arrays of strings and nested arrays included).
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(const std::string& key) const;
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* tensor(const std::string& name) const;  // nullptr if absent
  std::shared_ptr<const MappedFile> mapping() const { return file_; }

 private:
  std::shared_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace markbase
