// A thin layer over metal-cpp: the device, the kernel library, pipelines by kernel name, and
// buffers (new, copied, or wrapped without a copy around mapped model files). Knows Metal, not
// graphs or models. Every Objective-C object is held in an NS::SharedPtr.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include <Foundation/Foundation.hpp>
#include <Metal/Metal.hpp>

namespace markbase::metal {

class Device {
 public:
  // Throws BackendError when there is no Metal device or the kernels do not build.
  Device();

  MTL::Device* device() const { return device_.get(); }
  MTL::CommandQueue* queue() const { return queue_.get(); }
  // The pipeline of a kernel by its host name (e.g. "mul_mv_q4_0"), built on first use.
  MTL::ComputePipelineState* pipeline(const std::string& kernel);

  NS::SharedPtr<MTL::Buffer> new_buffer(size_t bytes);
  NS::SharedPtr<MTL::Buffer> copy_buffer(const void* data, size_t bytes);
  // A buffer over [data, data + bytes) of a mapping, without a copy where Metal allows it (the
  // region is widened to whole 16 KiB pages inside the mapping); *offset receives where data
  // starts inside the buffer. Falls back to a copy (offset 0).
  NS::SharedPtr<MTL::Buffer> wrap(const uint8_t* data, size_t bytes, const uint8_t* mapping,
                                  size_t mapping_bytes, size_t* offset);

 private:
  NS::SharedPtr<MTL::Device> device_;
  NS::SharedPtr<MTL::CommandQueue> queue_;
  NS::SharedPtr<MTL::Library> library_;
  std::map<std::string, NS::SharedPtr<MTL::ComputePipelineState>> pipelines_;
};

// The kernels' source (metal/*.metal with their headers inlined), embedded at build time.
extern const char* const kKernelSource;
// Where the build put a compiled metallib, or "" (then the source is compiled at load time).
std::string metallib_path();

}  // namespace markbase::metal
