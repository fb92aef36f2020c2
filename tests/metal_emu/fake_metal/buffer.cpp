// buffer.cpp -- MTLBuffer: memory shared by host and "GPU" (unified memory, like Apple silicon).
#include <Block.h>

#include <cstdlib>
#include <cstring>

#include "install.h"
#include "metal_objects.h"

namespace fake_objc {

FBuffer::~FBuffer() {
  the_device()->allocated -= length;
  if (owned) {
    free(data);
  } else if (deallocator) {
    auto block = (void (^)(void*, UInt))deallocator;
    block(data, length);
  }
  if (deallocator) _Block_release(deallocator);
  release(label);
}

void install_buffer() {
  const char* C = "MTLBuffer";
  // Private storage is GPU-only: Apple returns NULL contents, and so does the fake, so that
  // host code that reads a private buffer fails here as it would on a Mac.
  instance_method(C, "contents", +[](FBuffer* b, SEL) -> void* {
    return b->storage_mode() == kStoragePrivate ? nullptr : (void*)b->data;
  });
  instance_method(C, "length", +[](FBuffer* b, SEL) { return b->length; });
  instance_method(C, "allocatedSize", +[](FBuffer* b, SEL) { return (b->length + kPageBytes - 1) / kPageBytes * kPageBytes; });
  // With unified memory the GPU address is the CPU address, so that buffers holding
  // gpuAddress values (argument buffers) also work in the emulator.
  instance_method(C, "gpuAddress", +[](FBuffer* b, SEL) { return (uint64_t)(uintptr_t)b->data; });
  instance_method(C, "didModifyRange:", +[](FBuffer* b, SEL, NSRange r) {
    if (r.location + r.length > b->length)
      refuse("didModifyRange: range [" + std::to_string(r.location) + ", " + std::to_string(r.location + r.length) +
             ") is outside the buffer's " + std::to_string(b->length) + " bytes");
  });
  instance_method(C, "storageMode", +[](FBuffer* b, SEL) { return b->storage_mode(); });
  instance_method(C, "resourceOptions", +[](FBuffer* b, SEL) { return b->options; });
  instance_method(C, "cpuCacheMode", +[](FBuffer* b, SEL) { return b->options & 0xF; });
  instance_method(C, "hazardTrackingMode", +[](FBuffer* b, SEL) { return (b->options >> 8) & 0x3; });
  instance_method(C, "device", +[](FBuffer*, SEL) { return the_device(); });
  instance_method(C, "label", +[](FBuffer* b, SEL) { return b->label; });
  instance_method(C, "setLabel:", +[](FBuffer* b, SEL, Object* l) {
    retain(l);
    release(b->label);
    b->label = l;
  });
}

}  // namespace fake_objc
