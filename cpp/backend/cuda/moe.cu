// Mixture of experts on the GPU: routing (softmax, top-k, renormalise, per-expert scale) and the
// expert feed-forward, with no host read of the routing result.
//  - decode (few tokens): each (token, slot) warp reads its expert id from the route slot in
//    device memory and walks that expert's rows; gate and up rows are computed together and
//    GeGLU'd in registers; the down kernel sums the k experts' outputs, weighted, per output row.
//  - prefill: one small kernel counts tokens per expert, sorts the (token, slot) entries by
//    expert and writes a list of tiles of at most kMatmulBM entries of one expert; the grouped
//    matmuls (matmul.cu) run over that list with a fixed grid whose surplus blocks exit, so each
//    expert's weights are read once per tile of its tokens.
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "backend/cuda/fast_dot.cuh"
#include "backend/cuda/q8.cuh"
#include "backend/cuda/row_chain.cuh"

namespace markbase::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxHostIds = 64;

// Routing of one token by one warp: the k largest logits by k rounds of arg-max, their softmax
// (exp(l_j - l_top) over the k, which is the full softmax renormalised over the k: the other
// experts' terms cancel), each weight times its expert's scale. The softmax over all E before the
// top-k (a reduction, E exps and E divisions on the routing's critical path) is not needed to
// choose: the logits order the experts as their probabilities do. p[] (E floats of shared memory)
// holds the logits. The logits are read through L2 (__ldcg): in the fused router they were
// written by other blocks of the same launch.
__device__ void route_row(const float* l, const float* scale, int E, int k, float* o, float* p) {
  const int lane = threadIdx.x & 31;
  for (int e = lane; e < E; e += 32) p[e] = __ldcg(l + e);
  __syncwarp();
  // k rounds of arg-max; ties go to the lower expert id, as the CPU's partial sort does.
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int bi = E;  // none (only with non-finite logits; expert_of clamps it)
    for (int e = lane; e < E; e += 32)
      if (p[e] > best || (p[e] == best && e < bi)) { best = p[e]; bi = e; }
    for (int off = 16; off > 0; off >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (ob > best || (ob == best && oi < bi)) { best = ob; bi = oi; }
    }
    if (lane == 0) {
      o[2 * j] = best;
      o[2 * j + 1] = static_cast<float>(bi);
      if (bi < E) p[bi] = -INFINITY;  // taken
    }
    __syncwarp();
  }
  // The softmax of the k, scaled, the choices spread over the lanes (route_row_reg's arithmetic).
  const float top = o[0];
  float es = 0.0f;
  for (int j = lane; j < k; j += 32) {
    const float e = expf(o[2 * j] - top);
    o[2 * j] = e;
    es += e;
  }
  const float ws = warp_sum(es);
  __syncwarp();
  for (int j = lane; j < k; j += 32) {
    const int e = static_cast<int>(o[2 * j + 1]);
    o[2 * j] = o[2 * j] / ws * (scale && e < E ? scale[e] : 1.0f);
  }
}

// A float's bits as an unsigned that orders as the floats do (negatives flipped, positives above
// them), and back. 0 is below every float's key but one NaN pattern's: route_row_reg's "none".
__device__ __forceinline__ unsigned order_key(float v) {
  const unsigned u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(unsigned key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// The route from the k choices, lane j < k holding choice j (its logit mine, its expert mine_e)
// and every lane the largest logit top: the softmax of the k, each weight times its expert's
// scale (route_row's arithmetic).
template <int PER>
__device__ __forceinline__ void route_write(float top, float mine, int mine_e, const float* scale, int k, float* o,
                                           const float (&sc)[PER], bool has_sc) {
  const int lane = threadIdx.x & 31;
  const float ex = lane < k ? expf(mine - top) : 0.0f;
  const float ws = warp_sum(ex);
  float mine_sc = 1.0f;
  if (has_sc) {  // every lane takes part in the shuffles; lane j keeps its expert's scale
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const float v = __shfl_sync(0xffffffffu, sc[i], mine_e & 31);
      if (i == mine_e >> 5) mine_sc = v;
    }
  } else if (scale && lane < k) {
    mine_sc = scale[mine_e];
  }
  if (lane < k) {
    o[2 * lane] = ex / ws * mine_sc;
    o[2 * lane + 1] = static_cast<float>(mine_e);
  }
}
// route_row for E <= 32 * PER experts, the logits in registers (lane l holds experts l + 32 i),
// each round's arg-max by two warp reductions (redux.sync: the largest key, then the lowest
// expert id holding it) instead of a shuffle butterfly of value and id over shared memory. Keys
// are order_key of the logits, 0 for taken experts. Each lane j < k keeps choice j, and the
// softmax of the k and the scales are route_row's arithmetic (for k <= 32: one choice a lane).
// sc (used when has_sc): the per-expert scales, held like the logits, loaded by the caller
// before its wait; lane j then takes its expert's scale by shuffles instead of a dependent load
// after the top-k. A reference to the caller's registers, not a pointer: through a pointer the
// array went to local memory (sass.sh).
// route_row_vals: the same from the logits already in registers (lv[i]: expert lane + 32 i).
template <int PER>
__device__ void route_row_vals(const float (&lv)[PER], const float* scale, int E, int k, float* o,
                               const float (&sc)[PER], bool has_sc) {
  const int lane = threadIdx.x & 31;
  unsigned key[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) key[i] = lane + 32 * i < E ? order_key(lv[i]) : 0u;
  float top = 0.0f, mine = 0.0f;
  int mine_e = 0;
  for (int j = 0; j < k; ++j) {
    unsigned best = 0u, bi = 0xFFFFFFFFu;
#pragma unroll
    for (int i = 0; i < PER; ++i)
      if (key[i] > best) { best = key[i]; bi = lane + 32 * i; }  // ascending ids: ties keep the lowest
    const unsigned m = __reduce_max_sync(0xffffffffu, best);
    const unsigned e = __reduce_min_sync(0xffffffffu, best == m ? bi : 0xFFFFFFFFu);
    const float v = key_value(m);
    if (j == 0) top = v;
    if (lane == j) { mine = v; mine_e = static_cast<int>(min(e, static_cast<unsigned>(E - 1))); }
    // taken: a select on every key, not a store to key[e >> 5] under a branch, which the compiler
    // turned into an indexed store that kept key[] in local memory (a store and a reload on each
    // round's critical path; sass.sh)
    const bool own = (e & 31) == static_cast<unsigned>(lane);
#pragma unroll
    for (int i = 0; i < PER; ++i) key[i] = own && static_cast<unsigned>(i) == e >> 5 ? 0u : key[i];
  }
  route_write<PER>(top, mine, mine_e, scale, k, o, sc, has_sc);
}
template <int PER>
__device__ void route_row_reg(const float* l, const float* scale, int E, int k, float* o, const float (&sc)[PER],
                              bool has_sc) {
  const int lane = threadIdx.x & 31;
  float lv[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) lv[i] = lane + 32 * i < E ? __ldcg(l + lane + 32 * i) : 0.0f;
  route_row_vals<PER>(lv, scale, E, k, o, sc, has_sc);
}

// One warp per token row.
__global__ void route_kernel(const float* logits, int ls, const float* scale, int E, int k, float* out, int os) {
  pdl_entry();
  extern __shared__ float p[];
  const int t = blockIdx.x;
  route_row(logits + static_cast<size_t>(t) * ls, scale, E, k, out + static_cast<size_t>(t) * os, p);
}

// Decode, one token: the router's product and the routing in one launch. Block e computes logit e
// (its 128 threads striding over the row); the last block to finish (a device counter, which it
// resets for the next launch) routes. Saves a launch and its gap per MoE layer.
constexpr int kRouterThreads = 128;
constexpr int kRouterVec = 8;
constexpr int kMaxExperts = 1024;

// A/B switch: MARKBASE_CUDA_ROUTER_SCALE_EARLY=0 reads the chosen experts' scales after the top-k
// (the same values: the logits do not change).
bool router_scale_early() {
  static const bool on = env_flag("MARKBASE_CUDA_ROUTER_SCALE_EARLY", true);
  return on;
}

struct RouterArgs {
  WeightRef w;
  const float* x;
  const float* scale;
  int E, k;
  float* logits;
  float* out;
  unsigned* counter;
  bool scale_early;
  float* poll;  // chain_router: null, or its poll buffer (kChainPollExperts floats, kPollEmpty)
  bool chain_trigger_late;  // chain_router: its chain blocks let the next launch start only as they end
};

// chain_router's poll buffer (the default; MARKBASE_CUDA_ROUTER_POLL=0: the count): each router
// block stores its logits there too, and one routing block, the last in the grid, polls it until
// none is kPollEmpty (a NaN bit pattern that arithmetic does not produce: the GPU's NaNs are
// 0x7fffffff), routes, and empties it for the next launch. Against the count of finished router
// blocks (an acquire-release atomic after the logits' stores, then the logits read back by the last
// block counted): one L2 round trip after the last logit lands instead of the store's release, the
// atomic's round trip and the read. A poll that outlasts kPollCycles (~1 s: a router block that
// never ran) traps, which the backend reports as an error. H200, 6-layer 26B-A4B file: the routing
// block routed ~1 200 SM cycles earlier after its wait, but decode moved only 0.4 % slower to 0.6 %
// faster than with the count while chain blocks set the launch's length (bench/RESULTS.md,
// twenty-fourth session); with the spread form (SpreadChain), where the routing block ends the
// launch, decode 1.3 % faster (twenty-fifth session).
constexpr unsigned kPollEmpty = 0xffffffffu;
constexpr long long kPollCycles = 2000000000ll;
// The E <= 128 logits of the poll buffer in the calling warp's registers (lane l: experts
// l + 32 i), once all have landed; then the buffer is emptied.
__device__ __forceinline__ void poll_clear(float* poll, int E) {  // for the next launch
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (lane + 32 * i < E) st_relaxed(poll + lane + 32 * i, __uint_as_float(kPollEmpty));
}
__device__ __forceinline__ void poll_logits(float* poll, int E, float (&lv)[4]) {
  const int lane = threadIdx.x & 31;
  const long long t0 = clock64();
  for (;;) {
    bool ready = true;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lv[i] = lane + 32 * i < E ? ld_relaxed(poll + lane + 32 * i) : 0.0f;
      ready = ready && __float_as_uint(lv[i]) != kPollEmpty;
    }
    if (__all_sync(0xffffffffu, ready)) break;
    if (clock64() - t0 > kPollCycles) __trap();
  }
  poll_clear(poll, E);
}

// Block e of the router (kRouterThreads threads; the caller has triggered its dependents).
template <int TYPE>
__device__ __forceinline__ void router_block(const RouterArgs& a, int e) {
  const WeightRef& w = a.w;
  const float* __restrict__ x = a.x;
  const float* scale = a.scale;
  const int E = a.E, k = a.k;
  float* logits = a.logits;
  float* out = a.out;
  unsigned* counter = a.counter;
  const bool scale_early = a.scale_early;
  __shared__ float p[kMaxExperts];
  __shared__ bool last;
  const mb_u8* row = w.data + static_cast<size_t>(e) * w.row_bytes;
  // The row's first kRouterVec float4s a thread (all of it for K <= 4096) are loaded into
  // registers before the wait, while the kernel before runs: the router's first DRAM round trip
  // leaves the layer's critical path. Longer rows go to L2 meanwhile and are read after it. The
  // sums are block_row_dot's, in its order.
  float4 wv[kRouterVec];
#pragma unroll
  for (int c = 0; c < kRouterVec; ++c) {
    const int i = (threadIdx.x + kRouterThreads * c) * 4;
    wv[c] = i < w.K ? w4<TYPE>(row, i, w.K) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  if (w.K > kRouterThreads * 4 * kRouterVec) prefetch_l2(row, w.row_bytes);
  // The per-expert scales (weights: no kernel writes them) go to the first warp's registers here
  // too, in every block since any block may be the last: the routing's final step then needs no
  // load after the top-k.
  const bool reg_route = E <= 128 && k <= 32;
  float sc[4];
  const bool sc_early = scale_early && scale && reg_route && threadIdx.x < 32;
  if (sc_early) {
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[i] = threadIdx.x + 32 * i < E ? scale[threadIdx.x + 32 * i] : 1.0f;
  }
  pdl_wait();
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  float acc = 0.0f;
#pragma unroll
  for (int c = 0; c < kRouterVec; ++c) {
    const int i = (threadIdx.x + kRouterThreads * c) * 4;
    if (i < w.K) acc += dot4(wv[c], x4(x, i, w.K, vec));
  }
  for (int i = (threadIdx.x + kRouterThreads * kRouterVec) * 4; i < w.K; i += kRouterThreads * 4)
    acc += dot4(w4<TYPE>(row, i, w.K), x4(x, i, w.K, vec));
  acc = block_sum(acc);
  if (threadIdx.x == 0) {
    logits[e] = acc;
    // release: the logit is visible device-wide before this block is counted; acquire (the last
    // block): the other blocks' logits are, before the barrier below lets the routing warp read them
    last = atomic_add_acq_rel(counter, 1u) == static_cast<unsigned>(E - 1);
  }
  __syncthreads();
  if (!last) return;
  if (threadIdx.x < 32) {
    if (reg_route) route_row_reg<4>(logits, scale, E, k, out, sc, sc_early);
    else route_row(logits, scale, E, k, out, p);
  }
  if (threadIdx.x == 0) *counter = 0;
}

template <int TYPE>
__global__ void __launch_bounds__(kRouterThreads) router_kernel(RouterArgs a) {
  pdl_trigger();
  router_block<TYPE>(a, blockIdx.x);
}

// Decode, one token: the row chain before a MoE router (the post-attention norm, the residual
// add, the feed-forward input norms) and the router itself, in one launch, side by side instead of
// one after the other. The chain blocks (block 0, and with chain_split_tail a second one for the
// last norms) run the chain p (row_chain.cuh), writing its rows. Every other block computes
// kRouterGroups experts' logits from the chain's inputs, writing nothing else; the last router
// block to finish routes. So the router's step leaves the layer's critical path: it no longer
// waits for the chain's launch to end, nor the experts for the router's. A router block either
// computes its logits in direct form (RouterDirect, below: the default where the chain allows)
// or replays in its shared memory rp, the chain's ops that the router's input depends on
// (chain_replay_plan; rn_slot: its slot in rp), then the dot in router_block's order: the same
// bits as the router's own launch. (The twenty-first session's direct form, the router's input
// in registers in two reductions, counted its reads after its dot, and block 0 waited for that
// count: no faster in any of four builds; bench/RESULTS.md. This one counts them before.)
// Where block 0 rewrites rows that the router blocks and the other chain block read (a graph
// adding the residual in place), it stores those (p.held) last, once every other block has
// counted its reads done (*copied, which it then resets), so that the wait for router blocks that
// started late (they need SMs the kernel before still holds) overlaps its chain instead of
// delaying it. All blocks fit on the GPU at once, and block 0 is the only one that waits, for
// blocks that wait for nothing. Gemma's graph (model/gemma.cpp) writes the layer's residual to a
// row of its own (xm) and the attention output's post-norm too, so none is held and nobody counts
// or waits: on the H200 the count cost the router blocks ~2 300 SM cycles between their last
// load landing and their count done, and the wait and the stores at the end cost block 0 ~1 600
// (bench/RESULTS.md, twenty-third session). Each kind of
// block runs the compact chain loop (~18 KB of instructions): the sixteenth session's form, the
// unrolled chain and an unrolled replay of it in one kernel of 147 KB, ran its chain block at
// 13 us against 5.7 alone.
constexpr int kRouterGroups = kChainThreads / kRouterThreads;

// chain_router's router blocks in direct form: the router's input rn = norm(h) * wr of the residual
// h = x + norm(a) * wa (the post-attention norm and the residual add: the chain ops that the router
// replay plan holds, chain_direct_form) is never formed. Its logits are linear in h, and both norms
// only scale: with y = wa * a, r_a = 1 / sqrt(sum(a^2) / n + eps_a) and
// sum(h^2) = sum(x^2) + 2 r_a sum(x y) + r_a^2 sum(y^2), logit_e = r_h (P_e + r_a Q_e) where
// P_e = sum(W_e wr x) and Q_e = sum(W_e wr y). Every sum comes from x and a as loaded, so the
// block needs one reduction (of 4 + 2 * kRouterGroups values) after one round of loads, where the
// replay copies x and a into shared memory and runs three ops with two reductions before its dot.
// H200, 6-layer 26B-A4B file (bench/RESULTS.md, twenty-second session): the last router block's
// dot 4950 SM cycles after its wait against 7930, the launch 7.9 us against 9.0 (trace), decode
// 2.7 % faster. Two things that did not help: using the router rows before the wait (the block
// then waits ~6000 cycles for them: no gain), and block 0 prefetching the rows to L2 (the issue
// of 1.4 MB of prefetches held it ~12 000 cycles: 1.3 % slower than none).
// The same value as the replay's to rounding, not the same bits: tests compare it with the
// replay and the CPU within bounds.
struct RouterDirect {
  const float* a;   // the attention output, before its norm
  const float* wa;  // its norm's weight (null: ones)
  const float* x;   // the residual before the add
  const float* wr;  // the router input norm's weight (null: ones)
  float eps_a, eps_r;
  bool on;          // false: the router blocks replay the chain's ops instead
  bool rows_vec;    // the router rows' float4s load whole (router_row4)
};

// Float4 j of a float router row. rows_vec (the launcher checked the rows' alignment: 16 bytes for
// F32, 8 for F16 and BF16, and K a multiple of 4): one 128-bit or 64-bit load. Otherwise w4's
// element loads with their bounds checks: 4 loads and their address arithmetic a float4, which
// made the direct form's ~140 loads before its wait ~945 instructions (bench/RESULTS.md,
// twenty-seventh session).
template <int TYPE>
__device__ __forceinline__ float4 router_row4(const mb_u8* row, int j, int K, bool rows_vec) {
  if (rows_vec) {
    if constexpr (TYPE == MB_F32) {
      return __ldg(reinterpret_cast<const float4*>(row) + j);
    } else {
      const uint2 h = __ldg(reinterpret_cast<const uint2*>(row) + j);
      auto f = [](mb_u32 bits) {  // dequant.h's decoding of one half
        const mb_u16 v = static_cast<mb_u16>(bits);
        return TYPE == MB_BF16 ? mb_bf16_bits(v) : mb_half_bits(v);
      };
      return make_float4(f(h.x), f(h.x >> 16), f(h.y), f(h.y >> 16));
    }
  }
  return w4<TYPE>(row, 4 * j, K);
}
constexpr int kDirectSums = 4 + 2 * kRouterGroups;
// The direct form's two scales from the block's sums tot (n: the row's length): r_a, and sum(h^2).
struct DirectScales {
  float ra, hh;
};
__device__ __forceinline__ DirectScales direct_scales(const float* tot, float n, float eps_a) {
  const float ra = rms_scale(tot[0], n, eps_a);
  return {ra, fmaxf(tot[1] + 2.0f * ra * tot[2] + ra * ra * tot[3], 0.0f)};
}

// chain_router in spread form (the default where the chain allows; MARKBASE_CUDA_CHAIN_SPREAD=0:
// off): no chain blocks. The chain is Gemma 4's before a MoE router: the post-attention norm of a,
// the residual add h = x + norm(a) * wa, then norms of h (the dense MLP's input, the experts',
// and the router's when something else reads it), with their 8-bit copies. The router blocks in
// direct form already hold every sum these need (r_a, and sum(h^2) expanded as above), so each
// also writes a share of those rows: router block r owns the groups of 8 float4s (one 8-bit block
// of 32 values) r, r + routers, .., done by its warps 1 .. while warp 0 stores the logits and
// counts. Why: the chain block was the launch's last to end. H200, 6-layer 26B-A4B file: it ended
// ~11 300 SM cycles after its wait (the first norm alone took ~6 000 there, ~500 in the row-chain
// kernel), the routing block ~8 500 (bench/RESULTS.md, twenty-fifth session). Each norm of h takes
// its scale from the expanded sum (as the router's logits do), not from a sum over h itself: the
// same values to rounding, unless x and norm(a) * wa nearly cancel (the sum's error grows by
// sum(x^2) / sum(h^2)).
constexpr int kSpreadNorms = 3;
struct SpreadChain {
  float* a_norm;  // op 0's output: norm(a) * wa (null: not stored, RowOp::keep; so for each row)
  float* h;       // op 1's output: x + norm(a) * wa
  int norms;      // ops 2 ..: norms of h
  const float* w[kSpreadNorms];  // their weights (null: ones)
  float eps[kSpreadNorms];
  float* out[kSpreadNorms];
  Q8Vec q8[kSpreadNorms];  // their 8-bit copies (q null: none)
};
// One slice thread's float4 of the spread chain's rows (j < 0: none) and its weights, loaded
// before the wait (the first pass's), and x and a, loaded after it with the router's own.
struct SpreadPart {
  int j;
  float4 wa, w[kSpreadNorms], x, a;
};
constexpr int kSpreadThreads = kChainThreads - 32;  // warps 1 ..: warp 0 stores the logits and counts

// Slice thread u's float4 in pass m of router block blk (of routers), or -1.
__device__ __forceinline__ int spread_index(int u, int m, int blk, int routers, int n4) {
  const int g = blk + routers * (m * (kSpreadThreads / 8) + u / 8), j = 8 * g + u % 8;
  return j < n4 ? j : -1;
}

__device__ __forceinline__ float4 ld_float4_or(const float* p, int j, float4 none) {
  return p && j >= 0 ? reinterpret_cast<const float4*>(p)[j] : none;
}

__device__ __forceinline__ void spread_weights(const SpreadChain& s, const RouterDirect& d, SpreadPart& part) {
  const float4 one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
  part.wa = ld_float4_or(d.wa, part.j, one);
#pragma unroll
  for (int i = 0; i < kSpreadNorms; ++i) part.w[i] = i < s.norms ? ld_float4_or(s.w[i], part.j, one) : one;
}

__device__ __forceinline__ void spread_rows(const RouterDirect& d, SpreadPart& part) {
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  part.x = part.j >= 0 ? __ldcg(reinterpret_cast<const float4*>(d.x) + part.j) : zero;
  part.a = part.j >= 0 ? __ldcg(reinterpret_cast<const float4*>(d.a) + part.j) : zero;
}

// The slice thread's float4 of every row of the chain, in the chain ops' arithmetic (row_chain.cuh's
// run_chain: a norm scales, then multiplies by its weight; the add). ra: the post-attention norm's
// scale; hh: sum(h^2); n: the row's length. Every lane of the warp calls it (8-bit copies).
__device__ __forceinline__ void spread_store(const SpreadChain& s, const SpreadPart& p, float ra, float hh, float n) {
  const bool in = p.j >= 0;
  const int j = in ? p.j : 0;
  const float4 o = mul4(make_float4(p.a.x * ra, p.a.y * ra, p.a.z * ra, p.a.w * ra), p.wa);
  const float4 h = make_float4(p.x.x + o.x, p.x.y + o.y, p.x.z + o.z, p.x.w + o.w);
  if (in && s.a_norm) reinterpret_cast<float4*>(s.a_norm)[j] = o;
  if (in && s.h) reinterpret_cast<float4*>(s.h)[j] = h;
#pragma unroll
  for (int i = 0; i < kSpreadNorms; ++i) {
    if (i >= s.norms) break;
    const float r = rms_scale(hh, n, s.eps[i]);
    const float4 out = mul4(make_float4(h.x * r, h.y * r, h.z * r, h.w * r), p.w[i]);
    if (in && s.out[i]) reinterpret_cast<float4*>(s.out[i])[j] = out;
    if (s.q8[i].q) q8_store_float4(out, j, in, s.q8[i]);
  }
}

// A router block's kRouterGroups logits (experts e0 ..) in direct form, into lg (shared memory);
// counts its reads of the chain's rows done on *copied when not null (block 0 rewrites them). n4:
// float4s a row. SPREAD: its warps 1 .. then write its share of the chain's rows (SpreadChain; blk:
// its index among the routers router blocks) while warp 0 returns as soon as lg is written.
template <int TYPE, bool PROBE, bool SPREAD = false>
__device__ __forceinline__ void direct_router_logits(const RouterDirect& d, const WeightRef& w, int E, int e0,
                                                     int n4, unsigned* copied, float* lg, ChainProbe<PROBE>& probe,
                                                     const SpreadChain& sp = {}, int blk = 0, int routers = 1) {
  __shared__ float part[kDirectSums][kChainWarps];
  __shared__ float tot[kDirectSums];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const float4 one = make_float4(1.0f, 1.0f, 1.0f, 1.0f), zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  // Issued before the wait (weights, which no kernel writes), used after it: the block's router
  // rows and the two norm weights. Using them here would hold the block until they land (float
  // rows: plain loads; half rows are converted here). The whole block strides over the row once
  // (not each group of kRouterThreads over it), so each thread loads kChainVec float4s of x and
  // of a after the wait.
  float4 wv[kRouterGroups][kChainVec], wr4[kChainVec], wa4[kChainVec];
#pragma unroll
  for (int c = 0; c < kChainVec; ++c) {
    const int j = t + kChainThreads * c;
    const bool in = j < n4;
    wr4[c] = in && d.wr ? reinterpret_cast<const float4*>(d.wr)[j] : one;
    wa4[c] = in && d.wa ? reinterpret_cast<const float4*>(d.wa)[j] : one;
  }
  // The rows' loads in one branch-free run, clamped to the last row and float4: per-load bounds
  // checks made a branch around each. Not zeroed here, which would hold the block until they
  // land: a float4 past the row meets zeros of x and a (its product adds nothing), and a row past
  // the last expert gives a logit that is not stored.
  auto rows = [&](auto vec) {
#pragma unroll
    for (int c = 0; c < kChainVec; ++c) {
      const int j = min(t + kChainThreads * c, n4 - 1);
#pragma unroll
      for (int g = 0; g < kRouterGroups; ++g)
        wv[g][c] = router_row4<TYPE>(w.data + static_cast<size_t>(min(e0 + g, E - 1)) * w.row_bytes, j, w.K,
                                     decltype(vec)::value);
    }
  };
  if (d.rows_vec) rows(std::true_type{});
  else rows(std::false_type{});
  SpreadPart slice{-1};  // SPREAD: this thread's float4 of the first pass
  const bool slicer = SPREAD && t >= 32;
  if constexpr (SPREAD) {
    if (slicer) slice.j = spread_index(t - 32, 0, blk, routers, n4);
    spread_weights(sp, d, slice);
  }
  probe.stamp(kStagePreWait);
  pdl_wait();
  probe.stamp(kStageWaited);
  if constexpr (SPREAD) spread_rows(d, slice);
  // sum(a^2), sum(x^2), sum(x y), sum(y^2), then P and Q of each group. Reduced one warp_sum each,
  // so that the first four reduce while the router rows still land: one reduce-scatter of the 12
  // (common.cuh's warp_sums, 16 shuffles a warp against 60; the same bits) waits for all of them
  // and ran this launch 0.5 us slower on the H200 (bench/RESULTS.md, thirty-first session).
  float sum[kDirectSums] = {};
  float4 xr[kChainVec], yr[kChainVec];  // wr x, wr y
  float4 xs[kChainVec], as[kChainVec];
  // Every load at once, from a clamped index (a float4 past the row reads the row's last and
  // counts as zero): skipping a thread's loads past the row put its second pair behind a branch,
  // after the first pair's arithmetic, a second L2 round trip after the wait (twenty-seventh
  // session, SASS).
#pragma unroll
  for (int c = 0; c < kChainVec; ++c) {
    const int j = min(t + kChainThreads * c, n4 - 1);
    xs[c] = __ldcg(reinterpret_cast<const float4*>(d.x) + j);  // written by the kernel before
    as[c] = __ldcg(reinterpret_cast<const float4*>(d.a) + j);
  }
#pragma unroll
  for (int c = 0; c < kChainVec; ++c) {
    const bool in = t + kChainThreads * c < n4;
    xs[c] = in ? xs[c] : zero;
    as[c] = in ? as[c] : zero;
  }
  if constexpr (PROBE) {  // when each kind of load lands (thread 0's)
    probe.stamp_after(kStageXA, xs[0].x + as[0].x + xs[kChainVec - 1].w + as[kChainVec - 1].w);
    probe.stamp_after(kStageNormW, wr4[0].x + wa4[0].x + wr4[kChainVec - 1].w + wa4[kChainVec - 1].w);
    float r = 0.0f;
#pragma unroll
    for (int g = 0; g < kRouterGroups; ++g) r += wv[g][0].x + wv[g][kChainVec - 1].w;
    probe.stamp_after(kStageRows, r);
  }
#pragma unroll
  for (int c = 0; c < kChainVec; ++c) {  // past the row: zeros, which add nothing
    const float4 x = xs[c], a = as[c];
    const float4 y = mul4(wa4[c], a);
    sum[0] += dot4(a, a);
    sum[1] += dot4(x, x);
    sum[2] += dot4(x, y);
    sum[3] += dot4(y, y);
    xr[c] = mul4(wr4[c], x);
    yr[c] = mul4(wr4[c], y);
  }
  // Every thread has used its x and a: block 0 may overwrite those rows now, even while this
  // block's router rows are still on their way (copied null: it writes none of them).
  if (copied) {
    __syncthreads();
    if (t == 0) red_add_release(copied, 1u);
  }
  probe.stamp(kStageLoaded);
#pragma unroll
  for (int c = 0; c < kChainVec; ++c) {
#pragma unroll
    for (int g = 0; g < kRouterGroups; ++g) {
      sum[4 + 2 * g] += dot4(wv[g][c], xr[c]);
      sum[5 + 2 * g] += dot4(wv[g][c], yr[c]);
    }
  }
#pragma unroll
  for (int v = 0; v < kDirectSums; ++v) {
    const float r = warp_sum(sum[v]);
    if (lane == 0) part[v][warp] = r;
  }
  __syncthreads();
  if (t < kDirectSums) {
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < kChainWarps; ++i) v += part[t][i];
    tot[t] = v;
  }
  __syncthreads();
  const float n = 4.0f * n4;
  if (t < kRouterGroups) {
    const DirectScales z = direct_scales(tot, n, d.eps_a);
    const float rh = rms_scale(z.hh, n, d.eps_r);
    lg[t] = rh * (tot[4 + 2 * t] + z.ra * tot[5 + 2 * t]);
  }
  __syncthreads();
  if constexpr (SPREAD) {
    if (!slicer) return;
    const DirectScales z = direct_scales(tot, n, d.eps_a);
    spread_store(sp, slice, z.ra, z.hh, n);
    // More passes only where the routers are few (groups > routers * kSpreadThreads / 8; not on
    // Gemma 4's 128 experts): loaded as they go.
    const int groups = (n4 + 7) / 8, passes = (groups + routers * (kSpreadThreads / 8) - 1) /
                                                (routers * (kSpreadThreads / 8));
    for (int m = 1; m < passes; ++m) {
      slice.j = spread_index(t - 32, m, blk, routers, n4);
      spread_weights(sp, d, slice);
      spread_rows(d, slice);
      spread_store(sp, slice, z.ra, z.hh, n);
    }
  }
}

// A router block's end, its logits lg (shared memory, experts e0 ..) computed: with r.poll set, it
// stores them to the poll buffer too and, the grid's last block, routes once all are in; else it
// counts itself done and routes if last (routers: the router blocks in the grid). sc: the first
// warp's per-expert scales when sc_early. kind, ops: the probe's key for the routing block.
template <bool PROBE>
__device__ __forceinline__ void router_finish(const RouterArgs& r, const float* lg, int e0, unsigned routers,
                                              const float (&sc)[4], bool sc_early, int ops, int kind,
                                              ChainProbe<PROBE>& probe) {
  __shared__ float p_route[kMaxExperts];
  __shared__ bool last;
  const int E = r.E, k = r.k;
  if (r.poll) {  // E <= 128, k <= 32: chain_router checked
    const int me = e0 / kRouterGroups;  // among the router blocks
    probe.leave_times(me);
    if (threadIdx.x == 0)
      for (int g = 0; g < kRouterGroups && e0 + g < E; ++g) {
        r.logits[e0 + g] = lg[g];
        st_relaxed(r.poll + e0 + g, lg[g]);
      }
    probe.stamp(kStageDot);
    if (blockIdx.x != gridDim.x - 1) return;
    if (threadIdx.x < 32) {
      float lv[4];
      poll_logits(r.poll, E, lv);
      probe.stamp(kStageCounted);
      probe.add_skew(static_cast<int>(routers), me);
      route_row_vals<4>(lv, r.scale, E, k, r.out, sc, sc_early);
    }
    probe.stamp(kStageRouted);
    probe.commit(kProbeRouterPoll, ops);
    return;
  }
  if (threadIdx.x == 0) {
    for (int g = 0; g < kRouterGroups && e0 + g < E; ++g) r.logits[e0 + g] = lg[g];
    probe.stamp(kStageDot);
    last = atomic_add_acq_rel(r.counter, 1u) == routers - 1;  // as router_block's counter
    probe.stamp(kStageCounted);
  }
  __syncthreads();
  if (!last) return;
  if (threadIdx.x < 32) {
    if (E <= 128 && k <= 32) route_row_reg<4>(r.logits, r.scale, E, k, r.out, sc, sc_early);
    else route_row(r.logits, r.scale, E, k, r.out, p_route);
  }
  if (threadIdx.x == 0) *r.counter = 0;
  probe.stamp(kStageRouted);
  probe.commit(kind, ops);
}

// PROBE: chain_probe.cuh's stamps (block 0 and the last router block). DIRECT: the router blocks
// in direct form (d), else they replay rp. SPREAD (with DIRECT): no chain blocks (chains == 0);
// the router blocks write the chain's rows (sp).
// The parameters in the order the spread form first reads them, the chain plans (~1.7 KB, which it
// reads nothing of) last: each 128-byte line of parameters first read by a block stalls it on a
// constant-cache miss, and with the plans first the spread form's reads fell on ~8 lines from
// 0x738 on (ncu's source counters; bench/RESULTS.md, twenty-eighth session). n4: rp.n4.
template <int TYPE, bool PROBE = false, bool DIRECT = false, bool SPREAD = false>
__global__ void __launch_bounds__(kChainThreads, 1) chain_router_kernel(RouterArgs r, RouterDirect d, SpreadChain sp,
                                                                     int n4, int rn_slot, int chains,
                                                                     unsigned* copied,
                                                                     const __grid_constant__ ChainPlan p,
                                                                     const __grid_constant__ ChainPlan rp) {
  static_assert(DIRECT || !SPREAD, "the spread form needs the direct form's sums");
  extern __shared__ float4 sm[];  // p.slots rows of p.n4 float4s (rp has fewer)
  __shared__ float part[kChainWarps];
  __shared__ float lg[kRouterGroups];
  ChainProbe<PROBE> probe;
  probe.start();
  // A block that never triggers lets the dependents start when it ends.
  if (!r.chain_trigger_late || static_cast<int>(blockIdx.x) >= chains) pdl_trigger();
  const unsigned routers = gridDim.x - chains;
  // Whether block 0 rewrites rows that other blocks read (p.held): only then do they count their
  // reads, and block 0 waits for the count. Gemma's graph writes no row that this launch reads.
  const bool hold = p.held != 0;
  auto after_op = [&](int i) { probe.stamp(kStageOp0 + i); };
  const int blk = static_cast<int>(blockIdx.x);
  if (!SPREAD && blk < chains) {
    chain_load_all(p, sm, probe);
    if (blk > 0 && hold) {  // another chain block (chain_split_tail): count its copies done, as router blocks do
      __syncthreads();
      if (threadIdx.x == 0) red_add_release(copied, 1u);
    }
    run_chain<true>(p, sm, p.c.count, true, blk, after_op);
    if (blk > 0) return;
    if (hold) {
      if (threadIdx.x == 0) {
        while (ld_acquire(copied) < routers + chains - 1) {
        }
        *copied = 0;
      }
      __syncthreads();
      probe.stamp(kStageHeld);
      chain_store_held(p, sm);
    }
    probe.commit(kProbeRouterChain, p.c.count);
    return;
  }
  const int e0 = (blk - chains) * kRouterGroups;
  const WeightRef& w = r.w;
  const int E = r.E;
  // Before the wait (weights, which no kernel writes): the first warp's per-expert scales, as
  // router_block loads them.
  float sc[4];
  const bool sc_early = r.scale_early && r.scale && E <= 128 && r.k <= 32 && threadIdx.x < 32;
  if (sc_early) {
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[i] = threadIdx.x + 32 * i < E ? r.scale[threadIdx.x + 32 * i] : 1.0f;
  }
  if constexpr (SPREAD) {
    // Warp 0 goes on to store the logits and count as soon as they are in lg; warps 1 .. write the
    // block's share of the chain's rows first, and join router_finish's barrier after.
    direct_router_logits<TYPE, PROBE, true>(d, w, E, e0, n4, nullptr, lg, probe, sp, blk, static_cast<int>(routers));
    router_finish(r, lg, e0, routers, sc, sc_early, rp.c.count, kProbeRouterDirect, probe);
    return;
  } else if constexpr (DIRECT) {
    direct_router_logits<TYPE>(d, w, E, e0, n4, hold ? copied : nullptr, lg, probe);
  } else {
    const int grp = threadIdx.x / kRouterThreads, gt = threadIdx.x % kRouterThreads, lane = threadIdx.x & 31;
    const int e = e0 + grp;
    // Before the wait: this group's router row in registers (the launcher checked
    // K <= kRouterThreads * 4 * kRouterVec).
    float4 wv[kRouterVec];
    const mb_u8* row = w.data + static_cast<size_t>(e < E ? e : 0) * w.row_bytes;
#pragma unroll
    for (int c = 0; c < kRouterVec; ++c) {
      const int i = (gt + kRouterThreads * c) * 4;
      wv[c] = e < E && i < w.K ? w4<TYPE>(row, i, w.K) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    chain_load_all(rp, sm, probe);
    if (hold) {
      __syncthreads();  // every thread's copies have landed: block 0 may overwrite those rows now
      if (threadIdx.x == 0) red_add_release(copied, 1u);
    }
    run_chain<true>(rp, sm, rp.c.count, false, 0, after_op);
    __syncthreads();  // the dot below reads other threads' float4s of the router's input
    const float4* x = sm + rn_slot * rp.n4;
    float acc = 0.0f;
#pragma unroll
    for (int c = 0; c < kRouterVec; ++c) {
      const int i = gt + kRouterThreads * c;
      if (i * 4 < w.K) acc += dot4(wv[c], x[i]);
    }
    // block_sum's order over each group's kRouterThreads threads
    acc = warp_sum(acc);
    if (lane == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (gt < 32) {
      constexpr int kGroupWarps = kRouterThreads / 32;
      const float v = warp_sum(gt < kGroupWarps ? part[grp * kGroupWarps + gt] : 0.0f);
      if (gt == 0) lg[grp] = v;
    }
  }
  __syncthreads();
  router_finish(r, lg, e0, routers, sc, sc_early, rp.c.count, DIRECT ? kProbeRouterDirect : kProbeRouterLast, probe);
}

// The experts chosen on the host (MARKBASE_CUDA_HOST_ROUTING's debug mode): host_n of them, passed
// by value as the experts' kernels' last parameter, and their count host_n apart, among the first
// parameters: in GPU routing (host_n 0) no block reads the ids' ~260 bytes, and the parameters
// after them had each block miss the constant cache on two to three more lines (the down launch's
// DenseMlp; bench/RESULTS.md, twenty-eighth session).
struct HostIds {
  int ids[kMaxHostIds];
};

__device__ __forceinline__ int expert_of(const float* route, int rs, int t, int j, int E, int host_n,
                                         const HostIds& hid, int k) {
  const int e = host_n ? hid.ids[t * k + j] : static_cast<int>(route[static_cast<size_t>(t) * rs + 2 * j + 1]);
  return min(max(e, 0), E - 1);
}

// grid: (Ie / kWarps, k, rows). act[(t k + j) Ie + r] = gelu(gate_e[r] . x_t) * (up_e[r] . x_t)
template <int TYPE>
__global__ void __launch_bounds__(kWarps * 32) gate_up_kernel(WeightRef w, int E, int Ie, int k, int host_n,
                                                               const float* x, int xs, const float* route, int rs,
                                                               float* act, bool fast, HostIds hid) {
  pdl_entry();
  const int r = blockIdx.x * kWarps + (threadIdx.x >> 5), j = blockIdx.y, t = blockIdx.z;
  if (r >= Ie) return;
  const int e = expert_of(route, rs, t, j, E, host_n, hid, k);
  const mb_u8* base = w.data + static_cast<size_t>(e) * w.expert_bytes;
  const float* xt = x + static_cast<size_t>(t) * xs;
  const bool vec = (xs & 3) == 0;
  const mb_u8* gr = base + static_cast<size_t>(r) * w.row_bytes;
  const mb_u8* ur = base + static_cast<size_t>(Ie + r) * w.row_bytes;
  float g = 0.0f, u = 0.0f;
  bool done = false;
  if constexpr (has_fast_dot(TYPE)) {
    if (fast) {
      const mb_u8* const rows[2] = {gr, ur};  // gate and up rows share each load of x
      float acc[2];
      pair_dot_rows<TYPE, 2>(rows, w.K / 64, xt, threadIdx.x & 31, 32, acc);
      g = warp_sum(acc[0]);
      u = warp_sum(acc[1]);
      done = true;
    }
  }
  if (!done) {
    g = warp_sum(lane_dot<TYPE>(gr, w.K, xt, vec));
    u = warp_sum(lane_dot<TYPE>(ur, w.K, xt, vec));
  }
  if ((threadIdx.x & 31) == 0) act[(static_cast<size_t>(t) * k + j) * Ie + r] = mb_gelu_tanh(g) * u;
}

// grid: (H / kWarps, rows). out[t, h] = sum_j weight_j * (down_e_j[h] . act[t, j])
template <int TYPE>
__global__ void __launch_bounds__(kWarps * 32) down_kernel(WeightRef w, int E, int Ie, int H, int k, int host_n,
                                                            const float* route, int rs, const float* act, float* out,
                                                            int os, bool fast, HostIds hid) {
  pdl_entry();
  const int h = blockIdx.x * kWarps + (threadIdx.x >> 5), t = blockIdx.y;
  if (h >= H) return;
  const bool vec = (Ie & 3) == 0;
  float acc = 0.0f;
  if constexpr (has_fast_dot(TYPE)) if (fast) {
    // 4 groups of 8 lanes, group s taking experts s, s + 4, ...: a 704-wide row is only 11 block
    // pairs, too few to keep a whole warp busy on one expert at a time.
    const int lane = threadIdx.x & 31, grp = lane / 8, sub = lane % 8;
    for (int j = grp; j < k; j += 4) {
      const int e = expert_of(route, rs, t, j, E, host_n, hid, k);
      const mb_u8* row = w.data + static_cast<size_t>(e) * w.expert_bytes + static_cast<size_t>(h) * w.row_bytes;
      acc += route[static_cast<size_t>(t) * rs + 2 * j] *
             pair_dot<TYPE>(row, Ie / 64, act + (static_cast<size_t>(t) * k + j) * Ie, sub, 8);
    }
    acc = warp_sum(acc);
    if ((threadIdx.x & 31) == 0) out[static_cast<size_t>(t) * os + h] = acc;
    return;
  }
  for (int j = 0; j < k; ++j) {
    const int e = expert_of(route, rs, t, j, E, host_n, hid, k);
    const mb_u8* row = w.data + static_cast<size_t>(e) * w.expert_bytes + static_cast<size_t>(h) * w.row_bytes;
    const float wgt = route[static_cast<size_t>(t) * rs + 2 * j];
    acc += wgt * warp_sum(lane_dot<TYPE>(row, Ie, act + (static_cast<size_t>(t) * k + j) * Ie, vec));
  }
  if ((threadIdx.x & 31) == 0) out[static_cast<size_t>(t) * os + h] = acc;
}

// Default mode, one token, on the quantized x (q8.cuh). grid: (Ie / kPairs, k); a block of THREADS
// threads computes kPairs gate rows and the matching up rows of expert slot j, all threads
// striding over the units of the rows, each x unit loaded once for the 2 kPairs rows. THREADS:
// q8_row_warps' count (3 warps for the 26B-A4B's 176 Q4_0 units: 12 blocks an SM where 4 warps fit 9,
// for a launch of 2816 blocks; 8.6 us on the critical path against 10.1).
constexpr int kQ8Threads = 128;
constexpr int kPairs = 2;  // 4 ran the 26B-A4B experts 2 us a layer slower on the H200

// Rows r0 .. r0 + kPairs - 1 of expert slot j, by the block's first THREADS threads (a block of
// the dense MLP's launch may be wider: the others only pass the barrier). The caller has waited.
template <int TYPE, int THREADS>
__device__ __forceinline__ void gate_up_q8_block(const WeightRef& w, int E, int Ie, int k, const Q8Vec& x,
                                                 const float* route, int host_n, const HostIds& hid, float* act,
                                                 int r0, int j) {
  constexpr int R = 2 * kPairs;
  const int e = expert_of(route, 0, 0, j, E, host_n, hid, k);
  const mb_u8* base = w.data + static_cast<size_t>(e) * w.expert_bytes;
  const mb_u8* rows[R];
#pragma unroll
  for (int p = 0; p < kPairs; ++p) {
    const int r = min(r0 + p, Ie - 1);
    rows[2 * p] = base + static_cast<size_t>(r) * w.row_bytes;
    rows[2 * p + 1] = base + static_cast<size_t>(Ie + r) * w.row_bytes;
  }
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  // q8_units_in_flight units a thread in flight (the loads of all before any sum): the expert's
  // rows can only be asked for once the route is known, so every load is on the critical path.
  // The sums keep the order of one unit at a time.
  constexpr int F = q8_units_in_flight(TYPE);
  const int units = w.K / q8_unit_weights(TYPE);
  for (int u = threadIdx.x < THREADS ? static_cast<int>(threadIdx.x) : units; u < units; u += F * THREADS) {
    const int u2 = u + THREADS;
    const bool two = F == 2 && u2 < units;
    WUnit<TYPE> wa[R], wb[F == 2 ? R : 1];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      wa[r] = load_w_unit<TYPE>(rows[r], u);
      if constexpr (F == 2) wb[r] = load_w_unit<TYPE>(rows[r], two ? u2 : u);
    }
    const XUnitOf<TYPE> xa = load_x_unit<TYPE>(x.q, x.d, u);
    const XUnitOf<TYPE> xb = F == 2 ? load_x_unit<TYPE>(x.q, x.d, two ? u2 : u) : xa;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += unit_dot<TYPE>(wa[r], xa);
    if constexpr (F == 2) {
      if (two) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += unit_dot<TYPE>(wb[r], xb);
      }
    }
  }
  __shared__ float part[4][R];  // up to 4 warps a block
  warp_partials(acc, part);
  if (threadIdx.x < kPairs && r0 + static_cast<int>(threadIdx.x) < Ie) {
    float g = 0.0f, u = 0.0f;
#pragma unroll
    for (int i = 0; i < THREADS / 32; ++i) {
      g += part[i][2 * threadIdx.x];
      u += part[i][2 * threadIdx.x + 1];
    }
    act[static_cast<size_t>(j) * Ie + r0 + threadIdx.x] = mb_gelu_tanh(g) * u;
  }
}

template <int TYPE, int THREADS>
__global__ void __launch_bounds__(THREADS) gate_up_q8_kernel(WeightRef w, int E, int Ie, int k, int host_n, Q8Vec x,
                                                              const float* route, float* act, bool trigger_late,
                                                              HostIds hid) {
  if (trigger_late) {  // see down_q8_kernel's `early`
    pdl_wait();
    pdl_trigger();
  } else {
    pdl_entry();
  }
  gate_up_q8_block<TYPE, THREADS>(w, E, Ie, k, x, route, host_n, hid, act, blockIdx.x * kPairs, blockIdx.y);
}

// grid: H / ROWS; a block computes ROWS output rows over all k experts (the units of
// the k expert rows are concatenated), weighting each expert's part by its route weight, so the
// weighted sum needs no second pass and no atomics. Each thread has FLIGHT units' loads in flight
// before its first sum: the 26B-A4B shape has 8 x 44 = 352 units a row, which 2 a thread (the
// first version) took in two dependent DRAM round trips and 3 take in one (Q5_0's whole-block
// units: 176, 2 a thread). The sums keep the order of one unit at a time, whatever FLIGHT is.
//
// early: the route and the first round of weights are read before the PDL wait, as the dense
// products read theirs. That is safe only because the gate/up kernel then triggers its dependents
// after its own wait (trigger_late): this kernel is launched after the quantization kernel, which
// is launched once every gate/up block has passed its wait, i.e. once the router has finished.
// The route is read once a block through L2 (__ldcg), never from a stale L1 line of an earlier
// layer's. ROWS: output rows a block, 2 or 4 (experts_q8 picks).

// A work unit of the down kernel: 16 weights (load_w_unit), or Q5_0's whole 32-weight block
// (q8.cuh's load_w_block_q5_0: fewer loads for the same weights).
constexpr int down_unit_weights(int type) { return q8_word_block(type) ? 32 : 16; }
template <int TYPE>
using DownUnit = std::conditional_t<q8_word_block(TYPE), WBlockQ5, WUnit<TYPE>>;

template <int TYPE, int FLIGHT, int ROWS>
__device__ __forceinline__ void down_q8_block(const WeightRef& w, int E, int Ie, int H, int k, const float* route,
                                              int host_n, const HostIds& hid, const Q8Vec& act, float* out, bool early,
                                              int blk) {
  static_assert(q8_unit_weights(TYPE) == 16, "the 32-weight block types (has_q8_moe_down's)");
  constexpr bool WHOLE = q8_word_block(TYPE);
  extern __shared__ float rt[];  // the route: 2 k floats (weight, expert id)
  bool waited = !early;  // each thread passes the wait once (pdl_wait stamps the trace)
  if (waited) pdl_wait();
  // Read once a block, through L2: read by every thread, the route's one or two lines would be
  // a hot spot of one L2 slice (the kernel ran twice as long that way: session 14).
  for (int i = threadIdx.x; i < 2 * k; i += kQ8Threads) rt[i] = __ldcg(route + i);
  __syncthreads();
  const int h0 = blk * ROWS;
  const int upe = Ie / down_unit_weights(TYPE);  // units per expert row
  float acc[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
  const int units = k * upe;
  for (int u = threadIdx.x; u < units; u += FLIGHT * kQ8Threads) {
    DownUnit<TYPE> wu[FLIGHT][ROWS];
    XUnit xu[FLIGHT][WHOLE ? 2 : 1];
    float wgt[FLIGHT];
    bool ok[FLIGHT];
#pragma unroll
    for (int f = 0; f < FLIGHT; ++f) {
      const int v0 = u + f * kQ8Threads;
      ok[f] = v0 < units;
      const int v = ok[f] ? v0 : u;  // past the end: a repeat of unit u (no new traffic), not summed
      const int j = v / upe, uu = v - j * upe;
      const int e = expert_of(rt, 0, 0, j, E, host_n, hid, k);
      wgt[f] = rt[2 * j];
      const mb_u8* base = w.data + static_cast<size_t>(e) * w.expert_bytes;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const mb_u8* row = base + static_cast<size_t>(min(h0 + r, H - 1)) * w.row_bytes;
        if constexpr (WHOLE) wu[f][r] = load_w_block_q5_0(row, uu);
        else wu[f][r] = load_w_unit<TYPE>(row, uu);
      }
    }
    if (!waited) {
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int f = 0; f < FLIGHT; ++f) {
      const int v = ok[f] ? u + f * kQ8Threads : u;
      const int j = v / upe, uu = v - j * upe;
      const signed char* q = act.q + static_cast<size_t>(j) * Ie;
      const float* d = act.d + static_cast<size_t>(j) * (Ie / 32);
      if constexpr (WHOLE) {
        xu[f][0] = load_x_half<TYPE>(q, d, 2 * uu);
        xu[f][1] = load_x_half<TYPE>(q, d, 2 * uu + 1);
      } else {
        xu[f][0] = load_x_unit<TYPE>(q, d, uu);
      }
    }
#pragma unroll
    for (int f = 0; f < FLIGHT; ++f) {
      if (!ok[f]) break;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        if constexpr (WHOLE) {
          acc[r] += wgt[f] * unit_dot<TYPE>(block_half(wu[f][r], 0), xu[f][0]);
          acc[r] += wgt[f] * unit_dot<TYPE>(block_half(wu[f][r], 1), xu[f][1]);
        } else {
          acc[r] += wgt[f] * unit_dot<TYPE>(wu[f][r], xu[f][0]);
        }
      }
    }
  }
  if (!waited) pdl_wait();  // a thread with no unit: nothing is written before the wait
  __shared__ float part[kQ8Threads / 32][ROWS];
  warp_partials(acc, part);
  if (threadIdx.x < ROWS && h0 + static_cast<int>(threadIdx.x) < H) {
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < kQ8Threads / 32; ++i) v += part[i][threadIdx.x];
    out[h0 + threadIdx.x] = v;
  }
}

template <int TYPE, int FLIGHT, int ROWS>
__global__ void __launch_bounds__(kQ8Threads) down_q8_kernel(WeightRef w, int E, int Ie, int H, int k, int host_n,
                                                              const float* route, Q8Vec act, float* out, bool early,
                                                              HostIds hid) {
  pdl_trigger();
  down_q8_block<TYPE, FLIGHT, ROWS>(w, E, Ie, H, k, route, host_n, hid, act, out, early, blockIdx.x);
}

// --- The dense MLP beside the experts (Gemma 4's MoE layers), decode, default mode, in the
// experts' launches instead of its own three on a second stream: its gate and up products run in
// the router's launch (both read only the row chain's outputs, and the dense blocks load their
// weights before the wait as the router's blocks do), its GeGLU output is quantized with the
// experts' (one quantize_q8 over both: it sits right after them in the same buffer), and its down
// product runs in the experts' down launch. Each part keeps the arithmetic of the kernel it
// replaces (matvec_q8_block with matvec_q8's thread count, GeGLU on the same two floats, the same
// quantization), so the logits are the same bits as with the dense MLP's own launches
// (MARKBASE_CUDA_MOE_DENSE=0). Why: on two streams the dense MLP's kernels slowed the experts'
// as much as they overlapped them (bench/RESULTS.md, sixteenth session).
// The down launch's fields first: it takes the struct after its own parameters, and these then
// share their 128-byte lines (each line a block first reads misses the constant cache).
struct DenseMlp {
  int I, H;
  WeightRef down;            // H rows of I
  Q8Vec act_q8;              // act, quantized
  float* out;                // H floats: down . act
  WeightRef gate, up;        // I rows of H
  Q8Vec x;                   // the MLP's input (the row chain's ffn_norm output), quantized
  float* act;                // I floats: gelu(gate . x) * (up . x)
};

// Outputs r0 .. r0 + kPairs - 1 of the dense MLP's activation: their gate and up rows' sums
// (matvec_q8_block, DT threads), then gelu(gate) * up. trigger_late: as matvec_q8_block's.
template <int TYPE, int DT>
__device__ __forceinline__ void dense_gate_up_block(const DenseMlp& d, int r0, bool trigger_late) {
  const mb_u8* rows[2 * kPairs];
#pragma unroll
  for (int p = 0; p < kPairs; ++p) {
    const int i = min(r0 + p, d.I - 1);
    rows[2 * p] = d.gate.data + static_cast<size_t>(i) * d.gate.row_bytes;
    rows[2 * p + 1] = d.up.data + static_cast<size_t>(i) * d.up.row_bytes;
  }
  const float v = matvec_q8_block<TYPE, 2 * kPairs, DT>(rows, d.H, d.gate.row_bytes, d.x, trigger_late);
  __shared__ float gu[2 * kPairs];
  if (threadIdx.x < 2 * kPairs) gu[threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.x < kPairs && r0 + static_cast<int>(threadIdx.x) < d.I)
    d.act[r0 + threadIdx.x] = mb_gelu_tanh(gu[2 * threadIdx.x]) * gu[2 * threadIdx.x + 1];
}

// grid: E router blocks, then one block per kPairs dense outputs (their gate and up rows).
// DT: the dense products' threads, matvec_q8's choice for K = H.
template <int WTYPE, int DT>
__global__ void __launch_bounds__(kRouterThreads) router_dense_kernel(RouterArgs r, DenseMlp d) {
  pdl_trigger();
  if (static_cast<int>(blockIdx.x) < r.E) {
    router_block<MB_F32>(r, blockIdx.x);
    return;
  }
  dense_gate_up_block<WTYPE, DT>(d, (blockIdx.x - r.E) * kPairs, false);
}

// After chain_router (the route already in device memory): the experts' gate/up rows and the
// dense MLP's gate/up rows (router_dense_kernel's; both of weight type TYPE) in one launch of
// blocks of max(GT, DT) threads;
// the expert blocks compute on their first GT threads, the dense blocks on their first DT, so each
// row's sum is the one its own kernel gives. grid: the dense blocks first when dense_first (the
// default), else the experts' (k * nb blocks, nb = Ie / kPairs rounded up), then the other kind.
// Dense blocks first are resident at the launch and load their first weights before the wait,
// while the chain and router run; last, they start after the experts' blocks and their rows
// lengthen the step. H200, 6-layer 26B-A4B file: 2069 tok/s first, 2005 last, 2030 with the
// router in its own launch (MARKBASE_CUDA_CHAIN_ROUTER=0; bench/RESULTS.md, eighteenth session).
template <int TYPE, int GT, int DT>
__global__ void __launch_bounds__(GT > DT ? GT : DT) gate_up_dense_kernel(WeightRef w, int E, int Ie, int k, Q8Vec x,
                                                                          const float* route, float* act,
                                                                          bool trigger_late, bool dense_first,
                                                                          DenseMlp d) {
  if (!trigger_late) pdl_trigger();
  const int nb = (Ie + kPairs - 1) / kPairs, experts = k * nb, dense = (d.I + kPairs - 1) / kPairs;
  const int b = blockIdx.x;
  const bool is_dense = dense_first ? b < dense : b >= experts;
  if (!is_dense) {
    const int eb = dense_first ? b - dense : b;
    pdl_wait();
    if (trigger_late) pdl_trigger();  // see down_q8_kernel's `early`
    gate_up_q8_block<TYPE, GT>(w, E, Ie, k, x, route, 0, HostIds{}, act, (eb % nb) * kPairs, eb / nb);
    return;
  }
  dense_gate_up_block<TYPE, DT>(d, (dense_first ? b : b - experts) * kPairs, trigger_late);
}

// grid: the experts' down blocks (down_q8_kernel's), then one block per 4 dense outputs.
template <int TYPE, int FLIGHT, int ROWS, int DT>
__global__ void __launch_bounds__(kQ8Threads) down_dense_kernel(WeightRef w, int E, int Ie, int H, int k,
                                                                 int host_n, const float* route, Q8Vec act,
                                                                 float* out, bool early, DenseMlp d, HostIds hid) {
  pdl_trigger();
  const int experts_blocks = (H + ROWS - 1) / ROWS;
  if (static_cast<int>(blockIdx.x) < experts_blocks) {
    down_q8_block<TYPE, FLIGHT, ROWS>(w, E, Ie, H, k, route, host_n, hid, act, out, early, blockIdx.x);
    return;
  }
  constexpr int R = 4;  // matvec_q8's rows a block
  const int h0 = (blockIdx.x - experts_blocks) * R;
  const mb_u8* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = d.down.data + static_cast<size_t>(min(h0 + r, d.H - 1)) * d.down.row_bytes;
  const float v = matvec_q8_block<TYPE, R, DT>(rows, d.I, d.down.row_bytes, d.act_q8);
  if (threadIdx.x < R && h0 + static_cast<int>(threadIdx.x) < d.H) d.out[h0 + threadIdx.x] = v;
}

// One block: entries (t, j) sorted by expert, and the tile list of the grouped matmuls.
__global__ void group_kernel(const float* route, int rs, int rows, int k, int E, int* counts, int* order,
                             int* tiles, int* n_tiles) {
  pdl_entry();
  extern __shared__ int sh[];
  int* cnt = sh;           // E
  int* off = sh + E;       // E
  int* fill = sh + 2 * E;  // E
  int* toff = sh + 3 * E;  // E
  const int n = rows * k;
  for (int e = threadIdx.x; e < E; e += blockDim.x) { cnt[e] = 0; fill[e] = 0; }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int e = min(max(static_cast<int>(route[static_cast<size_t>(i / k) * rs + 2 * (i % k) + 1]), 0), E - 1);
    atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int o = 0, to = 0;
    for (int e = 0; e < E; ++e) {
      off[e] = o;
      toff[e] = to;
      o += cnt[e];
      to += (cnt[e] + kMatmulBM - 1) / kMatmulBM;
    }
    *n_tiles = to;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int e = min(max(static_cast<int>(route[static_cast<size_t>(i / k) * rs + 2 * (i % k) + 1]), 0), E - 1);
    order[off[e] + atomicAdd(&fill[e], 1)] = i;  // order within an expert does not change any row's result
  }
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    counts[e] = cnt[e];
    for (int tt = 0; tt * kMatmulBM < cnt[e]; ++tt) {
      int* d = tiles + 3 * (toff[e] + tt);
      d[0] = e;
      d[1] = off[e] + tt * kMatmulBM;
      d[2] = min(kMatmulBM, cnt[e] - tt * kMatmulBM);
    }
  }
}

// out[t, h] = sum_j weight_j * y[t k + j, h]
__global__ void combine_kernel(const float* route, int rs, const float* y, int H, int k, float* out, int os) {
  pdl_entry();
  const int t = blockIdx.y, h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= H) return;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j)
    acc += route[static_cast<size_t>(t) * rs + 2 * j] * y[(static_cast<size_t>(t) * k + j) * H + h];
  out[static_cast<size_t>(t) * os + h] = acc;
}

// Warps of the decode gate/up kernel (gate_up_q8_kernel's THREADS / 32) for rows of K weights;
// MARKBASE_CUDA_GATE_UP_WARPS=1-4 forces it.
int gate_up_warps(int K, int type) {
  static const int forced = env_digit("MARKBASE_CUDA_GATE_UP_WARPS", 1, 4);
  return forced ? forced : q8_row_warps(K, type, 1);
}

// Decode experts on the quantized x: gate/up with gu_warps warps a block (1-4), the quantization
// of their output, and down with `flight` units a thread in flight (2-4). GU: the gate/up weights'
// type (and the dense MLP's gate/up, whose rows share its launch); DN: the down weights' type (and
// the dense MLP's down). They differ in llama.cpp's K-quant mixes, where the 704- and 2112-wide
// down rows fall back to a 32-block type.
template <int GU, int DN>
void experts_q8(cudaStream_t s, int gu_warps, int flight, int forced_rows, bool dn_early, const WeightRef& gu,
                const WeightRef& dn, int E, int Ie, int H, int k, Q8Vec x_q8, const float* route, int host_n,
                const HostIds& hid, float* act, Q8Vec act_q8, float* out, const DenseMlp* dense,
                int dense_warps, bool dense_gate_up) {
  constexpr decltype(&gate_up_q8_kernel<GU, 32>) gate_up[] = {
      gate_up_q8_kernel<GU, 32>, gate_up_q8_kernel<GU, 64>, gate_up_q8_kernel<GU, 96>,
      gate_up_q8_kernel<GU, 128>};
  constexpr decltype(&down_q8_kernel<DN, 2, 2>) down[2][3] = {
      {down_q8_kernel<DN, 2, 2>, down_q8_kernel<DN, 3, 2>, down_q8_kernel<DN, 4, 2>},
      {down_q8_kernel<DN, 2, 4>, down_q8_kernel<DN, 3, 4>, down_q8_kernel<DN, 4, 4>}};
  // Rows a block of the down kernel: 2, or 4 when the blocks of 2 rows would not all be resident
  // at once. Its early reads (down_q8_kernel's `early`) go out before the wait only in the blocks
  // resident then: the 26B-A4B's 1408 blocks of 2 rows against 8 an SM (1.3 waves) took 6.0 us
  // on the critical path, its 704 blocks of 4 against 6 an SM 2.8 us (H200, session 14, call 7).
  int rows = forced_rows;
  if (!rows) {
    const int per_sm = blocks_per_sm(down[0][flight - 2], kQ8Threads, 2 * k * sizeof(float));
    rows = MB_BLOCKS(H, 2) > static_cast<unsigned>(per_sm * sm_count()) ? 4 : 2;
  }
  if (dense_gate_up) {  // moe_dense_fits (routed) checked the pair of thread counts
    static const bool dense_first = env_flag("MARKBASE_CUDA_DENSE_GU_FIRST", true);  // A/B: =0 last
    const int dt = matvec_q8_warps(dense->H, GU);  // as matvec_q8 over K = H: the same bits
    using GateUpDense = decltype(&gate_up_dense_kernel<GU, 32, 64>);
    const GateUpDense kernel = gu_warps == 1   ? gate_up_dense_kernel<GU, 32, 64>
                               : gu_warps == 2 ? gate_up_dense_kernel<GU, 64, 64>
                               : gu_warps == 3 ? gate_up_dense_kernel<GU, 96, 96>
                                               : gate_up_dense_kernel<GU, 128, 128>;
    if (!(gu_warps == dt || (gu_warps == 1 && dt == 2))) throw std::logic_error("[cuda] gate_up_dense: thread counts");
    enqueue(kernel, k * MB_BLOCKS(Ie, kPairs) + MB_BLOCKS(dense->I, kPairs), 32 * std::max(gu_warps, dt), 0, s, gu, E,
            Ie, k, x_q8, route, act, dn_early, dense_first, *dense);
  } else {
    enqueue(gate_up[gu_warps - 1], dim3(MB_BLOCKS(Ie, kPairs), k), 32 * gu_warps, 0, s, gu, E, Ie, k, host_n, x_q8,
            route, act, dn_early, hid);
  }
  // With the dense MLP: its GeGLU output follows the experts' in act, quantized in the same launch.
  quantize_q8(s, act, 0, k * Ie + (dense ? dense->I : 0), 1, act_q8, 0);
  if (!dense) {
    enqueue(down[rows == 4][flight - 2], MB_BLOCKS(H, rows), kQ8Threads, 2 * k * sizeof(float), s, dn, E, Ie, H, k,
            host_n, route, act_q8, out, dn_early, hid);
    return;
  }
  constexpr decltype(&down_dense_kernel<DN, 2, 2, 64>) down_dense[2][3][3] = {
      {{down_dense_kernel<DN, 2, 2, 64>, down_dense_kernel<DN, 2, 2, 96>, down_dense_kernel<DN, 2, 2, 128>},
       {down_dense_kernel<DN, 3, 2, 64>, down_dense_kernel<DN, 3, 2, 96>, down_dense_kernel<DN, 3, 2, 128>},
       {down_dense_kernel<DN, 4, 2, 64>, down_dense_kernel<DN, 4, 2, 96>, down_dense_kernel<DN, 4, 2, 128>}},
      {{down_dense_kernel<DN, 2, 4, 64>, down_dense_kernel<DN, 2, 4, 96>, down_dense_kernel<DN, 2, 4, 128>},
       {down_dense_kernel<DN, 3, 4, 64>, down_dense_kernel<DN, 3, 4, 96>, down_dense_kernel<DN, 3, 4, 128>},
       {down_dense_kernel<DN, 4, 4, 64>, down_dense_kernel<DN, 4, 4, 96>, down_dense_kernel<DN, 4, 4, 128>}}};
  enqueue(down_dense[rows == 4][flight - 2][dense_warps - 2], MB_BLOCKS(H, rows) + MB_BLOCKS(dense->H, 4), kQ8Threads,
          2 * k * sizeof(float), s, dn, E, Ie, H, k, host_n, route, act_q8, out, dn_early, *dense, hid);
}

// The experts in default mode, one token (the backend checked: one row, a has_q8_dot gate/up
// type, a has_q8_moe_down down type, Ie % 32 == 0), with their launch settings; dense: the dense
// MLP's parts too.
void run_experts_q8(cudaStream_t s, const WeightRef& gu, const WeightRef& dn, int E, int Ie, int H, int k, Q8Vec x_q8,
                    const float* route, int host_n, const HostIds& hid, float* act, Q8Vec act_q8, float* out,
                    const DenseMlp* dense, int dense_warps, bool dense_gate_up) {
  // Units a thread of the down kernel has in flight: the fewest that cover the k expert rows in
  // one round (at most 4). On the 26B-A4B shape (352 units a row) 3 ran the kernel in 7.4 us on
  // the critical path, 2 in 8.5 and 4 in 8.4 (119 registers: fewer blocks an SM). A/B switch:
  // MARKBASE_CUDA_DOWN_FLIGHT=2, 3 or 4 forces it (the same sums in the same order).
  static const int forced = env_digit("MARKBASE_CUDA_DOWN_FLIGHT", 2, 4);
  const int need = (k * (Ie / down_unit_weights(dn.type)) + kQ8Threads - 1) / kQ8Threads;
  const int flight = forced ? forced : std::min(4, std::max(2, need));
  const int gu_warps = gate_up_warps(gu.K, gu.type);
  // The down kernel's early reads (above). A/B switch: MARKBASE_CUDA_DOWN_EARLY=0.
  static const bool dn_early = env_flag("MARKBASE_CUDA_DOWN_EARLY", true);
  // MARKBASE_CUDA_DOWN_ROWS=2 or 4 forces the down kernel's rows a block (experts_q8 picks).
  static const int dn_rows = [] {
    const int r = env_digit("MARKBASE_CUDA_DOWN_ROWS", 2, 4);
    return r == 3 ? 0 : r;
  }();
  bool known = false;
  with_q8_type(gu.type, [&](auto g) {
    known = with_q8_type<true>(dn.type, [&](auto d) {
      experts_q8<decltype(g)::value, decltype(d)::value>(s, gu_warps, flight, dn_rows, dn_early, gu, dn, E, Ie, H, k,
                                                         x_q8, route, host_n, hid, act, act_q8, out, dense,
                                                         dense_warps, dense_gate_up);
    });
  });
  if (!known) throw std::logic_error("[cuda] experts_q8: a weight type without 8-bit kernels");
}

}  // namespace

int moe_route(cudaStream_t s, const float* logits, int ls, const float* scale, int E, int k, int rows, float* out,
              int os) {
  enqueue(route_kernel, rows, 32, E * sizeof(float), s, logits, ls, scale, E, k, out, os);
  return 1;
}

int moe_experts_decode(cudaStream_t s, const WeightRef& gu, const WeightRef& dn, int E, int Ie, int H, int k,
                       const float* x, int xs, const float* route, int rs, int rows, const int* host_ids,
                       float* act, float* out, int os, Q8Vec x_q8, Q8Vec act_q8) {
  HostIds hid{};
  const int host_n = host_ids ? std::min(rows * k, kMaxHostIds) : 0;
  std::copy(host_ids, host_ids + host_n, hid.ids);
  if (x_q8.q) {  // the backend checked: one row, 8-bit kernels for both types, Ie % 32 == 0
    run_experts_q8(s, gu, dn, E, Ie, H, k, x_q8, route, host_n, hid, act, act_q8, out, nullptr, 0, false);
    return 3;
  }
  const dim3 block(kWarps * 32);
  // fast_dot.cuh needs 16-byte aligned activation rows and 4-byte aligned weight rows
  const bool fast_gu = fast_dot_ok(gu.type, gu.K) && (xs & 3) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
                       (reinterpret_cast<uintptr_t>(gu.data) & 3) == 0;
  const bool fast_dn = fast_dot_ok(dn.type, Ie) && (Ie & 3) == 0 && (reinterpret_cast<uintptr_t>(dn.data) & 3) == 0;
#define MB_GATE_UP(T)                                                                                      \
  enqueue(gate_up_kernel<T>, dim3(MB_BLOCKS(Ie, kWarps), k, rows), block, 0, s, gu, E, Ie, k, host_n, x, xs, route, \
          rs, act, fast_gu, hid);                                                                          \
  break;
  MB_TYPE_DISPATCH(gu.type, MB_GATE_UP)
#undef MB_GATE_UP
#define MB_DOWN(T)                                                                                          \
  enqueue(down_kernel<T>, dim3(MB_BLOCKS(H, kWarps), rows), block, 0, s, dn, E, Ie, H, k, host_n, route, rs, act, \
          out, os, fast_dn, hid);                                                                           \
  break;
  MB_TYPE_DISPATCH(dn.type, MB_DOWN)
#undef MB_DOWN
  return 2;
}

bool moe_dense_fits(const WeightRef* router, const WeightRef& gate_up, const WeightRef& down, const WeightRef& gate,
                    const WeightRef& up, const WeightRef& dense_down, int Ie, int I) {
  // the dense down rows share the experts' down launch (down_dense_kernel): one type
  const bool fits = has_q8_dot(gate_up.type) && has_q8_moe_down(down.type) && gate.type == up.type &&
                    has_q8_dot(gate.type) && dense_down.type == down.type && gate.row_bytes == up.row_bytes &&
                    Ie % 32 == 0 && I % 32 == 0;
  if (router) return fits && router->type == MB_F32 && router->K <= kRouterThreads * 4 * kRouterVec;
  // routed (moe_ffn_decode_routed): gate_up_dense_kernel's instances
  const int gt = gate_up_warps(gate_up.K, gate_up.type), dt = matvec_q8_warps(gate.K, gate.type);
  return fits && gate.type == gate_up.type && (gt == dt || (gt == 1 && dt == 2));
}

namespace {
DenseMlp dense_mlp(int k, int Ie, int H, float* act, Q8Vec act_q8, const WeightRef& gate, const WeightRef& up,
                   const WeightRef& dense_down, Q8Vec dense_x, float* dense_out) {
  return DenseMlp{dense_down.K, H, dense_down,
                  Q8Vec{act_q8.q + static_cast<size_t>(k) * Ie, act_q8.d + static_cast<size_t>(k) * Ie / 32},
                  dense_out, gate, up, dense_x, act + static_cast<size_t>(k) * Ie};
}
}  // namespace

int moe_ffn_decode(cudaStream_t s, const WeightRef& router, const float* router_x, const float* expert_scale, int E,
                   int k, float* logits, float* route, unsigned* counter, const WeightRef& gu, const WeightRef& dn,
                   int Ie, int H, Q8Vec x_q8, float* act, Q8Vec act_q8, float* out, const WeightRef& gate,
                   const WeightRef& up, const WeightRef& dense_down, Q8Vec dense_x, float* dense_out) {
  const DenseMlp d = dense_mlp(k, Ie, H, act, act_q8, gate, up, dense_down, dense_x, dense_out);
  const int I = d.I;
  const RouterArgs r{router, router_x, expert_scale, E, k, logits, route, counter, router_scale_early()};
  // as matvec_q8: the same bits
  const int gu_dense_warps = matvec_q8_warps(H, gate.type), dn_dense_warps = matvec_q8_warps(I, dense_down.type);
  with_q8_type(gate.type, [&](auto t) {
    constexpr int T = decltype(t)::value;
    constexpr decltype(&router_dense_kernel<T, 64>) kernel[] = {router_dense_kernel<T, 64>, router_dense_kernel<T, 96>,
                                                                router_dense_kernel<T, 128>};
    enqueue(kernel[gu_dense_warps - 2], E + MB_BLOCKS(I, kPairs), kRouterThreads, 0, s, r, d);
  });
  // The experts as moe_experts_decode runs them, with the dense MLP's down rows in their down launch.
  run_experts_q8(s, gu, dn, E, Ie, H, k, x_q8, route, 0, HostIds{}, act, act_q8, out, &d, dn_dense_warps, false);
  return 4;
}

int moe_ffn_decode_routed(cudaStream_t s, const float* route, int E, int k, const WeightRef& gu, const WeightRef& dn,
                          int Ie, int H, Q8Vec x_q8, float* act, Q8Vec act_q8, float* out, const WeightRef& gate,
                          const WeightRef& up, const WeightRef& dense_down, Q8Vec dense_x, float* dense_out) {
  const DenseMlp d = dense_mlp(k, Ie, H, act, act_q8, gate, up, dense_down, dense_x, dense_out);
  run_experts_q8(s, gu, dn, E, Ie, H, k, x_q8, route, 0, HostIds{}, act, act_q8, out, &d, matvec_q8_warps(d.I, d.down.type), true);
  return 3;
}

bool chain_router_fits(const RowChain& c, const float* router_in, const WeightRef& w, int E) {
  int writes = 0;
  for (int i = 0; i < c.count; ++i) writes += c.op[i].out == router_in;
  const int n = c.op[0].n;
  return writes > 0 && (w.type == MB_F32 || w.type == MB_F16 || w.type == MB_BF16) && w.K == n &&
         n <= kRouterThreads * 4 * kRouterVec && E <= kMaxExperts &&
         static_cast<size_t>(chain_plan(c, 0, c.count).slots) * (n / 4) * 16 <= kChainSmem;
}

namespace {
// What chain_router's router blocks replay: the ops of c that the router's input depends on, in
// order, up to its last write (the feed-forward input norm, which the router does not read, is
// left out). Walking backwards from the router's input, an op is kept when it writes a row still
// needed, which it then defines (its inputs are needed instead). A kept norm's sum is the same
// bits alone as in a group. rn_slot: the router input's slot in the plan.
ChainPlan chain_replay_plan(const RowChain& c, const float* router_in, int* rn_slot) {
  int last = -1;
  for (int i = 0; i < c.count; ++i)
    if (c.op[i].out == router_in) last = i;
  const float* need[2 * kMaxRowOps + 1] = {router_in};
  int needed = 1;
  bool keep[kMaxRowOps] = {};
  for (int i = last; i >= 0; --i) {
    const RowOp& o = c.op[i];
    const auto it = std::find(need, need + needed, o.out);
    if (it == need + needed) continue;
    keep[i] = true;
    *it = need[--needed];
    need[needed++] = o.a;
    if (o.kind == RowOpKind::Add) need[needed++] = o.b;
  }
  RowChain sub;
  for (int i = 0; i <= last; ++i)
    if (keep[i]) sub.op[sub.count++] = c.op[i];
  const ChainPlan rp = chain_plan(sub, 0, sub.count);
  *rn_slot = rp.out[sub.count - 1];
  return rp;
}

// The held rows of block 0's plan p (ChainPlan::held): the rows it rewrites that the router
// blocks (replay plan rp) or the other chain blocks (chains > 1: they copy in all that it does)
// read.
unsigned chain_holds(const ChainPlan& p, const ChainPlan& rp, int chains) {
  unsigned held = 0;
  for (int slot = 0; slot < p.slots; ++slot) {
    if (!p.load[slot] || p.weight[slot]) continue;
    bool written = false, copied = chains > 1;
    for (int i = 0; i < p.c.count; ++i) written = written || p.out[i] == slot;
    for (int t = 0; t < rp.slots; ++t) copied = copied || (rp.load[t] == p.load[slot] && !rp.weight[t]);
    if (written && copied) held |= 1u << slot;
  }
  return held;
}

// The direct form of the router's input (RouterDirect) when the replay plan is its three ops: a
// norm of a, the residual add of its output to x, and the router input's norm of the sum (Gemma 4's
// MoE layers); off otherwise.
RouterDirect chain_direct_form(const ChainPlan& rp) {
  RouterDirect d{};
  const RowOp* o = rp.c.op;
  if (rp.c.count != 3 || o[0].kind != RowOpKind::Norm || o[1].kind != RowOpKind::Add ||
      o[2].kind != RowOpKind::Norm || o[2].a != o[1].out)
    return d;
  const bool a_first = o[1].a == o[0].out;
  if (!a_first && o[1].b != o[0].out) return d;
  const float* x = a_first ? o[1].b : o[1].a;
  if (x == o[0].out || x == o[0].a) return d;
  return RouterDirect{o[0].a, o[0].w, x, o[2].w, o[0].f, o[2].f, true, false};
}

// The spread form of c0 (SpreadChain: on where .norms > 0) when the direct form d is on and c0 is
// its first two ops, the post-attention norm of d.a and the residual add with d.x, then one to
// kSpreadNorms norms of the sum; every op writing a row of its own that no op reads first (the
// router blocks write their shares while others still read x and a). Off (norms 0) otherwise.
SpreadChain chain_spread_form(const RowChain& c0, const RouterDirect& d) {
  SpreadChain sp{};
  const RowOp* o = c0.op;
  if (!d.on || c0.count < 3 || c0.count - 2 > kSpreadNorms || o[0].kind != RowOpKind::Norm || o[0].a != d.a ||
      o[0].w != d.wa || o[0].f != d.eps_a || o[1].kind != RowOpKind::Add)
    return sp;
  const float* h = o[1].out;
  if (!((o[1].a == o[0].out && o[1].b == d.x) || (o[1].b == o[0].out && o[1].a == d.x))) return sp;
  for (int i = 0; i < c0.count; ++i) {
    if (i >= 2 && (o[i].kind != RowOpKind::Norm || o[i].a != h)) return sp;
    if (o[i].out == d.a || o[i].out == d.x) return sp;
    for (int k = 0; k < i; ++k)
      if (o[k].out == o[i].out) return sp;
  }
  sp.a_norm = stored_out(o[0]);
  sp.h = stored_out(o[1]);
  for (int i = 2; i < c0.count; ++i) {
    const int k = sp.norms++;
    sp.w[k] = o[i].w;
    sp.eps[k] = o[i].f;
    sp.out[k] = stored_out(o[i]);
    sp.q8[k] = o[i].q8;
  }
  return sp;
}
}  // namespace

// Lets kernel (one of chain_router_kernel's instances) take kChainSmem of dynamic shared memory,
// once per instance, when a launch of smem bytes needs more than the default 48 KB. Every instance
// has the same type, so a static in the launching lambda would have run once for the first
// instance only: another one launched later in the process (a model whose router is another float
// type, a probe or A/B switch set in between) then failed to launch with more than 48 KB of rows
// (a 4096-wide chain). Only where needed: the spread form takes none, and an instance with much
// static shared memory cannot be given kChainSmem more (the twenty-fifth session's
// MARKBASE_CUDA_ROUTER_SMEM_SUMS, since dropped); that refusal, left as the last error, had
// failed its launch ("invalid argument"). A refusal is cleared here: a launch that needed the
// allowance then fails with its own error.
static void allow_chain_smem(const void* kernel, size_t smem) {
  if (smem <= 48 * 1024) return;
  static std::mutex mu;
  static std::vector<const void*> done;
  std::lock_guard<std::mutex> lock(mu);
  if (std::find(done.begin(), done.end(), kernel) != done.end()) return;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kChainSmem)) ==
      cudaSuccess)
    done.push_back(kernel);
  else
    (void)cudaGetLastError();
}

int chain_router(cudaStream_t s, const RowChain& c, const float* router_in, bool router_in_read,
                 const WeightRef& w, const float* expert_scale, int E, int k, float* logits, float* out,
                 unsigned* counters, float* poll, bool split, bool direct, bool spread) {
  if (!chain_router_fits(c, router_in, w, E)) return 0;
  int rn_slot = 0;
  const ChainPlan rp = chain_replay_plan(c, router_in, &rn_slot);
  // The router blocks compute the router's input themselves (replayed, or folded into the direct
  // form's sums): the chain blocks leave out the op writing its row when nothing else reads it (no later op of the chain, nor,
  // router_in_read false, any op after the chain but the router).
  RowChain c0 = c;
  if (!router_in_read) {
    int i = c.count - 1;
    while (c.op[i].out != router_in) --i;
    bool read = c.op[i].q8.q != nullptr;
    for (int j = i + 1; j < c.count; ++j) read = read || c.op[j].a == router_in || c.op[j].b == router_in;
    if (!read) {
      for (int j = i; j + 1 < c.count; ++j) c0.op[j] = c.op[j + 1];
      --c0.count;
    }
  }
  ChainPlan p = chain_plan(c0, 0, c0.count);
  // Block 0 runs the general chain loop (row_chain.cuh's run_chain), not the fused form that
  // row_chain launches take: in this launch the fused chain ran its 4 ops in ~12 900 SM cycles
  // after the wait against ~7 300 for the loop with its last norm on a second block, and the
  // launch took 9.1 us a layer against 7.0 (H200, 6-layer 26B-A4B file; bench/RESULTS.md,
  // twenty-third session). Why the same code is slower here than alone is not known yet.
  // Timing only (wrong results): MARKBASE_CUDA_PROBE_NO_ROUTER=1 launches the chain blocks alone,
  // to see what the router blocks beside them cost them (the route is not written).
  static const bool no_router = [] {
    const bool on = env_flag("MARKBASE_CUDA_PROBE_NO_ROUTER", false);
    if (on) std::fprintf(stderr, "[cuda] MARKBASE_CUDA_PROBE_NO_ROUTER=1: MoE layers are not routed (timing only)\n");
    return on;
  }();
  RouterDirect d = direct ? chain_direct_form(rp) : RouterDirect{};
  // A/B switch: MARKBASE_CUDA_ROUTER_VEC_ROWS=0 loads the direct form's router rows element by
  // element even where they are aligned for whole float4 loads (router_row4).
  static const bool vec_rows = env_flag("MARKBASE_CUDA_ROUTER_VEC_ROWS", true);
  const size_t row_align = w.type == MB_F32 ? 16 : 8;
  d.rows_vec = vec_rows && w.K % 4 == 0 && w.row_bytes % row_align == 0 &&
               reinterpret_cast<uintptr_t>(w.data) % row_align == 0;
  // (the spread form has no chain blocks to launch alone)
  const SpreadChain sp = spread && !no_router ? chain_spread_form(c0, d) : SpreadChain{};
  const bool spreads = sp.norms > 0;
  const int chains = spreads ? 0 : split ? chain_split_tail(p) : 1;
  p.held = spreads ? 0u : chain_holds(p, rp, chains);
  // block 0's rows, or rp's (the spread form's blocks keep theirs in registers)
  const size_t smem = spreads ? 0 : static_cast<size_t>(std::max(p.slots, rp.slots)) * p.n4 * 16;
  const bool polled = poll && E <= kChainPollExperts && k <= 32;
  const int grid = chains + (no_router ? 0 : (E + kRouterGroups - 1) / kRouterGroups);
  // A/B switch: MARKBASE_CUDA_CHAIN_ROUTER_LATE_TRIGGER=1 starts the next launch (the experts'
  // gate/up, whose dense blocks load their weights before their wait) only once the chain blocks
  // end, not as this launch starts: whether its early blocks slow the chain beside them.
  static const bool late = env_flag("MARKBASE_CUDA_CHAIN_ROUTER_LATE_TRIGGER", false);
  const RouterArgs r{w, router_in, expert_scale, E, k, logits, out, counters, router_scale_early(),
                     polled ? poll : nullptr, late};
  auto launch = [&](auto kernel) {
    allow_chain_smem(reinterpret_cast<const void*>(kernel), smem);
    enqueue(kernel, grid, kChainThreads, smem, s, r, d, sp, rp.n4, rn_slot, chains, counters + 1, p, rp);
    return 1;
  };
  // Float routers only (GGUF files keep the router in F32, Hugging Face directories in BF16).
  auto typed = [&](auto probe, auto direct, auto spread_form) {
    constexpr bool P = decltype(probe)::value, D = decltype(direct)::value, S = decltype(spread_form)::value;
    if (w.type == MB_F32) return launch(chain_router_kernel<MB_F32, P, D, S>);
    if (w.type == MB_F16) return launch(chain_router_kernel<MB_F16, P, D, S>);
    return launch(chain_router_kernel<MB_BF16, P, D, S>);
  };
  using Yes = std::true_type;
  using No = std::false_type;
  auto forms = [&](auto probe) {
    if (spreads) return typed(probe, Yes{}, Yes{});
    return d.on ? typed(probe, Yes{}, No{}) : typed(probe, No{}, No{});
  };
  return chain_probe() ? forms(Yes{}) : forms(No{});
}

int moe_router(cudaStream_t s, const WeightRef& w, const float* x, const float* scale, int E, int k,
               float* logits, float* out, unsigned* counter) {
#define MB_ROUTER(T)                                                                                      \
  enqueue(router_kernel<T>, E, kRouterThreads, 0, s,                                                      \
          RouterArgs{w, x, scale, E, k, logits, out, counter, router_scale_early()});                     \
  return 1;
  MB_TYPE_DISPATCH(w.type, MB_ROUTER)
#undef MB_ROUTER
  return 0;
}

int moe_max_tiles(int rows, int k, int E) { return (rows * k + kMatmulBM - 1) / kMatmulBM + E; }

int moe_experts_prefill(cudaStream_t s, const WeightRef& gu, const WeightRef& dn, int E, int Ie, int H, int k,
                        const float* x, int xs, const float* route, int rs, int rows, const MoeScratch& m,
                        bool precise, float* out, int os, Q8Vec x_q8) {
  enqueue(group_kernel, 1, 1024, 4 * E * sizeof(int), s, route, rs, rows, k, E, m.counts, m.order, m.tiles, m.n_tiles);
  Grouped g;
  g.order = m.order;
  g.tiles = m.tiles;
  g.n_tiles = m.n_tiles;
  g.max_tiles = moe_max_tiles(rows, k, E);
  g.a_div = k;
  const int n = rows * k;
  int launched = 1;
  launched += x_q8.q ? matmul_q8(s, gu, 2 * Ie, x_q8, H, n, m.hg, 2 * Ie, &g)
                     : matmul(s, gu, 2 * Ie, x, xs, n, m.hg, 2 * Ie, precise, &g);
  launched += gelu_mul(s, m.hg, 2 * Ie, m.hg, 2 * Ie, Ie, Ie, n, m.act, Ie);
  g.a_div = 1;
  if (x_q8.q) {
    launched += quantize_q8(s, m.act, Ie, Ie, n, m.act_q8, Ie);
    launched += matmul_q8(s, dn, H, m.act_q8, Ie, n, m.y, H, &g);
  } else {
    launched += matmul(s, dn, H, m.act, Ie, n, m.y, H, precise, &g);
  }
  enqueue(combine_kernel, dim3(MB_BLOCKS(H, 256), rows), 256, 0, s, route, rs, m.y, H, k, out, os);
  return launched + 1;
}

MB_TRACE_ATTACH(trace_attach_moe)

void chain_probe_report_router() { chain_probe_print("moe.cu"); }

}  // namespace markbase::cuda
