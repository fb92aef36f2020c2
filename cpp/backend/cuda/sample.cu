// Token sampling on the GPU (runtime/sampler.cpp's semantics), so that only the token id comes
// back to the host: repeat penalty, then greedy (arg-max, lowest id on ties: the host's choice),
// or top-k, top-p and min-p cuts on the temperature-1 distribution followed by a draw from
// exp((l - max) / temperature) over what remains, walked from the largest logit down as the host
// walks its sorted candidates, with u from the host's seeded generator.
//
// Instead of sorting the vocabulary, each step is a threshold on an order-preserving integer key
// of the logit, found by a 3-level radix select (11 + 11 + 10 bits): the largest key theta whose
// candidates at or above it hold at least `need` of a weight: a count for top-k, probability mass
// for top-p (at temperature 1) and for the draw (at the temperature; need = u times the total).
// Every candidate at or above a cut is kept, so exact ties at a cut are all kept, where the host
// keeps the lower ids: the only difference, on exact float ties.
//
// One cooperative launch of one block per SM, each block owning a contiguous slice of the
// vocabulary; a level's histogram is built per block in shared memory and summed into a global
// one, and after a grid-wide barrier every block scans the global histogram itself (the same
// result everywhere, so no second barrier to share it). The masses are summed as 64-bit fixed
// point (2^40 for the largest weight, exp(0)) so that every sum is exact and the draw repeats bit
// for bit under a seed, whatever order the blocks add in. The first version was one block of 1024
// threads: its histograms' shared-memory atomics on the few bins that hold most logits serialised,
// and a sampled decode token cost 0.7 ms more than a greedy one on the H200 (bench/RESULTS.md,
// eighteenth session).
#include <cooperative_groups.h>

#include <algorithm>
#include <cfloat>
#include <climits>

#include "backend/cuda/common.cuh"

namespace markbase::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;
constexpr int kBins = 2048;
constexpr int kLevels = 3;
constexpr int kSelects = 3;  // top-k, top-p, the draw
constexpr float kFixed = 1099511627776.0f;  // 2^40: a weight of 1 in fixed point
using u64 = unsigned long long;

__device__ __forceinline__ unsigned key_of(float f) {
  const unsigned b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Scratch in global memory (sample_scratch_bytes), zero before the first launch; the kernel
// leaves it zero.
struct Scratch {
  u64 hist[kSelects][kLevels][kBins];
  int min_id[kBins];         // the draw's last level: INT_MAX - the lowest id of each bin (0: empty)
  float block_max[1024];     // per block: the largest logit and its lowest id
  int block_arg[1024];
};

enum class Weight { Count, Mass };
// How a select's need is given: as is (top-k), as ceil(frac * total) (top-p: the fewest
// candidates holding that share of the mass), or as floor(frac * total) + 1 (the draw: the
// candidate whose running weight passes u * total).
enum class Need { Given, Share, Draw };

// The block-wide scan of a global histogram, bins from the highest down: the bin b where the
// weight of the bins above it is < need <= that plus bin b's own (or, when rounding leaves need
// past the total, the lowest non-empty bin). Every thread gets the bin and the need left in it.
__device__ void pick_bin(const u64* h, int nbins, u64 need, int* out_bin, u64* out_need, u64* total) {
  __shared__ u64 warp_tot[kThreads / 32];
  __shared__ int s_bin, s_low;
  __shared__ u64 s_need, s_total;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  // thread t: bins hi = nbins - 1 - 2t and hi - 1 (descending order over the threads)
  const int hi = nbins - 1 - 2 * t, lo = hi - 1;
  const u64 vh = hi >= 0 ? h[hi] : 0, vl = lo >= 0 ? h[lo] : 0;
  u64 incl = vh + vl;
  for (int o = 1; o < 32; o <<= 1) {
    const u64 v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (t == 0) { s_bin = -1; s_low = nbins; }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  u64 before = 0;
  for (int w = 0; w < warp; ++w) before += warp_tot[w];
  if (t == kThreads - 1) s_total = before + incl;
  const u64 excl = before + incl - vh - vl;
  if (vh && hi < s_low) atomicMin(&s_low, hi);
  if (vl && lo < s_low) atomicMin(&s_low, lo);
  if (vh && excl < need && need <= excl + vh) { s_bin = hi; s_need = need - excl; }
  else if (vl && excl + vh < need && need <= excl + vh + vl) { s_bin = lo; s_need = need - excl - vh; }
  __syncthreads();
  *total = s_total;
  if (s_bin >= 0) {
    *out_bin = s_bin;
    *out_need = s_need;
  } else {  // rounding: keep every candidate
    *out_bin = s_low < nbins ? s_low : 0;
    *out_need = 1;
  }
  __syncthreads();  // s_* are rewritten by the next call
}

// One level of a select over this block's slice [i0, i1) of L: the histogram of the level's digit
// among candidates with key >= floor_key whose higher bits equal the prefix, summed into g.
// MIN_ID: the lowest id of each bin too (as INT_MAX - id, maximised; 0: none).
template <Weight W, bool MIN_ID>
__device__ void level_hist(const float* L, int i0, int i1, unsigned floor_key, unsigned prefix, int shift, int nb,
                           float mx, float inv_t, u64* sh, int* sh_id, u64* g, int* g_id) {
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    sh[b] = 0;
    if (MIN_ID) sh_id[b] = 0;
  }
  __syncthreads();
  const int sh_digit = shift - nb;
  for (int i = i0 + threadIdx.x; i < i1; i += kThreads) {
    const float l = L[i];
    const unsigned k = key_of(l);
    if (k < floor_key) continue;
    if (shift < 32 && (k >> shift) != prefix) continue;
    const int b = (k >> sh_digit) & ((1u << nb) - 1);
    const u64 w = W == Weight::Count ? 1ull : static_cast<u64>(expf((l - mx) * inv_t) * kFixed);
    atomicAdd(&sh[b], w);
    if (MIN_ID) atomicMax(&sh_id[b], INT_MAX - i);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    if (sh[b]) atomicAdd(&g[b], sh[b]);
    if (MIN_ID && sh_id[b]) atomicMax(&g_id[b], sh_id[b]);
  }
}

// The largest key theta with (weight of candidates >= theta, among those >= floor_key) >= need,
// need given as N says (the total read off the first level). MIN_ID: *id_out, the lowest id
// with key theta. The caller clears the histograms once every block has read them.
template <Weight W, Need N, bool MIN_ID>
__device__ unsigned radix_select(cg::grid_group& grid, const float* L, int i0, int i1, unsigned floor_key,
                                 float mx, float inv_t, u64 need, double frac, u64 (*g)[kBins], int* g_id,
                                 u64* sh, int* sh_id, int* id_out) {
  constexpr int bits[kLevels] = {11, 11, 10};
  unsigned prefix = 0;
  int shift = 32;
  for (int level = 0; level < kLevels; ++level) {
    const int nb = bits[level];
    const bool last = level == kLevels - 1;
    if (last) level_hist<W, MIN_ID>(L, i0, i1, floor_key, prefix, shift, nb, mx, inv_t, sh, sh_id, g[level], g_id);
    else level_hist<W, false>(L, i0, i1, floor_key, prefix, shift, nb, mx, inv_t, sh, sh_id, g[level], g_id);
    grid.sync();
    int bin;
    u64 left, total;
    if (level == 0 && N != Need::Given) {
      // the total is the sum of the first level's bins: scan once for it, then for the need
      pick_bin(g[level], 1 << nb, ~0ull, &bin, &left, &total);
      const double x = frac * static_cast<double>(total);
      need = N == Need::Share ? static_cast<u64>(ceil(x)) : static_cast<u64>(floor(x)) + 1;
      need = std::min(std::max(need, 1ull), total);
    }
    pick_bin(g[level], 1 << nb, need, &bin, &left, &total);
    need = left;
    prefix = (prefix << nb) | static_cast<unsigned>(bin);
    shift -= nb;
    if (last && MIN_ID) *id_out = g_id[bin] ? INT_MAX - g_id[bin] : -1;
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int V, SampleArgs a,
                                                          const int* recent, float* work, Scratch* s, int* result) {
  cg::grid_group grid = cg::this_grid();
  pdl_wait();  // passes at once (a plain launch); stamps the decode trace, which times the LM head to here
  __shared__ u64 sh[kBins];
  __shared__ int sh_id[kBins];
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nblocks = gridDim.x, slice = (V + nblocks - 1) / nblocks;
  const int i0 = min(V, static_cast<int>(blockIdx.x) * slice), i1 = min(V, i0 + slice);

  // 1. repeat penalty, on a copy of this block's slice
  const float* L = logits;
  if (a.repeat_penalty != 1.0f && a.n_recent > 0) {
    for (int i = i0 + tid; i < i1; i += kThreads) work[i] = logits[i];
    __syncthreads();
    for (int r = tid; r < a.n_recent; r += kThreads) {
      const int id = recent[r];
      if (id < i0 || id >= i1) continue;
      const float l = work[id];
      work[id] = l > 0 ? l / a.repeat_penalty : l * a.repeat_penalty;
    }
    __syncthreads();
    L = work;
  }
  // 2. the block's arg-max (lowest id on ties), then the grid's, from the blocks' in block order
  float bv = -INFINITY;
  int bi = V;
  for (int i = i0 + tid; i < i1; i += kThreads)
    if (L[i] > bv || (L[i] == bv && i < bi)) { bv = L[i]; bi = i; }
  auto argmax_warp = [&] {
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
  };
  argmax_warp();
  if (lane == 0) { red_v[warp] = bv; red_i[warp] = bi; }
  __syncthreads();
  if (warp == 0) {
    bv = red_v[lane];
    bi = red_i[lane];
    argmax_warp();
    if (lane == 0) { s->block_max[blockIdx.x] = bv; s->block_arg[blockIdx.x] = bi; }
  }
  grid.sync();
  if (warp == 0) {
    bv = -INFINITY;
    bi = V;
    for (int b = lane; b < nblocks; b += 32)  // every block reduces the same values in the same order
      if (s->block_max[b] > bv || (s->block_max[b] == bv && s->block_arg[b] < bi)) { bv = s->block_max[b]; bi = s->block_arg[b]; }
    argmax_warp();
    if (lane == 0) { red_v[0] = bv; red_i[0] = bi; }
  }
  __syncthreads();
  const float mx = red_v[0];
  const int arg = red_i[0] < V ? red_i[0] : 0;
  if (a.temperature == 0.0f || !(mx > -INFINITY)) {
    if (blockIdx.x == 0 && tid == 0) *result = arg;
    return;  // no histogram was touched
  }
  // 3. the cuts, as thresholds on the key
  unsigned floor_key = 0;
  int id = -1;
  if (a.top_k > 0 && a.top_k < V)
    floor_key = radix_select<Weight::Count, Need::Given, false>(grid, L, i0, i1, 0, mx, 1.0f, static_cast<u64>(a.top_k),
                                                                0.0, s->hist[0], nullptr, sh, sh_id, &id);
  if (a.top_p < 1.0f)
    floor_key = max(floor_key, radix_select<Weight::Mass, Need::Share, false>(grid, L, i0, i1, floor_key, mx, 1.0f, 0,
                                                                              a.top_p, s->hist[1], nullptr, sh, sh_id,
                                                                              &id));
  if (a.min_p > 0.0f) floor_key = max(floor_key, key_of(mx + logf(a.min_p)));
  // 4. the draw: the first candidate, from the largest logit down, at which the running weight
  // exp((l - mx) / temperature) passes u times the total
  radix_select<Weight::Mass, Need::Draw, true>(grid, L, i0, i1, floor_key, mx, 1.0f / a.temperature, 0, a.u,
                                                s->hist[2], s->min_id, sh, sh_id, &id);
  // 5. every block has read the histograms: clear them for the next launch (each block its share)
  grid.sync();
  u64* flat = &s->hist[0][0][0];
  const int n = kSelects * kLevels * kBins;
  for (int i = blockIdx.x * kThreads + tid; i < n; i += nblocks * kThreads) flat[i] = 0;
  for (int i = blockIdx.x * kThreads + tid; i < kBins; i += nblocks * kThreads) s->min_id[i] = 0;
  if (blockIdx.x == 0 && tid == 0) *result = id >= 0 && id < V ? id : arg;
}

}  // namespace

size_t sample_scratch_bytes() { return sizeof(Scratch); }

int sample(cudaStream_t s, const float* logits, int vocab, const SampleArgs& a, const int* recent, float* work,
           void* scratch, int* result) {
  // One block per SM (all must be resident at once for the grid barriers), at most one per 1024
  // logits and at most 1024 (Scratch's per-block slots).
  static const int per_sm = blocks_per_sm(sample_kernel, kThreads);
  if (per_sm < 1) return 0;
  const int blocks = std::max(1, std::min({sm_count(), (vocab + kThreads - 1) / kThreads, 1024}));
  Scratch* sc = static_cast<Scratch*>(scratch);
  void* args[] = {const_cast<float**>(&logits), &vocab, const_cast<SampleArgs*>(&a), const_cast<int**>(&recent),
                  &work, &sc, &result};
  // A plain (cooperative) launch: it follows the graph's launch, not a kernel.
  return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(sample_kernel), blocks, kThreads, args, 0, s) == cudaSuccess;
}

MB_TRACE_ATTACH(trace_attach_sample)

}  // namespace markbase::cuda
