#include "formats/safetensors.h"

#include <cstring>
#include <set>
#include <sys/stat.h>

#include "formats/error.h"
#include "formats/json.h"

namespace markbase {
namespace {

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

[[noreturn]] void fail_at(const std::string& path, const std::string& problem) {
  throw FormatError(path + ": " + problem);
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(std::make_shared<MappedFile>(path)) {
  const size_t size = file_->size();
  auto fail = [&path](const std::string& problem) { fail_at(path, problem); };
  if (size < 8) fail("truncated: shorter than the 8-byte header length");
  uint64_t hlen;
  std::memcpy(&hlen, file_->data(), 8);
  if (hlen < 2 || hlen > size - 8)
    fail("header length " + std::to_string(hlen) + " does not fit in the " +
         std::to_string(size) + "-byte file");
  Value header = parse_json(
      std::string_view(reinterpret_cast<const char*>(file_->data() + 8), hlen), path + " header");
  if (!header.is_object()) fail("header is not a JSON object");
  const uint8_t* data = file_->data() + 8 + hlen;
  const uint64_t data_size = size - 8 - hlen;
  for (const auto& [name, info] : header.as_object()) {
    if (name == "__metadata__") continue;
    const std::string ctx = "tensor '" + name + "'";
    const Value* dtype = info.find("dtype");
    const Value* shape = info.find("shape");
    const Value* offs = info.find("data_offsets");
    if (!dtype || !dtype->is_string() || !shape || !shape->is_array() || !offs ||
        !offs->is_array() || offs->as_array().size() != 2)
      fail(ctx + ": header entry needs dtype, shape and data_offsets [begin, end]");
    TensorView t;
    t.name = name;
    const std::string& dt = dtype->as_string();
    size_t esize = 0;
    if (dt == "F32") { t.type = TensorType::F32; esize = 4; }
    else if (dt == "F16") { t.type = TensorType::F16; esize = 2; }
    else if (dt == "BF16") { t.type = TensorType::BF16; esize = 2; }
    else fail(ctx + ": dtype " + dt + " is not supported (F32, F16 and BF16 are)");
    uint64_t numel = 1;
    for (const Value& d : shape->as_array()) {
      if (!d.is_number()) fail(ctx + ": shape entries must be integers");
      int64_t v = 0;
      try { v = d.as_int(); } catch (const std::exception&) { fail(ctx + ": shape entries must be integers"); }
      if (v < 0) fail(ctx + ": negative dimension");
      if (v > 0 && numel > (uint64_t(1) << 62) / static_cast<uint64_t>(v))
        fail(ctx + ": element count overflows");
      numel *= static_cast<uint64_t>(v);
      t.shape.push_back(v);
    }
    int64_t begin = 0, end = 0;
    try {
      begin = offs->as_array()[0].as_int();
      end = offs->as_array()[1].as_int();
    } catch (const std::exception&) {
      fail(ctx + ": data_offsets must be integers");
    }
    if (begin < 0 || end < begin || static_cast<uint64_t>(end) > data_size)
      fail(ctx + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
           "] lie outside the " + std::to_string(data_size) + "-byte data section");
    if (static_cast<uint64_t>(end - begin) != numel * esize)
      fail(ctx + ": data_offsets span " + std::to_string(end - begin) + " bytes but shape and " +
           dt + " need " + std::to_string(numel * esize));
    if (begin % esize != 0) fail(ctx + ": data is not aligned to its element size");
    t.data = data + begin;
    t.mapping = file_->data();
    t.mapping_bytes = file_->size();
    t.nbytes = static_cast<size_t>(end - begin);
    tensors_.push_back(std::move(t));
  }
}

SafetensorsSet::SafetensorsSet(const std::string& dir) {
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::vector<std::string> files;
  if (file_exists(index_path)) {
    Value index = read_json_file(index_path);
    const Value* wm = index.find("weight_map");
    if (!wm || !wm->is_object())
      throw FormatError(index_path + ": no \"weight_map\" object");
    std::set<std::string> names;
    for (const auto& [tensor, file] : wm->as_object()) {
      if (!file.is_string() || file.as_string().find('/') != std::string::npos ||
          file.as_string().empty())
        throw FormatError(index_path + ": weight_map entry for '" + tensor +
                          "' is not a plain file name");
      names.insert(file.as_string());
    }
    files.assign(names.begin(), names.end());
    for (auto& f : files) f = dir + "/" + f;
  } else if (file_exists(single)) {
    files.push_back(single);
  } else {
    throw FileNotFound(dir + ": no model.safetensors or model.safetensors.index.json");
  }
  for (const std::string& f : files) {
    if (!file_exists(f)) throw FormatError(index_path + ": shard '" + f + "' is missing");
    shards_.emplace_back(f);
  }
  for (const SafetensorsFile& s : shards_)
    for (const TensorView& t : s.tensors()) {
      if (index_.count(t.name))
        throw FormatError(dir + ": tensor '" + t.name + "' appears in more than one shard");
      index_[t.name] = tensors_.size();
      tensors_.push_back(t);
    }
}

const TensorView* SafetensorsSet::tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace markbase
