// bindings.cpp -- the arguments of one dispatch, checked against Metal's limits as they are set.
#include <cstring>

#include "msl_emu/runtime.h"

namespace msl_emu {
namespace {
[[noreturn]] void refuse(const std::string& m) { throw KernelError(m, "", Dim3{0, 0, 0}, -1, "", 0); }
void check_buffer_index(unsigned index, const char* what) {
  if (index > kMaxBufferIndex)
    refuse(std::string(what) + ": buffer index " + std::to_string(index) + " is above Metal's limit of " +
           std::to_string(kMaxBufferIndex));
}
}  // namespace

void Bindings::set_buffer(unsigned index, void* base, size_t offset) {
  check_buffer_index(index, "setBuffer");
  bytes_[index].reset();
  buffers_[index] = base ? (unsigned char*)base + offset : nullptr;
}

void Bindings::set_bytes(unsigned index, const void* data, size_t length) {
  check_buffer_index(index, "setBytes");
  if (length > kMaxSetBytes)
    refuse("setBytes: " + std::to_string(length) + " bytes exceed Metal's limit of " + std::to_string(kMaxSetBytes) +
           " bytes (use a buffer)");
  // At least one byte, so that an empty setBytes still counts as bound.
  auto copy = std::make_shared<std::vector<unsigned char>>(length ? length : 1);
  if (length) std::memcpy(copy->data(), data, length);
  bytes_[index] = copy;
  buffers_[index] = copy->data();
}

void Bindings::set_threadgroup_memory(unsigned index, size_t length) {
  if (index > kMaxThreadgroupMemoryIndex)
    refuse("setThreadgroupMemoryLength: index " + std::to_string(index) + " is above Metal's limit of " +
           std::to_string(kMaxThreadgroupMemoryIndex));
  if (length % 16 != 0)
    refuse("setThreadgroupMemoryLength: " + std::to_string(length) + " bytes is not a multiple of 16, as Metal requires");
  if (length > kMaxThreadgroupMemory)
    refuse("setThreadgroupMemoryLength: " + std::to_string(length) + " bytes exceed the threadgroup memory limit of " +
           std::to_string(kMaxThreadgroupMemory) + " bytes");
  tg_len_[index] = length;
}

void Bindings::clear_buffer(unsigned index) {
  check_buffer_index(index, "clear_buffer");
  bytes_[index].reset();
  buffers_[index] = nullptr;
}

void* Bindings::buffer(unsigned index) const { return index <= kMaxBufferIndex ? buffers_[index] : nullptr; }

size_t Bindings::threadgroup_memory(unsigned index) const {
  return index <= kMaxThreadgroupMemoryIndex ? tg_len_[index] : 0;
}

size_t Bindings::dynamic_threadgroup_bytes() const {
  size_t s = 0;
  for (size_t v : tg_len_) s += v;
  return s;
}

}  // namespace msl_emu
