// The CUDA backend: executes a Graph on an NVIDIA GPU.
//  - Weights are uploaded once, as the file's blocks (no dequantized copy); only the small
//    vectors (norm weights, per-expert scales) get a float copy, as on the CPU.
//  - Each graph gets its slot buffers and a device step buffer (position, token ids). The first
//    run captures the graph's kernels into a CUDA graph; every run then writes the step buffer
//    and replays it, so a decode token costs one graph launch and one host wait (for the logits,
//    or with run_sample for the sampled token id only).
//  - Decode in default mode runs its products on 8-bit activations (q8.cuh): each slot that a
//    product of block-typed weights (Q4_0 .. Q6_K) reads gets a quantized copy, written by the op
//    that produces the slot (norm, GeGLU, attention, residual add) or else by a quantize kernel,
//    and reused by every product that reads it before the slot changes. Prefill in default mode
//    does the same for its products of block-typed weights (quantized rows, int8 tensor cores:
//    matmul_q8.cu). Precise mode keeps float32 activations.
//  - MoE routing stays on the GPU. MARKBASE_CUDA_HOST_ROUTING=1 is a debug switch that instead
//    reads every MoE layer's top-k back to the host (one wait per layer, launches eager), to
//    measure what naive host routing costs; MARKBASE_CUDA_GRAPH=0 runs eagerly without capture;
//    MARKBASE_CUDA_FUSE=0 turns off the fusions and the batching of products (see encode());
//    MARKBASE_CUDA_INT8_PREFILL=0 sends prefill's int8 products back to the f16 tiles;
//    MARKBASE_CUDA_PROFILE=1 times every op with events (recorded into the CUDA graph, which then
//    runs without programmatic launch) and prints the time per op (label without its layer, graph
//    size) to stderr when the backend is destroyed; MARKBASE_CUDA_ATTN_TC=0 keeps
//    prefill attention on the float32 kernel in default mode too (A/B checks of the tensor-core one);
//    MARKBASE_CUDA_PDL=0 launches kernels without programmatic dependent launch (common.cuh);
//    MARKBASE_CUDA_STREAMS=0 keeps every step of a decode graph on one stream (plan_streams);
//    MARKBASE_CUDA_HEAD_SOFTCAP=0 launches the final softcap on its own instead of in the LM head's
//    decode product (the same arithmetic: bit-identical logits); MARKBASE_CUDA_MOE_DENSE=0 runs a
//    MoE layer's dense MLP in its own launches (on the second stream) instead of in the router's
//    and the experts' (cuda::moe_ffn_decode; bit-identical); MARKBASE_CUDA_CHAIN_ROUTER=0 launches a
//    MoE router after the row chain before it instead of beside it (cuda::chain_router; bit-identical).
//    MARKBASE_CUDA_ROUTER_DIRECT=0: chain_router's router blocks replay the chain's ops instead of
//    computing their logits in direct form (bit-identical to the router's own launch; the direct
//    form is the same to rounding). MARKBASE_CUDA_CHAIN_FUSED=0 runs every decode row chain on the
//    general loop over its plan instead of the fused form where Gemma's shape allows (kernels.h's
//    chain_fused; bit-identical). MARKBASE_CUDA_ROUTER_POLL=0: chain_router's routing block is
//    the last router block to count itself done instead of one that polls the router blocks'
//    logits (bit-identical).
//    MARKBASE_CUDA_CHAIN_SPREAD=0: chain_router keeps its chain blocks instead of the direct
//    router blocks writing the chain's rows (moe.cu's SpreadChain; the same values to rounding).
//    MARKBASE_CUDA_ROUTER_VEC_ROWS=0: the direct form's router rows loaded element by element, not
//    a float4 at a time where aligned (moe.cu's router_row4; bit-identical).
//    MARKBASE_CUDA_PROBE_NO_ROUTER=1 (timing only, wrong results): chain_router without its router
//    blocks.
//    MARKBASE_CUDA_SPLIT_K=0: prefill products with few outputs (the MoE router) on the
//    matrix-vector kernel instead of cuda::matmul_split_k (an A/B switch; float32 either way).
//    MARKBASE_CUDA_MMQ_MMA_SUMS=0: the int8 prefill products of the types with a minimum take
//    their activation rows' sums by dp4a and shuffles instead of an mma (matmul_q8.cu; bit-identical).
//    MARKBASE_CUDA_MATVEC_Q5K_BOUND=0: Q5_K's decode products without their register cap; a digit 1-7
//    caps the block sizes of its bits (1: 64 threads, 2: 96, 4: 128) instead of the default rule
//    (matvec_q8.cu's use_capped; the same arithmetic either way).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "formats/error.h"
#include "formats/model_file.h"
#include "formats/tensor_types.h"

namespace markbase {
namespace {

void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so that later calls can report their own
  throw BackendError(std::string("[cuda] ") + what + " failed: " + cudaGetErrorString(e) + " (" + file + ":" +
                     std::to_string(line) + ")");
}
#define CK(x) check((x), #x, __FILE__, __LINE__)

using cuda::env_flag;

struct CudaFree {
  void operator()(void* p) const { if (p) cudaFree(p); }
};
struct HostFree {
  void operator()(void* p) const { if (p) cudaFreeHost(p); }
};
using DevPtr = std::unique_ptr<void, CudaFree>;
using HostPtr = std::unique_ptr<void, HostFree>;

DevPtr dev_alloc(size_t bytes) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  CK(cudaMemset(p, 0, std::max<size_t>(bytes, 16)));
  return DevPtr(p);
}
HostPtr host_alloc(size_t bytes) {
  void* p = nullptr;
  CK(cudaMallocHost(&p, std::max<size_t>(bytes, 16)));
  return HostPtr(p);
}
template <class T>
T* ptr(const DevPtr& p) { return static_cast<T*>(p.get()); }

class CudaCaches : public KVCaches {
 public:
  CudaCaches(const std::vector<CacheDesc>& d, bool f16) : desc(d), f16(f16) {
    for (const CacheDesc& c : d) {
      const size_t n = static_cast<size_t>(c.kv_heads) * c.capacity * c.head_dim * (f16 ? 2 : 4);
      k.push_back(n ? dev_alloc(n) : DevPtr());
      v.push_back(n ? dev_alloc(n) : DevPtr());
    }
  }
  cuda::CacheRef ref(int layer) const {
    if (layer < 0 || layer >= static_cast<int>(desc.size()) || !k[layer])
      throw std::logic_error("graph refers to KV cache " + std::to_string(layer) + ", which has none");
    const CacheDesc& c = desc[layer];
    return {k[layer].get(), v[layer].get(), c.kv_heads, c.head_dim, c.capacity, c.ring, f16};
  }
  std::vector<CacheDesc> desc;
  bool f16;
  std::vector<DevPtr> k, v;
};

// Two streams for one graph: a decode step's independent branches (E2B/E4B's per-layer embedding
// projection beside its lookup; in Gemma 4's MoE layers the dense MLP beside the router and the
// experts when it has launches of its own: precise mode, or MARKBASE_CUDA_MOE_DENSE=0; in default
// mode it runs inside theirs, see moe_dense()) run side by side. Decode kernels are mostly
// latency, but each spreads many small blocks over the whole GPU, so two branches interleave more
// than they overlap: on the H200 this saves 6 % of a 26B-A4B token (bench/RESULTS.md). The branch
// that comes first in the graph stays on the main stream (the router and the experts, the longer
// one: gemma.cpp puts them first), and only there does each kernel launch under the one before it
// (programmatic launch); a cross-stream edge waits for its kernel's end. With the dense MLP first
// (on main) instead, decode was 2 % slower.
//
// A step is what encode() launches for one op and what it fuses or batches with it. StepUse: the
// resources (slots, caches, scratch buffers) it reads and writes; StepPlan: where it runs.
struct StepUse {
  std::vector<int> reads, writes;
};
struct StepPlan {
  bool side = false;    // on the side stream
  int wait = -1;        // a step on the other stream to wait for first
  bool record = false;  // a later step waits for this one: record its event
};
struct StreamPlan {
  std::vector<StepPlan> steps;
  int join = -1;        // the side stream's last step, which the main stream waits for at the end
  int side_steps = 0;
};

// A step waits for the last writer of everything it touches and for the readers of what it writes.
// It joins the stream whose latest step it depends on (the main stream if both); if it depends on
// neither, it goes to the stream that has been idle longer, so it overlaps the other's work.
StreamPlan plan_streams(const std::vector<StepUse>& uses) {
  StreamPlan plan;
  plan.steps.resize(uses.size());
  std::map<int, int> writer;
  std::map<int, std::vector<int>> readers;
  int tail[2] = {-1, -1};    // latest step on each stream
  int waited[2] = {-1, -1};  // latest step of the other stream that each stream has waited for
  for (int k = 0; k < static_cast<int>(uses.size()); ++k) {
    int dep[2] = {-1, -1};  // latest step each stream holds that k depends on
    auto on = [&](int j) {
      if (j >= 0) dep[plan.steps[j].side] = std::max(dep[plan.steps[j].side], j);
    };
    for (const std::vector<int>* set : {&uses[k].reads, &uses[k].writes})
      for (int r : *set) {
        auto w = writer.find(r);
        if (w != writer.end()) on(w->second);
      }
    for (int r : uses[k].writes)
      for (int j : readers[r]) on(j);
    int s;
    if (dep[0] < 0 && dep[1] < 0) s = 0;
    else if (tail[0] >= 0 && dep[0] == tail[0]) s = 0;
    else if (tail[1] >= 0 && dep[1] == tail[1]) s = 1;
    else s = tail[1] < tail[0] ? 1 : 0;
    StepPlan& sp = plan.steps[k];
    sp.side = s == 1;
    if (dep[1 - s] > waited[s]) {
      sp.wait = dep[1 - s];
      plan.steps[sp.wait].record = true;
      waited[s] = sp.wait;
    }
    tail[s] = k;
    plan.side_steps += s;
    for (int r : uses[k].reads) readers[r].push_back(k);
    for (int r : uses[k].writes) {
      writer[r] = k;
      readers[r].clear();
    }
  }
  if (tail[1] > waited[0]) {
    plan.join = tail[1];
    plan.steps[tail[1]].record = true;
  }
  return plan;
}

// What the backend keeps for one Graph.
struct GraphState {
  std::vector<DevPtr> slots;
  DevPtr step;                 // cuda::StepBuf with T tokens
  HostPtr step_host;
  std::vector<DevPtr> rope;    // the graph's RoPE tables
  DevPtr attn_scratch;
  cuda::MoeScratch moe{};
  std::vector<DevPtr> moe_bufs;
  HostPtr logits_host;         // rows x vocab of the logits slot
  HostPtr route_host;          // host-routing debug mode
  std::vector<DevPtr> q8;      // per slot: its quantized row (decode graphs in default mode)
  DevPtr moe_act_q8;           // the experts' GeGLU outputs, quantized
  DevPtr prefill_q8;           // prefill in default mode: one slot's rows, quantized (int8 products),
  cuda::Q8Vec prefill_q8v;     // row r's codes at r * K, its scales at r * K / 32
  DevPtr matmul_scratch;       // prefill int8 products: split-K parts and tile counters
  DevPtr split_k;              // cuda::matmul_split_k's partial tiles
  cuda::MatmulQ8Scratch matmul_scratch_v;
  DevPtr router_counter;       // cuda::moe_router's count of finished blocks (cuda::chain_router: two counts)
  DevPtr router_poll;          // cuda::chain_router's poll buffer (not with MARKBASE_CUDA_ROUTER_POLL=0)
  cudaGraphExec_t exec = nullptr;
  const CudaCaches* captured_for = nullptr;
  int kernels = 0;             // kernels launched by one run of the graph
  // MARKBASE_CUDA_PROFILE: an event pair around each op (op kind, index of its first event),
  // recorded into the CUDA graph with the kernels (or on the stream, eager runs).
  std::vector<std::pair<std::string, size_t>> timed;
  std::vector<cudaEvent_t> events;
  // MARKBASE_CUDA_TRACE: each step's op label and the kernels it launched, in launch order
  std::vector<std::pair<std::string, int>> traced;
  std::vector<cudaEvent_t> step_events;  // per step of the stream plan (null where none waits)
  ~GraphState() {
    if (exec) cudaGraphExecDestroy(exec);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    for (cudaEvent_t e : step_events)
      if (e) cudaEventDestroy(e);
  }
};

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& o) : opt_(o) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      cudaGetLastError();
      throw BackendError(std::string("backend 'cuda' is not available: no usable NVIDIA GPU (") +
                         (e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device found") + ")");
    }
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    cur_ = stream_;
    cuda::attention_smem_limit();
    cuda::matmul_q8_setup();
    cuda::row_chain_setup();
    CK(cudaGetLastError());
    host_routing_ = env_flag("MARKBASE_CUDA_HOST_ROUTING", false);
    profile_ = env_flag("MARKBASE_CUDA_PROFILE", false);
    trace_ = env_flag("MARKBASE_CUDA_TRACE", false);
    use_graphs_ = env_flag("MARKBASE_CUDA_GRAPH", true) && !host_routing_;
    fuse_ = env_flag("MARKBASE_CUDA_FUSE", true);
    head_softcap_ = env_flag("MARKBASE_CUDA_HEAD_SOFTCAP", true);
    moe_dense_ = env_flag("MARKBASE_CUDA_MOE_DENSE", true);
    chain_router_ = env_flag("MARKBASE_CUDA_CHAIN_ROUTER", true);
    chain_split_ = env_flag("MARKBASE_CUDA_CHAIN_SPLIT", true);
    router_direct_ = env_flag("MARKBASE_CUDA_ROUTER_DIRECT", true);
    chain_spread_ = env_flag("MARKBASE_CUDA_CHAIN_SPREAD", true);
    router_poll_ = env_flag("MARKBASE_CUDA_ROUTER_POLL", true);
    streams_ = env_flag("MARKBASE_CUDA_STREAMS", true) && !trace_;  // the trace is one stream's order
    int8_prefill_ = env_flag("MARKBASE_CUDA_INT8_PREFILL", true) && !opt_.precise;
    attn_tc_ = env_flag("MARKBASE_CUDA_ATTN_TC", true);
    split_k_ = env_flag("MARKBASE_CUDA_SPLIT_K", true);
    int major = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    cuda::programmatic_launch = major >= 9 && env_flag("MARKBASE_CUDA_PDL", true) && !profile_;
    sample_result_ = dev_alloc(sizeof(int));
    sample_scratch_ = dev_alloc(cuda::sample_scratch_bytes());  // zeroed: the sampler's histograms start empty
    sample_recent_ = dev_alloc(cuda::kMaxRecent * sizeof(int));
    sample_host_ = host_alloc((cuda::kMaxRecent + 1) * sizeof(int));
    if (trace_) {
      const size_t bytes = (1 + cuda::kTraceMax) * sizeof(unsigned long long);
      trace_buf_ = dev_alloc(bytes);
      trace_host_ = host_alloc(bytes);
      auto* b = ptr<unsigned long long>(trace_buf_);
      for (auto attach : {cuda::trace_attach_attention, cuda::trace_attach_attention_tc, cuda::trace_attach_matmul,
                          cuda::trace_attach_matmul_q8, cuda::trace_attach_matvec, cuda::trace_attach_matvec_q8,
                          cuda::trace_attach_moe, cuda::trace_attach_norm_rope, cuda::trace_attach_sample})
        attach(b);
      CK(cudaGetLastError());
    }
  }
  ~CudaBackend() override {
    // One line per op: its summed ms, its calls and us per call.
    auto print_ops = [](const char* tag, const std::map<std::string, std::pair<double, int>>& ops) {
      for (const auto& [k, v] : ops)
        std::fprintf(stderr, "[cuda %s] %-52s %10.3f %8d %10.2f\n", tag, k.c_str(), v.first, v.second,
                     1000.0 * v.first / std::max(1, v.second));
    };
    if (profile_) {
      std::fprintf(stderr, "[cuda profile] op (graph T): total ms, calls, us per call\n");
      print_ops("profile", prof_);
    }
    if (trace_) {
      std::fprintf(stderr, "[cuda trace] op (graph T): critical-path ms, calls, us per call (runs: %d, "
                   "skipped: %d)\n", trace_runs_, trace_skipped_);
      print_ops("trace", trace_acc_);
      std::fprintf(stderr, "[cuda trace] %-52s %10.3f\n", "total", trace_total_ms_);
    }
    if (cuda::chain_probe()) {
      cuda::chain_probe_report_rows();
      cuda::chain_probe_report_router();
    }
    states_.clear();
    if (side_) cudaStreamDestroy(side_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // 2048 tokens a step: on the H200 the int8 products fill the GPU far better than at 512 (E4B
  // prefill of 4096 tokens 18.5k tok/s against 13.8k at 512 and 16.7k at 1024; 26B-A4B 16.5k
  // against 12.2k). llama.cpp's logical batch is 2048 too (its physical ubatch 512).
  int preferred_prefill_chunk() const override { return 2048; }
  std::string name() const override { return "cuda"; }
  std::unique_ptr<KVCaches> make_caches(const std::vector<CacheDesc>& d) override {
    return std::make_unique<CudaCaches>(d, opt_.kv_f16);
  }
  void release(const Graph& g) override { states_.erase(&g); }
  int ops_last_run() const override { return ops_; }
  int waits_last_run() const override { return waits_; }
  bool samples_on_device() const override { return true; }

  const float* run(const Graph& g, const Step& step, KVCaches& kv) override {
    GraphState& st = launch(g, step, static_cast<CudaCaches&>(kv));
    const size_t n = static_cast<size_t>(g.rows(g.logits)) * g.vocab;
    CK(cudaMemcpyAsync(st.logits_host.get(), st.slots[g.logits].get(), n * sizeof(float), cudaMemcpyDeviceToHost,
                       stream_));
    wait();
    return static_cast<const float*>(st.logits_host.get());
  }

  int run_sample(const Graph& g, const Step& step, KVCaches& kv, const DeviceSampling& s) override {
    if (s.recent.size() > static_cast<size_t>(cuda::kMaxRecent))
      throw std::invalid_argument("repeat penalty window too long for the CUDA sampler (at most " +
                                  std::to_string(cuda::kMaxRecent) + " tokens)");
    GraphState& st = launch(g, step, static_cast<CudaCaches&>(kv));
    cuda::SampleArgs a;
    a.temperature = s.temperature;
    a.top_k = s.top_k;
    a.top_p = s.top_p;
    a.min_p = s.min_p;
    a.repeat_penalty = s.repeat_penalty;
    a.u = static_cast<float>(s.u);
    a.n_recent = static_cast<int>(s.recent.size());
    int* hs = static_cast<int*>(sample_host_.get());
    if (a.n_recent) {
      std::memcpy(hs + 1, s.recent.data(), a.n_recent * sizeof(int));
      CK(cudaMemcpyAsync(sample_recent_.get(), hs + 1, a.n_recent * sizeof(int), cudaMemcpyHostToDevice, stream_));
    }
    const int rows = g.rows(g.logits);
    const float* last = ptr<float>(st.slots[g.logits]) + static_cast<size_t>(rows - 1) * g.slots[g.logits].cols;
    if (sample_work_size_ < g.vocab) {
      sample_work_ = dev_alloc(static_cast<size_t>(g.vocab) * sizeof(float));
      sample_work_size_ = g.vocab;
    }
    const int launched = cuda::sample(stream_, last, g.vocab, a, ptr<int>(sample_recent_), ptr<float>(sample_work_),
                                      sample_scratch_.get(), ptr<int>(sample_result_));
    if (!launched)
      throw BackendError(std::string("[cuda] the sampler failed to launch: ") + cudaGetErrorString(cudaGetLastError()));
    ops_ += launched;
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(hs, sample_result_.get(), sizeof(int), cudaMemcpyDeviceToHost, stream_));
    wait();
    return hs[0];
  }

 private:
  void wait() {
    CK(cudaStreamSynchronize(stream_));
    ++waits_;
    if (trace_run_) read_trace();
    if (!profile_ || !timing_) return;
    for (const auto& [key, i] : timing_->timed) {
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, timing_->events[i], timing_->events[i + 1]);
      auto& acc = prof_[key];
      acc.first += ms;
      acc.second += 1;
    }
    timing_ = nullptr;
  }
  // The trace of the run that just ended: stamp k is kernel k passing its wait, so kernel k's time
  // on the critical path is stamp k + 1 - stamp k (the last kernel of the run has no next stamp,
  // unless the sampler's kernel followed it). A run whose stamps do not match its kernels is skipped.
  void read_trace() {
    const GraphState& st = *trace_run_;
    trace_run_ = nullptr;
    auto* h = static_cast<unsigned long long*>(trace_host_.get());
    CK(cudaMemcpy(h, trace_buf_.get(), sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    const size_t n = std::min<size_t>(h[0], cuda::kTraceMax);
    size_t kernels = 0;
    for (const auto& [key, k] : st.traced) kernels += k;
    if (h[0] < kernels || h[0] > kernels + 1 || n < h[0]) {
      ++trace_skipped_;
      return;
    }
    CK(cudaMemcpy(h + 1, ptr<unsigned long long>(trace_buf_) + 1, n * sizeof(unsigned long long),
                  cudaMemcpyDeviceToHost));
    std::sort(h + 1, h + 1 + n);  // slots are taken in the order of the waits' starts (common.cuh)
    size_t k = 0;
    for (const auto& [key, count] : st.traced) {
      double ns = 0.0;
      for (int i = 0; i < count; ++i, ++k) {
        if (k + 1 >= n) continue;
        const double d = static_cast<double>(h[2 + k] - h[1 + k]);
        ns += d;
        if (count > 1) {  // a step of several kernels: each on a line of its own too
          auto& part = trace_acc_[key + " [" + std::to_string(i + 1) + "/" + std::to_string(count) + "]"];
          part.first += d * 1e-6;
          part.second += 1;
        }
      }
      auto& acc = trace_acc_[key];
      acc.first += ns * 1e-6;
      acc.second += 1;
      trace_total_ms_ += ns * 1e-6;
    }
    ++trace_runs_;
  }
  // Profiling: an event pair around one op, and its records (inside a capture, as external event
  // nodes, which keep their timestamps when the graph replays).
  size_t event_pair(GraphState& st) {
    const size_t i = 2 * st.timed.size();
    while (st.events.size() < i + 2) {
      cudaEvent_t e;
      CK(cudaEventCreate(&e));
      st.events.push_back(e);
    }
    return i;
  }
  void record(cudaEvent_t e) {
    if (capturing_) CK(cudaEventRecordWithFlags(e, cur_, cudaEventRecordExternal));
    else CK(cudaEventRecord(e, cur_));
  }

  // Uploads the graph's inputs, then replays its CUDA graph (capturing it first if needed) or
  // launches its kernels one by one. The caller copies results back and waits.
  GraphState& launch(const Graph& g, const Step& step, CudaCaches& kv) {
    if (static_cast<int>(step.tokens.size()) != g.T)
      throw std::logic_error("step has " + std::to_string(step.tokens.size()) + " tokens, graph " +
                             std::to_string(g.T));
    GraphState& st = prepare(g, kv);
    int* sh = static_cast<int*>(st.step_host.get());
    sh[0] = step.pos0;
    for (int t = 0; t < g.T; ++t) {
      const int id = step.tokens[t];
      if (id < 0 || id >= g.vocab) throw std::out_of_range("token id " + std::to_string(id) + " out of range");
      sh[1 + t] = id;
    }
    for (const CacheDesc& c : kv.desc)
      if (!c.ring && c.capacity > 0 && step.pos0 + g.T > c.capacity) throw std::out_of_range("KV cache full");
    waits_ = 0;
    ops_ = 0;
    CK(cudaMemcpyAsync(st.step.get(), sh, (1 + g.T) * sizeof(int), cudaMemcpyHostToDevice, stream_));
    if (profile_) timing_ = &st;
    if (trace_) {
      CK(cudaMemsetAsync(trace_buf_.get(), 0, sizeof(unsigned long long), stream_));
      trace_run_ = &st;
    }
    if (!use_graphs_) {
      st.timed.clear();
      ops_ = encode(g, st, kv);
      return st;
    }
    if (!st.exec || st.captured_for != &kv) {
      if (st.exec) { cudaGraphExecDestroy(st.exec); st.exec = nullptr; }
      int kernels = 0;
      cudaGraph_t graph = nullptr;
      if (streams_ && fuse_ && q8_graph(g)) {
        // A first capture, thrown away, tells what each step touches; the second runs the
        // independent steps on the side stream.
        std::vector<StepUse> uses;
        cudaGraphDestroy(capture(g, st, kv, nullptr, &uses, kernels));
        const StreamPlan plan = plan_streams(uses);
        if (plan.side_steps > 0) {
          for (cudaEvent_t e : st.step_events)
            if (e) cudaEventDestroy(e);
          st.step_events.assign(plan.steps.size(), nullptr);
          for (size_t k = 0; k < plan.steps.size(); ++k)
            if (plan.steps[k].record) CK(cudaEventCreateWithFlags(&st.step_events[k], cudaEventDisableTiming));
          graph = capture(g, st, kv, &plan, nullptr, kernels);
        }
      }
      if (!graph) graph = capture(g, st, kv, nullptr, nullptr, kernels);
      const cudaError_t e = cudaGraphInstantiate(&st.exec, graph, 0);
      cudaGraphDestroy(graph);
      CK(e);
      st.captured_for = &kv;
      st.kernels = kernels;
    }
    CK(cudaGraphLaunch(st.exec, stream_));
    ops_ = st.kernels;
    return st;
  }

  // Records g's kernels into a CUDA graph (encode() under stream capture).
  cudaGraph_t capture(const Graph& g, GraphState& st, CudaCaches& kv, const StreamPlan* plan,
                      std::vector<StepUse>* uses, int& kernels) {
    CK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    st.timed.clear();
    capturing_ = true;
    try {
      kernels = encode(g, st, kv, plan, uses);
      capturing_ = false;
    } catch (...) {
      capturing_ = false;
      cur_ = stream_;
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream_, &broken);
      if (broken) cudaGraphDestroy(broken);
      throw;
    }
    cudaGraph_t graph = nullptr;
    CK(cudaStreamEndCapture(stream_, &graph));
    return graph;
  }

  // --- weights
  const uint8_t* upload(const TensorView* t) {
    auto it = weights_.find(t->data);
    if (it != weights_.end()) return ptr<uint8_t>(it->second);
    if (!type_traits(static_cast<uint32_t>(t->type)))
      throw BackendError("[cuda] tensor '" + t->name + "' has a type the CUDA backend cannot read");
    // 16 bytes of room past the last row: the staged LM head (matvec_q8.cu) copies whole 16-byte
    // lines, the last of which may run past a row length that is not a multiple of 16.
    DevPtr d = dev_alloc(t->nbytes + 16);
    CK(cudaMemcpy(d.get(), t->data, t->nbytes, cudaMemcpyHostToDevice));
    const uint8_t* p = ptr<uint8_t>(d);
    weights_.emplace(t->data, std::move(d));
    return p;
  }
  // A float copy of a small vector (norm weights, per-expert scales), made once.
  const float* small_f32(const TensorView* t) {
    auto it = small_.find(t->data);
    if (it != small_.end()) return ptr<float>(it->second);
    std::vector<float> v(static_cast<size_t>(t->numel()));
    dequantize_tensor(*t, v.data());
    DevPtr d = dev_alloc(v.size() * sizeof(float));
    CK(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    const float* p = ptr<float>(d);
    small_.emplace(t->data, std::move(d));
    return p;
  }
  cuda::WeightRef wref(const TensorView* t, size_t expert_rows = 0) {
    cuda::WeightRef w;
    w.data = upload(t);
    w.type = static_cast<int>(t->type);
    w.K = static_cast<int>(t->cols());
    w.row_bytes = t->row_stride();
    w.expert_bytes = expert_rows * w.row_bytes;
    return w;
  }

  static void need(bool ok, const Op& op, const std::string& what) {
    if (!ok) throw std::logic_error("[cuda] op '" + op.label + "': " + what);
  }

  // Allocates everything a graph needs (so that capture allocates nothing) and checks its ops.
  GraphState& prepare(const Graph& g, CudaCaches& kv) {
    auto it = states_.find(&g);
    if (it != states_.end()) return *it->second;
    auto st = std::make_unique<GraphState>();
    for (size_t i = 0; i < g.slots.size(); ++i)
      st->slots.push_back(dev_alloc(static_cast<size_t>(g.rows(static_cast<int>(i))) * g.slots[i].cols * sizeof(float)));
    st->step = dev_alloc((1 + g.T) * sizeof(int));
    st->step_host = host_alloc((1 + g.T) * sizeof(int));
    st->logits_host = host_alloc(static_cast<size_t>(g.rows(g.logits)) * g.vocab * sizeof(float));
    for (const auto& table : g.rope_tables) {
      st->rope.push_back(dev_alloc(table.size() * sizeof(float)));
      CK(cudaMemcpy(st->rope.back().get(), table.data(), table.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    size_t attn = 0, act = 0, counts = 0, order = 0, tiles = 0, hg = 0, y = 0, route = 0, pf_q8 = 0;
    for (size_t oi = 0; oi < g.ops.size(); ++oi) {
      const Op& op = g.ops[oi];
      const int rows = op.out >= 0 ? g.rows(op.out) : g.T;
      if (op.w) upload(op.w);
      if (int8_matmul(g, op) || int8_moe(g, op))
        pf_q8 = std::max(pf_q8, static_cast<size_t>(g.rows(op.a)) * (op.kind == OpKind::MatMul ? op.w->cols() : op.n));
      switch (op.kind) {
        case OpKind::MatMul:
          need(op.w && op.w->shape.size() == 2 && op.w->rows() >= op.n, op, "weight has fewer rows than outputs");
          need(op.w->cols() <= g.slots[op.a].cols, op, "weight is wider than its input");
          break;
        case OpKind::RmsNorm:
          need(op.group > 0 && op.n % op.group == 0, op, "bad group");
          if (op.w) small_f32(op.w);
          break;
        case OpKind::Rope:
          need(op.table >= 0 && op.table < static_cast<int>(g.rope_tables.size()), op, "bad RoPE table");
          need(static_cast<int>(g.rope_tables[op.table].size()) >= op.group / 2, op, "RoPE table too short");
          break;
        case OpKind::StoreKV: kv.ref(op.layer); break;
        case OpKind::Attention: {
          const cuda::CacheRef c = kv.ref(op.layer);
          need(c.head_dim == op.group && op.group <= 512 && op.group % 4 == 0, op,
               "head dim above 512, not a multiple of 4 or not the cache's");
          need(op.kv_heads > 0 && op.heads % c.kv_heads == 0, op, "heads not a multiple of KV heads");
          attn = std::max(attn, static_cast<size_t>(g.T) * op.heads * cuda::attention_splits(c, g.T) * (op.group + 2));
          break;
        }
        case OpKind::MoeRoute:
          need(op.group > 0 && op.group <= 1024 && op.k > 0 && op.k <= op.group, op, "bad expert counts");
          if (op.w2) small_f32(op.w2);
          route = std::max(route, static_cast<size_t>(rows) * g.slots[op.out].cols);
          break;
        case OpKind::MoeExperts: {
          need(op.w && op.w2 && op.w->shape.size() == 3 && op.w2->shape.size() == 3, op, "expert weights not 3-D");
          upload(op.w2);
          const size_t E = op.w->shape[0], K = op.heads, Ie = op.k, H = op.n;
          need(op.w->shape[1] == static_cast<int64_t>(2 * Ie) && op.w->shape[2] == static_cast<int64_t>(H) &&
                   op.w2->shape[0] == static_cast<int64_t>(E) && op.w2->shape[1] == static_cast<int64_t>(H) &&
                   op.w2->shape[2] == static_cast<int64_t>(Ie),
               op, "expert weight shapes do not match");
          need(E <= 1024, op, "more than 1024 experts");
          const size_t n = static_cast<size_t>(rows) * K;
          // decode: the dense MLP's GeGLU output may follow the experts' (moe_dense())
          const size_t dense = rows == 1 && oi + 1 < g.ops.size() ? static_cast<size_t>(g.ops[oi + 1].n) : 0;
          act = std::max(act, n * Ie + dense);
          counts = std::max(counts, E);
          order = std::max(order, n);
          tiles = std::max(tiles, static_cast<size_t>(3) * cuda::moe_max_tiles(rows, static_cast<int>(K), static_cast<int>(E)));
          if (rows > kDecodeRows) {
            hg = std::max(hg, n * 2 * Ie);
            y = std::max(y, n * H);
          }
          break;
        }
        default: break;
      }
    }
    if (attn) st->attn_scratch = dev_alloc(attn * sizeof(float));
    if (act) {
      auto buf = [&](size_t bytes) { st->moe_bufs.push_back(dev_alloc(bytes)); return st->moe_bufs.back().get(); };
      st->moe.act = static_cast<float*>(buf(act * sizeof(float)));
      st->moe.counts = static_cast<int*>(buf(counts * sizeof(int)));
      st->moe.order = static_cast<int*>(buf(order * sizeof(int)));
      st->moe.tiles = static_cast<int*>(buf(tiles * sizeof(int)));
      st->moe.n_tiles = static_cast<int*>(buf(sizeof(int)));
      if (hg) st->moe.hg = static_cast<float*>(buf(hg * sizeof(float)));
      if (y) st->moe.y = static_cast<float*>(buf(y * sizeof(float)));
    }
    if (pf_q8) {
      st->prefill_q8 = dev_alloc(q8_bytes(pf_q8));
      st->prefill_q8v = q8_of(st->prefill_q8, pf_q8);
      if (act) st->moe.act_q8 = q8_of(st->moe_bufs.emplace_back(dev_alloc(q8_bytes(act))), act);
    }
    if (route) st->route_host = host_alloc(route * sizeof(float));
    // The int8 products' split-K scratch: the most any of this graph's launches (as encode()
    // batches them) asks for.
    size_t mmq = 0;
    std::vector<char> batched(g.ops.size(), 0);
    for (size_t oi = 0; oi < g.ops.size(); ++oi)
      if (!batched[oi] && int8_matmul(g, g.ops[oi])) {  // as encode() launches them
        const int M = g.rows(g.ops[oi].out);
        const std::vector<int> others = other_types(g, oi, batched, true);
        mmq = std::max(mmq, cuda::matmul_q8_scratch_bytes(prefill_jobs(g, *st, oi, batched), M));
        for (int t : others) mmq = std::max(mmq, cuda::matmul_q8_scratch_bytes(prefill_jobs(g, *st, oi, batched, t), M));
      }
    if (mmq) {
      st->matmul_scratch = dev_alloc(mmq);  // zeroed: the tile counters start at 0
      st->matmul_scratch_v = {st->matmul_scratch.get(), mmq};
    }
    // The split-K products' partial tiles (narrow_product): the most any of them needs.
    size_t split_k = 0;
    for (const Op& op : g.ops)
      if (narrow_product(g, op))
        split_k = std::max(split_k, cuda::matmul_split_k_floats(op.n, g.rows(op.out), static_cast<int>(op.w->cols())));
    if (split_k) st->split_k = dev_alloc(split_k * sizeof(float));
    st->router_counter = dev_alloc(2 * sizeof(unsigned));
    if (router_poll_) {
      st->router_poll = dev_alloc(cuda::kChainPollExperts * sizeof(float));
      CK(cudaMemset(st->router_poll.get(), 0xff, cuda::kChainPollExperts * sizeof(float)));  // empty
    }
    if (q8_graph(g)) {
      for (size_t i = 0; i < g.slots.size(); ++i) st->q8.push_back(dev_alloc(q8_bytes(g.slots[i].cols)));
      if (act) st->moe_act_q8 = dev_alloc(q8_bytes((act + 31) / 32 * 32));
    }
    return *states_.emplace(&g, std::move(st)).first->second;
  }

  // --- 8-bit activations (decode graphs in default mode)
  bool q8_graph(const Graph& g) const { return g.T == 1 && !opt_.precise; }
  static size_t q8_bytes(size_t n) { return (n + 31) / 32 * 32 + (n + 31) / 32 * sizeof(float); }
  static cuda::Q8Vec q8_of(const DevPtr& buf, size_t n) {
    signed char* q = static_cast<signed char*>(buf.get());
    return {q, reinterpret_cast<float*>(q + (n + 31) / 32 * 32)};
  }
  cuda::Q8Vec slot_q8(const Graph& g, const GraphState& st, int slot) const {
    return q8_of(st.q8[slot], g.slots[slot].cols);
  }
  static bool moe_q8(const Graph& g, const Op& op) {
    return g.rows(op.out) == 1 && cuda::has_q8_dot(static_cast<int>(op.w->type)) &&
           cuda::has_q8_moe_down(static_cast<int>(op.w2->type)) && op.k % 32 == 0;
  }
  // Whether op reads slot s as the input of a product on its quantized copy.
  bool reads_q8(const Graph& g, const Op& op, int s) const {
    if (op.a != s || !q8_graph(g)) return false;
    if (op.kind == OpKind::MatMul) return g.rows(op.out) == 1 && cuda::has_q8_dot(static_cast<int>(op.w->type));
    if (op.kind == OpKind::MoeExperts) return moe_q8(g, op);
    return false;
  }
  // Whether an op after op `from` reads slot s before s is written again.
  bool read_later(const Graph& g, size_t from, int s) const {
    for (size_t j = from + 1; j < g.ops.size(); ++j) {
      if (g.ops[j].a == s || g.ops[j].b == s) return true;
      if (g.ops[j].out == s) return false;
    }
    return false;
  }
  // Whether the graph's first access to slot s is a read (a value carried from the step before).
  static bool read_first(const Graph& g, int s) {
    for (const Op& o : g.ops) {
      if (o.a == s || o.b == s) return true;
      if (o.out == s) return false;
    }
    return false;
  }
  // Whether a product after op `from` reads slot s quantized before s is written again.
  bool wants_q8(const Graph& g, size_t from, int s) const {
    if (!fuse_ || !q8_graph(g)) return false;
    for (size_t j = from + 1; j < g.ops.size(); ++j) {
      if (reads_q8(g, g.ops[j], s)) return true;
      if (g.ops[j].out == s) return false;
    }
    return false;
  }
  // The later products that can share op oi's launch (same quantized input, weight type and
  // width): each must be movable to oi, i.e. no op in between reads or writes its output, and
  // nothing in between rewrites the input.
  // prefill: int8 prefill products (int8_matmul) of the same input rows instead.
  // type >= 0: the later products of that weight type (not op oi itself) that can move up to oi.
  std::vector<size_t> batch_products(const Graph& g, size_t oi, const std::vector<char>& done,
                                     bool prefill = false, int type = -1) const {
    const Op& op = g.ops[oi];
    std::vector<size_t> jobs;
    if (type < 0) jobs.push_back(oi);
    if (!fuse_) return jobs;
    const int want = type < 0 ? static_cast<int>(op.w->type) : type;
    const size_t max_jobs = prefill ? cuda::kMaxMatmulQ8Jobs : cuda::kMaxMatvecJobs;
    for (size_t j = oi + 1; j < g.ops.size() && jobs.size() < max_jobs; ++j) {
      const Op& o = g.ops[j];
      if (o.out == op.a) break;
      const bool same_input = prefill ? o.kind == OpKind::MatMul && o.a == op.a && int8_matmul(g, o) &&
                                            g.rows(o.out) == g.rows(op.out)
                                      : reads_q8(g, o, op.a);
      if (done[j] || o.kind != OpKind::MatMul || !same_input || static_cast<int>(o.w->type) != want ||
          o.w->cols() != op.w->cols())
        continue;
      bool movable = true;
      for (size_t i = oi; i < j && movable; ++i) {
        const Op& m = g.ops[i];
        movable = m.out != o.out && m.a != o.out && m.b != o.out;
      }
      if (movable) jobs.push_back(j);
    }
    return jobs;
  }

  // --- 8-bit activations in prefill (default mode): products of block-typed weights on many rows
  // run on the int8 tensor cores (matmul_q8.cu) from a quantized copy of their input slot.
  bool int8_matmul(const Graph& g, const Op& op) const {
    return int8_prefill_ && op.kind == OpKind::MatMul && g.rows(op.out) > kDecodeRows && op.n > kNarrowRows &&
           cuda::has_int8_mma(static_cast<int>(op.w->type)) && op.w->cols() % 32 == 0;
  }
  // A prefill product with few outputs that no other path takes: cuda::matmul_split_k.
  bool narrow_product(const Graph& g, const Op& op) const {
    return split_k_ && op.kind == OpKind::MatMul && op.w && g.rows(op.out) > kDecodeRows && op.n <= kNarrowRows &&
           !int8_matmul(g, op);
  }
  // The weight types of the later products that batch_products(g, oi, done, prefill, type) would
  // move up to oi, other than oi's own: products of another type that read the same input (a
  // llama.cpp Q4_K_M file's Q6_K v beside Q4_K q and k) run right after oi's launch, one launch a
  // type, so that the ops after them find them done (norm_rope_store's chain of q, k and v).
  std::vector<int> other_types(const Graph& g, size_t oi, const std::vector<char>& done, bool prefill) const {
    std::vector<int> types;
    if (!fuse_) return types;
    const Op& op = g.ops[oi];
    for (size_t j = oi + 1; j < g.ops.size(); ++j) {
      const Op& o = g.ops[j];
      if (o.out == op.a) break;
      const int t = o.w ? static_cast<int>(o.w->type) : -1;
      if (done[j] || o.kind != OpKind::MatMul || t == static_cast<int>(op.w->type) ||
          std::find(types.begin(), types.end(), t) != types.end())
        continue;
      if (!batch_products(g, oi, done, prefill, t).empty()) types.push_back(t);
    }
    return types;
  }

  // Prefill: int8 product oi and the later ones that share its launch (batch_products), as the
  // launch's jobs; marks them done.
  cuda::MatmulQ8Jobs prefill_jobs(const Graph& g, GraphState& st, size_t oi, std::vector<char>& done, int type = -1) {
    cuda::MatmulQ8Jobs jobs;
    for (size_t j : batch_products(g, oi, done, true, type)) {
      const Op& o = g.ops[j];
      jobs.w[jobs.count] = wref(o.w);
      jobs.n[jobs.count] = o.n;
      jobs.out[jobs.count] = ptr<float>(st.slots[o.out]);
      jobs.out_stride[jobs.count] = g.slots[o.out].cols;
      ++jobs.count;
      done[j] = 1;
    }
    return jobs;
  }
  bool int8_moe(const Graph& g, const Op& op) const {
    return int8_prefill_ && op.kind == OpKind::MoeExperts && g.rows(op.out) > kDecodeRows &&
           cuda::has_int8_mma(static_cast<int>(op.w->type)) && cuda::has_int8_mma(static_cast<int>(op.w2->type)) &&
           op.n % 32 == 0 && op.k % 32 == 0;
  }
  // Whether an op after `from` reads slot s as floats before s is written again: anything but
  // int8 products (not MoE, which reads the floats too) served by the prefill buffer while it
  // still holds s.
  bool reads_f32_later(const Graph& g, size_t from, int s) const {
    bool buffer = true;
    for (size_t j = from + 1; j < g.ops.size(); ++j) {
      const Op& o = g.ops[j];
      if (int8_matmul(g, o) && o.a == s && buffer) {
        if (o.out == s) return false;
        continue;
      }
      if (int8_matmul(g, o) || int8_moe(g, o)) buffer = false;
      if (o.a == s || o.b == s) return true;
      if (o.out == s) return false;
    }
    return s == g.logits;
  }
  // Whether the next int8 prefill product after op `from` reads slot s's first n columns: then
  // the op writing s (a norm, a residual add, GeGLU) also fills the prefill buffer with them, which
  // saves that product's quantize_q8 launch (the buffer holds one slot, so only the next one).
  bool wants_prefill_q8(const Graph& g, size_t from, int s, int n) const {
    if (!fuse_ || n % 32 != 0 || g.rows(s) <= kDecodeRows) return false;
    for (size_t j = from + 1; j < g.ops.size(); ++j) {
      const Op& o = g.ops[j];
      if (int8_matmul(g, o)) return o.a == s && static_cast<int>(o.w->cols()) == n;
      if (int8_moe(g, o)) return o.a == s && o.n == n;
      if (o.out == s) return false;
    }
    return false;
  }

  // The attention inputs' finish that norm_rope_store does in one launch: from op oi, skipping ops
  // already launched with a batch of products, q's RmsNorm + Rope, k's RmsNorm + Rope, optionally
  // v's RmsNorm (per head, no weight), then the StoreKV of k and v. Returns the index of the
  // StoreKV with args filled, or 0 when the ops there do not have that shape.
  size_t finish_heads(const Graph& g, size_t oi, const std::vector<char>& done, GraphState& st, CudaCaches& kv,
                      cuda::HeadFinishArgs& hf) {
    auto next = [&](size_t j) {
      for (++j; j < g.ops.size(); ++j)
        if (!done[j]) return j;
      return g.ops.size();
    };
    auto at = [&](size_t j) -> const Op* { return j < g.ops.size() ? &g.ops[j] : nullptr; };
    auto norm_rope = [&](size_t j) {  // per-head norm at j, its in-place rotation next
      const Op* n = at(j);
      const Op* r = at(next(j));
      return n && r && n->kind == OpKind::RmsNorm && r->kind == OpKind::Rope && r->a == n->out &&
             r->out == n->out && r->group == n->group && r->heads * r->group == n->n;
    };
    if (!norm_rope(oi)) return 0;
    const size_t kn = next(next(oi));
    if (!norm_rope(kn)) return 0;
    size_t j = next(next(kn));
    const Op* vn = at(j);
    if (vn && vn->kind == OpKind::RmsNorm && !vn->w) j = next(j);
    else vn = nullptr;
    const Op* sk = at(j);
    const Op& q = g.ops[oi];
    const Op& k = g.ops[kn];
    if (!sk || sk->kind != OpKind::StoreKV || sk->a != k.out || (vn && (sk->b != vn->out || vn->group != k.group)))
      return 0;
    const cuda::CacheRef c = kv.ref(sk->layer);
    if (q.group != c.head_dim || k.group != c.head_dim || c.head_dim > 512 || k.n != c.kv_heads * c.head_dim ||
        g.slots[q.out].cols < q.n)
      return 0;
    auto part = [&](const Op& o, const Op* rope, void* cache) {
      cuda::HeadPart p;
      p.a = ptr<float>(st.slots[o.a]);
      p.as = g.slots[o.a].cols;
      p.norm = true;
      p.w = o.w ? small_f32(o.w) : nullptr;
      p.eps = o.f;
      p.inv = rope ? ptr<float>(st.rope[rope->table]) : nullptr;
      p.out = ptr<float>(st.slots[o.out]);
      p.os = g.slots[o.out].cols;
      p.heads = o.n / o.group;
      p.cache = cache;
      return p;
    };
    hf = cuda::HeadFinishArgs{};
    hf.part[0] = part(q, at(next(oi)), nullptr);
    hf.part[1] = part(k, at(next(kn)), c.k);
    if (vn) {
      hf.part[2] = part(*vn, nullptr, c.v);
    } else {  // v stored as it is: a part with neither norm nor rotation
      cuda::HeadPart p;
      p.a = p.out = ptr<float>(st.slots[sk->b]);
      p.as = p.os = g.slots[sk->b].cols;
      p.heads = c.kv_heads;
      p.cache = c.v;
      hf.part[2] = p;
    }
    hf.count = 3;
    for (int x = 0; x < 3; ++x)  // blocks of one part must not read what another part's blocks write
      for (int y = 0; y < 3; ++y)
        if (x != y && hf.part[x].a == hf.part[y].out) return 0;
    hf.c = c;
    hf.step = ptr<cuda::StepBuf>(st.step);
    return j;
  }

  // Whether op oi is the MoE router's product of one token followed by its routing (MoeRoute):
  // the pair cuda::moe_router launches as one (decode, GPU routing).
  bool router_pair(const Graph& g, size_t oi) const {
    const Op& op = g.ops[oi];
    const Op* nx = oi + 1 < g.ops.size() ? &g.ops[oi + 1] : nullptr;
    return fuse_ && !host_routing_ && g.T == 1 && op.kind == OpKind::MatMul && g.rows(op.out) == 1 && nx &&
           nx->kind == OpKind::MoeRoute && nx->a == op.out && nx->group == op.n && op.n <= 1024;
  }

  // Decode in default mode, Gemma 4's MoE feed-forward as gemma.cpp builds it, from the router's
  // product at oi: [router product, MoeRoute, MoeExperts, dense gate, dense up, GeGLU, dense down],
  // with the dense MLP reading neither the router's nor the experts' outputs. Then
  // cuda::moe_ffn_decode runs all seven in four launches, when the weights' types allow it
  // (cuda::moe_dense_fits). routed: the router pair runs in the row chain's launch before it
  // (cuda::chain_router), and cuda::moe_ffn_decode_routed runs the other five in three launches.
  // Returns the index of the dense down, or 0.
  size_t moe_dense(const Graph& g, size_t oi, const std::vector<char>& done, bool routed) {
    if (!moe_dense_ || !router_pair(g, oi) || !q8_graph(g) || oi + 6 >= g.ops.size()) return 0;
    const Op &r = g.ops[oi], &e = g.ops[oi + 2], &ga = g.ops[oi + 3], &up = g.ops[oi + 4], &gm = g.ops[oi + 5],
             &dn = g.ops[oi + 6];
    for (size_t j = oi + 2; j <= oi + 6; ++j)
      if (done[j]) return 0;
    const int route = g.ops[oi + 1].out;
    const bool shape = e.kind == OpKind::MoeExperts && e.b == route && ga.kind == OpKind::MatMul &&
                       up.kind == OpKind::MatMul && ga.a == up.a && ga.a != e.out && ga.a != r.out && ga.a != route &&
                       gm.kind == OpKind::GeluMul && gm.a == ga.out && gm.out == ga.out && gm.b == up.out &&
                       gm.b_col == 0 && gm.n == ga.n && ga.n == up.n && dn.kind == OpKind::MatMul && dn.a == ga.out &&
                       dn.out != e.out && dn.n == e.n && reads_q8(g, e, e.a) && reads_q8(g, ga, ga.a) &&
                       g.rows(e.out) == 1 && static_cast<int>(ga.w->cols()) == e.n &&
                       static_cast<int>(dn.w->cols()) == ga.n && g.slots[e.out].cols >= e.n;
    if (!shape) return 0;
    const int Ie = e.k, H = e.n;
    const cuda::WeightRef router = wref(r.w);
    const bool fits = cuda::moe_dense_fits(routed ? nullptr : &router, wref(e.w, 2 * static_cast<size_t>(Ie)),
                                           wref(e.w2, static_cast<size_t>(H)), wref(ga.w), wref(up.w), wref(dn.w), Ie,
                                           ga.n);
    return fits ? oi + 6 : 0;
  }

  // A row op that a decode row chain can take (cuda::row_chain).
  static bool chainable(const Graph& g, const Op& op) {
    if (op.out < 0 || g.T != 1 || g.rows(op.out) != 1 || op.n > cuda::kChainMaxN || op.n % 4 != 0) return false;
    // LastRow of a one-token graph is a copy (a Scale by 1): the output norm after it joins the
    // last layer's chain.
    return (op.kind == OpKind::RmsNorm && op.group == op.n) || op.kind == OpKind::Add || op.kind == OpKind::Scale ||
           (op.kind == OpKind::LastRow && g.rows(op.a) == 1);
  }

  // Enqueues every op of g; returns the number of kernels launched.
  //
  // Fusions (off with MARKBASE_CUDA_FUSE=0): in decode, runs of row ops (norms, residual adds,
  // layer scalars) in one launch, and the MoE router's product with the routing; in prefill, a
  // post-norm with the residual add after it (and the layer scalar after that); a QK-norm with its
  // RoPE; the quantization of a slot with the op that produces it; products that read the same
  // quantized slot, in one launch.
  //
  // Steps (one loop iteration: an op and what is fused or batched with it) go to the main stream,
  // or with a StreamPlan to the one it names, after waiting for the step it names on the other
  // stream. `uses`, if given, receives what each step reads and writes (for plan_streams).
  int encode(const Graph& g, GraphState& st, CudaCaches& kv, const StreamPlan* plan = nullptr,
             std::vector<StepUse>* uses = nullptr) {
    int kernels = 0;
    std::vector<char> done(g.ops.size(), 0);  // ops already launched with an earlier one
    std::vector<char> stepped(g.ops.size(), 0);  // ops whose step is over (uses)
    std::vector<int> q8_cols(g.slots.size(), 0);  // columns of each slot's current quantized copy
    std::vector<int> requantized;  // slots quantize_q8 rewrote in this step (uses)
    size_t chain_routed = SIZE_MAX;  // the last router product launched by cuda::chain_router
    cuda::HeadFinishArgs hf;
    size_t step_no = 0;
    cur_ = stream_;
    std::string step_key;  // the step's op label (profile, trace)
    int step_k0 = 0;       // kernels launched before the step
    if (trace_) st.traced.clear();
    // A slot's quantized copy, quantizing it first when its producer did not.
    auto need_q8 = [&](int slot, int K) {
      const cuda::Q8Vec q = slot_q8(g, st, slot);
      if (q8_cols[slot] < K) {
        kernels += cuda::quantize_q8(cur_, ptr<float>(st.slots[slot]), g.slots[slot].cols, K, 1, q, 0);
        q8_cols[slot] = K;
        requantized.push_back(slot);
      }
      return q;
    };
    // The start and end of a step: its stream and cross-stream wait; what it touched, and the
    // event a later step on the other stream waits for.
    auto begin_step = [&]() {
      requantized.clear();
      if (!plan) return;
      if (step_no >= plan->steps.size()) throw std::logic_error("[cuda] graph has more steps than its stream plan");
      const StepPlan& sp = plan->steps[step_no];
      cur_ = sp.side ? side_ : stream_;
      if (sp.wait >= 0) CK(cudaStreamWaitEvent(cur_, st.step_events[sp.wait], 0));
    };
    auto end_step = [&](size_t first, size_t last) {
      if (uses) {
        StepUse u;
        for (size_t j = first; j < g.ops.size(); ++j) {
          if (stepped[j] || (j > last && !done[j])) continue;
          stepped[j] = 1;
          op_use(g, g.ops[j], u);
        }
        for (int s : requantized) u.writes.push_back(s);
        uses->push_back(std::move(u));
      }
      if (plan && plan->steps[step_no].record) CK(cudaEventRecord(st.step_events[step_no], cur_));
      if (trace_) st.traced.push_back({step_key, kernels - step_k0});
      ++step_no;
    };
    // Which slot's first pf_K columns the prefill buffer holds (-1: none), quantizing on demand.
    int pf_slot = -1, pf_K = 0;
    auto need_prefill_q8 = [&](int slot, int K) {
      const cuda::Q8Vec q = st.prefill_q8v;
      if (pf_slot != slot || pf_K != K) {
        kernels += cuda::quantize_q8(cur_, ptr<float>(st.slots[slot]), g.slots[slot].cols, K, g.rows(slot), q, K);
        pf_slot = slot;
        pf_K = K;
      }
      return q;
    };
    const auto* step = ptr<cuda::StepBuf>(st.step);
    static const char* kind_names[] = {"Embed", "RmsNorm", "MatMul", "GeluMul", "Add", "Scale", "Rope",
                                       "StoreKV", "Attention", "Softcap", "MoeRoute", "MoeExperts", "LastRow"};
    for (size_t oi = 0; oi < g.ops.size(); ++oi) {
      if (done[oi]) continue;
      const Op& op = g.ops[oi];
      const int T = g.T;
      const size_t first = oi;  // ops first..oi are launched in this step (oi grows when fused)
      int q8_out = -1, q8_n = 0;  // a slot whose quantized copy this step writes
      int pf_out = -1, pf_n = 0;  // prefill: a slot whose rows this step also quantizes into prefill_q8
      size_t ev = 0;
      begin_step();
      step_k0 = kernels;
      if (profile_ || trace_) {
        // The op's label without its layer ("blk.7.attn_q.weight" -> "attn_q.weight"): one line
        // per op of a layer, its calls summed over the layers.
        std::string label = op.label;
        if (label.rfind("blk.", 0) == 0 && label.find('.', 4) != std::string::npos) label = label.substr(label.find('.', 4) + 1);
        step_key = std::string(kind_names[static_cast<int>(op.kind)]) + " " + label + " (T=" + std::to_string(T) + ")";
      }
      if (profile_) {
        ev = event_pair(st);
        st.timed.push_back({step_key, ev});
        record(st.events[ev]);
      }
      if (fuse_ && chainable(g, op)) {
        std::vector<size_t> chain;
        for (size_t j = oi; j < g.ops.size() && chain.size() < static_cast<size_t>(cuda::kMaxRowOps); ++j) {
          if (done[j]) continue;  // a product launched earlier with its batch
          if (!chainable(g, g.ops[j]) || g.ops[j].n != op.n) break;
          chain.push_back(j);
        }
        if (chain.size() >= 2) {
          cuda::RowChain c;
          for (size_t j : chain) {
            const Op& o = g.ops[j];
            cuda::RowOp& r = c.op[c.count++];
            r.n = o.n;
            r.a = ptr<float>(st.slots[o.a]);
            r.out = ptr<float>(st.slots[o.out]);
            if (o.kind == OpKind::RmsNorm) {
              r.kind = cuda::RowOpKind::Norm;
              r.w = o.w ? small_f32(o.w) : nullptr;
              r.f = o.f;
            } else if (o.kind == OpKind::Add) {
              r.kind = cuda::RowOpKind::Add;
              r.b = ptr<float>(st.slots[o.b]);
            } else {
              r.kind = cuda::RowOpKind::Scale;
              r.f = o.kind == OpKind::LastRow ? 1.0f : o.f;
            }
          }
          // A row that nothing after the chain reads is not stored (RowOp::keep): in Gemma 4 the
          // post-norms of the attention output, of the dense MLP's and the experts' outputs, their
          // sum and its norm, the residual before the layer scalar. The chain's one block stores
          // each row whole (~11 KB on the 26B-A4B), so the MoE layer's chain after the
          // feed-forward stored seven rows where three are read.
          // (Read later also where the graph's next step reads the row before writing it.)
          for (size_t i = 0; i < chain.size(); ++i) {
            const int s = g.ops[chain[i]].out;
            c.op[i].keep = s == g.logits || read_later(g, chain.back(), s) || read_first(g, s);
          }
          // Each output that a later product reads quantized is quantized by the op that writes it
          // last in the chain.
          std::vector<int> quantized;
          for (size_t i = chain.size(); i-- > 0;) {
            const Op& o = g.ops[chain[i]];
            bool last_write = true;
            for (size_t j = i + 1; j < chain.size(); ++j) last_write = last_write && g.ops[chain[j]].out != o.out;
            if (last_write && o.n % 32 == 0 && wants_q8(g, chain.back(), o.out)) {
              c.op[i].q8 = slot_q8(g, st, o.out);
              quantized.push_back(o.out);
            }
          }
          // A MoE router right after the chain, on one of its rows, runs beside it in its launch
          // (cuda::chain_router; MARKBASE_CUDA_CHAIN_ROUTER=0: after it). In default mode the
          // feed-forward then runs as cuda::moe_ffn_decode_routed (MoeExperts below): the pair is
          // taken when that fits too, or when moe_ffn_decode would not have run it either.
          size_t routed = 0;
          if (const size_t r = chain.back() + 1; chain_router_ && r + 1 < g.ops.size() && !done[r] && router_pair(g, r)) {
            const Op &rm = g.ops[r], &ro = g.ops[r + 1];
            const float* router_in = ptr<float>(st.slots[rm.a]);
            const bool ffn_ok = !moe_dense(g, r, done, false) || moe_dense(g, r, done, true);
            if (ffn_ok && cuda::chain_router_fits(c, router_in, wref(rm.w), ro.group)) {
              kernels += cuda::chain_router(cur_, c, router_in, read_later(g, r, rm.a), wref(rm.w),
                                            ro.w2 ? small_f32(ro.w2) : nullptr,
                                            ro.group, ro.k, ptr<float>(st.slots[rm.out]), ptr<float>(st.slots[ro.out]),
                                            ptr<unsigned>(st.router_counter),
                                            router_poll_ ? ptr<float>(st.router_poll) : nullptr, chain_split_,
                                            router_direct_, chain_spread_);
              routed = r + 1;
              chain_routed = r;
            }
          }
          if (!routed) kernels += cuda::row_chain(cur_, c);
          step_key = (routed ? "RowChain+router from " : "RowChain from ") + step_key;
          if (profile_) st.timed.back().first = step_key;
          oi = routed ? routed : chain.back();
          for (size_t j = first; j <= oi; ++j)
            if (g.ops[j].out >= 0) q8_cols[g.ops[j].out] = 0;
          for (int q : quantized) q8_cols[q] = op.n;
          const cudaError_t e = cudaGetLastError();
          if (e != cudaSuccess)
            throw BackendError("[cuda] op '" + op.label + "' failed to launch: " + cudaGetErrorString(e));
          if (profile_) record(st.events[ev + 1]);
          end_step(first, oi);
          continue;
        }
      }
      float* out = op.out >= 0 ? ptr<float>(st.slots[op.out]) : nullptr;
      const int os = op.out >= 0 ? g.slots[op.out].cols : 0;
      const float* a = op.a >= 0 ? ptr<float>(st.slots[op.a]) : nullptr;
      const int as = op.a >= 0 ? g.slots[op.a].cols : 0;
      const float* b = op.b >= 0 ? ptr<float>(st.slots[op.b]) : nullptr;
      const int bs = op.b >= 0 ? g.slots[op.b].cols : 0;
      const int rows = op.out >= 0 ? g.rows(op.out) : T;
      switch (op.kind) {
        case OpKind::Embed:
          kernels += cuda::embed(cur_, wref(op.w), step, T, static_cast<int>(op.w->shape[0]), op.f, op.n, out, os);
          break;
        case OpKind::RmsNorm: {
          const Op* nx = oi + 1 < g.ops.size() ? &g.ops[oi + 1] : nullptr;
          const float* w = op.w ? small_f32(op.w) : nullptr;
          if (fuse_ && nx && nx->kind == OpKind::Add && op.group == op.n && nx->b == op.out && nx->a != op.out &&
              nx->out != op.out && nx->out != op.a && nx->n == op.n && g.rows(nx->out) == rows &&
              g.rows(nx->a) == rows) {
            // post-norm + residual add, in place or not (+ the layer scalar on the sum)
            const Op* sc = oi + 2 < g.ops.size() ? &g.ops[oi + 2] : nullptr;
            const bool scaled = sc && sc->kind == OpKind::Scale && sc->a == nx->out && sc->out == nx->out && sc->n == nx->n;
            const size_t last = oi + (scaled ? 2 : 1);
            cuda::Q8Vec q8{};
            if (rows == 1 && op.n % 32 == 0 && wants_q8(g, last, nx->out)) {
              q8 = slot_q8(g, st, nx->out);
              q8_out = nx->out;
              q8_n = op.n;
            } else if (wants_prefill_q8(g, last, nx->out, op.n)) {
              q8 = st.prefill_q8v;
              pf_out = nx->out;
              pf_n = op.n;
            }
            kernels += cuda::rms_norm_add(cur_, a, as, w, op.n, op.f, rows, out, os, ptr<float>(st.slots[nx->out]),
                                          g.slots[nx->out].cols, ptr<float>(st.slots[nx->a]), g.slots[nx->a].cols, q8,
                                          scaled ? sc->f : 1.0f);
            oi = last;
          } else if (size_t last = 0; fuse_ && (last = finish_heads(g, oi, done, st, kv, hf)) > 0) {
            // q's norm and RoPE, k's, v's norm and the KV store
            kernels += cuda::norm_rope_store(cur_, hf, T);
            for (size_t j = oi + 1; j <= last; ++j) {
              if (done[j]) continue;
              done[j] = 1;
              if (g.ops[j].out >= 0) q8_cols[g.ops[j].out] = 0;
              if (g.ops[j].out == pf_slot) pf_slot = -1;
            }
          } else if (fuse_ && nx && nx->kind == OpKind::Rope && nx->a == op.out && nx->out == op.out &&
                     nx->group == op.group && nx->heads * nx->group == op.n) {
            // QK-norm + RoPE
            kernels += cuda::rms_norm_rope(cur_, a, as, w, op.f, ptr<float>(st.rope[nx->table]), step, T, nx->heads,
                                           nx->group, out, os);
            ++oi;
          } else {
            cuda::Q8Vec q8{};
            if (rows == 1 && op.group == op.n && op.n % 32 == 0 && wants_q8(g, oi, op.out)) {
              q8 = slot_q8(g, st, op.out);
              q8_out = op.out;
              q8_n = op.n;
            } else if (op.group == op.n && wants_prefill_q8(g, oi, op.out, op.n)) {
              q8 = st.prefill_q8v;
              pf_out = op.out;
              pf_n = op.n;
            }
            kernels += cuda::rms_norm(cur_, a, as, w, op.n, op.group, op.f, rows, out, os, q8);
          }
          break;
        }
        case OpKind::MatMul: {
          const Op* nx = oi + 1 < g.ops.size() ? &g.ops[oi + 1] : nullptr;
          if (const size_t dense_down = moe_dense(g, oi, done, false)) {  // router, experts and dense MLP
            const Op &e = g.ops[oi + 2], &ga = g.ops[oi + 3], &up = g.ops[oi + 4], &dn = g.ops[dense_down];
            const int Ie = e.k, H = e.n, K = e.heads;
            const cuda::Q8Vec h2 = need_q8(e.a, H), h = need_q8(ga.a, H);
            kernels += cuda::moe_ffn_decode(
                cur_, wref(op.w), a, nx->w2 ? small_f32(nx->w2) : nullptr, nx->group, nx->k, out,
                ptr<float>(st.slots[nx->out]), ptr<unsigned>(st.router_counter), wref(e.w, 2 * static_cast<size_t>(Ie)),
                wref(e.w2, static_cast<size_t>(H)), Ie, H, h2, st.moe.act,
                q8_of(st.moe_act_q8, static_cast<size_t>(K) * Ie + ga.n), ptr<float>(st.slots[e.out]), wref(ga.w),
                wref(up.w), wref(dn.w), h, ptr<float>(st.slots[dn.out]));
            for (size_t j = oi + 1; j <= dense_down; ++j) {
              done[j] = 1;
              if (g.ops[j].out >= 0) q8_cols[g.ops[j].out] = 0;
            }
            oi = dense_down;
          } else if (router_pair(g, oi)) {  // router product + routing
            kernels += cuda::moe_router(cur_, wref(op.w), a, nx->w2 ? small_f32(nx->w2) : nullptr, nx->group,
                                        nx->k, out, ptr<float>(st.slots[nx->out]), ptr<unsigned>(st.router_counter));
            ++oi;
          } else if (reads_q8(g, op, op.a)) {
            auto matvec_jobs = [&](const std::vector<size_t>& batch) {
              cuda::MatvecJobs jobs;
              for (size_t j : batch) {
                const Op& o = g.ops[j];
                jobs.w[jobs.count] = wref(o.w);
                jobs.n[jobs.count] = o.n;
                jobs.out[jobs.count] = ptr<float>(st.slots[o.out]);
                ++jobs.count;
                done[j] = 1;
                q8_cols[o.out] = 0;
              }
              return jobs;
            };
            cuda::MatvecJobs jobs = matvec_jobs(batch_products(g, oi, done));
            // The final softcap right after a lone product on its output (the LM head): in its launch.
            if (const Op* sc = oi + 1 < g.ops.size() ? &g.ops[oi + 1] : nullptr;
                fuse_ && head_softcap_ && jobs.count == 1 && sc && !done[oi + 1] && sc->kind == OpKind::Softcap &&
                sc->a == op.out && sc->out == op.out && sc->n == op.n && sc->f > 0.0f) {
              jobs.softcap = sc->f;
              done[oi + 1] = 1;
            }
            const int K = static_cast<int>(op.w->cols());
            kernels += cuda::matvec_q8(cur_, jobs, need_q8(op.a, K), K);
            for (int t : other_types(g, oi, done, false))  // the same vector's products of other types
              kernels += cuda::matvec_q8(cur_, matvec_jobs(batch_products(g, oi, done, false, t)), need_q8(op.a, K), K);
          } else if (int8_matmul(g, op)) {
            const int K = static_cast<int>(op.w->cols());
            const std::vector<int> others = other_types(g, oi, done, true);
            const cuda::MatmulQ8Jobs jobs = prefill_jobs(g, st, oi, done);
            kernels += cuda::matmul_q8_jobs(cur_, jobs, need_prefill_q8(op.a, K), K, rows, st.matmul_scratch_v);
            for (int t : others)  // the same rows' products of other types
              kernels += cuda::matmul_q8_jobs(cur_, prefill_jobs(g, st, oi, done, t), need_prefill_q8(op.a, K), K, rows,
                                              st.matmul_scratch_v);
          } else if (narrow_product(g, op)) {
            // Few outputs: the MoE router in prefill (128 float32 rows), where the tiled matmul
            // would run one column of 8 blocks (259 us a layer for 256 tokens on the H200) and the
            // matrix-vector kernel, reading each weight once per 4 tokens, took 102-125 us a layer
            // for 512 tokens (RESULTS.md). Split over runs of K, the tiles fill the GPU.
            kernels += cuda::matmul_split_k(cur_, wref(op.w), op.n, a, as, rows, out, os, ptr<float>(st.split_k));
          } else if (rows <= kDecodeRows || op.n <= kNarrowRows) {
            kernels += cuda::matvec(cur_, wref(op.w), op.n, a, as, rows, out, os);
          } else {
            kernels += cuda::matmul(cur_, wref(op.w), op.n, a, as, rows, out, os, opt_.precise);
          }
          break;
        }
        case OpKind::GeluMul: {
          cuda::Q8Vec q8{};
          if (rows == 1 && op.n % 32 == 0 && wants_q8(g, oi, op.out)) {
            q8 = slot_q8(g, st, op.out);
            q8_out = op.out;
            q8_n = op.n;
          } else if (wants_prefill_q8(g, oi, op.out, op.n)) {
            q8 = st.prefill_q8v;
            pf_out = op.out;
            pf_n = op.n;
          }
          // the floats are not needed when the next product (down) reads the quantized copy and
          // nothing reads the slot otherwise
          kernels += cuda::gelu_mul(cur_, a, as, b, bs, op.b_col, op.n, rows, out, os, q8,
                                    pf_out < 0 || reads_f32_later(g, oi, op.out));
          break;
        }
        case OpKind::Add: kernels += cuda::add(cur_, a, as, b, bs, op.n, rows, out, os); break;
        case OpKind::Scale: kernels += cuda::scale(cur_, a, as, op.f, op.n, rows, out, os); break;
        case OpKind::Softcap: kernels += cuda::softcap(cur_, a, as, op.f, op.n, rows, out, os); break;
        case OpKind::LastRow: kernels += cuda::copy_row(cur_, a + static_cast<size_t>(T - 1) * as, op.n, out); break;
        case OpKind::Rope:
          kernels += cuda::rope(cur_, a, as, ptr<float>(st.rope[op.table]), step, T, op.heads, op.group, out, os);
          break;
        case OpKind::StoreKV:
          kernels += cuda::store_kv(cur_, kv.ref(op.layer), a, as, b, bs, step, T, nullptr);
          break;
        case OpKind::Attention: {
          const cuda::CacheRef c = kv.ref(op.layer);
          cuda::Q8Vec q8{};
          if (rows == 1 && op.n % 32 == 0 && wants_q8(g, oi, op.out)) {
            q8 = slot_q8(g, st, op.out);
            q8_out = op.out;
            q8_n = op.n;
          }
          kernels += cuda::attention(cur_, c, a, as, step, T, op.heads, op.f, op.window, out, os,
                                     cuda::attention_splits(c, T), ptr<float>(st.attn_scratch), q8,
                                     attn_tc_ && !opt_.precise);
          break;
        }
        case OpKind::MoeRoute:
          kernels += cuda::moe_route(cur_, a, as, op.w2 ? small_f32(op.w2) : nullptr, op.group, op.k, rows, out, os);
          if (host_routing_) {  // debug: the naive engine's round trip, one wait per MoE layer
            CK(cudaGetLastError());
            CK(cudaMemcpyAsync(st.route_host.get(), out, static_cast<size_t>(rows) * os * sizeof(float),
                               cudaMemcpyDeviceToHost, cur_));
            wait();
            const float* r = static_cast<const float*>(st.route_host.get());
            host_ids_.clear();
            for (int t = 0; t < rows; ++t)
              for (int j = 0; j < op.k; ++j) host_ids_.push_back(static_cast<int>(r[t * os + 2 * j + 1]));
          }
          break;
        case OpKind::MoeExperts: {
          const int E = static_cast<int>(op.w->shape[0]), Ie = op.k, H = op.n, K = op.heads;
          const cuda::WeightRef gu = wref(op.w, 2 * static_cast<size_t>(Ie));
          const cuda::WeightRef dn = wref(op.w2, static_cast<size_t>(H));
          // routed by cuda::chain_router, with the dense MLP after (moe_dense)
          const size_t dense_down = chain_routed + 2 == oi ? moe_dense(g, chain_routed, done, true) : 0;
          if (dense_down) {
            const Op &ga = g.ops[oi + 1], &up = g.ops[oi + 2], &ddn = g.ops[dense_down];
            const cuda::Q8Vec h2 = need_q8(op.a, H), h = need_q8(ga.a, H);
            kernels += cuda::moe_ffn_decode_routed(cur_, b, E, K, gu, dn, Ie, H, h2, st.moe.act,
                                                   q8_of(st.moe_act_q8, static_cast<size_t>(K) * Ie + ga.n), out,
                                                   wref(ga.w), wref(up.w), wref(ddn.w), h, ptr<float>(st.slots[ddn.out]));
            for (size_t j = oi + 1; j <= dense_down; ++j) {
              done[j] = 1;
              if (g.ops[j].out >= 0) q8_cols[g.ops[j].out] = 0;
            }
            oi = dense_down;
          } else if (rows <= kDecodeRows) {
            const bool ids = host_routing_ && static_cast<int>(host_ids_.size()) == rows * K && rows * K <= 64;
            const bool q8 = reads_q8(g, op, op.a);
            kernels += cuda::moe_experts_decode(cur_, gu, dn, E, Ie, H, K, a, as, b, bs, rows,
                                                ids ? host_ids_.data() : nullptr, st.moe.act, out, os,
                                                q8 ? need_q8(op.a, H) : cuda::Q8Vec{},
                                                q8 ? q8_of(st.moe_act_q8, static_cast<size_t>(K) * Ie) : cuda::Q8Vec{});
          } else {
            kernels += cuda::moe_experts_prefill(cur_, gu, dn, E, Ie, H, K, a, as, b, bs, rows, st.moe,
                                                 opt_.precise, out, os,
                                                 int8_moe(g, op) ? need_prefill_q8(op.a, H) : cuda::Q8Vec{});
          }
          break;
        }
      }
      for (size_t j = first; j <= oi; ++j) {
        if (g.ops[j].out >= 0) q8_cols[g.ops[j].out] = 0;  // written: its quantized copy is stale
        if (g.ops[j].out == pf_slot) pf_slot = -1;
      }
      if (q8_out >= 0) q8_cols[q8_out] = q8_n;
      if (pf_out >= 0) {
        pf_slot = pf_out;
        pf_K = pf_n;
      }
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess)
        throw BackendError("[cuda] op '" + op.label + "' failed to launch: " + cudaGetErrorString(e));
      if (profile_) record(st.events[ev + 1]);
      end_step(first, oi);
    }
    if (plan && plan->steps.size() != step_no) throw std::logic_error("[cuda] graph has fewer steps than its stream plan");
    if (plan && plan->join >= 0) CK(cudaStreamWaitEvent(stream_, st.step_events[plan->join], 0));
    cur_ = stream_;
    return kernels;
  }

  // What an op reads and writes, as resource ids: slots by index, KV caches after them, and the
  // scratch buffers one kind of op reuses from layer to layer (negative).
  static void op_use(const Graph& g, const Op& o, StepUse& u) {
    const int caches = static_cast<int>(g.slots.size());
    if (o.a >= 0) u.reads.push_back(o.a);
    if (o.b >= 0) u.reads.push_back(o.b);
    if (o.out >= 0) u.writes.push_back(o.out);
    switch (o.kind) {
      case OpKind::StoreKV: u.writes.push_back(caches + o.layer); break;
      case OpKind::Attention:
        u.reads.push_back(caches + o.layer);
        u.writes.push_back(-1);  // attn_scratch
        break;
      case OpKind::MoeRoute: u.writes.push_back(-2); break;    // router_counter
      case OpKind::MoeExperts: u.writes.push_back(-3); break;  // moe.act, moe_act_q8
      default: break;
    }
  }

  static constexpr int kDecodeRows = 4;  // up to this many rows: matrix-vector kernels
  static constexpr int kNarrowRows = 128;  // products with at most this many outputs too
  BackendOptions opt_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t side_ = nullptr;  // a decode graph's independent steps (plan_streams)
  cudaStream_t cur_ = nullptr;   // where encode() launches the current step
  bool host_routing_ = false, use_graphs_ = true, profile_ = false, fuse_ = true, int8_prefill_ = true;
  bool head_softcap_ = true;
  bool moe_dense_ = true;  // MARKBASE_CUDA_MOE_DENSE=0: the dense MLP of a MoE layer in its own launches
  bool chain_router_ = true;  // MARKBASE_CUDA_CHAIN_ROUTER=0: a MoE router in its own launch after the row chain
  bool chain_split_ = true;  // MARKBASE_CUDA_CHAIN_SPLIT=0: chain_router's chain in block 0 alone
  bool router_poll_ = true;  // MARKBASE_CUDA_ROUTER_POLL=0: chain_router's last router block to count routes
  bool router_direct_ = true;  // MARKBASE_CUDA_ROUTER_DIRECT=0: chain_router's router blocks replay the chain
  bool chain_spread_ = true;  // MARKBASE_CUDA_CHAIN_SPREAD=0: chain_router keeps its chain blocks
  bool streams_ = true;  // MARKBASE_CUDA_STREAMS=0: every step on one stream
  bool attn_tc_ = true;  // default-mode prefill attention on the tensor cores (attention_tc.cu)
  bool split_k_ = true;  // MARKBASE_CUDA_SPLIT_K=0: narrow prefill products on the matrix-vector kernel
  bool capturing_ = false;           // encode() is recording into a CUDA graph
  const GraphState* timing_ = nullptr;  // profiling: the run whose op timers wait() reads
  bool trace_ = false;                  // MARKBASE_CUDA_TRACE: the critical-path timeline (common.cuh)
  DevPtr trace_buf_;
  HostPtr trace_host_;
  const GraphState* trace_run_ = nullptr;  // the run whose stamps wait() reads
  std::map<std::string, std::pair<double, int>> trace_acc_;
  int trace_runs_ = 0, trace_skipped_ = 0;
  double trace_total_ms_ = 0.0;
  std::map<std::string, std::pair<double, int>> prof_;
  std::unordered_map<const uint8_t*, DevPtr> weights_, small_;
  std::map<const Graph*, std::unique_ptr<GraphState>> states_;
  std::vector<int> host_ids_;
  DevPtr sample_result_, sample_recent_, sample_work_, sample_scratch_;
  HostPtr sample_host_;
  int sample_work_size_ = 0;
  int ops_ = 0, waits_ = 0;
};

}  // namespace

bool cuda_device_present() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) cudaGetLastError();
  return e == cudaSuccess && n > 0;
}

std::unique_ptr<Backend> create_cuda_backend(const BackendOptions& o) { return std::make_unique<CudaBackend>(o); }

}  // namespace markbase
