#include "formats/model_file.h"

#include <stdexcept>
#include <sys/stat.h>

#include "formats/error.h"
#include "formats/json.h"
#include "formats/quants.h"

namespace markbase {

std::shared_ptr<ModelFile> ModelFile::open(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw FileNotFound("No such file or directory: '" + path + "'");
  auto mf = std::shared_ptr<ModelFile>(new ModelFile());
  mf->path_ = path;
  if (S_ISDIR(st.st_mode)) {
    const std::string cfg = path + "/config.json";
    struct stat cs {};
    if (::stat(cfg.c_str(), &cs) != 0)
      throw FileNotFound(path + ": not a Hugging Face model directory (no config.json)");
    mf->config_ = read_json_file(cfg);
    if (!mf->config_.is_object()) throw FormatError(cfg + ": not a JSON object");
    for (const auto& [k, v] : mf->config_.as_object()) mf->metadata_.emplace_back(k, v);
    mf->st_ = std::make_unique<SafetensorsSet>(path);
  } else {
    mf->gguf_ = std::make_unique<GGUFFile>(path);
  }
  return mf;
}

const Value* ModelFile::find(const std::string& key) const {
  if (gguf_) return gguf_->find(key);
  return config_.find(key);
}

const std::vector<TensorView>& ModelFile::tensors() const {
  return gguf_ ? gguf_->tensors() : st_->tensors();
}

const TensorView* ModelFile::tensor(const std::string& name) const {
  return gguf_ ? gguf_->tensor(name) : st_->tensor(name);
}

void dequantize_tensor(const TensorView& t, float* dst) {
  const int64_t cols = t.cols(), rows = t.rows();
  const size_t stride = t.row_stride();
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(t.type, t.data + r * stride, dst + r * cols, cols);
}

std::vector<float> ModelFile::read(const std::string& name) const {
  const TensorView* t = tensor(name);
  if (!t) throw std::out_of_range(path_ + ": no tensor named '" + name + "'");
  std::vector<float> out(static_cast<size_t>(t->numel()));
  if (!out.empty()) dequantize_tensor(*t, out.data());
  return out;
}

}  // namespace markbase
