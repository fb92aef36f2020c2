// Token sampling on the GPU (runtime/sampler.cpp's semantics), so that only the token id comes
// back to the host: repeat penalty, then greedy (arg-max, lowest id on ties: the host's choice),
// or top-k, top-p and min-p cuts on the temperature-1 distribution followed by a draw from
// exp((l - max) / temperature) over what remains, with u from the host's seeded generator.
//
// The cuts need the candidates in descending logit order; instead of sorting the vocabulary,
// each cut is found as a threshold on an order-preserving integer key of the logit by a 3-level
// radix select (11 + 11 + 10 bits: a histogram of counts for top-k, of probability mass for
// top-p). Every candidate at or above the final threshold is kept, so exact ties at a cut are
// all kept, where the host keeps the lower ids: the only difference, on exact float ties.
// One block of 1024 threads does it all; a few passes over the logits (1 MB for 262k tokens).
#include <cfloat>

#include "backend/cuda/common.cuh"

namespace markbase::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kBins = 2048;

__device__ __forceinline__ unsigned key_of(float f) {
  const unsigned b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The largest key theta with (count or mass of candidates with key >= theta) >= need, among
// candidates with key >= floor_key. MASS: weight exp(l - mx); else 1.
template <bool MASS>
__device__ unsigned radix_select(const float* L, int V, unsigned floor_key, float mx, float need, float* hist_f,
                                 int* hist_i) {
  __shared__ unsigned s_prefix;
  __shared__ float s_need;
  const int bits[3] = {11, 11, 10};
  unsigned prefix = 0;
  int shift = 32;
  if (threadIdx.x == 0) s_need = need;
  for (int level = 0; level < 3; ++level) {
    const int nb = bits[level];
    const int sh = shift - nb;
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) { hist_f[b] = 0.0f; hist_i[b] = 0; }
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const unsigned k = key_of(L[i]);
      if (k < floor_key) continue;
      if (shift < 32 && (k >> shift) != prefix) continue;
      const int b = (k >> sh) & ((1u << nb) - 1);
      if (MASS) atomicAdd(&hist_f[b], expf(L[i] - mx));
      else atomicAdd(&hist_i[b], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float cum = 0.0f, nd = s_need;
      int pick = -1, last = -1;
      for (int b = (1 << nb) - 1; b >= 0; --b) {
        const float v = MASS ? hist_f[b] : static_cast<float>(hist_i[b]);
        if (v <= 0.0f) continue;
        last = b;
        if (cum + v >= nd) { pick = b; break; }
        cum += v;
      }
      if (pick < 0) pick = last < 0 ? 0 : last;  // rounding: keep every candidate
      s_need = nd - cum;
      s_prefix = (prefix << nb) | static_cast<unsigned>(pick);
    }
    __syncthreads();
    prefix = s_prefix;
    shift = sh;
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int V, SampleArgs a,
                                                          const int* recent, float* work, int* result) {
  pdl_entry();
  __shared__ float hist_f[kBins];
  __shared__ int hist_i[kBins];
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  __shared__ float s_chunk[kThreads];
  __shared__ int s_pick;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // 1. repeat penalty (on a copy of the logits)
  const float* L = logits;
  if (a.repeat_penalty != 1.0f && a.n_recent > 0) {
    for (int i = tid; i < V; i += kThreads) work[i] = logits[i];
    __syncthreads();
    for (int r = tid; r < a.n_recent; r += kThreads) {
      const int id = recent[r];
      if (id < 0 || id >= V) continue;
      const float l = work[id];
      work[id] = l > 0 ? l / a.repeat_penalty : l * a.repeat_penalty;
    }
    __syncthreads();
    L = work;
  }
  // 2. arg-max, lowest id on ties
  float bv = -INFINITY;
  int bi = V;
  for (int i = tid; i < V; i += kThreads)
    if (L[i] > bv || (L[i] == bv && i < bi)) { bv = L[i]; bi = i; }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
  }
  if (lane == 0) { red_v[warp] = bv; red_i[warp] = bi; }
  __syncthreads();
  if (warp == 0) {
    bv = red_v[lane];
    bi = red_i[lane];
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { red_v[0] = bv; red_i[0] = bi; }
  }
  __syncthreads();
  const float mx = red_v[0];
  const int arg = red_i[0];
  if (a.temperature == 0.0f || !(mx > -INFINITY)) {
    if (tid == 0) *result = arg < V ? arg : 0;
    return;
  }
  // 3. cuts, as thresholds on the key
  unsigned theta = 0;
  if (a.top_k > 0 && a.top_k < V) theta = radix_select<false>(L, V, 0, mx, static_cast<float>(a.top_k), hist_f, hist_i);
  if (a.top_p < 1.0f) {
    float s = 0.0f;
    for (int i = tid; i < V; i += kThreads)
      if (key_of(L[i]) >= theta) s += expf(L[i] - mx);
    s = block_sum(s);
    const unsigned tp = radix_select<true>(L, V, theta, mx, a.top_p * s, hist_f, hist_i);
    theta = max(theta, tp);
  }
  if (a.min_p > 0.0f) theta = max(theta, key_of(mx + logf(a.min_p)));
  // 4. the draw: weights exp((l - mx) / temperature) over the candidates, walked in id order
  const int chunk = (V + kThreads - 1) / kThreads, i0 = tid * chunk, i1 = min(V, i0 + chunk);
  float mine = 0.0f;
  for (int i = i0; i < i1; ++i)
    if (key_of(L[i]) >= theta) mine += expf((L[i] - mx) / a.temperature);
  s_chunk[tid] = mine;
  if (tid == 0) s_pick = -1;
  __syncthreads();
  if (tid == 0) {  // exclusive prefix sums, in a fixed order
    float c = 0.0f;
    for (int t = 0; t < kThreads; ++t) { const float v = s_chunk[t]; s_chunk[t] = c; c += v; }
    red_v[1] = c;
  }
  __syncthreads();
  const float target = a.u * red_v[1];
  const float before = s_chunk[tid];
  // Every range that starts at or below the target claims; the highest claim is the range that
  // holds it (or, when rounding puts the target past the total, the last candidate).
  if (mine > 0.0f && before <= target) {
    float c = before;
    int pick = -1;
    for (int i = i0; i < i1; ++i) {
      if (key_of(L[i]) < theta) continue;
      pick = i;
      c += expf((L[i] - mx) / a.temperature);
      if (c > target) break;
    }
    atomicMax(&s_pick, pick);
  }
  __syncthreads();
  if (tid == 0) *result = s_pick >= 0 ? s_pick : arg;
}

}  // namespace

int sample(cudaStream_t s, const float* logits, int vocab, const SampleArgs& a, const int* recent, float* work,
           int* result) {
  // A plain launch: it follows the graph's launch, not a kernel (pdl_wait passes at once).
  sample_kernel<<<1, kThreads, 0, s>>>(logits, vocab, a, recent, work, result);
  return 1;
}

MB_TRACE_ATTACH(trace_attach_sample)

}  // namespace markbase::cuda
