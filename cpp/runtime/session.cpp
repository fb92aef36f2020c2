#include "runtime/session.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace markbase {

Session::Session(const GemmaModel& model, Backend& backend, int max_context, int chunk)
    : model_(model), backend_(backend), max_context_(max_context), chunk_(chunk) {
  if (max_context < 1) throw std::invalid_argument("max_context must be >= 1");
  if (chunk < 1) throw std::invalid_argument("prefill_chunk must be >= 1");
  caches_ = backend.make_caches(model.caches(max_context, chunk));
}

Session::~Session() {
  for (const auto& [key, g] : graphs_) backend_.release(g);
}

const Graph& Session::graph(int T, bool all_logits) {
  auto key = std::make_pair(T, all_logits);
  auto it = graphs_.find(key);
  if (it == graphs_.end()) it = graphs_.emplace(key, model_.build(T, all_logits)).first;
  return it->second;
}

void Session::check_tokens(const std::vector<int>& tokens) const {
  const int V = model_.config().vocab_size;
  if (tokens.empty()) throw std::invalid_argument("no tokens to run");
  if (pos_ + static_cast<int64_t>(tokens.size()) > max_context_)
    throw std::length_error(std::to_string(pos_ + tokens.size()) + " tokens exceed the context of " +
                            std::to_string(max_context_) + " tokens (max_context)");
  for (int id : tokens)
    if (id < 0 || id >= V)
      throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary of " +
                                  std::to_string(V));
}

// Calls each(g, step, done, is_last) for every chunk of at most chunk_ tokens, advancing pos_.
// Graphs that return every row's logits take at most kAllLogitsChunk tokens a step: their logits
// buffers hold T x vocab floats (1 GiB at 1024 x 262144), on the device and pinned on the host.
template <class F>
void Session::chunks(const std::vector<int>& tokens, bool all, const F& each) {
  constexpr int kAllLogitsChunk = 512;
  const int chunk = all ? std::min(chunk_, kAllLogitsChunk) : chunk_;
  size_t done = 0;
  while (done < tokens.size()) {
    const int T = static_cast<int>(std::min<size_t>(chunk, tokens.size() - done));
    const Graph& g = graph(T, all);
    Step step;
    step.tokens.assign(tokens.begin() + done, tokens.begin() + done + T);
    step.pos0 = pos_;
    each(g, step, done, done + T == tokens.size());
    ops_ = backend_.ops_last_run();
    pos_ += T;
    done += T;
    // Keep the graphs every sequence uses (a full chunk, one token) and the last one of another
    // size (a prompt's last chunk: prompts of one length in a row reuse it; building a graph
    // costs its buffers and, on CUDA, a capture, ~10 ms for a 512-token 26B-A4B step). Older
    // odd sizes are freed, so memory does not grow with each new length.
    const auto key = std::make_pair(T, all);
    if (T != chunk && T != 1 && key != odd_) {
      auto old = graphs_.find(odd_);
      if (old != graphs_.end()) {
        backend_.release(old->second);
        graphs_.erase(old);
      }
      odd_ = key;
    }
  }
}

std::vector<float> Session::forward(const std::vector<int>& tokens, float* all_rows) {
  check_tokens(tokens);
  const int V = model_.config().vocab_size;
  std::vector<float> last(V);
  const bool all = all_rows != nullptr;
  chunks(tokens, all, [&](const Graph& g, const Step& step, size_t done, bool) {
    const int T = g.T;
    const float* logits = backend_.run(g, step, *caches_);
    if (all) std::memcpy(all_rows + done * V, logits, sizeof(float) * T * V);
    std::memcpy(last.data(), logits + (all ? static_cast<size_t>(T - 1) * V : 0), sizeof(float) * V);
  });
  return last;
}

int Session::forward_sample(const std::vector<int>& tokens, const DeviceSampling& s) {
  check_tokens(tokens);
  int token = -1;
  chunks(tokens, false, [&](const Graph& g, const Step& step, size_t, bool is_last) {
    if (is_last) token = backend_.run_sample(g, step, *caches_, s);
    else backend_.run(g, step, *caches_);
  });
  return token;
}

}  // namespace markbase
