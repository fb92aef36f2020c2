// host_metal_cpp.cpp -- real metal-cpp host code on the fake Metal runtime.
//
//   host_metal_cpp run HOST_METAL   buffers, pipelines, one command buffer with several
//                                   dispatches (one indirect, sized by an earlier kernel),
//                                   blits, one wait; results, counters, errors, limits
//   host_metal_cpp unknown          sends a selector the fake doesn't implement (must abort)
//   host_metal_cpp selectors FILE   looks up every "Class +sel" / "Class -sel" line of FILE
//   host_metal_cpp methods          lists every method the fake implements
#include <Foundation/Foundation.hpp>
#include <Metal/Metal.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"
#include "msl_emu/counters.h"
#include "msl_emu/runtime.h"

extern "C" int msl_emu_objc_responds(const char* class_name, int class_method, const char* selector, const char** message);
extern "C" const char* msl_emu_objc_method_list();

using selftest::report;

namespace {

NS::String* str(const char* s) { return NS::String::string(s, NS::UTF8StringEncoding); }

std::string read_file(const char* path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

template <class F> void expect_refused(const char* what, const char* needle, F f) {
  try {
    f();
    report(false, what, "not refused");
  } catch (const std::exception& e) {
    bool ok = std::strstr(e.what(), needle) != nullptr;
    report(ok, what, ok ? "" : std::string("unexpected message: ") + e.what());
  }
}

MTL::ComputePipelineState* pipeline(MTL::Device* dev, MTL::Library* lib, const char* name) {
  MTL::Function* fn = lib->newFunction(str(name));
  if (!fn) {
    report(false, std::string("newFunctionWithName: ") + name);
    exit(1);
  }
  NS::Error* err = nullptr;
  MTL::ComputePipelineState* p = dev->newComputePipelineState(fn, &err);
  fn->release();
  if (!p) {
    report(false, std::string("pipeline ") + name, err ? err->localizedDescription()->utf8String() : "");
    exit(1);
  }
  return p;
}

int run(const char* metal_path) {
  NS::AutoreleasePool* pool = NS::AutoreleasePool::alloc()->init();
  msl_emu_reset_counters();

  // ---- device
  MTL::Device* dev = MTL::CreateSystemDefaultDevice();
  report(dev != nullptr && dev->name()->length() > 0, "MTL::CreateSystemDefaultDevice and name()");
  report(dev->maxThreadgroupMemoryLength() == 32768 && dev->hasUnifiedMemory() && dev->supportsFamily(MTL::GPUFamilyApple7) &&
             dev->supportsFamily(MTL::GPUFamilyApple9) && dev->maxThreadsPerThreadgroup().width == 1024 &&
             dev->recommendedMaxWorkingSetSize() > 0,
         "device limits: 32 KiB threadgroup memory, unified memory, Apple7..9, 1024 threads (stret)");
  NS::Array* all = MTL::CopyAllDevices();
  report(all->count() == 1 && all->object<MTL::Device>(0) == dev, "MTL::CopyAllDevices");
  all->release();

  // ---- libraries
  const std::string source = read_file(metal_path);
  MTL::CompileOptions* opts = MTL::CompileOptions::alloc()->init();
  opts->setFastMathEnabled(false);
  opts->setLanguageVersion(MTL::LanguageVersion3_1);
  NS::Object* mv[1] = {str("1")};
  NS::Object* mk[1] = {str("MARKBASE_EMU")};
  opts->setPreprocessorMacros(NS::Dictionary::dictionary(mv, mk, 1));
  NS::Error* err = nullptr;
  MTL::Library* lib = dev->newLibrary(str(source.c_str()), opts, &err);
  report(lib != nullptr, "newLibraryWithSource:options:error:", err ? err->localizedDescription()->utf8String() : "");
  if (!lib) return selftest::summary();
  report(lib->newFunction(str("no_such_kernel")) == nullptr, "newFunctionWithName: of a name not in the source is nil");
  report(lib->functionNames()->count() == 5, "functionNames lists the source's 5 kernels");
  err = nullptr;
  MTL::Library* bad = dev->newLibrary(str("kernel void not_compiled_in(device float* x [[buffer(0)]]) {}"), nullptr, &err);
  report(bad == nullptr && err && std::strstr(err->localizedDescription()->utf8String(), "not_compiled_in") &&
             err->code() == 3 && std::strcmp(err->domain()->utf8String(), "MTLLibraryErrorDomain") == 0,
         "a source kernel missing from the emulator build: nil + NSError naming it");
  err = nullptr;
  NS::URL* url = NS::URL::fileURLWithPath(str(metal_path));
  MTL::Library* lib2 = dev->newLibrary(url, &err);
  report(lib2 != nullptr && lib2->functionNames()->count() == 5, "newLibraryWithURL:error: reads the file");
  if (lib2) lib2->release();
  MTL::Library* deflib = dev->newDefaultLibrary();
  report(deflib != nullptr && deflib->functionNames()->count() >= 5, "newDefaultLibrary holds every compiled kernel");
  deflib->release();
  opts->release();

  MTL::ComputePipelineState* p_rms = pipeline(dev, lib, "rms_norm");
  MTL::ComputePipelineState* p_count = pipeline(dev, lib, "count_above");
  MTL::ComputePipelineState* p_args = pipeline(dev, lib, "make_dispatch_args");
  MTL::ComputePipelineState* p_mark = pipeline(dev, lib, "mark");
  MTL::ComputePipelineState* p_add = pipeline(dev, lib, "add_into");
  report(p_rms->maxTotalThreadsPerThreadgroup() == 1024 && p_rms->threadExecutionWidth() == 32 &&
             p_rms->staticThreadgroupMemoryLength() == 4,
         "pipeline: maxTotalThreadsPerThreadgroup 1024, threadExecutionWidth 32, static threadgroup memory 4 bytes");

  // ---- buffers
  const uint32_t rows = 4, ncols = 1000, n = rows * ncols;
  std::vector<float> x(n), w(ncols);
  for (uint32_t i = 0; i < n; ++i) x[i] = std::sin(0.37f * (float)i);
  for (uint32_t i = 0; i < ncols; ++i) w[i] = 0.5f + (float)(i % 7) * 0.125f;
  MTL::Buffer* bx = dev->newBuffer(x.data(), n * sizeof(float), MTL::ResourceStorageModeShared);
  MTL::Buffer* bw = dev->newBuffer(w.data(), ncols * sizeof(float), MTL::ResourceStorageModeShared);
  MTL::Buffer* by = dev->newBuffer(n * sizeof(float), MTL::ResourceStorageModeShared);
  MTL::Buffer* bcount = dev->newBuffer(16, MTL::ResourceStorageModeShared);
  MTL::Buffer* bargs = dev->newBuffer(64, MTL::ResourceStorageModePrivate);  // GPU-only, like real indirect args
  MTL::Buffer* bmarks = dev->newBuffer(n * sizeof(uint32_t), MTL::ResourceStorageModeShared);
  MTL::Buffer* bcopy = dev->newBuffer(n * sizeof(float), MTL::ResourceStorageModeShared);
  by->setLabel(MTLSTR("y"));
  report(std::strcmp(by->label()->utf8String(), "y") == 0 && by->length() == n * sizeof(float) && by->gpuAddress() != 0 &&
             bargs->contents() == nullptr && bx->storageMode() == MTL::StorageModeShared,
         "buffers: label (MTLSTR constant string), length, gpuAddress, private contents() is NULL");
  by->didModifyRange(NS::Range::Make(0, 16));

  // ---- one command buffer: rms_norm, count, make args, indirect mark, offsets, blits
  MTL::CommandQueue* queue = dev->newCommandQueue();
  MTL::CommandBuffer* cb = queue->commandBuffer();
  bool handler_ran = false;
  MTL::CommandBufferStatus handler_status = MTL::CommandBufferStatusNotEnqueued;
  cb->addCompletedHandler([&](MTL::CommandBuffer* c) {
    handler_ran = true;
    handler_status = c->status();
  });
  MTL::ComputeCommandEncoder* enc = cb->computeCommandEncoder(MTL::DispatchTypeSerial);
  struct {
    uint32_t ncols;
    float eps;
  } rargs{ncols, 1e-6f};
  enc->setComputePipelineState(p_rms);
  enc->setBytes(&rargs, sizeof rargs, 0);
  enc->setBuffer(bx, 0, 1);
  enc->setBuffer(bw, 0, 2);
  enc->setBuffer(by, 0, 3);
  enc->setThreadgroupMemoryLength(32 * sizeof(float), 0);
  enc->dispatchThreadgroups(MTL::Size(rows, 1, 1), MTL::Size(256, 1, 1));
  rargs.ncols = 0;  // setBytes copied the struct: changing it now must not matter

  const float threshold = 0.5f;
  enc->setComputePipelineState(p_count);
  enc->setBuffer(bx, 0, 0);
  enc->setBuffer(bcount, 0, 1);
  enc->setBytes(&threshold, sizeof threshold, 2);
  enc->dispatchThreads(MTL::Size(n, 1, 1), MTL::Size(64, 1, 1));
  enc->memoryBarrier(MTL::BarrierScopeBuffers);

  enc->setComputePipelineState(p_args);
  enc->setBuffer(bcount, 0, 0);
  enc->setBuffer(bargs, 16, 1);
  enc->dispatchThreadgroups(MTL::Size(1, 1, 1), MTL::Size(1, 1, 1));
  MTL::Resource* res[1] = {bargs};
  enc->memoryBarrier(res, 1);

  enc->setComputePipelineState(p_mark);
  enc->setBuffer(bmarks, 0, 0);
  enc->useResource(bargs, MTL::ResourceUsageRead);
  enc->dispatchThreadgroups(bargs, 16, MTL::Size(32, 1, 1));

  // add_into over the second half via offsets: y[n/2 + i] += x[n/2 + i]
  enc->setComputePipelineState(p_add);
  const MTL::Buffer* bufs[2] = {bx, by};
  const NS::UInteger offs[2] = {0, 0};
  enc->setBuffers(bufs, offs, NS::Range::Make(0, 2));
  enc->setBufferOffset(n / 2 * sizeof(float), 0);
  enc->setBufferOffset(n / 2 * sizeof(float), 1);
  enc->dispatchThreads(MTL::Size(n / 2, 1, 1), MTL::Size(128, 1, 1));
  enc->endEncoding();

  MTL::BlitCommandEncoder* blit = cb->blitCommandEncoder();
  blit->copyFromBuffer(by, 0, bcopy, 0, n * sizeof(float));
  blit->fillBuffer(bcopy, NS::Range::Make(0, 4 * sizeof(float)), 0);
  blit->endEncoding();

  report(cb->status() == MTL::CommandBufferStatusNotEnqueued, "nothing runs before commit");
  cb->commit();
  cb->waitUntilCompleted();
  report(cb->status() == MTL::CommandBufferStatusCompleted && cb->error() == nullptr, "command buffer completed");
  report(handler_ran && handler_status == MTL::CommandBufferStatusCompleted, "completed handler (a block) ran after execution");

  // ---- results
  std::vector<float> want(n);
  uint32_t above = 0;
  for (uint32_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (uint32_t i = 0; i < ncols; ++i) ss += (double)x[r * ncols + i] * x[r * ncols + i];
    float s = 1.0f / std::sqrt((float)(ss / ncols) + 1e-6f);
    for (uint32_t i = 0; i < ncols; ++i) want[r * ncols + i] = x[r * ncols + i] * s * w[i];
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (i >= n / 2) want[i] += x[i];
    if (x[i] > threshold) ++above;
  }
  std::vector<float> got((float*)by->contents(), (float*)by->contents() + n);
  selftest::check_close("rms_norm + add_into (setBytes, threadgroup memory, buffer offsets)", got, want, 1e-5f, 1e-6f);
  std::vector<float> copied((float*)bcopy->contents(), (float*)bcopy->contents() + n);
  std::vector<float> want_copy = want;
  for (int i = 0; i < 4; ++i) want_copy[i] = 0.0f;
  selftest::check_close("blit copy + fill", copied, want_copy, 1e-5f, 1e-6f);
  uint32_t count = *(uint32_t*)bcount->contents(), marked = 0;
  for (uint32_t i = 0; i < n; ++i) marked += ((uint32_t*)bmarks->contents())[i];
  char d[160];
  snprintf(d, sizeof d, "count %u (want %u), marked %u (want %u)", count, above, marked, (above + 31) / 32 * 32);
  report(count == above && marked == (above + 31) / 32 * 32,
         "indirect dispatch sized by a kernel earlier in the same command buffer", d);

  MslEmuCounters c = msl_emu_counters();
  snprintf(d, sizeof d, "committed %llu waits %llu dispatches %llu indirect %llu blits %llu", (unsigned long long)c.command_buffers_committed,
           (unsigned long long)c.waits, (unsigned long long)c.dispatches, (unsigned long long)c.indirect_dispatches,
           (unsigned long long)c.blits);
  report(c.command_buffers_committed == 1 && c.waits == 1 && c.dispatches == 5 && c.indirect_dispatches == 1 && c.blits == 2,
         "counters: 1 commit, 1 wait, 5 dispatches (1 indirect), 2 blits", d);

  // ---- a kernel error fails the command buffer and skips the rest
  MTL::CommandBuffer* cb2 = queue->commandBufferWithUnretainedReferences();
  MTL::ComputeCommandEncoder* e2 = cb2->computeCommandEncoder();
  e2->setComputePipelineState(p_mark);  // [[buffer(0)]] left unbound
  e2->dispatchThreads(MTL::Size(32, 1, 1), MTL::Size(32, 1, 1));
  e2->setBuffer(bmarks, 0, 0);
  e2->dispatchThreads(MTL::Size(32, 1, 1), MTL::Size(32, 1, 1));
  e2->endEncoding();
  msl_emu_reset_counters();
  cb2->commit();
  cb2->waitUntilCompleted();
  NS::Error* e = cb2->error();
  report(cb2->status() == MTL::CommandBufferStatusError && e && std::strstr(e->localizedDescription()->utf8String(), "[[buffer(0)]] of mark is not bound") &&
             msl_emu_counters().dispatches == 1,
         "kernel error: status Error, NSError with the KernelError text, later commands skipped",
         e ? e->localizedDescription()->utf8String() : "no error");

  // ---- Metal's rules, refused when encoded
  MTL::CommandBuffer* cb3 = queue->commandBuffer();
  MTL::ComputeCommandEncoder* e3 = cb3->computeCommandEncoder();
  e3->setComputePipelineState(p_mark);
  e3->setBuffer(bmarks, 0, 0);
  std::vector<char> big(5000);
  expect_refused("setBytes over 4 KiB", "4096-byte limit", [&] { e3->setBytes(big.data(), big.size(), 1); });
  expect_refused("buffer index 31", "above Metal's limit of 30", [&] { e3->setBuffer(bx, 0, 31); });
  expect_refused("buffer offset past the end", "not inside the buffer", [&] { e3->setBuffer(bx, n * sizeof(float), 1); });
  expect_refused("threadgroup memory over 32 KiB", "exceed the threadgroup memory limit", [&] { e3->setThreadgroupMemoryLength(40960, 0); });
  expect_refused("2048 threads per threadgroup", "exceeds the device's maxThreadsPerThreadgroup",
                 [&] { e3->dispatchThreadgroups(MTL::Size(1, 1, 1), MTL::Size(2048, 1, 1)); });
  expect_refused("32x64 threads per threadgroup", "maxTotalThreadsPerThreadgroup of 1024",
                 [&] { e3->dispatchThreadgroups(MTL::Size(1, 1, 1), MTL::Size(32, 64, 1)); });
  expect_refused("indirect offset not 4-aligned", "not a multiple of 4", [&] { e3->dispatchThreadgroups(bargs, 2, MTL::Size(32, 1, 1)); });
  expect_refused("a second open encoder", "another encoder", [&] { cb3->blitCommandEncoder(); });
  e3->dispatchThreadgroups(MTL::Size(0, 1, 1), MTL::Size(32, 1, 1));  // empty grid: a no-op
  e3->endEncoding();
  expect_refused("waitUntilCompleted before commit", "never committed", [&] { cb3->waitUntilCompleted(); });
  cb3->commit();
  expect_refused("commit twice", "already committed", [&] { cb3->commit(); });

  // ---- no-copy buffers: page (16 KiB) alignment of pointer and length, as on Apple silicon
  const size_t page = 16384;
  void* mem = aligned_alloc(page, 2 * page);
  static bool freed;
  freed = false;
  MTL::Buffer* nc = dev->newBuffer(mem, 2 * page, MTL::ResourceStorageModeShared, ^(void* p, NS::UInteger) {
    freed = true;
    free(p);
  });
  report(nc != nullptr && nc->contents() == mem, "newBufferWithBytesNoCopy: aligned pointer and length accepted");
  void* mem2 = aligned_alloc(page, 2 * page);
  report(dev->newBuffer((char*)mem2 + 64, page, MTL::ResourceStorageModeShared, nullptr) == nullptr,
         "newBufferWithBytesNoCopy: unaligned pointer gives nil");
  report(dev->newBuffer(mem2, page + 4, MTL::ResourceStorageModeShared, nullptr) == nullptr,
         "newBufferWithBytesNoCopy: unaligned length gives nil");
  free(mem2);
  if (nc) nc->release();
  report(freed, "the no-copy buffer's deallocator block ran on release");

  for (MTL::ComputePipelineState* p : {p_rms, p_count, p_args, p_mark, p_add}) p->release();
  for (MTL::Buffer* b : {bx, bw, by, bcount, bargs, bmarks, bcopy}) b->release();
  queue->release();
  lib->release();
  pool->release();
  return selftest::summary();
}

int unknown() {
  MTL::Device* dev = MTL::CreateSystemDefaultDevice();
  dev->newSharedEvent();  // not implemented by the fake: must abort with a clear message
  printf("newSharedEvent returned\n");
  return 0;
}

int selectors(const char* path) {
  std::ifstream f(path);
  std::string cls, sel;
  int implemented = 0, missing = 0;
  while (f >> cls >> sel) {
    const char* msg = nullptr;
    int ok = msl_emu_objc_responds(cls.c_str(), sel[0] == '+', sel.c_str() + 1, &msg);
    printf("%s %s %s\n", cls.c_str(), sel.c_str(), ok ? "implemented" : msg);
    (ok ? implemented : missing)++;
  }
  printf("summary: %d implemented, %d not implemented\n", implemented, missing);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && !std::strcmp(argv[1], "run")) return run(argv[2]);
  if (argc == 2 && !std::strcmp(argv[1], "unknown")) return unknown();
  if (argc == 3 && !std::strcmp(argv[1], "selectors")) return selectors(argv[2]);
  if (argc == 2 && !std::strcmp(argv[1], "methods")) return printf("%s", msl_emu_objc_method_list()) < 0;
  fprintf(stderr, "usage: host_metal_cpp run HOST_METAL | unknown | selectors FILE | methods\n");
  return 2;
}
