// Gemma 3 and Gemma 4 text decoders (dense, per-layer embeddings, KV sharing, MoE): the step
// graph for a prefill chunk or a decode token, built from a ModelConfig and its weights.
#pragma once
#include <deque>
#include <memory>
#include <vector>

#include "graph/graph.h"
#include "model/config.h"
#include "model/weights.h"

namespace markbase {

class GemmaModel {
 public:
  GemmaModel(std::shared_ptr<const ModelFile> file, const std::string& quant);

  const ModelConfig& config() const { return cfg_; }
  const WeightSet& weights() const { return weights_; }
  // KV caches, one per layer (capacity 0 for layers that read another layer's cache).
  std::vector<CacheDesc> caches(int max_context, int chunk) const;
  // Weight bytes one decode step reads: every matrix once (the head included), and of the MoE
  // expert tensors only the used experts' share. The floor of a decode step is this over the
  // memory's read bandwidth (plus the KV cache, which grows with the context).
  size_t decode_weight_bytes(int T = 1) const;
  // all_logits: logits for every token of the step (else only the last one).
  Graph build(int T, bool all_logits) const;

 private:
  const TensorView* derived(const std::string& name, std::vector<float> values);
  void validate();

  std::shared_ptr<const ModelFile> file_;
  ModelConfig cfg_;
  WeightSet weights_;
  std::deque<std::vector<float>> derived_data_;
  std::deque<TensorView> derived_;
  std::vector<const TensorView*> router_norm_;  // per layer: router.scale * hidden^-0.5
  std::vector<float> layer_scale_;              // per layer: layer_scalar (1 if absent)
};

}  // namespace markbase
