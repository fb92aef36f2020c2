#include "backend/metal/metal_device.h"

#include <cstring>

#include "formats/error.h"

namespace markbase::metal {
namespace {

constexpr size_t kPage = 16384;  // Apple Silicon's page: no-copy buffers must be aligned to it

std::string describe(NS::Error* err) {
  if (!err || !err->localizedDescription()) return "unknown error";
  return err->localizedDescription()->utf8String();
}

NS::String* ns(const std::string& s) { return NS::String::string(s.c_str(), NS::UTF8StringEncoding); }

}  // namespace

Device::Device() {
  NS::SharedPtr<NS::AutoreleasePool> pool = NS::TransferPtr(NS::AutoreleasePool::alloc()->init());
  device_ = NS::TransferPtr(MTL::CreateSystemDefaultDevice());
  if (!device_) throw BackendError("backend 'metal' is not available: no Metal device found");
  queue_ = NS::TransferPtr(device_->newCommandQueue());
  if (!queue_) throw BackendError("[metal] could not create a command queue");
  NS::Error* err = nullptr;
  const std::string lib = metallib_path();
  if (!lib.empty()) {
    library_ = NS::TransferPtr(device_->newLibrary(NS::URL::fileURLWithPath(ns(lib)), &err));
    if (!library_) throw BackendError("[metal] could not load " + lib + ": " + describe(err));
  } else {
    NS::SharedPtr<MTL::CompileOptions> opt = NS::TransferPtr(MTL::CompileOptions::alloc()->init());
    opt->setFastMathEnabled(false);  // the CPU reference is IEEE float; keep exp/tanh precise
    opt->setLanguageVersion(MTL::LanguageVersion3_1);
    library_ = NS::TransferPtr(device_->newLibrary(ns(kKernelSource), opt.get(), &err));
    if (!library_) throw BackendError("[metal] the kernels did not compile: " + describe(err));
  }
}

MTL::ComputePipelineState* Device::pipeline(const std::string& kernel) {
  auto it = pipelines_.find(kernel);
  if (it != pipelines_.end()) return it->second.get();
  NS::SharedPtr<NS::AutoreleasePool> pool = NS::TransferPtr(NS::AutoreleasePool::alloc()->init());
  NS::SharedPtr<MTL::Function> fn = NS::TransferPtr(library_->newFunction(ns(kernel)));
  if (!fn) throw BackendError("[metal] unable to load kernel " + kernel);
  NS::Error* err = nullptr;
  NS::SharedPtr<MTL::ComputePipelineState> p =
      NS::TransferPtr(device_->newComputePipelineState(fn.get(), &err));
  if (!p) throw BackendError("[metal] unable to build the pipeline of " + kernel + ": " + describe(err));
  return pipelines_.emplace(kernel, p).first->second.get();
}

NS::SharedPtr<MTL::Buffer> Device::new_buffer(size_t bytes) {
  NS::SharedPtr<MTL::Buffer> b =
      NS::TransferPtr(device_->newBuffer(std::max<size_t>(bytes, 16), MTL::ResourceStorageModeShared));
  if (!b) throw BackendError("[metal] out of memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(b->contents(), 0, b->length());
  return b;
}

NS::SharedPtr<MTL::Buffer> Device::copy_buffer(const void* data, size_t bytes) {
  NS::SharedPtr<MTL::Buffer> b = new_buffer(bytes);
  std::memcpy(b->contents(), data, bytes);
  return b;
}

NS::SharedPtr<MTL::Buffer> Device::wrap(const uint8_t* data, size_t bytes, const uint8_t* mapping,
                                        size_t mapping_bytes, size_t* offset) {
  if (mapping) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(data), m = reinterpret_cast<uintptr_t>(mapping);
    const uintptr_t lo = p / kPage * kPage;
    const uintptr_t hi = (p + bytes + kPage - 1) / kPage * kPage;
    const uintptr_t map_hi = (m + mapping_bytes + kPage - 1) / kPage * kPage;
    // Inside the mapping: its pages (the OS maps whole pages) hold every byte of the region.
    if (lo >= m && hi <= map_hi) {
      MTL::Buffer* b = device_->newBuffer(reinterpret_cast<const void*>(lo), hi - lo,
                                          MTL::ResourceStorageModeShared, nullptr);
      if (b) {
        *offset = p - lo;
        return NS::TransferPtr(b);
      }
    }
  }
  *offset = 0;
  return copy_buffer(data, bytes);
}

}  // namespace markbase::metal
