// metal_objects.h -- the fake Metal objects (internal to fake_metal/).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "foundation.h"
#include "msl_emu/runtime.h"

namespace fake_objc {

struct Size3 {  // MTL::Size (24 bytes: passed and returned in memory)
  UInt width, height, depth;
};

// Storage modes as MTLResourceOptions encode them (bits 4-7).
constexpr UInt kStorageShift = 4;
constexpr UInt kStorageShared = 0, kStorageManaged = 1, kStoragePrivate = 2, kStorageMemoryless = 3;
// Apple-silicon virtual memory page: no-copy buffers must be aligned to it.
constexpr UInt kPageBytes = 16384;

struct FDevice : Object {
  std::atomic<uint64_t> allocated{0};  // bytes in live buffers (currentAllocatedSize)
};
FDevice* the_device();

struct FBuffer : Object {
  unsigned char* data = nullptr;
  UInt length = 0;
  UInt options = 0;
  bool owned = true;            // false for newBufferWithBytesNoCopy
  void* deallocator = nullptr;  // copied block (void (^)(void*, NS::UInteger)), or nullptr
  Object* label = nullptr;
  ~FBuffer() override;
  UInt storage_mode() const { return (options >> kStorageShift) & 0xF; }
};

struct FCompileOptions : Object {
  bool fast_math = true;
  Int math_mode = 2;  // MTLMathModeFast
  UInt language_version = (3ul << 16) | 1;  // MSL 3.1
  Object* macros = nullptr;                 // the NSDictionary the host set (kept, not applied)
  ~FCompileOptions() override { release(macros); }
};

struct FLibrary : Object {
  std::set<std::string> names;  // kernels the library's source defines
  Object* label = nullptr;
  ~FLibrary() override { release(label); }
};

struct FFunction : Object {
  const msl_emu::Kernel* kernel = nullptr;
  Object* label = nullptr;
  ~FFunction() override { release(label); }
};

struct FPipeline : Object {
  const msl_emu::Kernel* kernel = nullptr;
  Object* label = nullptr;
  ~FPipeline() override { release(label); }
  UInt max_threads() const { return kernel->max_total_threads; }
};

// Names of kernels defined by MSL source text: `kernel void name(` that isn't a template,
// and every `[[host_name("name")]]`.
std::set<std::string> kernel_names_in_source(const std::string& source);

// The exception thrown by encoder calls that break a Metal rule (Apple's validation layer
// stops there too); a KernelError so that the host code reports one kind of emulator error.
[[noreturn]] void refuse(const std::string& message);

}  // namespace fake_objc
