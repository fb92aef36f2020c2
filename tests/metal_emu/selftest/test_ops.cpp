// test_ops.cpp -- runs the kernels of kernels/ops.metal on the emulator and compares each
// with a plain C++ reference. The schedule order comes from MSL_EMU_ORDER (pytest runs this
// program once per order).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "msl_emu/runtime.h"

using namespace msl_emu;
using selftest::check_close;
using selftest::kernel;
using selftest::report;

namespace {

constexpr uint32_t kMathOps = 32;
constexpr uint32_t kSimdOut = 24;

void test_math() {
  std::vector<float> x;
  for (int i = 0; i < 600; ++i) x.push_back(-3.0f + 6.0f * (float)i / 599.0f);
  for (float v : {0.0f, -0.5f, 0.5f, 1.5f, 2.5f, -2.5f}) x.push_back(v);
  uint32_t n = (uint32_t)x.size();
  std::vector<float> out(n * kMathOps, -1.0f), want(n * kMathOps);
  for (uint32_t i = 0; i < n; ++i) {
    float v = x[i], a = std::fabs(v) + 0.1f, *w = &want[i * kMathOps];
    w[0] = std::exp(v);
    w[1] = std::exp2(v);
    w[2] = std::log(a);
    w[3] = std::log2(a);
    w[4] = std::tanh(v);
    w[5] = std::sqrt(a);
    w[6] = 1.0f / std::sqrt(a);
    w[7] = std::fabs(v);
    w[8] = std::fmax(v, 0.25f);
    w[9] = std::fmin(v, 0.25f);
    w[10] = std::max(v, -0.5f);
    w[11] = std::min(v, 0.5f);
    w[12] = std::min(std::max(v, -0.5f), 0.5f);
    w[13] = std::pow(a, 1.5f);
    w[14] = std::sin(v);
    w[15] = std::cos(v);
    w[16] = std::sin(v) + std::cos(v) * 1.57079632679f;
    w[17] = std::floor(v);
    w[18] = std::ceil(v);
    w[19] = std::round(v);
    w[20] = std::rint(v);
    w[21] = v > 0.0f ? 1.0f : -1.0f;
    w[22] = v + (2.0f - v) * 0.25f;
    w[23] = std::copysign(2.0f, v);
    w[24] = 0.0f;
    w[25] = std::fabs(v);
    w[26] = 0.0f;
    w[27] = v - std::floor(v);
    w[28] = std::trunc(v);
    w[29] = std::fmod(v, 0.75f);
    w[30] = std::atan2(v, 0.5f);
    w[31] = (v < 0.0f ? 0.0f : 1.0f) + (v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : 0.0f));
  }
  Bindings b;
  b.set_buffer(0, x.data());
  b.set_buffer(1, out.data());
  b.set_bytes(2, &n, sizeof n);
  dispatch_threads(kernel("math_ops"), b, {n, 1, 1}, {64, 1, 1});
  check_close("math_ops: 32 math functions x " + std::to_string(n) + " values", out, want, 2e-6f, 2e-6f);
}

void test_vectors() {
  std::vector<float> out(64, -12345.0f);
  const uint8_t q[4] = {0x12, 0x34, 0x56, 0x78};
  const _Float16 h[4] = {1, 2, 3, 4};
  Bindings b;
  b.set_buffer(0, out.data());
  b.set_buffer(1, (void*)q);
  b.set_buffer(2, (void*)h);
  dispatch_threadgroups(kernel("vector_ops"), b, {1, 1, 1}, {1, 1, 1});
  const std::vector<float> want = {
      2, 1, 3, 4,          // float4(b, a.zw)
      121,                 // float3(a.x, b)
      2, 1,                // e.xy = e.yx
      29,                  // dot
      5, 0.8f,             // length, normalize
      5,                   // clamp with scalar bounds
      20, 16,              // uchar4 nibbles converted to float4
      24,                  // half4 arithmetic, static_cast<float4>
      0.001953125f,        // half rounding after each operation
      1, 128,              // as_type
      1,                   // int4 abs/max/min
      7, 1, 1,             // select, all, any
      17, 16,              // packed_float3, float3 sizes
      1,                   // bfloat rounding
      65504,               // numeric_limits<half>::max
      1, 1,                // INFINITY, numeric_limits<float>::infinity
      4 + 1.57079632679f,  // constant globals
      3.5f,                // struct from the shared header
      42,                  // popcount + clz + ctz
      65536,               // ushort promotion
      14,                  // fma
      65504,               // half max
  };
  out.resize(want.size());
  check_close("vector_ops: constructors, swizzles, half, packed, as_type, constants", out, want, 1e-6f, 1e-7f);
}

// Reference for one thread of simd_ops, given its simdgroup's active lanes' values.
void simd_reference(const float* v, uint32_t active, uint32_t lane, uint32_t sg, float* w) {
  auto at = [&](int src) { return (src >= 0 && src < (int)active) ? v[src] : v[lane]; };
  float sum = 0, prod = 1, mx = -INFINITY, mn = INFINITY, ex = 0, in = 0;
  uint32_t band = ~0u, bor = 0, bxor = 0;
  uint64_t ballot = 0;
  for (uint32_t l = 0; l < active; ++l) {
    uint32_t u = (uint32_t)(v[l] * 4.0f) & 0xFFu;
    sum += v[l];
    prod *= l < 4 ? v[l] : 1.0f;
    mx = std::max(mx, v[l]);
    mn = std::min(mn, v[l]);
    band &= u | 0x100u;
    bor |= u;
    bxor ^= u;
    if (l < lane) ex += v[l];
    if (l <= lane) in += v[l];
    if (l % 3 == 0) ballot |= 1ull << l;
  }
  uint32_t qbase = lane & ~3u;
  float qsum = 0;
  for (uint32_t l = qbase; l < qbase + 4; ++l)
    if (l < active) qsum += v[l];
  w[0] = sum;
  w[1] = prod;
  w[2] = mx;
  w[3] = mn;
  w[4] = (float)band;
  w[5] = (float)bor;
  w[6] = (float)bxor;
  w[7] = ex;
  w[8] = in;
  w[9] = at((lane * 7) % 32);
  w[10] = at(lane + 3);
  w[11] = at((int)lane - 2);
  w[12] = at(lane ^ 1);
  w[13] = at(4);
  w[14] = v[0];
  w[15] = (float)ballot;
  w[16] = 1;
  w[17] = active > 5 ? 1 : 0;
  w[18] = lane == 0 ? 1 : 0;
  w[19] = qsum;
  w[20] = at((int)(qbase | ((lane & 3) ^ 1)));
  w[21] = at((lane + 1) & 31);
  w[22] = 2 * sum + (float)active * (float)sg;
  w[23] = (float)(1u << std::min(lane + 1, 5u));
}

void test_simd(const char* what, uint32_t nthreads, uint32_t tg, bool threads) {
  std::vector<float> in(nthreads), out(nthreads * kSimdOut, -1.0f), want(nthreads * kSimdOut);
  for (uint32_t i = 0; i < nthreads; ++i) in[i] = 1.0f + (float)((i * 37) % 23) * 0.25f;
  for (uint32_t g = 0; g < nthreads; g += tg) {
    uint32_t tg_n = std::min(tg, nthreads - g);
    for (uint32_t t = 0; t < tg_n; ++t) {
      uint32_t sg = t / 32, lane = t % 32, active = std::min(32u, tg_n - sg * 32);
      simd_reference(&in[g + sg * 32], active, lane, sg, &want[(g + t) * kSimdOut]);
    }
  }
  Bindings b;
  b.set_buffer(0, in.data());
  b.set_buffer(1, out.data());
  if (threads) dispatch_threads(kernel("simd_ops"), b, {nthreads, 1, 1}, {tg, 1, 1});
  else dispatch_threadgroups(kernel("simd_ops"), b, {nthreads / tg, 1, 1}, {tg, 1, 1});
  check_close(what, out, want, 1e-6f, 1e-6f);
}

void test_tg_reduce(uint32_t tg) {
  const uint32_t rows = 8, n = 1000;
  struct {
    uint32_t n;
    float scale;
  } args{n, 0.5f};
  std::vector<float> x(rows * n), sums(rows, -1), y(rows * n, -1), want_s(rows), want_y(rows * n);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(0.5f, 1.5f);
  for (float& v : x) v = d(rng);
  for (uint32_t r = 0; r < rows; ++r) {
    double s = 0;
    for (uint32_t i = 0; i < n; ++i) s += x[r * n + i];
    want_s[r] = (float)s * 0.5f;
    for (uint32_t i = 0; i < n; ++i) want_y[r * n + i] = x[r * n + i] / want_s[r];
  }
  Bindings b;
  b.set_bytes(0, &args, sizeof args);
  b.set_buffer(1, x.data());
  b.set_buffer(2, sums.data());
  b.set_buffer(3, y.data());
  b.set_threadgroup_memory(0, 32 * sizeof(float));
  dispatch_threadgroups(kernel("tg_reduce"), b, {rows, 1, 1}, {tg, 1, 1});
  std::string w = "tg_reduce tg=" + std::to_string(tg) + ": barriers, threadgroup memory, shared-header helper";
  check_close(w + " (sums)", sums, want_s, 1e-5f);
  check_close(w + " (rows)", y, want_y, 1e-5f);
}

void test_grid_ids() {
  const Dim3 n{37, 5, 3}, t{8, 4, 2};
  const Dim3 g{(n.x + t.x - 1) / t.x, (n.y + t.y - 1) / t.y, (n.z + t.z - 1) / t.z};
  size_t total = (size_t)n.x * n.y * n.z;
  std::vector<uint32_t> out(total * 16, 0xdeadbeef);
  Bindings b;
  b.set_buffer(0, out.data());
  dispatch_threads(kernel("grid_ids"), b, n, t);
  size_t bad = 0;
  for (uint32_t z = 0; z < n.z; ++z)
    for (uint32_t y = 0; y < n.y; ++y)
      for (uint32_t x = 0; x < n.x; ++x) {
        const uint32_t* o = &out[((z * n.y + y) * n.x + x) * 16];
        uint32_t vx = std::min(t.x, n.x - x / t.x * t.x), vy = std::min(t.y, n.y - y / t.y * t.y),
                 vz = std::min(t.z, n.z - z / t.z * t.z);
        uint32_t tx = x % t.x, ty = y % t.y, tz = z % t.z;
        uint32_t tidx = tx + ty * vx + tz * vx * vy;
        const uint32_t want[16] = {x, y, z, tx, ty, tz, x / t.x, y / t.y, z / t.z, vx * vy * vz, t.x * t.y * t.z,
                                   g.x * 1000 + g.y, tidx, tidx % 32, tidx / 32, 32};
        if (std::memcmp(o, want, sizeof want) != 0) ++bad;
      }
  report(bad == 0, "grid_ids: uint3/ushort3/uint2 builtins of a non-uniform dispatchThreads grid",
         bad ? std::to_string(bad) + " threads wrong" : "");
}

void test_atomics() {
  uint32_t counter = 0, cas = 0;
  float fsum = 0;
  int32_t imax = -1000, imin = 1000;
  std::vector<uint32_t> per_tg(10, 0);
  Bindings b;
  b.set_buffer(0, &counter);
  b.set_buffer(1, &fsum);
  b.set_buffer(2, &imax);
  b.set_buffer(3, &imin);
  b.set_buffer(4, per_tg.data());
  b.set_buffer(5, &cas);
  dispatch_threadgroups(kernel("atomics"), b, {10, 1, 1}, {64, 1, 1});
  bool tg_ok = std::all_of(per_tg.begin(), per_tg.end(), [](uint32_t v) { return v == 64 * 65 / 2; });
  char d[200];
  snprintf(d, sizeof d, "counter %u fsum %g max %d min %d cas %u tg[0] %u", counter, fsum, imax, imin, cas, per_tg[0]);
  report(counter == 640 && fsum == 320.0f && imax == 539 && imin == -100 && cas == 1280 && tg_ok,
         "atomics: device and threadgroup, add/max/min/CAS/float", d);
}

void test_sgmm() {
  const uint32_t M = 32, N = 24, K = 40;
  struct {
    uint32_t M, N, K;
  } args{M, N, K};
  std::vector<float> A(M * K), Bt(N * K), C(M * N, -1), want(M * N);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1, 1);
  for (float& v : A) v = d(rng);
  for (float& v : Bt) v = d(rng);
  for (uint32_t i = 0; i < M; ++i)
    for (uint32_t j = 0; j < N; ++j) {
      double s = 0;
      for (uint32_t k = 0; k < K; ++k) s += (double)A[i * K + k] * Bt[j * K + k];
      want[i * N + j] = (float)s;
    }
  Bindings b;
  b.set_bytes(0, &args, sizeof args);
  b.set_buffer(1, A.data());
  b.set_buffer(2, Bt.data());
  b.set_buffer(3, C.data());
  dispatch_threadgroups(kernel("sgmm_f32"), b, {(N + 15) / 16, (M + 15) / 16, 1}, {128, 1, 1});
  check_close("sgmm_f32: simdgroup_float8x8 load (origin, stride, transpose) / multiply_accumulate / store", C, want, 1e-5f, 1e-5f);

  std::vector<_Float16> a(64), bb(64);
  std::vector<float> D(64, -1), wd(64);
  for (int i = 0; i < 64; ++i) {
    a[i] = (_Float16)((float)((i * 5) % 9 - 4) / 8.0f);
    bb[i] = (_Float16)((float)((i * 3) % 7 - 3) / 4.0f);
  }
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c) {
      float s = 0;
      for (int k = 0; k < 8; ++k) s += (float)a[r * 8 + k] * (float)bb[k * 8 + c];
      wd[c * 8 + r] = s;
    }
  Bindings h;
  h.set_buffer(0, a.data());
  h.set_buffer(1, bb.data());
  h.set_buffer(2, D.data());
  dispatch_threadgroups(kernel("sgmm_f16_tile"), h, {1, 1, 1}, {32, 1, 1});
  check_close("sgmm_f16_tile: simdgroup_half8x8 from threadgroup memory, multiply, transposed store", D, wd, 0, 1e-6f);
}

void test_axpy() {
  const uint32_t n = 1000;
  float alpha = 1.5f;
  std::vector<float> x(n), y(n), want(n);
  std::vector<_Float16> xh(n), yh(n);
  for (uint32_t i = 0; i < n; ++i) {
    x[i] = (float)(i % 17) * 0.25f;
    y[i] = (float)(i % 5);
    want[i] = alpha * x[i] + y[i];
    xh[i] = (_Float16)x[i];
    yh[i] = (_Float16)y[i];
  }
  Bindings b;
  b.set_buffer(0, x.data());
  b.set_buffer(1, y.data());
  b.set_bytes(2, &alpha, sizeof alpha);
  dispatch_threads(kernel("axpy_f32"), b, {n, 1, 1}, {64, 1, 1});
  check_close("axpy_f32: template kernel registered by host_name", y, want);
  Bindings bh;
  bh.set_buffer(0, xh.data());
  bh.set_buffer(1, yh.data());
  bh.set_bytes(2, &alpha, sizeof alpha);
  dispatch_threads(kernel("axpy_f16"), bh, {n, 1, 1}, {64, 1, 1});
  std::vector<float> got(n);
  for (uint32_t i = 0; i < n; ++i) got[i] = (float)yh[i];
  check_close("axpy_f16: the half instantiation", got, want, 1e-3f);
}

}  // namespace

int main() {
  Options o = options();
  printf("order %s, seed %llu, workers %d\n", order_name(o.order), (unsigned long long)o.seed, o.workers);
  try {
    test_math();
    test_vectors();
    test_simd("simd_ops: 32-lane collectives, 50 threads in a threadgroup of 64 (partial simdgroup)", 50, 64, true);
    test_simd("simd_ops: 3 full simdgroups x 2 threadgroups", 192, 96, false);
    test_tg_reduce(256);
    test_tg_reduce(96);
    test_tg_reduce(32);
    test_grid_ids();
    test_atomics();
    test_sgmm();
    test_axpy();
  } catch (const KernelError& e) {
    report(false, "unexpected KernelError", e.what());
  }
  return selftest::summary();
}
