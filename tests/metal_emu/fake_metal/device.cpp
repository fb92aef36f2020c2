// device.cpp -- MTLDevice: an Apple-silicon-like GPU (family Apple9, unified memory, 32 KiB
// of threadgroup memory) whose kernels run on the msl_emu CPU emulator.
#include <Block.h>

#include <cstdlib>
#include <cstring>

#include "install.h"
#include "metal_objects.h"

namespace fake_objc {

[[noreturn]] void refuse(const std::string& message) {
  throw msl_emu::KernelError("fake Metal: " + message, "", msl_emu::Dim3{0, 0, 0}, -1, "", 0);
}

FDevice* the_device() {
  static FDevice* d = [] {
    FDevice* x = make<FDevice>("MTLDevice");
    x->refs = 1L << 40;  // immortal: every Create/Copy hands out a reference, few give it back
    return x;
  }();
  return d;
}

namespace {

FBuffer* new_buffer(UInt length, UInt options) {
  if (length == 0) return nullptr;  // Metal returns nil for an empty buffer
  FBuffer* b = make<FBuffer>("MTLBuffer");
  // Page-aligned and zero-filled, like fresh GPU memory on macOS.
  UInt rounded = (length + kPageBytes - 1) / kPageBytes * kPageBytes;
  b->data = (unsigned char*)aligned_alloc(kPageBytes, rounded);
  if (!b->data) {
    delete b;
    return nullptr;
  }
  std::memset(b->data, 0, rounded);
  b->length = length;
  b->options = options;
  the_device()->allocated += length;
  return b;
}

bool supports_family(Int family) {
  // MTLGPUFamily: Apple1..Apple9 = 1001..1009, Mac2 = 2002, Common1..3 = 3001..3003,
  // Metal3 = 5001. An Apple9 GPU supports every earlier Apple family.
  return (family >= 1001 && family <= 1009) || family == 2002 || (family >= 3001 && family <= 3003) || family == 5001;
}

}  // namespace

void install_device() {
  const char* C = "MTLDevice";
  instance_method(C, "name", +[](FDevice*, SEL) { return temp_string("msl_emu CPU emulator (Apple9-like)"); });
  instance_method(C, "registryID", +[](FDevice*, SEL) { return (uint64_t)0x6d736c5f656d75ull; });
  instance_method(C, "maxThreadsPerThreadgroup", +[](FDevice*, SEL) {
    return Size3{msl_emu::kMaxThreadsPerThreadgroup, msl_emu::kMaxThreadsPerThreadgroup, msl_emu::kMaxThreadsPerThreadgroup};
  });
  instance_method(C, "maxThreadgroupMemoryLength", +[](FDevice*, SEL) { return (UInt)msl_emu::kMaxThreadgroupMemory; });
  instance_method(C, "maxBufferLength", +[](FDevice*, SEL) { return (UInt)1 << 34; });
  instance_method(C, "hasUnifiedMemory", +[](FDevice*, SEL) { return true; });
  instance_method(C, "isLowPower", +[](FDevice*, SEL) { return false; });
  instance_method(C, "isHeadless", +[](FDevice*, SEL) { return false; });
  instance_method(C, "isRemovable", +[](FDevice*, SEL) { return false; });
  instance_method(C, "recommendedMaxWorkingSetSize", +[](FDevice*, SEL) { return (uint64_t)16 << 30; });
  instance_method(C, "currentAllocatedSize", +[](FDevice* d, SEL) { return (UInt)d->allocated.load(); });
  instance_method(C, "supportsFamily:", +[](FDevice*, SEL, Int family) { return supports_family(family); });

  instance_method(C, "newBufferWithLength:options:", +[](FDevice*, SEL, UInt length, UInt options) { return new_buffer(length, options); });
  instance_method(C, "newBufferWithBytes:length:options:", +[](FDevice*, SEL, const void* bytes, UInt length, UInt options) {
    FBuffer* b = new_buffer(length, options);
    if (b) std::memcpy(b->data, bytes, length);
    return b;
  });
  // Apple requires page alignment of both the pointer and the length (16 KiB on Apple silicon)
  // and returns nil otherwise.
  instance_method(C, "newBufferWithBytesNoCopy:length:options:deallocator:",
                  +[](FDevice*, SEL, void* bytes, UInt length, UInt options, void* deallocator) -> FBuffer* {
                    if (!bytes || length == 0 || (uintptr_t)bytes % kPageBytes != 0 || length % kPageBytes != 0) return nullptr;
                    FBuffer* b = make<FBuffer>("MTLBuffer");
                    b->data = (unsigned char*)bytes;
                    b->length = length;
                    b->options = options;
                    b->owned = false;
                    b->deallocator = deallocator ? _Block_copy(deallocator) : nullptr;
                    the_device()->allocated += length;
                    return b;
                  });
}

}  // namespace fake_objc

extern "C" {
using fake_objc::Object;

// MTL::CreateSystemDefaultDevice: the caller owns a reference (the Create rule).
__attribute__((visibility("default"))) void* MTLCreateSystemDefaultDevice() {
  fake_objc::cls("NSObject");
  fake_objc::Object* d = fake_objc::the_device();
  fake_objc::retain(d);
  return d;
}
__attribute__((visibility("default"))) void* MTLCopyAllDevices() {
  return fake_objc::new_array({fake_objc::the_device()});
}
// No devices come or go: the observer is nil and the handler is never called.
__attribute__((visibility("default"))) void* MTLCopyAllDevicesWithObserver(void** observer, void*) {
  if (observer) *observer = nullptr;
  return fake_objc::new_array({fake_objc::the_device()});
}
__attribute__((visibility("default"))) void MTLRemoveDeviceObserver(void*) {}
}
