// ModelConfig: the shape and math switches of a Gemma 3 / Gemma 4 text decoder, read from GGUF
// metadata (llama.cpp's gemma3/gemma4 conventions) or a Hugging Face config.json. Model code
// builds its graph from this alone; nothing here knows a backend.
#pragma once
#include <string>
#include <vector>

#include "formats/model_file.h"
#include "graph/graph.h"

namespace markbase {

struct LayerConfig {
  bool sliding = false;     // sliding-window attention layer (else full/global)
  int head_dim = 0;
  int n_kv_heads = 0;
  int ffn_dim = 0;          // dense MLP width (double on KV-shared layers of E2B-like models)
  int kv_layer = 0;         // the layer whose KV cache this layer reads (itself unless KV-shared)
  bool v_from_k = false;    // attention_k_eq_v: V is the raw K projection (no v weight)
};

struct ModelConfig {
  std::string architecture;  // "gemma3" or "gemma4"
  int vocab_size = 0, hidden_size = 0, n_layers = 0, n_heads = 0;
  int context_length = 0;
  float rms_eps = 1e-6f;
  int sliding_window = 0;
  std::vector<LayerConfig> layers;
  // RoPE, per layer type: inverse frequencies of each rotated pair (neox pairing i, i + d/2).
  std::vector<float> rope_inv_freq_sliding, rope_inv_freq_full;
  RopeSpec rope_spec_sliding, rope_spec_full;  // GGUF files: the same angles as llama.cpp forms them
  float attn_scale = 1.0f;          // multiplies q.k
  float final_softcap = 0.0f;       // 0: none
  bool v_norm = false;              // Gemma 4: parameter-free RMSNorm on V
  int ple_dim = 0;                  // per-layer-embedding width (0: none)
  int n_experts = 0, n_experts_used = 0, expert_ffn_dim = 0;
  float embed_scale = 1.0f;         // sqrt(hidden_size), in float32
  int n_kv_shared_layers = 0;

  bool is_gemma4() const { return architecture == "gemma4"; }
};

// Throws FormatError naming the file and key when something needed is missing or inconsistent.
ModelConfig parse_model_config(const ModelFile& f);

}  // namespace markbase
