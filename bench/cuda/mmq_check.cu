// Correctness and speed of the int8 tensor-core prefill products (cpp/backend/cuda/matmul_q8.cu)
// on the Gemma 4 26B-A4B and E4B shapes. Build and run on the GPU machine, from the repository root:
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -I cpp \
//     bench/cuda/mmq_check.cu cpp/backend/cuda/matmul_q8.cu cpp/backend/cuda/matvec_q8.cu -o /tmp/mmq && /tmp/mmq
// Part 1 (one product per launch, matmul_q8, as the MoE experts and the backend's fallback call
// it): checks 4096 sampled outputs of every product against a float64 reference computed from the
// very codes and scales the GPU used (the activation rows are quantized by quantize_q8 there), then
// times each product (median of 30 launches, CUDA events). Prints one line per shape.
// Part 2 (matmul_q8_jobs: several products in one launch, split K): for each shape, every tile
// width and split count, and the launch plan's own choice: the same check over all jobs' outputs,
// no output left unwritten (NaN), the same bits after 20 more launches (determinism of the split
// sums), and the median time; then the jobs launched one by one (each with its own plan) against
// the plan's single launch.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"

using namespace markbase::cuda;

#define CK(x)                                                                             \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

static std::mt19937 rng(7);

// The median time of n launches (CUDA events on the default stream) after 3 warm-ups, in us.
template <class F>
static double median_us(int n, F&& launch) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int it = 0; it < n + 3; ++it) {
    CK(cudaEventRecord(e0));
    launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (it >= 3) ms.push_back(t);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[ms.size() / 2];
}

// N rows of K weights (E experts stacked) in GGML's Q4_0 (18-byte blocks) or Q8_0 (34-byte).
static std::vector<uint8_t> make_weights(int type, size_t rows, int K) {
  const int bb = type == 2 ? 18 : 34;
  std::vector<uint8_t> w(rows * (K / 32) * bb);
  std::uniform_real_distribution<float> sd(0.004f, 0.02f);
  for (size_t blk = 0; blk < w.size() / bb; ++blk) {
    uint8_t* p = &w[blk * bb];
    const __half d = __float2half(sd(rng));
    std::memcpy(p, &d, 2);
    for (int i = 2; i < bb; ++i) p[i] = static_cast<uint8_t>(rng());
  }
  return w;
}

static int code(int type, const uint8_t* row, int k) {  // weight k's integer code (offset removed)
  if (type == 2) {
    const uint8_t* b = row + 18 * (k / 32);
    const int j = k % 32;
    return (j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4)) - 8;
  }
  return static_cast<int8_t>(row[34 * (k / 32) + 2 + k % 32]);
}
static float wscale(int type, const uint8_t* row, int b) {
  __half d;
  std::memcpy(&d, row + (type == 2 ? 18 : 34) * b, 2);
  return __half2float(d);
}

struct Case {
  const char* name;
  int type, M, N, K;
  int experts = 0, k = 0;  // grouped: M tokens x k slots over `experts` experts (a_div = k or 1)
  bool per_entry_rows = false;  // grouped down product: one activation row per entry
};

static void run(const Case& c) {
  const int E = std::max(c.experts, 1);
  const size_t row_bytes = static_cast<size_t>(c.K / 32) * (c.type == 2 ? 18 : 34);
  std::vector<uint8_t> hw = make_weights(c.type, static_cast<size_t>(E) * c.N, c.K);
  const int n_entries = c.experts ? c.M * c.k : c.M;
  const int a_rows = c.experts && !c.per_entry_rows ? c.M : n_entries;
  std::vector<float> ha(static_cast<size_t>(a_rows) * c.K);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : ha) v = nd(rng);

  // Grouped: random experts per token (distinct within a token), sorted entries, 64-entry tiles.
  std::vector<int> order, tiles;
  if (c.experts) {
    std::vector<std::vector<int>> by(E);
    for (int t = 0; t < c.M; ++t) {
      std::vector<int> ids(E);
      for (int e = 0; e < E; ++e) ids[e] = e;
      std::shuffle(ids.begin(), ids.end(), rng);
      for (int j = 0; j < c.k; ++j) by[ids[j]].push_back(t * c.k + j);
    }
    for (int e = 0; e < E; ++e) {
      for (size_t s = 0; s < by[e].size(); s += kMatmulBM) {
        tiles.push_back(e);
        tiles.push_back(static_cast<int>(order.size() + s));
        tiles.push_back(static_cast<int>(std::min<size_t>(kMatmulBM, by[e].size() - s)));
      }
      order.insert(order.end(), by[e].begin(), by[e].end());
    }
  }
  const int n_tiles = static_cast<int>(tiles.size() / 3);

  uint8_t* dw;
  float *da, *dout, *dq_scales;
  signed char* dq;
  int *dorder = nullptr, *dtiles = nullptr, *dn = nullptr;
  CK(cudaMalloc(&dw, hw.size()));
  CK(cudaMalloc(&da, ha.size() * 4));
  CK(cudaMalloc(&dq, static_cast<size_t>(a_rows) * c.K));
  CK(cudaMalloc(&dq_scales, static_cast<size_t>(a_rows) * c.K / 32 * 4));
  const int out_rows = c.experts ? n_entries : c.M;
  CK(cudaMalloc(&dout, static_cast<size_t>(out_rows) * c.N * 4));
  CK(cudaMemcpy(dw, hw.data(), hw.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(da, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice));
  Grouped g;
  if (c.experts) {
    CK(cudaMalloc(&dorder, order.size() * 4));
    CK(cudaMalloc(&dtiles, tiles.size() * 4));
    CK(cudaMalloc(&dn, 4));
    CK(cudaMemcpy(dorder, order.data(), order.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dtiles, tiles.data(), tiles.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dn, &n_tiles, 4, cudaMemcpyHostToDevice));
    g.order = dorder;
    g.tiles = dtiles;
    g.n_tiles = dn;
    g.max_tiles = n_tiles + 8;  // surplus blocks must exit
    g.a_div = c.per_entry_rows ? 1 : c.k;
  }
  WeightRef w;
  w.data = dw;
  w.type = c.type;
  w.K = c.K;
  w.row_bytes = row_bytes;
  w.expert_bytes = static_cast<size_t>(c.N) * row_bytes;
  const Q8Vec q{dq, dq_scales};
  quantize_q8(nullptr, da, c.K, c.K, a_rows, q, c.K);
  CK(cudaMemset(dout, 0xFF, static_cast<size_t>(out_rows) * c.N * 4));  // NaN: unwritten outputs show
  matmul_q8(nullptr, w, c.N, q, c.K, c.M * (c.experts ? c.k : 1), dout, c.N, c.experts ? &g : nullptr);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  std::vector<signed char> hq(static_cast<size_t>(a_rows) * c.K);
  std::vector<float> hs(static_cast<size_t>(a_rows) * c.K / 32), ho(static_cast<size_t>(out_rows) * c.N);
  CK(cudaMemcpy(hq.data(), dq, hq.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hs.data(), dq_scales, hs.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ho.data(), dout, ho.size() * 4, cudaMemcpyDeviceToHost));
  size_t nan = 0;
  for (float v : ho) nan += std::isnan(v);
  std::vector<int> expert_of(out_rows, 0);
  for (size_t t = 0; t < tiles.size(); t += 3)
    for (int i = 0; i < tiles[t + 2]; ++i) expert_of[order[tiles[t + 1] + i]] = tiles[t];
  double num = 0, den = 0;
  for (int s = 0; s < 4096; ++s) {
    const int o = static_cast<int>(rng() % out_rows), n = static_cast<int>(rng() % c.N);
    const int ar = c.experts && !c.per_entry_rows ? o / c.k : o;
    const uint8_t* row = hw.data() + (static_cast<size_t>(expert_of[o]) * c.N + n) * row_bytes;
    double ref = 0;
    for (int b = 0; b < c.K / 32; ++b) {
      long long isum = 0;
      for (int i = 0; i < 32; ++i) isum += static_cast<long long>(hq[static_cast<size_t>(ar) * c.K + 32 * b + i]) * code(c.type, row, 32 * b + i);
      ref += static_cast<double>(isum) * hs[static_cast<size_t>(ar) * (c.K / 32) + b] * wscale(c.type, row, b);
    }
    const double got = ho[static_cast<size_t>(o) * c.N + n];
    num += (got - ref) * (got - ref);
    den += ref * ref;
  }
  // Timing: 30 launches after 3 warm-ups, the median.
  const double t = median_us(30, [&] {
    matmul_q8(nullptr, w, c.N, q, c.K, c.M * (c.experts ? c.k : 1), dout, c.N, c.experts ? &g : nullptr);
  }) * 1e-6;
  const double ops = 2.0 * n_entries * c.N * c.K;
  const double bytes = static_cast<double>(hw.size()) + static_cast<double>(a_rows) * c.K * 1.125;
  std::printf("%-28s %-5s M=%5d N=%5d K=%5d  rel_err %.2e  nan %zu  %8.1f us  %6.1f TOPS  %6.0f GB/s\n", c.name,
              c.type == 2 ? "q4_0" : "q8_0", n_entries, c.N, c.K, std::sqrt(num / den), nan, t * 1e6, ops / t / 1e12,
              bytes / t / 1e9);
  cudaFree(dw); cudaFree(da); cudaFree(dq); cudaFree(dq_scales); cudaFree(dout);
  if (dorder) { cudaFree(dorder); cudaFree(dtiles); cudaFree(dn); }
}


// --- Part 2: several products in one launch, and split K.
struct JobsCase {
  const char* name;
  int type, M, K;
  std::vector<int> n;
};

struct Sample {
  int job, m, n;
  double ref;
};

static void run_jobs(const JobsCase& c) {
  const int J = static_cast<int>(c.n.size());
  const size_t row_bytes = static_cast<size_t>(c.K / 32) * (c.type == 2 ? 18 : 34);
  std::vector<std::vector<uint8_t>> hw(J);
  std::vector<uint8_t*> dw(J);
  std::vector<float*> dout(J);
  std::vector<int> stride(J);
  size_t total_n = 0;
  for (int j = 0; j < J; ++j) {
    hw[j] = make_weights(c.type, c.n[j], c.K);
    CK(cudaMalloc(&dw[j], hw[j].size()));
    CK(cudaMemcpy(dw[j], hw[j].data(), hw[j].size(), cudaMemcpyHostToDevice));
    stride[j] = c.n[j] + 16;  // outputs narrower than their rows, as the backend's slots may be
    CK(cudaMalloc(&dout[j], static_cast<size_t>(c.M) * stride[j] * 4));
    total_n += c.n[j];
  }
  std::vector<float> ha(static_cast<size_t>(c.M) * c.K);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : ha) v = nd(rng);
  float *da, *dq_scales;
  signed char* dq;
  CK(cudaMalloc(&da, ha.size() * 4));
  CK(cudaMalloc(&dq, ha.size()));
  CK(cudaMalloc(&dq_scales, ha.size() / 32 * 4));
  CK(cudaMemcpy(da, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice));
  const Q8Vec q{dq, dq_scales};
  quantize_q8(nullptr, da, c.K, c.K, c.M, q, c.K);
  // Scratch for the largest forced split (8 parts of 128-column tiles), plus the counters.
  MatmulQ8Scratch scratch;
  scratch.bytes = (1 << 20) + static_cast<size_t>((c.M + 63) / 64 * 64) * (total_n + 128 * J) * 8 * 4;
  CK(cudaMalloc(&scratch.p, scratch.bytes));
  CK(cudaMemset(scratch.p, 0, scratch.bytes));

  MatmulQ8Jobs jobs;
  for (int j = 0; j < J; ++j) {
    WeightRef& w = jobs.w[j];
    w.data = dw[j];
    w.type = c.type;
    w.K = c.K;
    w.row_bytes = row_bytes;
    w.expert_bytes = static_cast<size_t>(c.n[j]) * row_bytes;
    jobs.n[j] = c.n[j];
    jobs.out[j] = dout[j];
    jobs.out_stride[j] = stride[j];
  }
  jobs.count = J;

  std::vector<signed char> hq(ha.size());
  std::vector<float> hs(ha.size() / 32);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hq.data(), dq, hq.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hs.data(), dq_scales, hs.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<Sample> samples(4096);
  for (Sample& sm : samples) {
    sm.job = static_cast<int>(rng() % J);
    sm.m = static_cast<int>(rng() % c.M);
    sm.n = static_cast<int>(rng() % c.n[sm.job]);
    const uint8_t* row = hw[sm.job].data() + static_cast<size_t>(sm.n) * row_bytes;
    double ref = 0;
    for (int b = 0; b < c.K / 32; ++b) {
      long long isum = 0;
      for (int i = 0; i < 32; ++i)
        isum += static_cast<long long>(hq[static_cast<size_t>(sm.m) * c.K + 32 * b + i]) * code(c.type, row, 32 * b + i);
      ref += static_cast<double>(isum) * hs[static_cast<size_t>(sm.m) * (c.K / 32) + b] * wscale(c.type, row, b);
    }
    sm.ref = ref;
  }
  auto outputs = [&]() {
    std::vector<std::vector<float>> o(J);
    for (int j = 0; j < J; ++j) {
      o[j].resize(static_cast<size_t>(c.M) * stride[j]);
      CK(cudaMemcpy(o[j].data(), dout[j], o[j].size() * 4, cudaMemcpyDeviceToHost));
    }
    return o;
  };
  auto time_us = [&](auto&& launch) { return median_us(20, launch); };
  const double ops = 2.0 * c.M * static_cast<double>(total_n) * c.K;
  const int stages = (c.K / 32 + 3) / 4;
  bool all_ok = true;
  // One configuration: check, determinism, time. Returns the time in us (negative: failed).
  auto config = [&](int bn, int split, const char* tag) {
    for (int j = 0; j < J; ++j) CK(cudaMemset(dout[j], 0xFF, static_cast<size_t>(c.M) * stride[j] * 4));
    if (!matmul_q8_jobs(nullptr, jobs, q, c.K, c.M, scratch, bn, split)) { std::printf("  %s: not launched\n", tag); return -1.0; }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const auto first = outputs();
    size_t nan = 0;
    for (int j = 0; j < J; ++j)
      for (int m = 0; m < c.M; ++m)
        for (int n = 0; n < c.n[j]; ++n) nan += std::isnan(first[j][static_cast<size_t>(m) * stride[j] + n]);
    double num = 0, den = 0;
    for (const Sample& sm : samples) {
      const double got = first[sm.job][static_cast<size_t>(sm.m) * stride[sm.job] + sm.n];
      num += (got - sm.ref) * (got - sm.ref);
      den += sm.ref * sm.ref;
    }
    const double err = std::sqrt(num / den);
    const double t = time_us([&] { matmul_q8_jobs(nullptr, jobs, q, c.K, c.M, scratch, bn, split); });
    CK(cudaDeviceSynchronize());
    const auto again = outputs();
    bool same = true;
    for (int j = 0; j < J; ++j) same = same && std::memcmp(first[j].data(), again[j].data(), first[j].size() * 4) == 0;
    const bool ok = nan == 0 && err < 1e-5 && same;
    all_ok = all_ok && ok;
    if (!ok) std::printf("  FAIL %s bn %d split %d: rel_err %.2e nan %zu same %d\n", tag, bn, split, err, nan, same);
    return ok ? t : -t;
  };
  std::printf("%-22s %s M=%d K=%d N=", c.name, c.type == 2 ? "q4_0" : "q8_0", c.M, c.K);
  for (int j = 0; j < J; ++j) std::printf("%s%d", j ? "+" : "", c.n[j]);
  std::printf("\n");
  double best = 1e30;
  int best_bn = 0, best_s = 0;
  for (int bn : {64, 128}) {
    std::printf("  bn %3d  us by split:", bn);
    for (int split : {1, 2, 3, 4, 5, 6, 8}) {
      if (split > 1 && stages / split < 2) continue;
      const double t = config(bn, split, "sweep");
      std::printf("  %d:%.1f", split, t);
      if (t > 0 && t < best) { best = t; best_bn = bn; best_s = split; }
    }
    std::printf("\n");
  }
  const double tp = config(0, 0, "plan");
  // the jobs one by one, each with its own plan
  double sep = 0;
  for (int j = 0; j < J && J > 1; ++j) {
    MatmulQ8Jobs one;
    one.w[0] = jobs.w[j];
    one.n[0] = jobs.n[j];
    one.out[0] = jobs.out[j];
    one.out_stride[0] = jobs.out_stride[j];
    one.count = 1;
    sep += time_us([&] { matmul_q8_jobs(nullptr, one, q, c.K, c.M, scratch); });
  }
  std::printf("  plan %.1f us %.1f TOPS (scratch %.1f MB) | best bn %d split %d %.1f us | ", tp, ops / tp / 1e6,
              matmul_q8_scratch_bytes(jobs, c.M) / 1e6, best_bn, best_s, best);
  if (J > 1) std::printf("one by one %.1f us | ", sep);
  std::printf("%s\n", all_ok ? "ok" : "FAILED");
  for (int j = 0; j < J; ++j) { cudaFree(dw[j]); cudaFree(dout[j]); }
  cudaFree(da); cudaFree(dq); cudaFree(dq_scales); cudaFree(scratch.p);
}

int main(int argc, char** argv) {
  matmul_q8_setup();
  std::printf("variant: %s\n", argc > 1 ? argv[1] : "default");
  const Case cases[] = {
      {"26b q (sliding)", 2, 512, 4096, 2816},
      {"26b o (sliding)", 2, 512, 2816, 4096},
      {"26b mlp gate+up", 2, 512, 2112, 2816},
      {"26b mlp down", 2, 512, 2816, 2112},
      {"26b q, 64 rows", 2, 64, 4096, 2816},
      {"26b q, 100 rows", 2, 100, 4096, 2816},
      {"26b q q8_0", 8, 512, 4096, 2816},
      {"odd: 89 blocks, N 1000", 2, 200, 1000, 2848},    // 16-bit weight loads, part tiles
      {"odd: 89 blocks, N 1000 q8_0", 8, 200, 1000, 2848},
      {"e4b q", 2, 512, 2048, 2560},
      {"e4b k", 2, 512, 512, 2560},
      {"e4b o", 2, 512, 2560, 2048},
      {"e4b mlp gate", 2, 512, 10240, 2560},
      {"e4b mlp down", 2, 512, 2560, 10240},
      {"26b experts gate+up", 2, 512, 1408, 2816, 128, 8, false},
      {"26b experts down", 2, 512, 2816, 704, 128, 8, true},
      {"26b experts gate+up q8_0", 8, 512, 1408, 2816, 128, 8, false},
  };
  for (const Case& c : cases) run(c);
  const JobsCase jobs_cases[] = {
      {"e4b q+k+v", 2, 512, 2560, {2048, 512, 512}},
      {"e4b q", 2, 512, 2560, {2048}},
      {"e4b k", 2, 512, 2560, {512}},
      {"e4b o", 2, 512, 2048, {2560}},
      {"e4b gate+up", 2, 512, 2560, {10240, 10240}},
      {"e4b down", 2, 512, 10240, {2560}},
      {"e4b ple gate", 2, 512, 2560, {256}},
      {"e4b ple proj", 2, 512, 256, {2560}},
      {"26b q", 2, 512, 2816, {4096}},
      {"26b o", 2, 512, 4096, {2816}},
      {"26b gate+up", 2, 512, 2816, {2112, 2112}},
      {"26b down", 2, 512, 2112, {2816}},
      {"odd q4_0 (89 blocks)", 2, 200, 2848, {1000, 300, 72}},
      {"odd q8_0 (89 blocks)", 8, 200, 2848, {1000, 300, 72}},
  };
  for (const JobsCase& c : jobs_cases) run_jobs(c);
  return 0;
}
