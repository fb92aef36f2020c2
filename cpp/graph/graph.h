// A Graph is data: an ordered list of ops over activation slots, weights and KV caches, for one
// phase (a prefill chunk of T tokens, or one decode token). Per-token values (token ids,
// positions) live in the step buffer, not in the graph, so a backend may record a graph once
// and replay it for every token.
#pragma once
#include <string>
#include <vector>

#include "formats/tensor.h"

namespace markbase {

enum class OpKind {
  Embed,        // out[t] = W[token[t]] * f                       (w: [V, cols])
  RmsNorm,      // out = a / rms(a) * w, per group of `group` columns (w may be null)
  MatMul,       // out[t, n] = sum_k a[t, k] * W[n, k]             (any tensor type)
  GeluMul,      // out = gelu_tanh(a) * b                          (b may start at column b_col)
  Add,          // out = a + b
  Scale,        // out = a * f
  Rope,         // rotate `heads` heads of `head_dim` at the step's positions (table `table`)
  StoreKV,      // write k (slot a) and v (slot b) rows into cache `layer` at the step's positions
  Attention,    // out = softmax(q K^T * f [window]) V over cache `layer`
  Softcap,      // out = f * tanh(a / f)
  MoeRoute,     // out[t] = (weight, expert id) x k from router logits a (w2: per-expert scale)
  MoeExperts,   // out[t] = sum_k weight * down_e(gelu(gate_e a) * up_e a), e from route slot b
  LastRow,      // out[0] = a[T - 1]
};

struct Slot {
  int rows_per_token = 1;  // rows = T * rows_per_token, or 1 when last_only
  int cols = 0;
  bool last_only = false;  // a single row (the head of a decode graph)
};

struct Op {
  OpKind kind;
  int out = -1, a = -1, b = -1;
  const TensorView* w = nullptr;   // main weight
  const TensorView* w2 = nullptr;  // second weight (MoeExperts: down; MoeRoute: per-expert scale)
  float f = 0.0f;                  // eps / scale / softcap / attention scale
  int group = 0;                   // RmsNorm group width; Rope head_dim; Attention head_dim
  int heads = 0, kv_heads = 0;
  int layer = -1;                  // KV cache index (StoreKV, Attention)
  int table = -1;                  // RoPE table index
  int window = 0;                  // sliding window (0: full attention)
  int k = 0;                       // MoE experts used; MoeExperts: expert ffn width
  int b_col = 0;                   // column offset into b (GeluMul with per-layer inputs)
  int n = 0;                       // logical output columns (slots may be wider: they are reused)
  std::string label;               // what the op computes, for profiles and errors
};

// One KV cache: [kv_heads][capacity][head_dim] for K and for V. Sliding layers use a ring of
// `capacity` positions (window + one prefill chunk); full layers hold the whole context.
struct CacheDesc {
  int kv_heads = 0, head_dim = 0, capacity = 0;
  bool ring = false;
};

// How a RoPE table's angles arise, as llama.cpp computes them (a backend that reproduces llama.cpp's
// rounding uses it; the others use the table): angle_i = freq_scale * (theta_i / factor_i), with
// theta_0 = pos and theta_{i+1} = theta_i * theta_scale in float32. theta_scale == 0: unknown.
struct RopeSpec {
  float theta_scale = 0.0f, freq_scale = 1.0f;
  std::vector<float> factors;  // per pair; empty: all 1
};

struct Graph {
  int T = 1;                              // tokens per step
  std::vector<Slot> slots;
  std::vector<Op> ops;
  std::vector<std::vector<float>> rope_tables;  // inverse frequencies per table
  std::vector<RopeSpec> rope_specs;             // the same tables as llama.cpp builds them
  int logits = -1;                        // slot holding the logits
  int vocab = 0;

  int add_slot(int cols, bool last_only = false, int rows_per_token = 1) {
    slots.push_back({rows_per_token, cols, last_only});
    return static_cast<int>(slots.size()) - 1;
  }
  int rows(int slot) const {
    return slots[slot].last_only ? 1 : T * slots[slot].rows_per_token;
  }
};

// The per-token values of one step.
struct Step {
  std::vector<int> tokens;  // T token ids
  int pos0 = 0;             // position of tokens[0]
};

}  // namespace markbase
