// The decode row chain (cuda::row_chain, kernels.h): a run of row ops of one token done by one
// block, on copies of the rows in shared memory (run_chain, any chain), or in registers for the
// chains of Gemma's shape (run_fused_chain, below). Here so that a kernel other than norm_rope.cu's
// can run a chain too: moe.cu's chain_router_kernel runs the chain before a MoE router in its
// block 0, and its router blocks replay the part of it that the router's input needs.
#pragma once
#include "backend/cuda/chain_probe.cuh"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/q8.cuh"

namespace markbase::cuda {

// The chain runs in one block of kChainThreads threads; thread t owns float4 number t + kChainThreads c
// (c < kChainVec) of every row. Every distinct row the chain touches (an input, a norm weight, an
// output) gets a slot of shared memory holding its current value: the rows the chain reads before it
// writes them are copied in at the start, all at once (cp.async; the norm weights before the PDL wait,
// since no kernel writes them), and each op reads its operands from the slots and writes its result
// to its output's slot and to global memory. A thread only touches its own float4s of each slot, so
// only the norms' sums cross threads: one barrier per norm, or per group of norms (kNormGroup). The
// first version (1024 threads, one value each, operands loaded from global memory op by op) took
// 7-11 us a chain on the H200: its 32 warps spent more issue slots on per-op overhead than on the
// few values each held.
constexpr int kChainThreads = 512;  // 256 ran the three chains of a 26B-A4B layer 0.9 us slower, 128 3 us
constexpr int kChainVec = kChainMaxN / 4 / kChainThreads;
constexpr int kChainSlots = 3 * kMaxRowOps;
constexpr int kChainWarps = kChainThreads / 32;
// Norms in a row whose inputs none of them writes (Gemma 4's MoE layers: the three norms of the
// residual that feed the dense MLP, the router and the experts; the post-norms of the dense MLP's
// and the experts' outputs) share one reduction, so one barrier: up to this many.
constexpr int kNormGroup = 4;
constexpr size_t kChainSmem = 200 * 1024;  // shared memory a launch may take (the H200 has 227 KB a block)

struct ChainPlan {
  RowChain c;
  int n4;                            // float4s per row (every op of a chain has the same n)
  int slots;
  const float* load[kChainSlots];    // a slot's initial value, or null (written before read)
  unsigned char weight[kChainSlots]; // load is a norm weight: copied before the PDL wait
  unsigned char a[kMaxRowOps], b[kMaxRowOps], out[kMaxRowOps];  // slots; b: Add's b or Norm's w
  unsigned char has_b[kMaxRowOps];
  unsigned char group[kMaxRowOps];   // Norm: the norms from this one whose sums it reduces (0: done earlier)
  unsigned held;                     // bit s: slot s's row is stored only at the end (chain_store_held)
  // Which of the launch's chain blocks runs op i: kAllChainBlocks (each runs it, block 0 stores
  // its output), or one block, which stores it (chain_split_tail).
  unsigned char owner[kMaxRowOps];
};
constexpr unsigned char kAllChainBlocks = 0xff;
static_assert(kChainSlots <= 32, "ChainPlan::held is a 32-bit mask");

// Copies the plan's initial rows into the slots: the norm weights (weights == true, before the PDL
// wait) or the others; one commit group each.
__device__ __forceinline__ void chain_load(const ChainPlan& p, float4* sm, bool weights) {
  for (int s = 0; s < kChainSlots; ++s) {
    if (s >= p.slots) break;
    if (!p.load[s] || (p.weight[s] != 0) != weights) continue;
    const float4* src = reinterpret_cast<const float4*>(p.load[s]);
#pragma unroll
    for (int c = 0; c < kChainVec; ++c) {
      const int i = threadIdx.x + kChainThreads * c;
      if (i < p.n4) cp_async16(sm + s * p.n4 + i, src + i, true);
    }
  }
  cp_async_commit();
}

// Copies all of the plan's initial rows into the slots: the norm weights before the PDL wait
// (no kernel writes them), the others after it; returns when every thread's copies have landed.
template <bool PROBE>
__device__ __forceinline__ void chain_load_all(const ChainPlan& p, float4* sm, ChainProbe<PROBE>& probe) {
  chain_load(p, sm, true);
  probe.stamp(kStagePreWait);
  pdl_wait();
  probe.stamp(kStageWaited);
  chain_load(p, sm, false);
  if constexpr (PROBE) {  // the weights' group first: whether they or the rows come last
    cp_async_wait<1>();
    probe.stamp(kStageWeights);
  }
  cp_async_wait<0>();
  probe.stamp(kStageLoaded);
}

// Runs the plan's first `count` ops in order on the block's slots (their initial rows copied in
// and waited for by every thread). write: each op also stores its output row (and its quantized
// copy) to global memory, except rows of p.held's slots, whose final value chain_store_held
// stores later (chain_router_kernel: rows its router blocks copy in, stored once they have);
// false: a replay that only updates the slots. blk: the block's index among the launch's chain
// blocks: it runs the ops p.owner gives it (and stores those that it owns, or, block 0, that
// every block runs).
// COMPACT (the default): one copy of the op's code in a loop, the plan indexed at run time, instead
// of the loop unrolled over kMaxRowOps ops with constant indices (66 KB of instructions against
// 18 KB). The chain is one block, which fetches its instructions cold on every launch: decode on
// the H200 went +2.8 % (26B-A4B), +3.4 % (its dense equivalent) and +3.5 % (E4B) on the 6-layer
// files (bench/RESULTS.md, seventeenth session). The same arithmetic either way; the unrolled
// form stays for A/B: MARKBASE_CUDA_CHAIN_COMPACT=0.
// after_op(i) runs after op i (the chain probe's stamps; a no-op elsewhere).
template <bool COMPACT, typename AfterOp>
__device__ __forceinline__ void run_chain(const ChainPlan& p, float4* sm, int count, bool write, int blk,
                                          AfterOp after_op) {
  __shared__ float part[2][kNormGroup][kChainWarps];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  int norms = 0;
  float4 v[kChainVec];
  // each norm's sum of squares, reduced with its group's first norm. Indexed at run time, so kept
  // in local memory (a store and an L1 reload on each norm's path): selects over the whole array
  // instead (no local memory) ran every chain ~700 SM cycles slower on the H200 (chain probe,
  // twenty-first session: the dense 3-op chain's first norm 1560 -> 2050 cycles).
  float sums[kMaxRowOps];
  auto op = [&](int i) {
    const int owner = p.owner[i];
    if (owner != kAllChainBlocks && owner != blk) {
      after_op(i);
      return;
    }
    const RowOp& o = p.c.op[i];
    const float4* A = sm + p.a[i] * p.n4;
    const float4* B = sm + p.b[i] * p.n4;
    float4* Y = sm + p.out[i] * p.n4;
    const bool hb = p.has_b[i];
#pragma unroll
    for (int c = 0; c < kChainVec; ++c) {
      const int j = t + kChainThreads * c;
      v[c] = j < p.n4 ? A[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (o.kind == RowOpKind::Norm) {
      const int g = p.group[i];
      if (g > 0) {  // this norm's sum and those of the next g - 1, in one reduction
#pragma unroll
        for (int m = 0; m < kNormGroup; ++m) {
          if (m >= g || i + m >= kMaxRowOps) break;
          const float4* Am = sm + p.a[i + m] * p.n4;  // each thread reads only its own float4s
          float ss = 0.0f;
#pragma unroll
          for (int c = 0; c < kChainVec; ++c) {
            const int j = t + kChainThreads * c;
            if (j < p.n4) ss += dot4(Am[j], Am[j]);
          }
          ss = warp_sum(ss);
          if (lane == 0) part[norms & 1][m][warp] = ss;  // alternate halves: no barrier before the write
        }
        __syncthreads();
#pragma unroll
        for (int m = 0; m < kNormGroup; ++m) {
          if (m >= g || i + m >= kMaxRowOps) break;
          float ss = 0.0f;
#pragma unroll
          for (int w = 0; w < kChainWarps; ++w) ss += part[norms & 1][m][w];
          sums[i + m] = ss;
        }
        ++norms;
      }
      const float r = rms_scale(sums[i], o.n, o.f);
#pragma unroll
      for (int c = 0; c < kChainVec; ++c) {
        const int j = t + kChainThreads * c;
        v[c] = make_float4(v[c].x * r, v[c].y * r, v[c].z * r, v[c].w * r);
        if (hb && j < p.n4) {
          const float4 w = B[j];
          v[c] = make_float4(v[c].x * w.x, v[c].y * w.y, v[c].z * w.z, v[c].w * w.w);
        }
      }
    } else if (o.kind == RowOpKind::Add) {
#pragma unroll
      for (int c = 0; c < kChainVec; ++c) {
        const int j = t + kChainThreads * c;
        if (j < p.n4) {
          const float4 b = B[j];
          v[c] = make_float4(v[c].x + b.x, v[c].y + b.y, v[c].z + b.z, v[c].w + b.w);
        }
      }
    } else {
#pragma unroll
      for (int c = 0; c < kChainVec; ++c)
        v[c] = make_float4(v[c].x * o.f, v[c].y * o.f, v[c].z * o.f, v[c].w * o.f);
    }
    float4* out = reinterpret_cast<float4*>(o.out);
    const bool own = owner == blk || (owner == kAllChainBlocks && blk == 0);
    const bool store = write && own && o.keep && !((p.held >> p.out[i]) & 1u);
#pragma unroll
    for (int c = 0; c < kChainVec; ++c) {
      const int j = t + kChainThreads * c;
      if (j < p.n4) {
        Y[j] = v[c];
        if (store) out[j] = v[c];
      }
    }
    if (write && own && o.q8.q) quantize_float4s<kChainThreads>(v, o.q8, p.n4);
    after_op(i);
  };
  if constexpr (COMPACT) {
#pragma unroll 1
    for (int i = 0; i < count; ++i) op(i);
  } else {
#pragma unroll
    for (int i = 0; i < kMaxRowOps; ++i) {  // constant indices: the plan stays in parameter space
      if (i >= count) break;
      op(i);
    }
  }
}

// Stores the final value of each held slot's row (a row the chain reads first, so p.load[s]).
__device__ __forceinline__ void chain_store_held(const ChainPlan& p, const float4* sm) {
  for (unsigned h = p.held; h; h &= h - 1) {
    const int s = __ffs(h) - 1;
    float4* out = reinterpret_cast<float4*>(const_cast<float*>(p.load[s]));
#pragma unroll
    for (int c = 0; c < kChainVec; ++c) {
      const int j = threadIdx.x + kChainThreads * c;
      if (j < p.n4) out[j] = sm[s * p.n4 + j];
    }
  }
}

// The plan of ops first .. first + count - 1 of c.
inline ChainPlan chain_plan(const RowChain& c, int first, int count) {
  ChainPlan p{};
  p.c.count = count;
  for (int i = 0; i < kMaxRowOps; ++i) p.owner[i] = kAllChainBlocks;
  for (int i = 0; i < count; ++i) p.c.op[i] = c.op[first + i];
  p.n4 = c.op[first].n / 4;
  // Slots are keyed by row pointer: the current value of a row is always in its slot.
  const float* key[kChainSlots] = {};
  auto find = [&](const float* q, bool read, bool weight) {
    for (int s = 0; s < p.slots; ++s)
      if (key[s] == q) return s;
    const int s = p.slots++;
    key[s] = q;
    if (read) {  // read before any op of the chain writes it: copied in at the start
      p.load[s] = q;
      p.weight[s] = weight;
    }
    return s;
  };
  for (int i = 0; i < count; ++i) {
    const RowOp& o = p.c.op[i];
    p.a[i] = static_cast<unsigned char>(find(o.a, true, false));
    const float* b = o.kind == RowOpKind::Add ? o.b : o.kind == RowOpKind::Norm ? o.w : nullptr;
    p.has_b[i] = b != nullptr;
    p.b[i] = b ? static_cast<unsigned char>(find(b, true, o.kind == RowOpKind::Norm)) : 0;
    p.out[i] = static_cast<unsigned char>(find(o.out, false, false));
  }
  // Norm groups: a norm joins the group before it when no op of that group writes its input.
  for (int i = 0; i < count;) {
    if (p.c.op[i].kind != RowOpKind::Norm) { ++i; continue; }
    int g = 1;
    while (i + g < count && g < kNormGroup && p.c.op[i + g].kind == RowOpKind::Norm) {
      bool written = false;
      for (int x = i; x < i + g; ++x) written = written || p.out[x] == p.a[i + g];
      if (written) break;
      ++g;
    }
    p.group[i] = static_cast<unsigned char>(g);
    i += g;
  }
  return p;
}

// Gives each norm of the plan's last group a chain block of its own (at most kNormGroup), when
// that group ends the chain and writes only rows that no block copies in (Gemma 4's MoE layers:
// the dense MLP's and the experts' input norms of the residual, each with its quantized copy):
// each block then runs the ops before the group (the same arithmetic; block 0 stores their rows)
// and its own norm of it, in a reduction of its own (a norm's sum is the same bits alone as in a
// group). A norm with its reduction and quantization costs ~1800-3300 SM cycles in one block
// (chain probe, twentieth session), and the ops before the group, run by every block, are cheaper
// than the norms taken off block 0. Returns the chain blocks to launch (1: unchanged).
inline int chain_split_tail(ChainPlan& p) {
  int first = p.c.count;
  while (first > 0 && p.c.op[first - 1].kind == RowOpKind::Norm) --first;
  while (first < p.c.count && p.group[first] == 0) ++first;  // the last group's first norm
  const int g = p.c.count - first;
  if (g < 2 || p.group[first] != g) return 1;
  for (int i = first; i < p.c.count; ++i)
    if (p.load[p.out[i]]) return 1;
  for (int m = 0; m < g; ++m) {
    p.owner[first + m] = static_cast<unsigned char>(m);
    p.group[first + m] = 1;
  }
  return g;
}

// --- The fused row chain: Gemma's decode chains (the post-norms after a block, the residual add,
// the layer scalar, the next input norms) in registers, with the op sequence fixed in the code
// rather than read from a plan op by op. run_chain above pays for its generality: each op reads
// its operands' slots and its own parameters at run time, and 16 warps each pay that per op
// (~230 SM cycles an op that does nothing, ~700 an add; chain probe, twentieth session). Here each
// thread keeps its float4s of the few live rows in registers, the weights loaded before the
// programmatic wait, and the only costs left are the loads, one reduction per group of norms of
// one row, the stores and the quantization. The same arithmetic as run_chain in the same order
// (the sums of squares, the scale, then the weight; the adds; the scales): the same bits.
//
// The shape (fuse_chain checks a RowChain against it; anything else runs on run_chain):
//   u  = norm(a0) w0                                   (one input), or
//   u  = norm(a0) w0 + norm(a1) w1                     (two: Gemma 4's MoE layers), then maybe
//   u  = norm(u) wu;
//   r  = x + u, then r = r f for each layer scalar     (optional: no add, no scalars, r = u)
//   hj = norm(r) wj for j < nh                         (up to kFusedNorms norms of the same r)
// Every op's output is stored, and quantized where the op's q8 asks, as run_chain does.
constexpr int kFusedNorms = 3;
constexpr int kFusedScales = 2;
struct FusedOut {
  float* out;  // null: not stored (RowOp::keep)
  Q8Vec q8;
};
struct FusedChain {
  int ops;                      // the chain's ops (the probe's key)
  int n;                        // the rows' width (every op's)
  int na;                       // 1 or 2 inputs
  const float* a[2];            // the inputs
  const float* wa[2];           // their norms' weights (null: none)
  float eps_a[2];
  FusedOut ua[2];               // their norms' outputs
  FusedOut sum;                 // na == 2: the sum's output
  bool has_un;                  // the norm of u
  const float* wu;
  float eps_u;
  FusedOut un;
  bool has_add;                 // r = x + u
  const float* x;
  FusedOut r;
  int nsc;                      // layer scalars after the add (or on u)
  float f[kFusedScales];
  FusedOut rs[kFusedScales];
  int nh;                       // the norms of r
  const float* wh[kFusedNorms];
  float eps_h[kFusedNorms];
  FusedOut h[kFusedNorms];
};

// Whether c (all of it) has the fused shape; fills f. Each row read must not be written by an
// earlier op (so it is loaded once, at the start), and each op must read the row that the op
// before it wrote (the current value of u or r).
inline bool fuse_chain(const RowChain& c, FusedChain* out) {
  FusedChain f{};
  const RowOp* o = c.op;
  const int count = c.count;
  int i = 0;
  if (count < 2 || o[0].kind != RowOpKind::Norm) return false;
  f.ops = count;
  f.n = o[0].n;
  auto fo = [](const RowOp& op) { return FusedOut{stored_out(op), op.q8}; };
  f.na = 1;
  f.a[0] = o[0].a;
  f.wa[0] = o[0].w;
  f.eps_a[0] = o[0].f;
  f.ua[0] = fo(o[0]);
  const float* cur = o[0].out;
  i = 1;
  if (i + 1 < count && o[i].kind == RowOpKind::Norm && o[i].a != o[0].out && o[i].out != o[0].out &&
      o[i + 1].kind == RowOpKind::Add &&
      ((o[i + 1].a == o[0].out && o[i + 1].b == o[i].out) || (o[i + 1].a == o[i].out && o[i + 1].b == o[0].out))) {
    f.na = 2;
    f.a[1] = o[i].a;
    f.wa[1] = o[i].w;
    f.eps_a[1] = o[i].f;
    f.ua[1] = fo(o[i]);
    f.sum = fo(o[i + 1]);
    cur = o[i + 1].out;
    i += 2;
    if (i < count && o[i].kind == RowOpKind::Norm && o[i].a == cur) {
      f.has_un = true;
      f.wu = o[i].w;
      f.eps_u = o[i].f;
      f.un = fo(o[i]);
      cur = o[i].out;
      ++i;
    }
  }
  if (i < count && o[i].kind == RowOpKind::Add && (o[i].a == cur) != (o[i].b == cur)) {
    f.has_add = true;
    f.x = o[i].a == cur ? o[i].b : o[i].a;
    for (int j = 0; j < i; ++j)
      if (o[j].out == f.x) return false;  // x must be a row loaded at the start
    f.r = fo(o[i]);
    cur = o[i].out;
    ++i;
  }
  while (i < count && o[i].kind == RowOpKind::Scale && o[i].a == cur && f.nsc < kFusedScales) {
    f.f[f.nsc] = o[i].f;
    f.rs[f.nsc++] = fo(o[i]);
    cur = o[i].out;
    ++i;
  }
  while (i < count && o[i].kind == RowOpKind::Norm && o[i].a == cur && o[i].out != cur && f.nh < kFusedNorms) {
    f.wh[f.nh] = o[i].w;
    f.eps_h[f.nh] = o[i].f;
    f.h[f.nh++] = fo(o[i]);
    ++i;
  }
  if (i != count) return false;
  *out = f;
  return true;
}

// The sums of squares of M rows (each thread's float4s v[m]) over the block, in run_chain's order
// (the thread's float4s in order, the warp, then the warps in order): the same bits. part: the
// caller's shared memory, two halves used in turn (one barrier per reduction); `round` counts them.
template <int M>
__device__ __forceinline__ void fused_sums(const float4 (*v)[kChainVec], int n4, float (*part)[kFusedNorms][kChainWarps],
                                           int& round, float (&tot)[M]) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  float* half = &part[round & 1][0][0];
  float ss[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    ss[m] = 0.0f;
#pragma unroll
    for (int c = 0; c < kChainVec; ++c)
      if (t + kChainThreads * c < n4) ss[m] += dot4(v[m][c], v[m][c]);
  }
  constexpr int sh = WarpSums<M>::shift;
  const float r = warp_sums(ss);  // warp_sum of each, in fewer shuffles
  if ((lane >> sh) < M && (lane & ((1 << sh) - 1)) == 0) half[(lane >> sh) * kChainWarps + warp] = r;
  __syncthreads();
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kChainWarps; ++w) s += half[m * kChainWarps + w];
    tot[m] = s;
  }
  ++round;
}

// v = v r (then v w where w is given), as run_chain's norm.
__device__ __forceinline__ void fused_scale_rows(float4 (&v)[kChainVec], float r, const float4 (&w)[kChainVec], bool hw) {
#pragma unroll
  for (int c = 0; c < kChainVec; ++c) {
    v[c] = make_float4(v[c].x * r, v[c].y * r, v[c].z * r, v[c].w * r);
    if (hw) v[c] = mul4(v[c], w[c]);
  }
}

// Stores v to o.out (and its quantized copy where o.q8 asks).
__device__ __forceinline__ void fused_store(const float4 (&v)[kChainVec], const FusedOut& o, int n4) {
#pragma unroll
  for (int c = 0; c < kChainVec; ++c) {
    const int j = threadIdx.x + kChainThreads * c;
    if (o.out && j < n4) reinterpret_cast<float4*>(o.out)[j] = v[c];
  }
  if (o.q8.q) quantize_float4s<kChainThreads>(v, o.q8, n4);
}

__device__ __forceinline__ void fused_load(const float* p, float4 (&v)[kChainVec], int n4) {
#pragma unroll
  for (int c = 0; c < kChainVec; ++c) {
    const int j = threadIdx.x + kChainThreads * c;
    v[c] = p && j < n4 ? reinterpret_cast<const float4*>(p)[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// Runs f in the calling block (kChainThreads threads), the programmatic wait included: the norm
// weights are loaded before it, the rows after. Stamps: waited, loaded, then op0.. at the end of
// each stage (the ops' indices in the chain: the stage's last op).
template <bool PROBE>
__device__ __forceinline__ void run_fused_chain(const FusedChain& f, ChainProbe<PROBE>& probe) {
  __shared__ float part[2][kFusedNorms][kChainWarps];
  const int n4 = f.n / 4;
  float4 wa[2][kChainVec], wu[kChainVec], wh[kFusedNorms][kChainVec];
  fused_load(f.wa[0], wa[0], n4);
  if (f.na == 2) fused_load(f.wa[1], wa[1], n4);
  if (f.has_un) fused_load(f.wu, wu, n4);
#pragma unroll
  for (int k = 0; k < kFusedNorms; ++k)
    if (k < f.nh) fused_load(f.wh[k], wh[k], n4);
  touch_param_lines(f);
  probe.stamp(kStagePreWait);
  pdl_wait();
  probe.stamp(kStageWaited);
  float4 a[2][kChainVec], x[kChainVec];
  fused_load(f.a[0], a[0], n4);
  if (f.na == 2) fused_load(f.a[1], a[1], n4);
  if (f.has_add) fused_load(f.x, x, n4);
  int round = 0, op = 0;
  // u: the inputs' norms (one reduction for both), their sum, its norm
  if (f.na == 2) {
    float tot[2];
    fused_sums<2>(a, n4, part, round, tot);
    probe.stamp(kStageLoaded);
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      fused_scale_rows(a[m], rms_scale(tot[m], f.n, f.eps_a[m]), wa[m], f.wa[m] != nullptr);
      fused_store(a[m], f.ua[m], n4);
    }
#pragma unroll
    for (int c = 0; c < kChainVec; ++c)
      a[0][c] = make_float4(a[0][c].x + a[1][c].x, a[0][c].y + a[1][c].y, a[0][c].z + a[1][c].z, a[0][c].w + a[1][c].w);
    fused_store(a[0], f.sum, n4);
    op = 2;
    if (f.has_un) {
      float tu[1];
      fused_sums<1>(a, n4, part, round, tu);
      fused_scale_rows(a[0], rms_scale(tu[0], f.n, f.eps_u), wu, f.wu != nullptr);
      fused_store(a[0], f.un, n4);
      ++op;
    }
  } else {
    float tot[1];
    fused_sums<1>(a, n4, part, round, tot);
    probe.stamp(kStageLoaded);
    fused_scale_rows(a[0], rms_scale(tot[0], f.n, f.eps_a[0]), wa[0], f.wa[0] != nullptr);
    fused_store(a[0], f.ua[0], n4);
  }
  probe.stamp(kStageOp0 + op);
  // r: the residual add and the layer scalars
  if (f.has_add) {
#pragma unroll
    for (int c = 0; c < kChainVec; ++c)
      a[0][c] = make_float4(x[c].x + a[0][c].x, x[c].y + a[0][c].y, x[c].z + a[0][c].z, x[c].w + a[0][c].w);
    fused_store(a[0], f.r, n4);
    ++op;
  }
#pragma unroll
  for (int k = 0; k < kFusedScales; ++k) {
    if (k >= f.nsc) break;
    const float s = f.f[k];
#pragma unroll
    for (int c = 0; c < kChainVec; ++c) a[0][c] = make_float4(a[0][c].x * s, a[0][c].y * s, a[0][c].z * s, a[0][c].w * s);
    fused_store(a[0], f.rs[k], n4);
    ++op;
  }
  probe.stamp(kStageOp0 + op);
  // h: the norms of r, one reduction (the same sum for each)
  if (f.nh > 0) {
    float tr[1];
    fused_sums<1>(a, n4, part, round, tr);
#pragma unroll
    for (int k = 0; k < kFusedNorms; ++k) {
      if (k >= f.nh) break;
      float4 v[kChainVec];
#pragma unroll
      for (int c = 0; c < kChainVec; ++c) v[c] = a[0][c];
      fused_scale_rows(v, rms_scale(tr[0], f.n, f.eps_h[k]), wh[k], f.wh[k] != nullptr);
      fused_store(v, f.h[k], n4);
      ++op;
    }
    probe.stamp(kStageOp0 + op);
  }
}

}  // namespace markbase::cuda
