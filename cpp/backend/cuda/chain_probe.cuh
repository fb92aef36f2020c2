// MARKBASE_CUDA_CHAIN_PROBE=1: where the decode row chains' time goes (row_chain.cuh's kernels:
// norm_rope.cu's row_chain_kernel, moe.cu's chain_router_kernel), stage by stage, in SM cycles.
// bench/cuda/chain_probe.sh runs it beside the per-op critical-path trace.
#pragma once
#include <cstdio>

#include "backend/cuda/common.cuh"

namespace markbase::cuda {

// The chain kernels' PROBE instances add up, per kind of block and chain length, thread 0's SM
// cycles from its block's start to each stage, so that a chain's time on the critical path (the
// trace's) can be split into its parts. Each translation unit has its own table (no relocatable
// device code); chain_probe_print prints it.
enum ChainProbeKind {
  kProbeRowChain,
  kProbeRouterChain,
  kProbeRouterLast,
  kProbeRouterDirect,
  kProbeFusedChain,  // row_chain.cuh's run_fused_chain
  kProbeRouterPoll,  // chain_router's routing block in poll mode (moe.cu's poll_logits)
  kProbeKinds
};
enum ChainProbeStage {
  kStagePreWait,   // the weights' copies issued, before the PDL wait
  kStageWaited,    // past the wait
  kStageLoaded,    // the rows in shared memory (a direct router block: its rows read and counted)
  kStageOp0,       // after op i: kStageOp0 + i
  kStageHeld = kStageOp0 + kMaxRowOps,  // chain_router's block 0: the router blocks' copies counted
  kStageDot,       // a router block: its logits stored
  kStageCounted,   // a router block: past its count (the last one knows it is last), or its poll
  kStageRouted,    // the last router block: the route written
  kStageWeights,   // a chain block: its norm weights' copies landed (issued before the wait)
  kStageXA,        // a direct router block: its loads of x and a landed
  kStageNormW,     // a direct router block: its norm weights landed (issued before the wait)
  kStageRows,      // a direct router block: its router rows landed (issued before the wait)
  kStageEnd,       // the block's last instruction
  kProbeStages
};
struct ChainProbeTable {
  unsigned long long launches[kProbeKinds][kMaxRowOps + 1];
  // Whether a kind's block ran on the SM that its previous launch used (its instruction cache may
  // still hold its code): the previous SM id + 1, and the count of repeats.
  unsigned last_sm[kProbeKinds][kMaxRowOps + 1];
  unsigned long long same_sm[kProbeKinds][kMaxRowOps + 1];
  unsigned long long cycles[kProbeKinds][kMaxRowOps + 1][kProbeStages];
  unsigned long long hits[kProbeKinds][kMaxRowOps + 1][kProbeStages];
};
static __device__ ChainProbeTable mb_chain_probe;
// The spread of chain_router's router blocks (poll mode): each leaves its start, the end of its
// PDL wait and its logits-stored times (globaltimer, ns) and its wait (SM cycles from its
// pre-wait stamp to past the wait) in mb_router_times before its logits; the routing block, once
// it has all logits, adds up per launch how many blocks waited under kProbeLateWait cycles (the
// kernel before had ended by the time they reached their wait: their work before the wait was on
// the critical path), the spread of the blocks' starts, wait ends and logits, and the routing
// block's start after the first. The probe's own stores and fence slow the launch: its times are
// for comparing variants.
constexpr long long kProbeLateWait = 600;
struct RouterSkewTable {
  unsigned long long launches, blocks, late, start_spread_ns, waited_spread_ns, dot_spread_ns, routing_start_ns,
      wait_cycles, after_wait_ns, after_wait_max_ns, routing_seen_ns;
};
static __device__ RouterSkewTable mb_router_skew;
// kMaxExperts blocks: start, past the wait, logits stored (ns), wait (cycles)
static __device__ unsigned long long mb_router_times[1024][4];
// Thread 0's stamps of one block; PROBE false: nothing (the default instances' code is unchanged).
template <bool PROBE>
struct ChainProbe {
  long long t0 = 0, t[kProbeStages] = {};
  unsigned long long g0 = 0, gw = 0;  // globaltimer at the start and past the wait (ns)
  __device__ __forceinline__ static unsigned long long now_ns() {
    unsigned long long g;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
    return g;
  }
  __device__ __forceinline__ void start() {
    if constexpr (PROBE) {
      t0 = clock64();
      g0 = now_ns();
    }
  }
  // Thread 0 of router block i, its logits computed, before it stores them (RouterSkewTable).
  __device__ __forceinline__ void leave_times(int i) {
    if constexpr (PROBE) {
      if (threadIdx.x != 0) return;
      mb_router_times[i][0] = g0;
      mb_router_times[i][1] = gw;
      mb_router_times[i][2] = now_ns();
      mb_router_times[i][3] = static_cast<unsigned long long>(t[kStageWaited] - t[kStagePreWait]);
      __threadfence();
    }
  }
  // Thread 0 of the routing block (router block me of n), once every block's logits are in.
  __device__ __forceinline__ void add_skew(int n, int me) {
    if constexpr (PROBE) {
      if (threadIdx.x != 0) return;
      const unsigned long long seen = now_ns();
      __threadfence();
      unsigned long long s0 = ~0ull, s1 = 0, w0 = ~0ull, w1 = 0, d0 = ~0ull, d1 = 0, late = 0, wait = 0, aw = 0, awm = 0;
      for (int i = 0; i < n; ++i) {
        const unsigned long long s = mb_router_times[i][0], g = mb_router_times[i][1], d = mb_router_times[i][2],
                                 w = mb_router_times[i][3];
        s0 = min(s0, s), s1 = max(s1, s), w0 = min(w0, g), w1 = max(w1, g), d0 = min(d0, d), d1 = max(d1, d);
        late += w < static_cast<unsigned long long>(kProbeLateWait);
        wait += w;
        aw += d - g;
        awm = max(awm, d - g);
      }
      atomicAdd(&mb_router_skew.launches, 1ull);
      atomicAdd(&mb_router_skew.blocks, static_cast<unsigned long long>(n));
      atomicAdd(&mb_router_skew.late, late);
      atomicAdd(&mb_router_skew.start_spread_ns, s1 - s0);
      atomicAdd(&mb_router_skew.dot_spread_ns, d1 - d0);
      atomicAdd(&mb_router_skew.routing_start_ns, mb_router_times[me][0] - s0);
      atomicAdd(&mb_router_skew.wait_cycles, wait);
      atomicAdd(&mb_router_skew.waited_spread_ns, w1 - w0);
      atomicAdd(&mb_router_skew.after_wait_ns, aw);
      atomicAdd(&mb_router_skew.after_wait_max_ns, awm);
      atomicAdd(&mb_router_skew.routing_seen_ns, seen - d1);
    }
  }
  __device__ __forceinline__ static unsigned sm_id() {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
  }
  __device__ __forceinline__ void stamp(int stage) {
    if constexpr (PROBE) {
      if (threadIdx.x == 0) {
        t[stage] = clock64() - t0;
        if (stage == kStageWaited) gw = now_ns();
      }
    }
  }
  // The stamp once v has landed: an instruction that reads v holds the thread until its load
  // returns (an empty asm would not), and the clock is read after it (both volatile, so in order).
  __device__ __forceinline__ void stamp_after(int stage, float v) {
    if constexpr (PROBE) {
      if (threadIdx.x == 0) {
        unsigned u;
        asm volatile("mov.b32 %0, %1;" : "=r"(u) : "f"(v));
        long long c;
        asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) : "r"(u));
        t[stage] = c - t0;
      }
    }
  }
  // Adds the stamps taken to the table's row (kind, ops).
  __device__ __forceinline__ void commit(int kind, int ops) {
    if constexpr (PROBE) {
      if (threadIdx.x != 0) return;
      t[kStageEnd] = clock64() - t0;
      atomicAdd(&mb_chain_probe.launches[kind][ops], 1ull);
      const unsigned sm = sm_id() + 1;
      if (atomicExch(&mb_chain_probe.last_sm[kind][ops], sm) == sm) atomicAdd(&mb_chain_probe.same_sm[kind][ops], 1ull);
      for (int s = 0; s < kProbeStages; ++s)
        if (t[s] > 0) {
          atomicAdd(&mb_chain_probe.cycles[kind][ops][s], static_cast<unsigned long long>(t[s]));
          atomicAdd(&mb_chain_probe.hits[kind][ops][s], 1ull);
        }
    }
  }
};
// Prints this translation unit's table (to stderr; tag names the unit's kernels). static: each
// unit's own copy reads its own table (an inline function would be merged into one by the linker).
static void chain_probe_print(const char* tag) {
  ChainProbeTable h{};
  if (cudaMemcpyFromSymbol(&h, mb_chain_probe, sizeof(h)) != cudaSuccess) return;
  static const char* kinds[] = {"row_chain", "chain_router block 0", "chain_router last router block",
                                "chain_router last direct router block", "fused chain",
                                "chain_router polling router block"};
  static_assert(sizeof(kinds) / sizeof(kinds[0]) == kProbeKinds, "kind names");
  static const char* stages[] = {"pre-wait", "waited", "loaded", "op0", "op1", "op2", "op3", "op4", "op5", "op6",
                                 "op7", "held", "dot", "counted", "routed", "weights landed", "x,a landed",
                                 "norm weights landed", "router rows landed", "end"};
  static_assert(sizeof(stages) / sizeof(stages[0]) == kProbeStages, "stage names");
  for (int k = 0; k < kProbeKinds; ++k)
    for (int n = 0; n <= kMaxRowOps; ++n) {
      if (!h.launches[k][n]) continue;
      std::fprintf(stderr,
                   "[cuda chain probe] %s: %s, %d ops, %llu launches (%.0f %% on the SM of the previous one); "
                   "mean SM cycles from the block's start:",
                   tag, kinds[k], n, h.launches[k][n], 100.0 * h.same_sm[k][n] / h.launches[k][n]);
      for (int s = 0; s < kProbeStages; ++s)
        if (h.hits[k][n][s])
          std::fprintf(stderr, " %s %.0f", stages[s], static_cast<double>(h.cycles[k][n][s]) / h.hits[k][n][s]);
      std::fprintf(stderr, "\n");
    }
  RouterSkewTable r{};
  if (cudaMemcpyFromSymbol(&r, mb_router_skew, sizeof(r)) != cudaSuccess || !r.launches) return;
  const double L = static_cast<double>(r.launches);
  std::fprintf(stderr,
               "[cuda chain probe] %s: router blocks, %llu launches of %.0f: %.1f a launch waited under %lld "
               "cycles (reached it after the kernel before ended); mean wait %.0f cycles; starts spread over "
               "%.0f ns, waits' ends over %.0f ns, logits over %.0f ns; from a block's wait to its logits "
               "%.0f ns (the slowest %.0f); the routing block started %.0f ns after the first and had all "
               "logits %.0f ns after the last was stored\n",
               tag, r.launches, r.blocks / L, r.late / L, kProbeLateWait, static_cast<double>(r.wait_cycles) / r.blocks,
               r.start_spread_ns / L, r.waited_spread_ns / L, r.dot_spread_ns / L,
               static_cast<double>(r.after_wait_ns) / r.blocks, r.after_wait_max_ns / L, r.routing_start_ns / L,
               r.routing_seen_ns / L);
}

}  // namespace markbase::cuda
