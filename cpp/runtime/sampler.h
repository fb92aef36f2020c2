// Token sampling: repeat penalty, top-k, top-p, min-p and temperature, in llama.cpp's order.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace markbase {

struct SamplingParams {
  float temperature = 0.8f;   // 0: greedy
  int top_k = 0;              // 0: off
  float top_p = 1.0f;         // 1: off
  float min_p = 0.0f;         // 0: off
  float repeat_penalty = 1.0f;
  int repeat_last_n = 64;     // tokens the repeat penalty looks back over
  uint64_t seed = 0;
  bool has_seed = false;

  // Throws std::invalid_argument naming the bad argument.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // history: the tokens so far (prompt and generated), for the repeat penalty.
  int sample(const float* logits, int vocab, const std::vector<int>& history);
  // The same draw for a backend that samples on the device: the parameters, the distinct recent
  // ids the repeat penalty applies to, and one uniform number from this sampler's generator.
  DeviceSampling device_params(const std::vector<int>& history);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int>> cand_;
};

}  // namespace markbase
