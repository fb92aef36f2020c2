#include "formats/model_file.h"

#include <cstdio>
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
    mf->open_splits();
  }
  return mf;
}

namespace {

// A split key's value (split.no, split.count), -1 when absent, -2 when not an integer.
int64_t split_key(const GGUFFile& g, const char* key) {
  const Value* v = g.find(key);
  if (!v) return -1;
  try { return v->as_int(); } catch (const std::exception&) { return -2; }
}

std::string split_suffix(int64_t no, int64_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05lld-of-%05lld.gguf", static_cast<long long>(no), static_cast<long long>(count));
  return buf;
}

}  // namespace

// llama.cpp's split files: each is a whole GGUF file with split.no (0-based) and split.count;
// the first holds the model's metadata, and its name is <prefix>-00001-of-<count>.gguf, the
// others' <prefix>-<no + 1>-of-<count>.gguf (llama_split_path).
void ModelFile::open_splits() {
  const GGUFFile& first = *gguf_;
  const int64_t count = split_key(first, "split.count");
  if (count == -1 || count == 1) return;
  if (count < 1 || count > 99999) throw FormatError(path_ + ": split.count is not an integer in [1, 99999]");
  const int64_t no = split_key(first, "split.no");
  if (no != 0)
    throw FormatError(path_ + ": this is split " + (no < 0 ? std::string("?") : std::to_string(no + 1)) + " of " +
                      std::to_string(count) + " of a split GGUF; open the first (" + split_suffix(1, count).substr(1) + ")");
  const std::string suffix = split_suffix(1, count);
  if (path_.size() <= suffix.size() || path_.compare(path_.size() - suffix.size(), suffix.size(), suffix) != 0)
    throw FormatError(path_ + ": the first file of a split GGUF of " + std::to_string(count) +
                      " files, but its name does not end in '" + suffix + "', so the others cannot be found");
  const std::string prefix = path_.substr(0, path_.size() - suffix.size());
  for (const TensorView& t : first.tensors()) {
    split_index_[t.name] = split_tensors_.size();
    split_tensors_.push_back(t);
  }
  for (int64_t i = 1; i < count; ++i) {
    const std::string p = prefix + split_suffix(i + 1, count);
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0)
      throw FileNotFound(path_ + ": split " + std::to_string(i + 1) + " of " + std::to_string(count) +
                         " is missing: no file '" + p + "'");
    splits_.push_back(std::make_unique<GGUFFile>(p));
    const GGUFFile& g = *splits_.back();
    if (split_key(g, "split.no") != i || split_key(g, "split.count") != count)
      throw FormatError(p + ": split.no / split.count say it is not split " + std::to_string(i + 1) + " of " +
                        std::to_string(count));
    for (const TensorView& t : g.tensors()) {
      if (split_index_.count(t.name)) throw FormatError(p + ": tensor '" + t.name + "' is also in an earlier split");
      split_index_[t.name] = split_tensors_.size();
      split_tensors_.push_back(t);
    }
  }
  const int64_t total = split_key(first, "split.tensors.count");
  if (total >= 0 && total != static_cast<int64_t>(split_tensors_.size()))
    throw FormatError(path_ + ": split.tensors.count is " + std::to_string(total) + " but the " + std::to_string(count) +
                      " files hold " + std::to_string(split_tensors_.size()) + " tensors");
}

const Value* ModelFile::find(const std::string& key) const {
  if (gguf_) return gguf_->find(key);
  return config_.find(key);
}

const std::vector<TensorView>& ModelFile::tensors() const {
  if (!splits_.empty()) return split_tensors_;
  return gguf_ ? gguf_->tensors() : st_->tensors();
}

const TensorView* ModelFile::tensor(const std::string& name) const {
  if (!splits_.empty()) {
    auto it = split_index_.find(name);
    return it == split_index_.end() ? nullptr : &split_tensors_[it->second];
  }
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
