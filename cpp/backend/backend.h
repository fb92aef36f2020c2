// The backend interface: executes a Graph for one step against a set of KV caches. Backends know
// graphs and tensors, never a model.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace markbase {

struct BackendOptions {
  int threads = 0;          // 0: all cores
  bool kv_f16 = true;       // KV cache storage: float16 (default) or float32
  bool precise = false;     // float32 activations everywhere (the reference mode)
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
};

// "cpu" always exists; others throw BackendError when not built or not available here.
std::unique_ptr<Backend> create_backend(const std::string& name, const BackendOptions& opt);
// The best backend available on this machine ("cuda", "metal" or "cpu").
std::string auto_backend();

}  // namespace markbase
