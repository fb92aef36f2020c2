#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace markbase {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    throw std::invalid_argument("temperature must be a finite number >= 0, got " + std::to_string(temperature));
  if (top_k < 0) throw std::invalid_argument("top_k must be >= 0 (0 disables it), got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    throw std::invalid_argument("top_p must be in (0, 1], got " + std::to_string(top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    throw std::invalid_argument("min_p must be in [0, 1], got " + std::to_string(min_p));
  if (!(repeat_penalty > 0.0f) || !std::isfinite(repeat_penalty))
    throw std::invalid_argument("repeat_penalty must be a finite number > 0, got " + std::to_string(repeat_penalty));
  if (repeat_last_n < 0) throw std::invalid_argument("repeat_last_n must be >= 0");
}

Sampler::Sampler(const SamplingParams& p) : p_(p) {
  p_.validate();
  rng_.seed(p.has_seed ? p.seed : std::random_device{}());
}

int Sampler::sample(const float* logits, int vocab, const std::vector<int>& history) {
  cand_.resize(vocab);
  for (int i = 0; i < vocab; ++i) cand_[i] = {logits[i], i};
  if (p_.repeat_penalty != 1.0f && p_.repeat_last_n > 0) {
    std::unordered_set<int> seen;
    const size_t n = std::min<size_t>(history.size(), p_.repeat_last_n);
    for (size_t i = history.size() - n; i < history.size(); ++i) seen.insert(history[i]);
    for (int id : seen) {
      if (id < 0 || id >= vocab) continue;
      float& l = cand_[id].first;
      l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
    }
  }
  auto by_logit = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (p_.temperature == 0.0f)
    return std::min_element(cand_.begin(), cand_.end(), by_logit)->second;

  size_t n = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = p_.top_k;
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Probabilities at temperature 1 for the top-p / min-p cuts, as llama.cpp's default chain.
  std::vector<double> pr(n);
  const double mx = cand_[0].first;
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) { pr[i] = std::exp(static_cast<double>(cand_[i].first) - mx); sum += pr[i]; }
  if (p_.top_p < 1.0f) {
    double c = 0.0;
    for (size_t i = 0; i < n; ++i) {
      c += pr[i] / sum;
      if (c >= p_.top_p) { n = i + 1; break; }
    }
  }
  if (p_.min_p > 0.0f) {
    size_t keep = 1;
    while (keep < n && pr[keep] / pr[0] >= p_.min_p) ++keep;
    n = keep;
  }
  std::vector<double> w(n);
  for (size_t i = 0; i < n; ++i)
    w[i] = std::exp((static_cast<double>(cand_[i].first) - mx) / p_.temperature);
  std::discrete_distribution<size_t> dist(w.begin(), w.end());
  return cand_[dist(rng_)].second;
}

DeviceSampling Sampler::device_params(const std::vector<int>& history) {
  DeviceSampling d;
  d.temperature = p_.temperature;
  d.top_k = p_.top_k;
  d.top_p = p_.top_p;
  d.min_p = p_.min_p;
  d.repeat_penalty = p_.repeat_penalty;
  if (p_.repeat_penalty != 1.0f && p_.repeat_last_n > 0) {
    std::unordered_set<int> seen;
    const size_t n = std::min<size_t>(history.size(), p_.repeat_last_n);
    for (size_t i = history.size() - n; i < history.size(); ++i)
      if (seen.insert(history[i]).second) d.recent.push_back(history[i]);
  }
  if (p_.temperature > 0.0f) d.u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return d;
}

}  // namespace markbase
