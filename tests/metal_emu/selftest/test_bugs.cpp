// test_bugs.cpp CASE -- each case runs one deliberately broken kernel of kernels/bugs.metal
// (or breaks a Metal limit) and checks that the emulator reports it.
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "check.h"
#include "msl_emu/runtime.h"

using namespace msl_emu;
using selftest::expect_error;
using selftest::kernel;
using selftest::report;

namespace {

std::vector<float> src(1024, 1.0f), dst(1024, 0.0f);

Bindings src_dst() {
  Bindings b;
  b.set_buffer(0, src.data());
  b.set_buffer(1, dst.data());
  return b;
}

// Threadgroup memory starts as NaN, so reading a slot no thread wrote yet shows.
void missing_barrier(Order order, bool must_fail) {
  Options o = options();
  o.order = order;
  Bindings b = src_dst();
  dispatch_threadgroups(kernel("missing_barrier"), b, {1, 1, 1}, {256, 1, 1}, o);
  bool wrong = !(dst[0] == 256.0f);
  std::string what = std::string("missing barrier gives a wrong sum in ") + order_name(order) + " order";
  if (must_fail) report(wrong, what, "dst[0] = " + std::to_string(dst[0]));
  else printf("     %s order: dst[0] = %g (this order happens to hide the bug)\n", order_name(order), dst[0]);
}

const std::map<std::string, std::function<void()>> cases = {
    {"missing_barrier",
     [] {
       missing_barrier(Order::Forward, true);
       missing_barrier(Order::Shuffle, true);
       missing_barrier(Order::Reverse, false);
     }},
    {"early_return",
     [] {
       Bindings b = src_dst();
       uint32_t n = 200;
       b.set_bytes(2, &n, sizeof n);
       try {
         dispatch_threadgroups(kernel("early_return"), b, {1, 1, 1}, {256, 1, 1});
         report(false, "early return before a barrier", "no error");
       } catch (const KernelError& e) {
         printf("     -> %s\n", e.what());
         bool file_ok = e.file.size() >= 10 && e.file.compare(e.file.size() - 10, 10, "bugs.metal") == 0;
         report(std::string(e.what()).find("barrier divergence") != std::string::npos, "early return -> barrier divergence");
         report(e.kernel == "early_return" && file_ok && e.line == 40 && e.thread >= 200,
                "KernelError names kernel, .metal file:line of the barrier and the returning thread",
                e.kernel + " " + e.file + ":" + std::to_string(e.line) + " thread " + std::to_string(e.thread));
       }
     }},
    {"divergent_simd_sum",
     [] {
       Bindings b = src_dst();
       expect_error("simd_sum under a lane-divergent if, then a barrier -> deadlock", "deadlock",
                    [&] { dispatch_threadgroups(kernel("divergent_simd_sum"), b, {1, 1, 1}, {64, 1, 1}); });
     }},
    {"split_simd_sum",
     [] {
       Bindings b = src_dst();
       expect_error("lanes of one simdgroup in two different simd_sum calls", "divergent simd collective",
                    [&] { dispatch_threadgroups(kernel("split_simd_sum"), b, {1, 1, 1}, {32, 1, 1}); });
     }},
    {"barrier_lines",
     [] {
       Bindings b;
       b.set_buffer(0, dst.data());
       expect_error("threads at barriers on different lines", "different threadgroup_barrier calls",
                    [&] { dispatch_threadgroups(kernel("barrier_lines"), b, {1, 1, 1}, {64, 1, 1}); });
     }},
    {"unbound_buffer",
     [] {
       Bindings b;
       b.set_buffer(0, src.data());
       expect_error("unbound [[buffer(1)]] is named", "[[buffer(1)]] of copy is not bound",
                    [&] { dispatch_threads(kernel("copy"), b, {64, 1, 1}, {64, 1, 1}); });
     }},
    {"tg_memory_limit",
     [] {
       Bindings b;
       b.set_buffer(0, dst.data());
       expect_error("36000 bytes of kernel-scope threadgroup memory refused", "threadgroup memory limit",
                    [&] { dispatch_threadgroups(kernel("too_much_tg_memory"), b, {1, 1, 1}, {32, 1, 1}); });
       expect_error("template kernel's threadgroup array counted at run time", "threadgroup memory limit",
                    [&] { dispatch_threadgroups(kernel("big_tg_f32"), b, {1, 1, 1}, {32, 1, 1}); });
       expect_error("setThreadgroupMemoryLength over 32 KiB refused", "exceed the threadgroup memory limit",
                    [&] { b.set_threadgroup_memory(0, 32768 + 16); });
       expect_error("setThreadgroupMemoryLength not a multiple of 16 refused", "multiple of 16",
                    [&] { b.set_threadgroup_memory(0, 100); });
       b.set_threadgroup_memory(0, 20000 - 20000 % 16);
       expect_error("16 KiB static + 19 KiB dynamic threadgroup memory refused", "threadgroup memory limit",
                    [&] { dispatch_threadgroups(kernel("half_tg_memory"), b, {1, 1, 1}, {32, 1, 1}); });
       b.set_threadgroup_memory(0, 4096);
       dispatch_threadgroups(kernel("half_tg_memory"), b, {1, 1, 1}, {32, 1, 1});
       report(dst[5] == 3.0f, "16 KiB static + 4 KiB dynamic runs");
     }},
    {"set_bytes_limit",
     [] {
       std::vector<char> big(4097);
       Bindings b;
       expect_error("setBytes of 4097 bytes refused", "4096", [&] { b.set_bytes(0, big.data(), big.size()); });
       b.set_bytes(0, big.data(), 4096);
       report(b.buffer(0) != nullptr, "setBytes of 4096 bytes accepted");
       expect_error("buffer index 31 refused", "above Metal's limit of 30", [&] { b.set_buffer(31, big.data()); });
     }},
    {"threads_limit",
     [] {
       Bindings b = src_dst();
       expect_error("1025 threads in one dimension refused", "each dimension is limited to 1024",
                    [&] { dispatch_threadgroups(kernel("copy"), b, {1, 1, 1}, {1025, 1, 1}); });
       expect_error("32x33 threads per threadgroup refused", "maxTotalThreadsPerThreadgroup of 1024",
                    [&] { dispatch_threadgroups(kernel("copy"), b, {1, 1, 1}, {32, 33, 1}); });
       expect_error("[[max_total_threads_per_threadgroup(64)]] enforced", "maxTotalThreadsPerThreadgroup of 64",
                    [&] { dispatch_threadgroups(kernel("limited"), b, {1, 1, 1}, {128, 1, 1}); });
       expect_error("a zero threadsPerThreadgroup refused", "zero dimension",
                    [&] { dispatch_threadgroups(kernel("copy"), b, {1, 1, 1}, {0, 1, 1}); });
       dst.assign(dst.size(), 7.0f);
       dispatch_threadgroups(kernel("copy"), b, {0, 1, 1}, {64, 1, 1});
       dispatch_threads(kernel("copy"), b, {0, 1, 1}, {64, 1, 1});
       report(dst[0] == 7.0f, "an empty grid runs nothing");
     }},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || !cases.count(argv[1])) {
    printf("usage: test_bugs CASE; cases:");
    for (auto& kv : cases) printf(" %s", kv.first.c_str());
    printf("\n");
    return 2;
  }
  try {
    cases.at(argv[1])();
  } catch (const KernelError& e) {
    report(false, "unexpected KernelError", e.what());
  }
  return selftest::summary();
}
