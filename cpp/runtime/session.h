// A Session runs one sequence through a model: it owns the KV caches and the step graphs, runs
// prompts in prefill chunks and generated tokens one at a time.
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/gemma.h"

namespace markbase {

class Session {
 public:
  Session(const GemmaModel& model, Backend& backend, int max_context, int chunk);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void reset() { pos_ = 0; }
  int pos() const { return pos_; }
  int max_context() const { return max_context_; }
  // Runs tokens from the current position. Returns the last token's logits; when all_rows is
  // given, it receives every token's logits (tokens.size() x vocab).
  std::vector<float> forward(const std::vector<int>& tokens, float* all_rows = nullptr);
  // As forward(), but the backend draws the next token from the last logits row on the device
  // (Backend::run_sample): only the token id comes back.
  int forward_sample(const std::vector<int>& tokens, const DeviceSampling& s);
  int ops_per_step() const { return ops_; }

 private:
  const Graph& graph(int T, bool all_logits);
  void check_tokens(const std::vector<int>& tokens) const;
  // Cuts tokens into chunks of at most chunk_, calls each(g, step, done, is_last) for each and
  // advances the position.
  template <class F>
  void chunks(const std::vector<int>& tokens, bool all, const F& each);
  const GemmaModel& model_;
  Backend& backend_;
  int max_context_, chunk_;
  std::unique_ptr<KVCaches> caches_;
  std::map<std::pair<int, bool>, Graph> graphs_;
  std::pair<int, bool> odd_{0, false};  // the one graph kept for a size other than a full chunk or 1
  int pos_ = 0;
  int ops_ = 0;
};

}  // namespace markbase
