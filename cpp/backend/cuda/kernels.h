// Launchers of the CUDA backend's kernels, callable from plain C++ (cuda_backend.cpp). Each
// launcher enqueues its kernel(s) on `s` and returns how many kernels it launched, so that the
// backend can count kernels per token. Activations are float32 rows; weights are the file's
// blocks as uploaded (never dequantized into a copy); `type` is the GGML type id.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

namespace markbase::cuda {

// An on/off switch from the environment (MARKBASE_CUDA_*): unset or empty gives dflt; "0",
// "false" and "off" turn it off, anything else on.
inline bool env_flag(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  return !(std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 || std::strcmp(v, "off") == 0);
}

// A one-digit setting from the environment (MARKBASE_CUDA_*) in [lo, hi], or 0 when it is unset or
// anything else (the caller's own choice then applies).
inline int env_digit(const char* name, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || v[0] < '0' || v[0] > '9' || v[1]) return 0;
  const int d = v[0] - '0';
  return d >= lo && d <= hi ? d : 0;
}

// The current device's SM count, queried once (132, an H200's, if the query fails): grid sizes
// that should cover the GPU.
inline int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
                   cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms > 0
               ? sms
               : 132;
  }();
  return n;
}

// Blocks of `kernel` one SM holds at once with `threads` threads and `smem` bytes of dynamic shared
// memory (the occupancy API), or 0 if the query fails. A failure is cleared here, so that the next
// launch's error check does not report it as its own.
template <class Kernel>
inline int blocks_per_sm(Kernel kernel, int threads, size_t smem = 0) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) == cudaSuccess) return n;
  cudaGetLastError();
  return 0;
}

// Kernels are enqueued as programmatic dependent launches (common.cuh) when this is on: the
// backend sets it once, on compute capability 9.0+ devices, unless MARKBASE_CUDA_PDL=0.
inline bool programmatic_launch = false;

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

// A vector quantized to blocks of 32 int8 values, one float scale per block (q8.cuh): q holds
// n bytes (16-byte aligned), d n / 32 scales. Written once per step, read by every decode product
// of that vector (default mode; precise mode never quantizes activations).
struct Q8Vec {
  signed char* q = nullptr;
  float* d = nullptr;
};

// --- matvec.cu: out[t, n] = dot(a[t], W[n]) for few tokens (decode), weights read once.
int matvec(cudaStream_t s, const WeightRef& w, int N, const float* a, int a_stride, int T, float* out,
           int out_stride);

// --- matvec_q8.cu: the same for one token on a quantized vector, for weights of the types
// has_q8_dot() accepts (every block type: q8.cuh's units). One launch computes up to
// kMaxMatvecJobs products that read the same vector (all of one weight type and width K).
// GGML's ids: Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q4_K 12, Q5_K 13, Q6_K 14.
constexpr bool has_q8_dot(int type) {
  return type == 2 || type == 3 || type == 6 || type == 7 || type == 8 || type == 12 || type == 13 || type == 14;
}
// The types of the decode experts' 8-bit down kernels (moe.cu): the 32-weight block types, which
// are what llama.cpp's K-quant mixes fall back to for rows that are not whole 256-weight
// super-blocks (the 26B-A4B's 704-wide expert and 2112-wide dense down rows). Their instances are
// most of moe.cu's compile time, so the K-quants are left out: such a down weight takes the float
// expert kernels.
constexpr bool has_q8_moe_down(int type) { return type == 2 || type == 3 || type == 6 || type == 7 || type == 8; }
// The types of the int8 tensor-core prefill products (matmul_q8.cu): every block type.
constexpr bool has_int8_mma(int type) { return has_q8_dot(type); }
constexpr int kMaxMatvecJobs = 4;
struct MatvecJobs {
  WeightRef w[kMaxMatvecJobs];
  int n[kMaxMatvecJobs] = {};
  float* out[kMaxMatvecJobs] = {};
  int row0[kMaxMatvecJobs + 1] = {};  // filled by matvec_q8
  int count = 0;
  float softcap = 0.0f;  // > 0: every output y is stored as softcap * tanh(y / softcap) (the LM head's)
};
int matvec_q8(cudaStream_t s, MatvecJobs jobs, Q8Vec x, int K);
// q.q/q.d of row r start at r * q_stride bytes / r * q_stride / 32 scales (q_stride % 32 == 0).
int quantize_q8(cudaStream_t s, const float* a, int a_stride, int n, int rows, Q8Vec q, int q_stride);

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
// Few outputs (the MoE router in prefill: 128 float32 rows): the same product split over runs of
// K into scratch (matmul_split_k_floats floats), then summed in order; float32 FMA in either mode.
size_t matmul_split_k_floats(int N, int M, int K);
int matmul_split_k(cudaStream_t s, const WeightRef& w, int N, const float* a, int a_stride, int M, float* out,
                   int out_stride, float* scratch);

// --- matmul_q8.cu: the same on quantized activation rows (quantize_q8 with q_stride = a_stride)
// and the int8 tensor cores, for weights of a has_int8_mma() type (default mode). a_stride: bytes of
// codes per row, a multiple of 32. Grouped rows as matmul's. matmul_q8_setup(): once per process
// (raises the kernels' shared-memory limit, reads the occupancy the launch plans use).
void matmul_q8_setup();
int matmul_q8(cudaStream_t s, const WeightRef& w, int N, Q8Vec a, int a_stride, int M, float* out, int out_stride,
              const Grouped* grouped = nullptr);
// Several products of the same quantized rows (one weight type and K) in one launch, each with
// its own weights, outputs and output stride; long-K products may split K over several blocks
// per tile when that fills the GPU better, summing the parts in a fixed order (the same bits on
// every run). scratch: the split parts and per-tile counters, matmul_q8_scratch_bytes() of them,
// zeroed once when allocated (each launch leaves its counters at zero again); a launch whose plan
// needs more than scratch.bytes does not split. bn, split: force a tile width (64, 128) and
// split count, for the check harness (0: the launch plan's).
constexpr int kMaxMatmulQ8Jobs = 4;
struct MatmulQ8Jobs {
  WeightRef w[kMaxMatmulQ8Jobs];
  int n[kMaxMatmulQ8Jobs] = {};
  float* out[kMaxMatmulQ8Jobs] = {};
  int out_stride[kMaxMatmulQ8Jobs] = {};
  int count = 0;
};
struct MatmulQ8Scratch {
  void* p = nullptr;
  size_t bytes = 0;
};
size_t matmul_q8_scratch_bytes(const MatmulQ8Jobs& jobs, int M);
int matmul_q8_jobs(cudaStream_t s, const MatmulQ8Jobs& jobs, Q8Vec a, int a_stride, int M, MatmulQ8Scratch scratch,
                   int bn = 0, int split = 0);

// --- norm_rope.cu: row-wise and element-wise ops.
int embed(cudaStream_t s, const WeightRef& w, const StepBuf* step, int T, int vocab, float scale,
          int n, float* out, int out_stride);
// q8 (when q8.q is set; group == n, n % 32 == 0): the normed rows are also quantized, row r's
// codes at r * n and scales at r * n / 32 (quantize_q8's layout with q_stride = n).
int rms_norm(cudaStream_t s, const float* a, int a_stride, const float* w, int n, int group, float eps,
             int rows, float* out, int out_stride, Q8Vec q8 = {});
// Fusions the backend applies to adjacent ops (fewer kernels per token):
//   RmsNorm(out = S) then Add(x = res + S): out = norm(a) * w and x = res + out, in one pass (res
//   may be x: the add in place);
//   RmsNorm per head then Rope on the same slot: QK-norm and rotation in one pass.
//   q8 (when set; n % 32 == 0): the updated x is also quantized, as rms_norm's;
//   scale_x (the layer scalar that follows in Gemma 4): x = (x + out) * scale_x.
int rms_norm_add(cudaStream_t s, const float* a, int a_stride, const float* w, int n, float eps, int rows,
                 float* out, int out_stride, float* x, int x_stride, const float* res, int res_stride, Q8Vec q8 = {},
                 float scale_x = 1.0f);
int rms_norm_rope(cudaStream_t s, const float* a, int a_stride, const float* w, float eps, const float* inv_freq,
                  const StepBuf* step, int T, int heads, int head_dim, float* out, int out_stride);
// A run of row ops of one token (decode) in one launch: one block does the ops in order, on copies
// of the rows in shared memory, or, for the chains of Gemma's shape, in registers with the ops
// fixed in the code (row_chain.cuh's fused form; norm_rope.cu), so a chain of post-norm, residual
// add, layer scalar and the next norm costs one launch. RmsNorm here has one group (group == n). Every op of a chain
// has the same n, a multiple of 4 and at most kChainMaxN; rows are 16-byte aligned. An op with q8 set
// also writes its output quantized (n % 32 == 0). row_chain_setup(): once per process.
enum class RowOpKind { Norm, Add, Scale };
struct RowOp {
  RowOpKind kind = RowOpKind::Add;
  int n = 0;
  const float* a = nullptr;
  const float* b = nullptr;   // Add
  const float* w = nullptr;   // Norm (may be null)
  float f = 0.0f;             // Norm: eps; Scale: factor
  float* out = nullptr;
  Q8Vec q8;                   // if set: out's quantized copy, written too (n % 32 == 0)
  bool keep = true;           // false: nothing after the chain reads out, so the float row is not
                              // stored (its 8-bit copy still is, where q8 asks)
};
// Where op's float row is stored: out, or null where keep is false.
inline float* stored_out(const RowOp& op) { return op.keep ? op.out : nullptr; }
constexpr int kMaxRowOps = 8;
constexpr int kChainMaxN = 4096;
struct RowChain {
  RowOp op[kMaxRowOps];
  int count = 0;
};
void row_chain_setup();
int row_chain(cudaStream_t s, const RowChain& c);
// q8: as rms_norm's. floats_read = false: nothing reads out's floats, only the quantized rows;
// the prefill kernel (rows > 1, float4 rows) then skips writing them.
int gelu_mul(cudaStream_t s, const float* a, int a_stride, const float* b, int b_stride, int b_col,
             int n, int rows, float* out, int out_stride, Q8Vec q8 = {}, bool floats_read = true);
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
// QK-norm + RoPE of q and k, the V norm, and the KV store of one layer in one launch: each part
// is `heads` heads of the cache's head_dim (<= 512) in slot a (row stride as), normed when `norm`
// (times w when set, eps), rotated when inv (the RoPE table) is set, written to out and, when
// cache is set (c.k or c.v), to the cache at the step's positions.
struct HeadPart {
  const float* a = nullptr;
  int as = 0;
  bool norm = false;
  const float* w = nullptr;
  float eps = 0.0f;
  const float* inv = nullptr;
  float* out = nullptr;
  int os = 0;
  int heads = 0;
  void* cache = nullptr;
};
constexpr int kMaxHeadParts = 3;
struct HeadFinishArgs {
  HeadPart part[kMaxHeadParts];
  int count = 0;
  CacheRef c;
  const StepBuf* step = nullptr;
  bool early = true;  // norm weights and RoPE angles before the programmatic wait (set by norm_rope_store)
};
int norm_rope_store(cudaStream_t s, const HeadFinishArgs& p, int T);
// splits > 1: positions are split over that many blocks per row and combined (decode);
// scratch holds rows * splits * (head_dim + 2) floats.
// q8 (when set; one token, heads * head_dim % 32 == 0): the output row is also quantized.
// tensor_cores (default mode): prefill over f16 caches runs on the tensor cores (attention_tc.cu).
int attention(cudaStream_t s, const CacheRef& c, const float* q, int q_stride, const StepBuf* step, int T,
              int heads, float scale, int window, float* out, int out_stride, int splits, float* scratch,
              Q8Vec q8 = {}, bool tensor_cores = false);
int attention_splits(const CacheRef& c, int T);  // the split count the backend should use
size_t attention_smem_limit();                     // called once: raises the kernels' smem limit

// --- moe.cu
int moe_route(cudaStream_t s, const float* logits, int l_stride, const float* expert_scale, int n_experts,
              int k, int rows, float* out, int out_stride);
// Decode, one token: the router's product (logits = W x, any weight type) and moe_route in one
// launch. counter: one device word, zero before the first launch (the kernel leaves it zero).
int moe_router(cudaStream_t s, const WeightRef& w, const float* x, const float* expert_scale, int n_experts,
               int k, float* logits, float* out, unsigned* counter);
// Decode, one token, default mode: a Gemma 4 MoE feed-forward in four launches, the dense MLP
// beside the experts included (moe.cu): the router (as moe_router) with the dense gate and up
// products; the experts' gate/up; the quantization of both GeGLU outputs (act and act_q8 hold
// k * Ie + I values); the experts' down product with the dense one. moe_dense_fits: whether the
// types and widths allow it (Q4_0 or Q8_0 products, the experts' down and the dense down of one
// type; Ie and I multiples of 32) and, with the router given, a float32 router; with it null,
// moe_ffn_decode_routed's conditions (the dense gate and up of the experts' type and thread count).
bool moe_dense_fits(const WeightRef* router, const WeightRef& gate_up, const WeightRef& down, const WeightRef& gate,
                    const WeightRef& up, const WeightRef& dense_down, int Ie, int I);
int moe_ffn_decode(cudaStream_t s, const WeightRef& router, const float* router_x, const float* expert_scale, int E,
                   int k, float* logits, float* route, unsigned* counter, const WeightRef& gate_up,
                   const WeightRef& down, int Ie, int H, Q8Vec x_q8, float* act, Q8Vec act_q8, float* out,
                   const WeightRef& gate, const WeightRef& up, const WeightRef& dense_down, Q8Vec dense_x,
                   float* dense_out);
// moe_ffn_decode after chain_router (the route already in device memory), in three launches: the
// dense gate and up products ride in the experts' gate/up launch.
int moe_ffn_decode_routed(cudaStream_t s, const float* route, int E, int k, const WeightRef& gate_up,
                          const WeightRef& down, int Ie, int H, Q8Vec x_q8, float* act, Q8Vec act_q8, float* out,
                          const WeightRef& gate, const WeightRef& up, const WeightRef& dense_down, Q8Vec dense_x,
                          float* dense_out);
// Decode, one token: the row chain c and, beside it in the same launch, the MoE router (as
// moe_router) on one of the chain's rows, router_in (moe.cu). router_in_read: an op after the
// chain other than the router reads router_in (otherwise the launch may leave its row unwritten).
// counters: two device words, zero before the first launch (the kernel leaves them zero).
// chain_router_fits: whether the pair fits one launch (a float router whose K is the chain's
// width, the chain in one launch's shared memory); chain_router returns 0 (nothing launched) when
// it does not. split: the chain's last norms each on a chain block of its own (row_chain.cuh's
// chain_split_tail; false: the chain in block 0 alone). direct: the router blocks compute their
// logits in direct form where the chain allows (moe.cu's RouterDirect; false: they replay the
// chain's ops, bit-identical to the router's own launch). spread (with direct): where the chain is
// Gemma 4's, the router blocks write the chain's rows too, and no chain block runs (moe.cu's
// SpreadChain; the same values to rounding).
// poll: null, or kChainPollExperts floats that the backend filled with 0xff bytes: for up to 128
// experts and top-32, the routing block polls them for the router blocks' logits instead of
// counting the blocks done (moe.cu's poll_logits), and leaves them so.
constexpr int kChainPollExperts = 128;
bool chain_router_fits(const RowChain& c, const float* router_in, const WeightRef& w, int n_experts);
int chain_router(cudaStream_t s, const RowChain& c, const float* router_in, bool router_in_read, const WeightRef& w,
                 const float* expert_scale, int n_experts, int k, float* logits, float* out, unsigned* counters,
                 float* poll, bool split, bool direct, bool spread);
// Decode: experts read by id from the route slot (or from host_ids when not null: the debug mode
// that routes on the host). act: rows * k * Ie floats of scratch.
// x_q8 set (one row; both weights of has_q8_dot types, Ie % 32 == 0): the products run on the
// quantized x, and act is quantized into act_q8 (k * Ie values) for the down products.
int moe_experts_decode(cudaStream_t s, const WeightRef& gate_up, const WeightRef& down, int n_experts,
                       int Ie, int H, int k, const float* x, int x_stride, const float* route,
                       int route_stride, int rows, const int* host_ids, float* act, float* out,
                       int out_stride, Q8Vec x_q8 = {}, Q8Vec act_q8 = {});
// Prefill: tokens grouped by expert on the GPU (counts, order, tile list), then grouped matmuls.
struct MoeScratch {
  int* counts = nullptr;    // n_experts
  int* order = nullptr;     // rows * k
  int* tiles = nullptr;     // 3 * max_tiles
  int* n_tiles = nullptr;   // 1
  float* hg = nullptr;      // rows * k * 2 * Ie
  float* act = nullptr;     // rows * k * Ie
  float* y = nullptr;       // rows * k * H
  Q8Vec act_q8;             // rows * k * Ie, quantized (default mode with has_int8_mma() weights)
};
int moe_max_tiles(int rows, int k, int n_experts);
// x_q8 set (default mode, both weights of one has_int8_mma() type, H and Ie multiples of 32): the
// products run on int8 tensor cores (matmul_q8) from x's quantized rows (H bytes apart), and the
// GeGLU outputs are quantized into m.act_q8 for the down products.
int moe_experts_prefill(cudaStream_t s, const WeightRef& gate_up, const WeightRef& down, int n_experts,
                        int Ie, int H, int k, const float* x, int x_stride, const float* route,
                        int route_stride, int rows, const MoeScratch& m, bool precise, float* out,
                        int out_stride, Q8Vec x_q8 = {});

// MARKBASE_CUDA_TRACE: the timeline buffer of each .cu file's kernels (common.cuh), or null: a
// count, then up to kTraceMax stamps.
constexpr int kTraceMax = 8192;
// MARKBASE_CUDA_CHAIN_PROBE=1: the chain kernels' probe instances run (chain_probe.cuh), and the
// backend prints their tables of norm_rope.cu's row_chain_kernel and moe.cu's chain_router_kernel.
inline bool chain_probe() {
  static const bool on = env_flag("MARKBASE_CUDA_CHAIN_PROBE", false);
  return on;
}
// MARKBASE_CUDA_CHAIN_FUSED=0: every decode row chain runs on row_chain.cuh's general loop
// (run_chain) instead of the fused form where its shape allows (fuse_chain; the same bits).
inline bool chain_fused() {
  static const bool on = env_flag("MARKBASE_CUDA_CHAIN_FUSED", true);
  return on;
}
void chain_probe_report_rows();
void chain_probe_report_router();
void trace_attach_attention(unsigned long long* buf);
void trace_attach_attention_tc(unsigned long long* buf);
void trace_attach_matmul(unsigned long long* buf);
void trace_attach_matmul_q8(unsigned long long* buf);
void trace_attach_matvec(unsigned long long* buf);
void trace_attach_matvec_q8(unsigned long long* buf);
void trace_attach_moe(unsigned long long* buf);
void trace_attach_norm_rope(unsigned long long* buf);
void trace_attach_sample(unsigned long long* buf);

// --- sample.cu: one token from a logits row, on the device.
struct SampleArgs {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f, min_p = 0.0f, repeat_penalty = 1.0f;
  float u = 0.0f;             // a uniform random number in [0, 1) from the host's seeded generator
  int n_recent = 0;           // token ids the repeat penalty applies to (distinct)
};
constexpr int kMaxRecent = 1024;
// recent: device array of n_recent ids; work: vocab floats; scratch: sample_scratch_bytes(),
// zero before the first launch (the kernel leaves it zero); result: one int. Returns 0 when the
// (cooperative) launch failed: cudaGetLastError says why.
size_t sample_scratch_bytes();
int sample(cudaStream_t s, const float* logits, int vocab, const SampleArgs& a, const int* recent,
           float* work, void* scratch, int* result);

}  // namespace markbase::cuda
