// commands.cpp -- MTLCommandQueue, MTLCommandBuffer, MTLComputeCommandEncoder and
// MTLBlitCommandEncoder.
//
// Encoders record commands; commit executes them in order on the emulator, then calls the
// completed handlers. Each dispatch snapshots the bound state (buffers + offsets, setBytes
// data, threadgroup memory lengths). An indirect dispatch reads its threadgroup counts when it
// executes, i.e. after the earlier commands of the same command buffer wrote them, as a GPU
// does. A kernel error marks the buffer MTLCommandBufferStatusError with an NSError whose
// localizedDescription is the KernelError text, and skips the rest of the buffer.
// Breaking a Metal API rule (limits, encoder misuse) throws msl_emu::KernelError at the call.
#include <Block.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "counters_impl.h"
#include "install.h"
#include "metal_objects.h"

namespace fake_objc {
namespace {

using msl_emu::Dim3;

enum CommandBufferStatus : UInt { kNotEnqueued = 0, kEnqueued = 1, kCommitted = 2, kScheduled = 3, kCompleted = 4, kError = 5 };

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Command {
  enum Kind { kDispatch, kDispatchThreads, kDispatchIndirect, kCopy, kFill } kind = kDispatch;
  const msl_emu::Kernel* kernel = nullptr;
  msl_emu::Bindings bindings;
  Dim3 grid, tptg;
  FBuffer* indirect = nullptr;
  UInt indirect_offset = 0;
  FBuffer *src = nullptr, *dst = nullptr;
  UInt src_offset = 0, dst_offset = 0, size = 0;
  uint8_t value = 0;
  std::vector<Object*> retained;  // released after execution
};

struct FQueue : Object {
  Object* label = nullptr;
  ~FQueue() override { release(label); }
};

struct FCommandBuffer : Object {
  FQueue* queue = nullptr;
  bool retained_refs = true;
  std::vector<Command> commands;
  UInt status = kNotEnqueued;
  FError* error = nullptr;
  Object* label = nullptr;
  Object* open_encoder = nullptr;
  std::vector<void*> scheduled_handlers, completed_handlers;  // copied blocks
  double start = 0, end = 0;
  ~FCommandBuffer() override {
    for (Command& c : commands)
      for (Object* o : c.retained) release(o);
    for (void* h : scheduled_handlers) _Block_release(h);
    for (void* h : completed_handlers) _Block_release(h);
    release(error);
    release(label);
    release(queue);
  }
};

struct FEncoder : Object {
  FCommandBuffer* cb = nullptr;
  bool ended = false;
  Object* label = nullptr;
  ~FEncoder() override {
    if (!ended) {
      // Metal's validation layer stops here too.
      fprintf(stderr, "fake Metal: command encoder released without endEncoding\n");
      abort();
    }
    release(label);
    release(cb);
  }
  void check_open(const char* what) const {
    if (ended) refuse(std::string(what) + " after endEncoding");
  }
};

struct FComputeEncoder : FEncoder {
  FPipeline* pipeline = nullptr;
  msl_emu::Bindings bindings;
  FBuffer* buffers[msl_emu::kMaxBufferIndex + 1] = {};
  UInt offsets[msl_emu::kMaxBufferIndex + 1] = {};
  UInt dispatch_type = 0;
};

struct FBlitEncoder : FEncoder {};

// ------------------------------------------------------------------ command buffer
FCommandBuffer* new_command_buffer(FQueue* q, bool retained) {
  FCommandBuffer* cb = make<FCommandBuffer>("MTLCommandBuffer");
  retain(q);
  cb->queue = q;
  cb->retained_refs = retained;
  autorelease(cb);
  return cb;
}

void check_encodable(FCommandBuffer* cb, const char* what) {
  if (cb->status >= kCommitted) refuse(std::string(what) + " on a command buffer that was already committed");
  if (cb->open_encoder) refuse(std::string(what) + " while another encoder of the command buffer is open (call endEncoding first)");
}

template <class E> E* open_encoder(FCommandBuffer* cb, const char* cls_name, const char* what) {
  check_encodable(cb, what);
  E* e = make<E>(cls_name);
  retain(cb);
  e->cb = cb;
  cb->open_encoder = e;
  return (E*)autorelease(e);
}

void record(FEncoder* e, Command c, std::initializer_list<Object*> used) {
  if (e->cb->retained_refs)
    for (Object* o : used)
      if (o) {
        retain(o);
        c.retained.push_back(o);
      }
  e->cb->commands.push_back(std::move(c));
}

void execute(const Command& c) {
  switch (c.kind) {
    case Command::kDispatch:
      count_dispatch(false);
      msl_emu::dispatch_threadgroups(*c.kernel, c.bindings, c.grid, c.tptg);
      break;
    case Command::kDispatchThreads:
      count_dispatch(false);
      msl_emu::dispatch_threads(*c.kernel, c.bindings, c.grid, c.tptg);
      break;
    case Command::kDispatchIndirect: {
      count_dispatch(true);
      uint32_t n[3];  // MTLDispatchThreadgroupsIndirectArguments, read now
      std::memcpy(n, c.indirect->data + c.indirect_offset, sizeof n);
      msl_emu::dispatch_threadgroups(*c.kernel, c.bindings, Dim3{n[0], n[1], n[2]}, c.tptg);
      break;
    }
    case Command::kCopy:
      count_blit();
      std::memmove(c.dst->data + c.dst_offset, c.src->data + c.src_offset, c.size);
      break;
    case Command::kFill:
      count_blit();
      std::memset(c.dst->data + c.dst_offset, c.value, c.size);
      break;
  }
}

void commit(FCommandBuffer* cb) {
  if (cb->status >= kCommitted) refuse("commit: the command buffer was already committed");
  if (cb->open_encoder) refuse("commit: an encoder of the command buffer is still open (call endEncoding first)");
  count_commit();
  cb->status = kScheduled;
  for (void* h : cb->scheduled_handlers) ((void (^)(void*))h)(cb);
  cb->start = now_seconds();
  for (Command& c : cb->commands) {
    if (cb->status != kError) {
      try {
        execute(c);
      } catch (const std::exception& ex) {
        cb->status = kError;
        cb->error = new_error("MTLCommandBufferErrorDomain", 1 /* MTLCommandBufferErrorInternal */, ex.what());
        fprintf(stderr, "fake Metal: command buffer failed: %s\n", ex.what());
      }
    }
    for (Object* o : c.retained) release(o);
    c.retained.clear();
  }
  cb->end = now_seconds();
  if (cb->status != kError) cb->status = kCompleted;
  for (void* h : cb->completed_handlers) ((void (^)(void*))h)(cb);
}

// ------------------------------------------------------------------ compute encoder helpers
Dim3 to_dim(const Size3& s, const char* what) {
  if (s.width > UINT32_MAX || s.height > UINT32_MAX || s.depth > UINT32_MAX)
    refuse(std::string(what) + ": a dimension exceeds 2^32-1");
  return Dim3{(uint32_t)s.width, (uint32_t)s.height, (uint32_t)s.depth};
}

std::string size_str(const Size3& s) {
  return "(" + std::to_string(s.width) + "," + std::to_string(s.height) + "," + std::to_string(s.depth) + ")";
}

// The checks Metal's validation layer makes when a dispatch is encoded.
const msl_emu::Kernel* check_dispatch(FComputeEncoder* e, const Size3& tptg, const char* what) {
  e->check_open(what);
  if (!e->pipeline) refuse(std::string(what) + " without setComputePipelineState");
  const msl_emu::Kernel* k = e->pipeline->kernel;
  if (tptg.width == 0 || tptg.height == 0 || tptg.depth == 0)
    refuse(std::string(what) + ": threadsPerThreadgroup " + size_str(tptg) + " has a zero dimension");
  if (tptg.width > msl_emu::kMaxThreadsPerThreadgroup || tptg.height > msl_emu::kMaxThreadsPerThreadgroup ||
      tptg.depth > msl_emu::kMaxThreadsPerThreadgroup)
    refuse(std::string(what) + ": threadsPerThreadgroup " + size_str(tptg) + " exceeds the device's maxThreadsPerThreadgroup (1024 per dimension)");
  UInt n = tptg.width * tptg.height * tptg.depth;
  if (n > k->max_total_threads)
    refuse(std::string(what) + ": threadsPerThreadgroup " + size_str(tptg) + " = " + std::to_string(n) +
           " threads exceeds the pipeline's maxTotalThreadsPerThreadgroup of " + std::to_string(k->max_total_threads) +
           " (kernel " + k->name + ")");
  size_t tg = (size_t)k->static_tg_bytes + e->bindings.dynamic_threadgroup_bytes();
  if (tg > msl_emu::kMaxThreadgroupMemory)
    refuse(std::string(what) + ": threadgroup memory " + std::to_string(k->static_tg_bytes) + " (static) + " +
           std::to_string(e->bindings.dynamic_threadgroup_bytes()) + " (setThreadgroupMemoryLength) bytes exceeds maxThreadgroupMemoryLength " +
           std::to_string(msl_emu::kMaxThreadgroupMemory) + " (kernel " + k->name + ")");
  return k;
}

Command dispatch_command(FComputeEncoder* e, Command::Kind kind, const msl_emu::Kernel* k) {
  Command c;
  c.kind = kind;
  c.kernel = k;
  c.bindings = e->bindings;  // snapshot
  return c;
}

void bind_buffer(FComputeEncoder* e, FBuffer* b, UInt offset, UInt index, const char* what) {
  e->check_open(what);
  if (index > msl_emu::kMaxBufferIndex)
    refuse(std::string(what) + ": buffer index " + std::to_string(index) + " is above Metal's limit of " +
           std::to_string(msl_emu::kMaxBufferIndex));
  if (b && offset >= b->length)
    refuse(std::string(what) + ": offset " + std::to_string(offset) + " is not inside the buffer (length " +
           std::to_string(b->length) + ") at index " + std::to_string(index));
  if (b && b->storage_mode() == kStorageMemoryless) refuse(std::string(what) + ": memoryless buffers can't be bound to a compute kernel");
  e->buffers[index] = b;
  e->offsets[index] = offset;
  if (b) e->bindings.set_buffer((unsigned)index, b->data, offset);
  else e->bindings.clear_buffer((unsigned)index);
}

std::vector<Object*> bound_objects(FComputeEncoder* e) {
  std::vector<Object*> v;
  for (FBuffer* b : e->buffers)
    if (b) v.push_back(b);
  return v;
}

void record_dispatch(FComputeEncoder* e, Command c, FBuffer* indirect = nullptr) {
  std::vector<Object*> used = bound_objects(e);
  if (indirect) used.push_back(indirect);
  if (e->cb->retained_refs)
    for (Object* o : used) {
      retain(o);
      c.retained.push_back(o);
    }
  e->cb->commands.push_back(std::move(c));
}

void end_encoding(FEncoder* e) {
  e->check_open("endEncoding");
  e->ended = true;
  if (e->cb->open_encoder == e) e->cb->open_encoder = nullptr;
}

template <class T> void label_methods(const char* c) {
  instance_method(c, "label", +[](T* o, SEL) { return o->label; });
  instance_method(c, "setLabel:", +[](T* o, SEL, Object* l) {
    retain(l);
    release(o->label);
    o->label = l;
  });
}

// Debug groups and signposts only annotate GPU captures; there is no capture here.
template <class T> void debug_methods(const char* c) {
  instance_method(c, "pushDebugGroup:", +[](T*, SEL, Object*) {});
  instance_method(c, "popDebugGroup", +[](T*, SEL) {});
}

void check_range(FBuffer* b, UInt offset, UInt size, const char* what, const char* which) {
  if (!b) refuse(std::string(what) + ": " + which + " buffer is nil");
  if (offset > b->length || size > b->length - offset)
    refuse(std::string(what) + ": " + which + " range [" + std::to_string(offset) + ", " + std::to_string(offset + size) +
           ") is outside the buffer's " + std::to_string(b->length) + " bytes");
}

}  // namespace

void install_commands() {
  // ---- MTLDevice: queues
  instance_method("MTLDevice", "newCommandQueue", +[](FDevice*, SEL) { return make<FQueue>("MTLCommandQueue"); });
  instance_method("MTLDevice", "newCommandQueueWithMaxCommandBufferCount:", +[](FDevice*, SEL, UInt) {
    return make<FQueue>("MTLCommandQueue");
  });

  // ---- MTLCommandQueue
  const char* Q = "MTLCommandQueue";
  instance_method(Q, "commandBuffer", +[](FQueue* q, SEL) { return new_command_buffer(q, true); });
  instance_method(Q, "commandBufferWithUnretainedReferences", +[](FQueue* q, SEL) { return new_command_buffer(q, false); });
  instance_method(Q, "device", +[](FQueue*, SEL) { return the_device(); });
  label_methods<FQueue>(Q);

  // ---- MTLCommandBuffer
  const char* B = "MTLCommandBuffer";
  instance_method(B, "computeCommandEncoder", +[](FCommandBuffer* cb, SEL) {
    return open_encoder<FComputeEncoder>(cb, "MTLComputeCommandEncoder", "computeCommandEncoder");
  });
  // Serial and concurrent dispatch types behave alike: commands run one after another, which
  // is one of the orders a concurrent encoder may use (use memoryBarrier where it matters).
  instance_method(B, "computeCommandEncoderWithDispatchType:", +[](FCommandBuffer* cb, SEL, UInt type) {
    FComputeEncoder* e = open_encoder<FComputeEncoder>(cb, "MTLComputeCommandEncoder", "computeCommandEncoderWithDispatchType:");
    e->dispatch_type = type;
    return e;
  });
  instance_method(B, "blitCommandEncoder", +[](FCommandBuffer* cb, SEL) {
    return open_encoder<FBlitEncoder>(cb, "MTLBlitCommandEncoder", "blitCommandEncoder");
  });
  instance_method(B, "enqueue", +[](FCommandBuffer* cb, SEL) {
    if (cb->status == kNotEnqueued) cb->status = kEnqueued;
  });
  instance_method(B, "commit", +[](FCommandBuffer* cb, SEL) { commit(cb); });
  instance_method(B, "waitUntilCompleted", +[](FCommandBuffer* cb, SEL) {
    count_wait();
    if (cb->status < kCommitted)
      refuse("waitUntilCompleted on a command buffer that was never committed (on a GPU this waits forever)");
  });
  instance_method(B, "waitUntilScheduled", +[](FCommandBuffer* cb, SEL) {
    if (cb->status < kCommitted)
      refuse("waitUntilScheduled on a command buffer that was never committed (on a GPU this waits forever)");
  });
  instance_method(B, "status", +[](FCommandBuffer* cb, SEL) { return cb->status; });
  instance_method(B, "error", +[](FCommandBuffer* cb, SEL) { return (Object*)cb->error; });
  instance_method(B, "addCompletedHandler:", +[](FCommandBuffer* cb, SEL, void* block) {
    if (cb->status >= kCommitted) refuse("addCompletedHandler: after commit");
    cb->completed_handlers.push_back(_Block_copy(block));
  });
  instance_method(B, "addScheduledHandler:", +[](FCommandBuffer* cb, SEL, void* block) {
    if (cb->status >= kCommitted) refuse("addScheduledHandler: after commit");
    cb->scheduled_handlers.push_back(_Block_copy(block));
  });
  instance_method(B, "device", +[](FCommandBuffer*, SEL) { return the_device(); });
  instance_method(B, "commandQueue", +[](FCommandBuffer* cb, SEL) { return cb->queue; });
  instance_method(B, "retainedReferences", +[](FCommandBuffer* cb, SEL) { return cb->retained_refs; });
  instance_method(B, "GPUStartTime", +[](FCommandBuffer* cb, SEL) { return cb->start; });
  instance_method(B, "GPUEndTime", +[](FCommandBuffer* cb, SEL) { return cb->end; });
  instance_method(B, "kernelStartTime", +[](FCommandBuffer* cb, SEL) { return cb->start; });
  instance_method(B, "kernelEndTime", +[](FCommandBuffer* cb, SEL) { return cb->end; });
  label_methods<FCommandBuffer>(B);
  debug_methods<FCommandBuffer>(B);

  // ---- MTLComputeCommandEncoder
  const char* E = "MTLComputeCommandEncoder";
  instance_method(E, "setComputePipelineState:", +[](FComputeEncoder* e, SEL, FPipeline* p) {
    e->check_open("setComputePipelineState:");
    e->pipeline = p;
  });
  instance_method(E, "setBuffer:offset:atIndex:", +[](FComputeEncoder* e, SEL, FBuffer* b, UInt offset, UInt index) {
    bind_buffer(e, b, offset, index, "setBuffer:offset:atIndex:");
  });
  instance_method(E, "setBufferOffset:atIndex:", +[](FComputeEncoder* e, SEL, UInt offset, UInt index) {
    if (index > msl_emu::kMaxBufferIndex || !e->buffers[index])
      refuse("setBufferOffset:atIndex: " + std::to_string(index) + " has no buffer bound");
    bind_buffer(e, e->buffers[index], offset, index, "setBufferOffset:atIndex:");
  });
  instance_method(E, "setBuffers:offsets:withRange:", +[](FComputeEncoder* e, SEL, FBuffer* const* bufs, const UInt* offs, NSRange r) {
    for (UInt i = 0; i < r.length; ++i) bind_buffer(e, bufs[i], offs[i], r.location + i, "setBuffers:offsets:withRange:");
  });
  instance_method(E, "setBytes:length:atIndex:", +[](FComputeEncoder* e, SEL, const void* bytes, UInt length, UInt index) {
    e->check_open("setBytes:length:atIndex:");
    if (length > msl_emu::kMaxSetBytes)
      refuse("setBytes:length:atIndex: " + std::to_string(length) + " bytes exceed Metal's 4096-byte limit (use a buffer)");
    e->bindings.set_bytes((unsigned)index, bytes, length);
    if (index <= msl_emu::kMaxBufferIndex) e->buffers[index] = nullptr;
  });
  instance_method(E, "setThreadgroupMemoryLength:atIndex:", +[](FComputeEncoder* e, SEL, UInt length, UInt index) {
    e->check_open("setThreadgroupMemoryLength:atIndex:");
    e->bindings.set_threadgroup_memory((unsigned)index, length);
  });
  instance_method(E, "dispatchThreadgroups:threadsPerThreadgroup:", +[](FComputeEncoder* e, SEL, Size3 groups, Size3 tptg) {
    const msl_emu::Kernel* k = check_dispatch(e, tptg, "dispatchThreadgroups:threadsPerThreadgroup:");
    Command c = dispatch_command(e, Command::kDispatch, k);
    c.grid = to_dim(groups, "dispatchThreadgroups");
    c.tptg = to_dim(tptg, "dispatchThreadgroups");
    record_dispatch(e, std::move(c));
  });
  instance_method(E, "dispatchThreads:threadsPerThreadgroup:", +[](FComputeEncoder* e, SEL, Size3 threads, Size3 tptg) {
    const msl_emu::Kernel* k = check_dispatch(e, tptg, "dispatchThreads:threadsPerThreadgroup:");
    Command c = dispatch_command(e, Command::kDispatchThreads, k);
    c.grid = to_dim(threads, "dispatchThreads");
    c.tptg = to_dim(tptg, "dispatchThreads");
    record_dispatch(e, std::move(c));
  });
  instance_method(E, "dispatchThreadgroupsWithIndirectBuffer:indirectBufferOffset:threadsPerThreadgroup:",
                  +[](FComputeEncoder* e, SEL, FBuffer* b, UInt offset, Size3 tptg) {
                    const char* what = "dispatchThreadgroupsWithIndirectBuffer:indirectBufferOffset:threadsPerThreadgroup:";
                    const msl_emu::Kernel* k = check_dispatch(e, tptg, what);
                    if (!b) refuse(std::string(what) + ": the indirect buffer is nil");
                    if (offset % 4 != 0) refuse(std::string(what) + ": indirectBufferOffset " + std::to_string(offset) + " is not a multiple of 4");
                    check_range(b, offset, 12, what, "indirect");
                    if (b->storage_mode() == kStorageMemoryless) refuse(std::string(what) + ": the indirect buffer is memoryless");
                    Command c = dispatch_command(e, Command::kDispatchIndirect, k);
                    c.indirect = b;
                    c.indirect_offset = offset;
                    c.tptg = to_dim(tptg, what);
                    record_dispatch(e, std::move(c), b);
                  });
  // Commands run one after another, so every barrier is already satisfied.
  instance_method(E, "memoryBarrierWithScope:", +[](FComputeEncoder* e, SEL, UInt) { e->check_open("memoryBarrierWithScope:"); });
  instance_method(E, "memoryBarrierWithResources:count:", +[](FComputeEncoder* e, SEL, Object* const*, UInt) {
    e->check_open("memoryBarrierWithResources:count:");
  });
  // Residency hints: all memory is resident.
  instance_method(E, "useResource:usage:", +[](FComputeEncoder* e, SEL, Object*, UInt) { e->check_open("useResource:usage:"); });
  instance_method(E, "useResources:count:usage:", +[](FComputeEncoder* e, SEL, Object* const*, UInt, UInt) {
    e->check_open("useResources:count:usage:");
  });
  instance_method(E, "dispatchType", +[](FComputeEncoder* e, SEL) { return e->dispatch_type; });
  instance_method(E, "endEncoding", +[](FComputeEncoder* e, SEL) { end_encoding(e); });
  instance_method(E, "device", +[](FComputeEncoder*, SEL) { return the_device(); });
  instance_method(E, "insertDebugSignpost:", +[](FComputeEncoder*, SEL, Object*) {});
  label_methods<FComputeEncoder>(E);
  debug_methods<FComputeEncoder>(E);

  // ---- MTLBlitCommandEncoder
  const char* L = "MTLBlitCommandEncoder";
  instance_method(L, "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:",
                  +[](FBlitEncoder* e, SEL, FBuffer* src, UInt src_off, FBuffer* dst, UInt dst_off, UInt size) {
                    const char* what = "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:";
                    e->check_open(what);
                    check_range(src, src_off, size, what, "source");
                    check_range(dst, dst_off, size, what, "destination");
                    Command c;
                    c.kind = Command::kCopy;
                    c.src = src;
                    c.dst = dst;
                    c.src_offset = src_off;
                    c.dst_offset = dst_off;
                    c.size = size;
                    record(e, std::move(c), {src, dst});
                  });
  instance_method(L, "fillBuffer:range:value:", +[](FBlitEncoder* e, SEL, FBuffer* b, NSRange r, uint8_t value) {
    e->check_open("fillBuffer:range:value:");
    check_range(b, r.location, r.length, "fillBuffer:range:value:", "destination");
    Command c;
    c.kind = Command::kFill;
    c.dst = b;
    c.dst_offset = r.location;
    c.size = r.length;
    c.value = value;
    record(e, std::move(c), {b});
  });
  // Shared and managed memory is one copy here; there is nothing to synchronise.
  instance_method(L, "synchronizeResource:", +[](FBlitEncoder* e, SEL, Object*) { e->check_open("synchronizeResource:"); });
  instance_method(L, "endEncoding", +[](FBlitEncoder* e, SEL) { end_encoding(e); });
  instance_method(L, "device", +[](FBlitEncoder*, SEL) { return the_device(); });
  label_methods<FBlitEncoder>(L);
  debug_methods<FBlitEncoder>(L);
}

}  // namespace fake_objc
