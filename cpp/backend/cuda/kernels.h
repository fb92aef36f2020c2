// Launchers of the CUDA backend's kernels, callable from plain C++ (cuda_backend.cpp). Each
// launcher enqueues its kernel(s) on `s` and returns how many kernels it launched, so that the
// backend can count kernels per token. Activations are float32 rows; weights are the file's
// blocks as uploaded (never dequantized into a copy); `type` is the GGML type id.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace markbase::cuda {

// The per-step values of a graph, in device memory: written by the host before each launch, read
// by the kernels, so that a captured graph replays unchanged for every token.
struct StepBuf {
  int pos0;
  int tokens[1];  // T entries (the buffer is allocated with room for all of them)
};

// A weight matrix [experts x] N x K as the kernels see it.
struct WeightRef {
  const uint8_t* data = nullptr;
  int type = 0;
  int K = 0;                  // columns (the contiguous dimension)
  size_t row_bytes = 0;
  size_t expert_bytes = 0;    // bytes per expert (MoE stacks), else 0
};

// --- matvec.cu: out[t, n] = dot(a[t], W[n]) for few tokens (decode), weights read once.
int matvec(cudaStream_t s, const WeightRef& w, int N, const float* a, int a_stride, int T, float* out,
           int out_stride);

// --- matmul.cu: the same for many tokens (prefill), tiled. precise: float32 FMA; otherwise the
// tiles are dequantized to f16 and multiplied on the tensor cores (f32 accumulation).
// Grouped form (MoE prefill): tiles come from a device tile list; tile i covers sorted entries
// [start, start + count) of expert e; A row of entry x is a[x / a_div], its output row out[x].
struct Grouped {
  const int* order = nullptr;     // entries sorted by expert
  const int* tiles = nullptr;     // per tile: expert, start, count
  const int* n_tiles = nullptr;   // device count of tiles
  int max_tiles = 0;              // grid size (an upper bound of *n_tiles)
  int a_div = 1;
};
constexpr int kMatmulBM = 64;     // token rows per tile (MoE tiles hold at most this many)
int matmul(cudaStream_t s, const WeightRef& w, int N, const float* a, int a_stride, int M, float* out,
           int out_stride, bool precise, const Grouped* grouped = nullptr);

// --- norm_rope.cu: row-wise and element-wise ops.
int embed(cudaStream_t s, const WeightRef& w, const StepBuf* step, int T, int vocab, float scale,
          int n, float* out, int out_stride);
int rms_norm(cudaStream_t s, const float* a, int a_stride, const float* w, int n, int group, float eps,
             int rows, float* out, int out_stride);
// Fusions the backend applies to adjacent ops (fewer kernels per token):
//   RmsNorm(out = S) then Add(x = x + S): out = norm(a) * w and x += out, in one pass;
//   RmsNorm per head then Rope on the same slot: QK-norm and rotation in one pass.
int rms_norm_add(cudaStream_t s, const float* a, int a_stride, const float* w, int n, float eps, int rows,
                 float* out, int out_stride, float* x, int x_stride);
int rms_norm_rope(cudaStream_t s, const float* a, int a_stride, const float* w, float eps, const float* inv_freq,
                  const StepBuf* step, int T, int heads, int head_dim, float* out, int out_stride);
int gelu_mul(cudaStream_t s, const float* a, int a_stride, const float* b, int b_stride, int b_col,
             int n, int rows, float* out, int out_stride);
int add(cudaStream_t s, const float* a, int a_stride, const float* b, int b_stride, int n, int rows,
        float* out, int out_stride);
int scale(cudaStream_t s, const float* a, int a_stride, float f, int n, int rows, float* out, int out_stride);
int softcap(cudaStream_t s, const float* a, int a_stride, float f, int n, int rows, float* out, int out_stride);
int copy_row(cudaStream_t s, const float* a, int n, float* out);
int rope(cudaStream_t s, const float* a, int a_stride, const float* inv_freq, const StepBuf* step, int T,
         int heads, int head_dim, float* out, int out_stride);

// --- attention.cu: KV cache writes and attention over a (ring) cache.
struct CacheRef {
  void* k = nullptr;
  void* v = nullptr;
  int kv_heads = 0, head_dim = 0, capacity = 0;
  bool ring = false, f16 = true;
};
int store_kv(cudaStream_t s, const CacheRef& c, const float* k, int k_stride, const float* v, int v_stride,
             const StepBuf* step, int T, int* error_flag);
// splits > 1: positions are split over that many blocks per row and combined (decode);
// scratch holds rows * splits * (head_dim + 2) floats.
int attention(cudaStream_t s, const CacheRef& c, const float* q, int q_stride, const StepBuf* step, int T,
              int heads, float scale, int window, float* out, int out_stride, int splits, float* scratch);
int attention_splits(const CacheRef& c, int T);  // the split count the backend should use
size_t attention_smem_limit();                     // called once: raises the kernels' smem limit

// --- moe.cu
int moe_route(cudaStream_t s, const float* logits, int l_stride, const float* expert_scale, int n_experts,
              int k, int rows, float* out, int out_stride);
// Decode: experts read by id from the route slot (or from host_ids when not null: the debug mode
// that routes on the host). act: rows * k * Ie floats of scratch.
int moe_experts_decode(cudaStream_t s, const WeightRef& gate_up, const WeightRef& down, int n_experts,
                       int Ie, int H, int k, const float* x, int x_stride, const float* route,
                       int route_stride, int rows, const int* host_ids, float* act, float* out,
                       int out_stride);
// Prefill: tokens grouped by expert on the GPU (counts, order, tile list), then grouped matmuls.
struct MoeScratch {
  int* counts = nullptr;    // n_experts
  int* order = nullptr;     // rows * k
  int* tiles = nullptr;     // 3 * max_tiles
  int* n_tiles = nullptr;   // 1
  float* hg = nullptr;      // rows * k * 2 * Ie
  float* act = nullptr;     // rows * k * Ie
  float* y = nullptr;       // rows * k * H
};
int moe_max_tiles(int rows, int k, int n_experts);
int moe_experts_prefill(cudaStream_t s, const WeightRef& gate_up, const WeightRef& down, int n_experts,
                        int Ie, int H, int k, const float* x, int x_stride, const float* route,
                        int route_stride, int rows, const MoeScratch& m, bool precise, float* out,
                        int out_stride);

// --- sample.cu: one token from a logits row, on the device.
struct SampleArgs {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f, min_p = 0.0f, repeat_penalty = 1.0f;
  float u = 0.0f;             // a uniform random number in [0, 1) from the host's seeded generator
  int n_recent = 0;           // token ids the repeat penalty applies to (distinct)
};
constexpr int kMaxRecent = 1024;
// recent: device array of n_recent ids; work: vocab floats; result: one int.
int sample(cudaStream_t s, const float* logits, int vocab, const SampleArgs& a, const int* recent,
           float* work, int* result);

}  // namespace markbase::cuda
