// Causal (optionally sliding-window) attention of one layer on the CPU, for the T query tokens of
// a step against the KV cache (float16 or float32). The query heads that share a KV head and a
// few consecutive tokens form one tile: its keys and values are read once for the whole tile and
// reused from registers by up to four queries, instead of once per query and head.
#pragma once
#include <cstdint>

#include "backend/cpu/thread_pool.h"

namespace markbase::cpu {

struct AttentionArgs {
  const float* q;     // [T, heads * d], row stride q_stride
  int q_stride;
  float* out;         // [T, heads * d], row stride out_stride
  int out_stride;
  int T, pos0;        // query t sits at position pos0 + t
  int heads, kv_heads, d;
  int window;         // > 0: a query sees the last `window` positions only
  float scale;        // applied to q . k
  const void* k;      // [kv_heads][capacity][d] of uint16_t (f16) or float
  const void* v;
  bool f16;
  int capacity;
  bool ring;          // position p lives in slot p % capacity
};

void attention(ThreadPool& pool, const AttentionArgs& a);

}  // namespace markbase::cpu
