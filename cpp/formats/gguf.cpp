#include "formats/gguf.h"

#include <cstring>
#include <limits>

#include "formats/error.h"

namespace markbase {
namespace {

enum GGUFValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8,
  ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS

// Bytes a value of this scalar type occupies (0 for STRING/ARRAY, which are variable).
size_t scalar_size(uint32_t t) {
  switch (t) {
    case U8: case I8: case BOOL: return 1;
    case U16: case I16: return 2;
    case U32: case I32: case F32: return 4;
    case U64: case I64: case F64: return 8;
    default: return 0;
  }
}

// A bounds-checked cursor over the mapping. Every read checks what is left first.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}

  [[noreturn]] void fail(const std::string& problem) const {
    throw FormatError(path_ + ": " + problem);
  }
  size_t pos() const { return pos_; }
  size_t left() const { return n_ - pos_; }
  void need(size_t k, const std::string& context) const {
    if (k > left())
      fail("truncated: " + context + " needs " + std::to_string(k) + " bytes at offset " +
           std::to_string(pos_) + " but the file has only " + std::to_string(left()) + " left");
  }
  template <class T>
  T get(const std::string& context) {
    need(sizeof(T), context);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str(const std::string& context) {
    uint64_t len = get<uint64_t>(context + " (string length)");
    if (len > left())
      fail(context + ": string length " + std::to_string(len) + " exceeds the " +
           std::to_string(left()) + " bytes left in the file");
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  const std::string& path_;
  size_t pos_ = 0;
};

Value read_scalar(Reader& r, uint32_t type, const std::string& ctx) {
  switch (type) {
    case U8: return Value(static_cast<int64_t>(r.get<uint8_t>(ctx)));
    case I8: return Value(static_cast<int64_t>(r.get<int8_t>(ctx)));
    case U16: return Value(static_cast<int64_t>(r.get<uint16_t>(ctx)));
    case I16: return Value(static_cast<int64_t>(r.get<int16_t>(ctx)));
    case U32: return Value(static_cast<int64_t>(r.get<uint32_t>(ctx)));
    case I32: return Value(static_cast<int64_t>(r.get<int32_t>(ctx)));
    case F32: return Value(static_cast<double>(r.get<float>(ctx)));
    case BOOL: {
      uint8_t b = r.get<uint8_t>(ctx);
      if (b > 1) r.fail(ctx + ": boolean value " + std::to_string(b) + " is neither 0 nor 1");
      return Value(b != 0);
    }
    case U64: {
      uint64_t v = r.get<uint64_t>(ctx);
      if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return Value(static_cast<int64_t>(v));
      return Value(v);
    }
    case I64: return Value(r.get<int64_t>(ctx));
    case F64: return Value(r.get<double>(ctx));
    case STRING: return Value(r.str(ctx));
    default: r.fail(ctx + ": unknown value type " + std::to_string(type));
  }
}

Value read_value(Reader& r, uint32_t type, const std::string& ctx, int depth) {
  if (type != ARRAY) return read_scalar(r, type, ctx);
  if (depth >= kMaxArrayDepth) r.fail(ctx + ": arrays nested deeper than 8 levels");
  uint32_t elem = r.get<uint32_t>(ctx + " (array element type)");
  uint64_t count = r.get<uint64_t>(ctx + " (array length)");
  // Every element takes at least this many bytes, so the count is bounded by the file's size.
  size_t min_elem = elem == STRING ? 8 : elem == ARRAY ? 12 : scalar_size(elem);
  if (min_elem == 0) r.fail(ctx + ": unknown array element type " + std::to_string(elem));
  if (count > r.left() / min_elem)
    r.fail(ctx + ": array length " + std::to_string(count) + " cannot fit in the " +
           std::to_string(r.left()) + " bytes left in the file");
  ValueArray arr;
  arr.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) arr.push_back(read_value(r, elem, ctx, depth + 1));
  return Value(std::move(arr));
}

}  // namespace

GGUFFile::GGUFFile(const std::string& path) : file_(std::make_shared<MappedFile>(path)) {
  Reader r(file_->data(), file_->size(), path);
  uint32_t magic = r.get<uint32_t>("magic");
  if (std::memcmp(&magic, "GGUF", 4) != 0) r.fail("not a GGUF file (bad magic)");
  version_ = r.get<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    r.fail("unsupported GGUF version " + std::to_string(version_) + " (2 and 3 are supported)");
  uint64_t n_tensors = r.get<uint64_t>("tensor count");
  uint64_t n_kv = r.get<uint64_t>("metadata count");
  // A key-value pair needs at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
  // 8 + 4 + 8 + 4 + 8. Counts beyond what the file could hold are rejected before any allocation.
  if (n_kv > r.left() / 13)
    r.fail("metadata count " + std::to_string(n_kv) + " is larger than the file could hold");
  if (n_tensors > r.left() / 32)
    r.fail("tensor count " + std::to_string(n_tensors) + " is larger than the file could hold");

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = r.str("metadata key #" + std::to_string(i));
    uint32_t type = r.get<uint32_t>("type of key '" + key + "'");
    Value v = read_value(r, type, "key '" + key + "'", 0);
    if (kv_index_.count(key)) r.fail("duplicate metadata key '" + key + "'");
    kv_index_[key] = kv_.size();
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const Value* a = find("general.alignment")) {
    int64_t al = 0;
    try { al = a->as_int(); } catch (const std::exception&) { r.fail("general.alignment is not an integer"); }
    if (al <= 0 || (al & (al - 1)) != 0 || al > (1 << 20))
      r.fail("general.alignment " + std::to_string(al) + " is not a power of two up to 1 MiB");
    alignment_ = static_cast<size_t>(al);
  }

  struct RawInfo { uint64_t offset; };
  std::vector<RawInfo> raw;
  raw.reserve(static_cast<size_t>(n_tensors));
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorView t;
    t.name = r.str("tensor info #" + std::to_string(i) + " name");
    const std::string ctx = "tensor '" + t.name + "'";
    uint32_t n_dims = r.get<uint32_t>(ctx + " dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      r.fail(ctx + ": " + std::to_string(n_dims) + " dimensions (1 to 4 are allowed)");
    std::vector<int64_t> ne(n_dims);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t v = r.get<uint64_t>(ctx + " dimension");
      if (v == 0) r.fail(ctx + ": dimension " + std::to_string(d) + " is 0");
      if (v > (uint64_t(1) << 62) / numel)
        r.fail(ctx + ": element count overflows (dimension " + std::to_string(d) + " = " +
               std::to_string(v) + ")");
      numel *= v;
      ne[d] = static_cast<int64_t>(v);
    }
    uint32_t type_id = r.get<uint32_t>(ctx + " type");
    const TypeTraits* tr = type_traits(type_id);
    if (!tr)
      r.fail(ctx + ": tensor type " + ggml_type_name(type_id) +
             " is not supported (supported: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K)");
    t.type = static_cast<TensorType>(type_id);
    if (ne[0] % tr->block_elems != 0)
      r.fail(ctx + ": row length " + std::to_string(ne[0]) + " is not a multiple of the " +
             tr->name + " block size " + std::to_string(tr->block_elems));
    t.nbytes = static_cast<size_t>(numel / tr->block_elems) * tr->block_bytes;
    t.shape.assign(ne.rbegin(), ne.rend());
    uint64_t off = r.get<uint64_t>(ctx + " data offset");
    if (off % alignment_ != 0)
      r.fail(ctx + ": data offset " + std::to_string(off) + " is not aligned to " +
             std::to_string(alignment_));
    if (tensor_index_.count(t.name)) r.fail("duplicate tensor name '" + t.name + "'");
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
    raw.push_back({off});
  }

  size_t data_start = (r.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_start > file_->size())
    r.fail("truncated: the tensor data section would start at byte " + std::to_string(data_start) +
           " but the file has " + std::to_string(file_->size()) + " bytes");
  const size_t data_size = n_tensors > 0 ? file_->size() - data_start : 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    TensorView& t = tensors_[i];
    if (raw[i].offset > data_size || t.nbytes > data_size - raw[i].offset)
      r.fail("tensor '" + t.name + "': data [" + std::to_string(raw[i].offset) + ", +" +
             std::to_string(t.nbytes) + ") lies outside the " + std::to_string(data_size) +
             "-byte data section (file truncated or corrupt)");
    t.data = file_->data() + data_start + raw[i].offset;
    t.mapping = file_->data();
    t.mapping_bytes = file_->size();
  }
}

const Value* GGUFFile::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorView* GGUFFile::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace markbase
