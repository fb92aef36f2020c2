// The backend interface: executes a Graph for one step against a set of KV caches. Backends know
// graphs and tensors, never a model.
#pragma once
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace markbase {

struct BackendOptions {
  int threads = 0;          // 0: all cores
  bool kv_f16 = true;       // KV cache storage: float16 (default) or float32
  bool precise = false;     // float32 activations everywhere (the reference mode)
  bool llamacpp_exact = false;  // CPU: llama.cpp's own arithmetic (backend/cpu/llamacpp_exact.h)
};

// What a backend needs to draw the next token on the device (runtime/sampler.h's semantics:
// repeat penalty, then greedy when temperature is 0, else top-k, top-p, min-p and a draw).
struct DeviceSampling {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f, min_p = 0.0f, repeat_penalty = 1.0f;
  std::vector<int> recent;  // distinct token ids the repeat penalty applies to
  double u = 0.0;           // a uniform random number in [0, 1) from the session's seeded generator
};

// The KV caches of one sequence, owned by the session, laid out by the backend.
class KVCaches {
 public:
  virtual ~KVCaches() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual std::unique_ptr<KVCaches> make_caches(const std::vector<CacheDesc>& desc) = 0;
  // Runs every op of g for the step; returns the logits slot (rows x g.vocab floats).
  virtual const float* run(const Graph& g, const Step& step, KVCaches& caches) = 0;
  // Frees what the backend keeps for a graph that is about to be destroyed.
  virtual void release(const Graph& g) = 0;
  // Ops executed (or kernels launched) and host waits in the last run.
  virtual int ops_last_run() const = 0;
  virtual int waits_last_run() const = 0;

  // Sampling on the device, so that only the token id comes back to the host (one wait per
  // token). A backend that can overrides both; by default the caller runs the graph and samples
  // the logits on the host (runtime/sampler.cpp), which is what the CPU backend does.
  virtual bool samples_on_device() const { return false; }
  // Tokens per prefill step when the caller leaves it open: a GPU fills more of itself, and
  // MoE prefill finds more tokens per expert, with larger steps (llama.cpp's default is 512).
  virtual int preferred_prefill_chunk() const { return 256; }
  // Runs g (as run()) and returns the token drawn from its last logits row.
  virtual int run_sample(const Graph& g, const Step& step, KVCaches& caches, const DeviceSampling& s) {
    (void)g; (void)step; (void)caches; (void)s;
    throw std::logic_error(name() + " backend does not sample on the device");
  }
};

// "cpu" always exists; others throw BackendError when not built or not available here.
std::unique_ptr<Backend> create_backend(const std::string& name, const BackendOptions& opt);
// The best backend available on this machine ("cuda", "metal" or "cpu").
std::string auto_backend();

}  // namespace markbase
