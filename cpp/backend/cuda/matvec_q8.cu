// Decode matrix-vector products on 8-bit activations (q8.cuh), and the quantization of a vector.
//
// Layout: a block of 2-4 warps computes R rows; its threads stride over the rows' units (q8.cuh:
// 16 or 32 weights), each thread loading the activation unit once for all R rows and two units'
// loads before the first use, so that enough bytes are in flight per SM to run at DRAM speed.
// One launch may serve several weights that read the same vector (q/k/v, gate/up): their rows
// are concatenated in the grid, each block staying within one weight.

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/q8.cuh"

namespace markbase::cuda {
namespace {

// The output as stored: the final softcap folded into the product that writes the logits (saving
// the softcap kernel's launch), when cap > 0.
__device__ __forceinline__ float capped(float y, float cap) { return cap > 0.0f ? softcap_value(y, cap) : y; }

constexpr int kThreads = 128;
// Rows per block: each activation unit load serves all of them. On the H200 (26B-A4B layers, K of
// 2816 or 2112 against 128 threads) 4 rows ran the o and down products 0.4-0.6 us faster than 2,
// and 8 slower again (the q/k/v launch 1 us).
constexpr int kRows = 4;
// Very tall products (the LM head: 262144 rows) take 4 rows a block too: 158 us a token on the
// H200, against 168 at 8 rows, 187 at 2 and 226 at 16.
constexpr int kTallRows = 4;
constexpr int kTallN = 65536;
// MARKBASE_CUDA_TALL_STAGED=0: the LM head through the unit-load kernel (for A/B timing).
const bool tall_staged_ = env_flag("MARKBASE_CUDA_TALL_STAGED", true);
// MARKBASE_CUDA_MATVEC_Q5K_BOUND: Q5_K's register cap below (A/B). Unset: use_capped's rule; a
// digit: the mask of block sizes capped (bit 0: 64 threads, 1: 96, 2: 128), 0 none.
const int q5k_bound_ = [] {
  const char* v = std::getenv("MARKBASE_CUDA_MATVEC_Q5K_BOUND");
  return v && v[0] >= '0' && v[0] <= '7' && !v[1] ? v[0] - '0' : -1;
}();

// One row of `n` values per blockIdx.y; 32 consecutive values per warp (one q8 block).
__global__ void quantize_q8_kernel(const float* a, int as, int n, Q8Vec q, int qs) {
  pdl_entry();
  const int row = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
  const float v = j < n ? a[static_cast<size_t>(row) * as + j] : 0.0f;
  const Q8Vec qr{q.q + static_cast<size_t>(row) * qs, q.d + static_cast<size_t>(row) * (qs / 32)};
  q8_store_warp(v, j, j < n, qr);
}

// MIN_BLOCKS (0: none): blocks an SM must fit (__launch_bounds__), capping a thread's registers.
// Q5_K's unit holds 12 registers a row in flight (Q4_K's 8): with R = 4 rows its kernel takes 94
// registers at 64, 96 and 128 threads, against Q4_K's 64, and fewer blocks fit an SM (Nsight
// Compute, E4B gate/up at 96 threads: 42 % of DRAM peak either way, with 18 warps an SM against
// 30; bench/RESULTS.md, thirty-ninth session). kQ5kMaxRegs: the cap, 79 registers with no spills at
// each block size (72: 48 bytes of spills). use_capped says where it applies.
constexpr int kQ5kMaxRegs = 80;
template <int TYPE, int THREADS>
constexpr int matvec_q8_min_blocks() { return TYPE == MB_Q5_K ? 65536 / (kQ5kMaxRegs * THREADS) : 0; }

template <int TYPE, int R, int THREADS, int MIN_BLOCKS = 0>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS) matvec_q8_kernel(MatvecJobs jobs, Q8Vec x, int K) {
  pdl_trigger();
  const int first = blockIdx.x * R;
  WeightRef w;
  int n = 0, n0 = 0;
  float* out = nullptr;
#pragma unroll
  for (int i = 0; i < kMaxMatvecJobs; ++i)  // constant indices: the jobs stay in parameter space
    if (i < jobs.count && first >= jobs.row0[i] && first < jobs.row0[i + 1]) {
      w = jobs.w[i];
      n = jobs.n[i];
      n0 = first - jobs.row0[i];
      out = jobs.out[i];
    }
  const mb_u8* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = w.data + static_cast<size_t>(min(n0 + r, n - 1)) * w.row_bytes;
  const float s = matvec_q8_block<TYPE, R, THREADS>(rows, K, w.row_bytes, x);
  if (threadIdx.x < R && n0 + static_cast<int>(threadIdx.x) < n) {
    out[n0 + threadIdx.x] = capped(s, jobs.softcap);
  }
}

// Very tall products (the LM head) read more bytes than anything else in a decode step, and the
// unit loads above fetch them 2 bytes at a time (18- and 34-byte blocks are only 2-byte
// aligned): 158 us a token for 415 MB, 2.6 TB/s. Here a block's R rows, contiguous in memory,
// arrive in shared memory by 16-byte cp.async copies issued before the programmatic wait, and the
// units are read from there. The copies cover the 16-byte lines that hold the rows (rows of any
// length: Q6_K's 210-byte blocks make rows of 2-byte multiples), so they may read up to 15 bytes
// past the weight's last row: the backend allocates weights with that much room.
template <int TYPE, int R>
__global__ void __launch_bounds__(kThreads) matvec_q8_tall_kernel(WeightRef w, int n, float* out, Q8Vec x, int K,
                                                                   float cap) {
  pdl_trigger();
  extern __shared__ __align__(16) mb_u8 srows[];
  const int n0 = blockIdx.x * R, nr = min(R, n - n0);
  const size_t start = static_cast<size_t>(n0) * w.row_bytes, first = start & ~static_cast<size_t>(15);
  const int skip = static_cast<int>(start - first);  // bytes of the first line before row n0
  const int vecs = static_cast<int>((skip + nr * w.row_bytes + 15) / 16);
  const mb_u8* src = w.data + first;
#if MARKBASE_CUDA_WEIGHTS_EVICT_FIRST  // common.cuh: the weight stream's L2 policy
  const unsigned long long pol = evict_first_policy();
  for (int i = threadIdx.x; i < vecs; i += kThreads) cp_async16_policy(srows + 16 * i, src + 16 * static_cast<size_t>(i), pol);
#else
  for (int i = threadIdx.x; i < vecs; i += kThreads) cp_async16(srows + 16 * i, src + 16 * static_cast<size_t>(i), true);
#endif
  cp_async_commit();
  pdl_wait();
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  cp_async_wait<0>();
  __syncthreads();
  const int units = K / q8_unit_weights(TYPE);
  for (int u = threadIdx.x; u < units; u += kThreads) {
    const XUnitOf<TYPE> xu = load_x_unit<TYPE>(x.q, x.d, u);
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r < nr) acc[r] += unit_dot<TYPE>(load_w_unit<TYPE, true>(srows + skip + r * w.row_bytes, u), xu);
  }
  __shared__ float part[kThreads / 32][R];
  warp_partials<R, kThreads / 32, true>(acc, part);
  if (static_cast<int>(threadIdx.x) < nr) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) sum += part[i][threadIdx.x];
    out[n0 + threadIdx.x] = capped(sum, cap);
  }
}

constexpr int kTallStagedRows = 4;
constexpr size_t kTallStagedSmem = 48 * 1024;  // without raising the kernel's shared-memory limit

// The bytes of shared memory a block of the staged kernel takes: its rows and the parts of the
// 16-byte lines around them.
size_t tall_staged_smem(const WeightRef& w) { return kTallStagedRows * w.row_bytes + 32; }

bool tall_staged_fits(const MatvecJobs& jobs) {
  const WeightRef& w = jobs.w[0];
  return jobs.count == 1 && has_q8_dot(w.type) && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
         tall_staged_smem(w) <= kTallStagedSmem;
}

int launch_tall_staged(cudaStream_t s, const MatvecJobs& jobs, Q8Vec x, int K) {
  constexpr int R = kTallStagedRows;
  const WeightRef& w = jobs.w[0];
  const int n = jobs.n[0];
  const unsigned blocks = (n + R - 1) / R;
  return with_q8_type(w.type, [&](auto t) {
    enqueue(matvec_q8_tall_kernel<decltype(t)::value, R>, blocks, kThreads, tall_staged_smem(w), s, w, n, jobs.out[0],
            x, K, jobs.softcap);
  }) ? 1 : 0;
}

// Whether a launch of `blocks` blocks of `threads` takes the capped kernel. On the H200 (6-layer
// Q5_K_M files, fortieth session) the cap ran every 96-thread launch as fast or faster (E4B's
// gate/up 14.2 -> 12.9 us a layer: decode 1.2 % faster); at 64 and 128 threads it slowed the launches
// that fit one wave either way (E4B's down 6.1 -> 6.8 us, o 2.4 -> 2.9) and sped the one whose
// second wave it removed (26B-A4B's o, 704 blocks against 5 or 6 an SM: 4.8 -> 2.9 us). So: at 96
// threads always, else where it takes fewer waves. Decode against no cap: E4B 1.1 %, 26B-A4B 1.3 %
// faster (bench/RESULTS.md).
bool use_capped(const void* capped, const void* plain, int threads, unsigned blocks) {
  if (q5k_bound_ >= 0) return (q5k_bound_ >> (threads / 32 - 2)) & 1;
  if (threads == 96) return true;
  auto waves = [&](const void* kernel) {
    const int per_sm = blocks_per_sm(kernel, threads);
    if (per_sm < 1) return 0u;
    const unsigned wave = static_cast<unsigned>(per_sm * sm_count());
    return (blocks + wave - 1) / wave;
  };
  const unsigned c = waves(capped), p = waves(plain);
  return c && p && c < p;
}

template <int R>
int launch_rows(cudaStream_t s, MatvecJobs jobs, Q8Vec x, int K) {
  int rows = 0;
  for (int i = 0; i < jobs.count; ++i) {
    jobs.row0[i] = rows;
    rows += (jobs.n[i] + R - 1) / R * R;  // a block never spans two weights
  }
  jobs.row0[jobs.count] = rows;
  const unsigned blocks = rows / R;
  const int warps = matvec_q8_warps(K, jobs.w[0].type);
  return with_q8_type(jobs.w[0].type, [&](auto t) {
    constexpr int T = decltype(t)::value;
    constexpr decltype(&matvec_q8_kernel<T, R, 64>) kernel[2][3] = {
        {matvec_q8_kernel<T, R, 64>, matvec_q8_kernel<T, R, 96>, matvec_q8_kernel<T, R, 128>},
        {matvec_q8_kernel<T, R, 64, matvec_q8_min_blocks<T, 64>()>,
         matvec_q8_kernel<T, R, 96, matvec_q8_min_blocks<T, 96>()>,
         matvec_q8_kernel<T, R, 128, matvec_q8_min_blocks<T, 128>()>}};
    const int i = warps - 2;
    const bool capped = matvec_q8_min_blocks<T, 96>() > 0 &&  // the types with a cap
                        use_capped(reinterpret_cast<const void*>(kernel[1][i]),
                                   reinterpret_cast<const void*>(kernel[0][i]), 32 * warps, blocks);
    enqueue(kernel[capped][i], blocks, 32 * warps, 0, s, jobs, x, K);
  }) ? 1 : 0;
}

}  // namespace

int quantize_q8(cudaStream_t s, const float* a, int a_stride, int n, int rows, Q8Vec q, int q_stride) {
  enqueue(quantize_q8_kernel, dim3(MB_BLOCKS(n, 256), rows), 256, 0, s, a, a_stride, n, q, q_stride);
  return 1;
}

int matvec_q8(cudaStream_t s, MatvecJobs jobs, Q8Vec x, int K) {
  int n = 0;
  for (int i = 0; i < jobs.count; ++i) n += jobs.n[i];
  if (n >= kTallN && tall_staged_fits(jobs) && tall_staged_) return launch_tall_staged(s, jobs, x, K);
  return n >= kTallN ? launch_rows<kTallRows>(s, jobs, x, K) : launch_rows<kRows>(s, jobs, x, K);
}

MB_TRACE_ATTACH(trace_attach_matvec_q8)

}  // namespace markbase::cuda
