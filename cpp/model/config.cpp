#include "model/config.h"

#include <cmath>
#include <stdexcept>

#include "formats/error.h"

namespace markbase {
namespace {

// Reads keys of one metadata source with errors that name the file and key.
class Keys {
 public:
  Keys(const Value& root, std::string where, std::string prefix)
      : root_(root), where_(std::move(where)), prefix_(std::move(prefix)) {}
  const Value* find(const std::string& k) const {
    if (root_.is_object()) return root_.find(prefix_ + k);
    return nullptr;
  }
  [[noreturn]] void fail(const std::string& k, const std::string& problem) const {
    throw FormatError(where_ + ": " + prefix_ + k + ": " + problem);
  }
  int64_t i(const std::string& k) const {
    const Value* v = find(k);
    if (!v || v->is_null()) fail(k, "missing");
    try { return v->as_int(); } catch (const std::exception&) { fail(k, "not an integer"); }
  }
  int64_t i(const std::string& k, int64_t def) const {
    const Value* v = find(k);
    return (!v || v->is_null()) ? def : i(k);
  }
  double f(const std::string& k, double def) const {
    const Value* v = find(k);
    if (!v || v->is_null()) return def;
    try { return v->as_double(); } catch (const std::exception&) { fail(k, "not a number"); }
  }
  // Sizes and counts: integers in [lo, hi], checked before they become ints. size: [0, 2^30];
  // positive: [1, hi] (a required key).
  int in_range(const std::string& k, int64_t v, int64_t lo, int64_t hi) const {
    if (v < lo || v > hi) fail(k, "value " + std::to_string(v) + " is out of range");
    return static_cast<int>(v);
  }
  int size(const std::string& k) const { return checked_size(k, i(k)); }
  int size(const std::string& k, int64_t def) const { return checked_size(k, i(k, def)); }
  int checked_size(const std::string& k, int64_t v) const { return in_range(k, v, 0, int64_t{1} << 30); }
  int positive(const std::string& k, int64_t hi = 1 << 24) const { return in_range(k, i(k), 1, hi); }
  // A real parameter (a norm's epsilon, a RoPE base, a scale): finite and positive, or zero too
  // where zero_ok. Anything else would only surface as NaN logits.
  double real(const std::string& k, double def, bool zero_ok) const { return checked_real(k, f(k, def), zero_ok); }
  double checked_real(const std::string& k, double v, bool zero_ok) const {
    if (!std::isfinite(v) || v < 0 || (v == 0 && !zero_ok))
      fail(k, "value " + std::to_string(v) + (zero_ok ? " is not a finite number >= 0" : " is not a finite number > 0"));
    return v;
  }
  // A number or integer inside a nested object (key: its dotted path, for the message).
  double number(const Value& v, const std::string& k) const {
    try { return v.as_double(); } catch (const std::exception&) { fail(k, "not a number"); }
  }
  int64_t integer(const Value& v, const std::string& k) const {
    try { return v.as_int(); } catch (const std::exception&) { fail(k, "not an integer"); }
  }
  bool b(const std::string& k, bool def) const {
    const Value* v = find(k);
    if (!v || v->is_null()) return def;
    try { return v->as_bool(); } catch (const std::exception&) { fail(k, "not a boolean"); }
  }
  // A per-layer integer: either one number for every layer or an array of n.
  std::vector<int64_t> per_layer(const std::string& k, int n, int64_t def, bool required) const {
    const Value* v = find(k);
    if (!v || v->is_null()) {
      if (required) fail(k, "missing");
      return std::vector<int64_t>(n, def);
    }
    if (v->is_array()) {
      const ValueArray& a = v->as_array();
      if (static_cast<int>(a.size()) != n)
        fail(k, "has " + std::to_string(a.size()) + " entries for " + std::to_string(n) + " layers");
      std::vector<int64_t> out;
      for (const Value& x : a) {
        try { out.push_back(x.as_int()); } catch (const std::exception&) { fail(k, "not integers"); }
      }
      return out;
    }
    return std::vector<int64_t>(n, i(k));
  }
  const std::string& where() const { return where_; }

 private:
  const Value& root_;
  std::string where_, prefix_;
};

Value gguf_root(const ModelFile& f) {
  ValueObject o;
  for (const auto& [k, v] : f.metadata()) o.emplace(k, v);
  return Value(std::move(o));
}

// As llama.cpp's ggml_rope: theta_scale = powf(freq_base, -2 / n_dims) in float32.
static RopeSpec llama_rope_spec(double base, int n_dims, double freq_scale, std::vector<float> factors) {
  RopeSpec s;
  s.theta_scale = std::pow(static_cast<float>(base), -2.0f / static_cast<float>(n_dims));
  s.freq_scale = static_cast<float>(freq_scale);
  s.factors = std::move(factors);
  return s;
}

std::vector<float> rope_freqs(int head_dim, double theta, double divide, int rotated_pairs) {
  std::vector<float> inv(head_dim / 2, 0.0f);
  for (int j = 0; j < head_dim / 2 && j < rotated_pairs; ++j)
    inv[j] = static_cast<float>(std::pow(theta, -2.0 * j / head_dim) / divide);
  return inv;
}

// KV sharing: the last `shared` layers read the cache of an earlier layer.
void assign_kv_layers(ModelConfig& c, bool llama_cpp_rule, const Keys& k) {
  const int L = c.n_layers, first = L - c.n_kv_shared_layers;
  if (c.n_kv_shared_layers < 0 || first < 1) k.fail("shared_kv_layers", "out of range");
  for (int i = 0; i < L; ++i) {
    LayerConfig& l = c.layers[i];
    if (i < first) { l.kv_layer = i; continue; }
    int src = -1;
    if (llama_cpp_rule) {
      // llama.cpp (llama-model.cpp) hard-codes the producer: the last non-shared layer for full
      // layers, the one before it for sliding layers.
      src = first - (l.sliding ? 2 : 1);
    } else {
      // transformers: the last non-shared layer of the same type.
      for (int j = first - 1; j >= 0; --j)
        if (c.layers[j].sliding == l.sliding) { src = j; break; }
    }
    if (src < 0 || c.layers[src].sliding != l.sliding)
      k.fail("shared_kv_layers", "layer " + std::to_string(i) + " has no earlier layer of its "
             "type to share K/V with");
    l.kv_layer = src;
    if (c.layers[src].head_dim != l.head_dim || c.layers[src].n_kv_heads != l.n_kv_heads)
      k.fail("shared_kv_layers", "layer " + std::to_string(i) + " shares K/V with layer " +
             std::to_string(src) + " of a different head shape");
  }
}

ModelConfig from_gguf(const ModelFile& f) {
  Value root = gguf_root(f);
  Keys g(root, f.path(), "");
  const Value* av = root.find("general.architecture");
  if (!av || !av->is_string()) g.fail("general.architecture", "missing");
  ModelConfig c;
  c.architecture = av->as_string();
  if (c.architecture != "gemma3" && c.architecture != "gemma4")
    throw FormatError(f.path() + ": architecture '" + c.architecture +
                      "' is not supported (gemma3 and gemma4 are)");
  const bool g4 = c.is_gemma4();
  Keys k(root, f.path(), c.architecture + ".");
  c.hidden_size = k.positive("embedding_length");
  c.n_layers = k.positive("block_count", 4096);
  c.n_heads = k.positive("attention.head_count", 4096);
  c.context_length = k.size("context_length", 8192);
  c.rms_eps = static_cast<float>(k.real("attention.layer_norm_rms_epsilon", 1e-6, true));
  c.sliding_window = k.size("attention.sliding_window", 0);
  c.final_softcap = static_cast<float>(k.real("final_logit_softcapping", 0.0, true));
  const int hd_full = k.positive("attention.key_length", 65536);
  const int hd_swa = g4 ? k.size("attention.key_length_swa", hd_full) : hd_full;
  if (hd_full % 2 || hd_swa % 2 || hd_swa <= 0) k.fail("attention.key_length", "head dims must be even");
  const auto kv = k.per_layer("attention.head_count_kv", c.n_layers, c.n_heads, false);
  const auto ffn = k.per_layer("feed_forward_length", c.n_layers, 0, true);

  // Which layers are sliding: a bool array (gemma4) or a period (gemma3, default 6).
  std::vector<bool> swa(c.n_layers);
  const Value* pat = k.find("attention.sliding_window_pattern");
  if (pat && pat->is_array()) {
    if (static_cast<int>(pat->as_array().size()) != c.n_layers)
      k.fail("attention.sliding_window_pattern", "length differs from block_count");
    for (int i = 0; i < c.n_layers; ++i) swa[i] = pat->as_array()[i].as_bool();
  } else {
    const int64_t period = k.i("attention.sliding_window_pattern", 6);
    for (int i = 0; i < c.n_layers; ++i) swa[i] = period == 0 || (i % period < period - 1);
  }
  if (c.sliding_window <= 0)
    for (int i = 0; i < c.n_layers; ++i) swa[i] = false;

  c.layers.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    LayerConfig& l = c.layers[i];
    l.sliding = swa[i];
    l.head_dim = l.sliding ? hd_swa : hd_full;
    l.n_kv_heads = k.checked_size("attention.head_count_kv", kv[i]);
    l.ffn_dim = k.checked_size("feed_forward_length", ffn[i]);
    if (l.n_kv_heads <= 0 || c.n_heads % l.n_kv_heads != 0)
      k.fail("attention.head_count_kv", "layer " + std::to_string(i) + ": " +
             std::to_string(l.n_kv_heads) + " KV heads do not divide " + std::to_string(c.n_heads));
  }

  const double theta = k.real("rope.freq_base", 10000.0, false);
  const double theta_swa = k.real("rope.freq_base_swa", 10000.0, false);
  if (g4) {
    c.v_norm = true;
    c.attn_scale = 1.0f;
    c.n_kv_shared_layers = k.size("attention.shared_kv_layers", 0);
    c.ple_dim = k.size("embedding_length_per_layer_input", 0);
    c.n_experts = k.size("expert_count", 0);
    c.n_experts_used = k.size("expert_used_count", 0);
    c.expert_ffn_dim = k.size("expert_feed_forward_length", 0);
    const int n_rot = k.size("rope.dimension_count", hd_full);
    const int n_rot_swa = k.size("rope.dimension_count_swa", hd_swa);
    c.rope_inv_freq_sliding = rope_freqs(hd_swa, theta_swa, 1.0, n_rot_swa / 2);
    // Full layers: llama.cpp's rope_freqs tensor divides each frequency (1e30 for pairs that
    // are not rotated: proportional partial RoPE).
    c.rope_inv_freq_full.assign(hd_full / 2, 0.0f);
    const TensorView* rf = f.tensor("rope_freqs.weight");
    std::vector<float> factors(hd_full / 2, 1.0f);
    if (rf) {
      if (rf->numel() != hd_full / 2) throw FormatError(f.path() + ": rope_freqs.weight has " +
                                        std::to_string(rf->numel()) + " values, expected " +
                                        std::to_string(hd_full / 2));
      factors = f.read("rope_freqs.weight");
      for (float x : factors)
        if (!std::isfinite(x) || x <= 0)
          throw FormatError(f.path() + ": rope_freqs.weight holds " + std::to_string(x) +
                            " (each must be a finite number > 0)");
    }
    for (int j = 0; j < hd_full / 2 && 2 * j < n_rot; ++j)
      c.rope_inv_freq_full[j] =
          static_cast<float>(std::pow(theta, -2.0 * j / n_rot) / static_cast<double>(factors[j]));
    // llama.cpp rotates n_rot dims with its own pairing: the spec holds only when it is the head.
    if (n_rot_swa == hd_swa) c.rope_spec_sliding = llama_rope_spec(theta_swa, hd_swa, 1.0, {});
    if (n_rot == hd_full) c.rope_spec_full = llama_rope_spec(theta, hd_full, 1.0, rf ? factors : std::vector<float>{});
    for (int i = 0; i < c.n_layers; ++i) {
      LayerConfig& l = c.layers[i];
      const bool shared = i >= c.n_layers - c.n_kv_shared_layers;
      l.v_from_k = !shared && !f.tensor("blk." + std::to_string(i) + ".attn_v.weight");
    }
    assign_kv_layers(c, /*llama_cpp_rule=*/true, k);
  } else {
    const int n_layers = c.n_layers;
    c.attn_scale = n_layers == 62 ? 1.0f / std::sqrt(static_cast<float>(c.hidden_size / c.n_heads))
                                  : 1.0f / std::sqrt(static_cast<float>(hd_full));
    double factor = 1.0;
    const Value* st = k.find("rope.scaling.type");
    if (st && st->is_string() && st->as_string() == "linear") factor = k.real("rope.scaling.factor", 1.0, false);
    c.rope_inv_freq_sliding = rope_freqs(hd_swa, theta_swa, 1.0, hd_swa / 2);
    c.rope_inv_freq_full = rope_freqs(hd_full, theta, factor, hd_full / 2);
    c.rope_spec_sliding = llama_rope_spec(theta_swa, hd_swa, 1.0, {});
    c.rope_spec_full = llama_rope_spec(theta, hd_full, 1.0 / factor, {});
    for (int i = 0; i < c.n_layers; ++i) c.layers[i].kv_layer = i;
  }
  const Value* toks = root.find("tokenizer.ggml.tokens");
  const TensorView* emb = f.tensor("token_embd.weight");
  if (!emb) throw FormatError(f.path() + ": tensor 'token_embd.weight' is missing");
  c.vocab_size = static_cast<int>(emb->shape[0]);
  if (toks && toks->is_array() && static_cast<int>(toks->as_array().size()) != c.vocab_size)
    throw FormatError(f.path() + ": tokenizer.ggml.tokens has " +
                      std::to_string(toks->as_array().size()) + " tokens but token_embd.weight has " +
                      std::to_string(c.vocab_size) + " rows");
  c.embed_scale = std::sqrt(static_cast<float>(c.hidden_size));
  return c;
}

// transformers' defaults (Gemma3TextConfig, Gemma4TextConfig) of the keys read below, under the
// file's own keys: a key left out means what transformers reads it as. The published multimodal
// Gemma 3 checkpoints (gemma-3-4b/12b/27b, Gemma3ForConditionalGeneration) write only the
// text_config keys that differ from these. Gemma 4's default RoPE (proportional, a quarter of the
// full layers' pairs rotated) applies only where the file names no RoPE at all. Not defaulted:
// Gemma 4's full-layer head dim (transformers reads an absent one as 512, yet leaves it out when
// it saves a model whose full layers have the sliding layers' head dim: read as that here).
Value with_hf_defaults(const Value& cfg, bool gemma4) {
  ValueObject o = {{"hidden_size", int64_t{2304}},       {"intermediate_size", int64_t{9216}},
                   {"num_attention_heads", int64_t{8}},  {"num_key_value_heads", int64_t{4}},
                   {"head_dim", int64_t{256}},           {"max_position_embeddings", int64_t{131072}},
                   {"rms_norm_eps", 1e-6}};
  if (gemma4) {
    o["vocab_size"] = int64_t{262144};
    o["num_hidden_layers"] = int64_t{30};
    o["sliding_window"] = int64_t{512};
    o["hidden_size_per_layer_input"] = int64_t{256};
    if (!cfg.find("rope_parameters") && !cfg.find("rope_theta") && !cfg.find("rope_scaling"))
      o["rope_parameters"] = ValueObject{
          {"sliding_attention", ValueObject{{"rope_type", std::string("default")}, {"rope_theta", 10000.0}}},
          {"full_attention", ValueObject{{"rope_type", std::string("proportional")},
                                         {"partial_rotary_factor", 0.25}, {"rope_theta", 1000000.0}}}};
  } else {
    o["vocab_size"] = int64_t{262208};
    o["num_hidden_layers"] = int64_t{26};
    o["query_pre_attn_scalar"] = int64_t{256};
    o["sliding_window"] = int64_t{4096};
  }
  for (const auto& [key, v] : cfg.as_object()) o[key] = v;
  return Value(std::move(o));
}

// Hugging Face config.json (Gemma3ForCausalLM, Gemma4ForCausalLM, and the ...ForConditionalGeneration
// layouts with a nested text_config).
ModelConfig from_hf(const ModelFile& f) {
  const Value& top = f.config();  // an object (ModelFile::open checks)
  const Value* tc = top.find("text_config");
  const Value& file_cfg = (tc && tc->is_object()) ? *tc : top;
  std::string mt;
  if (const Value* v = file_cfg.find("model_type"); v && v->is_string()) mt = v->as_string();
  if (mt.empty())
    if (const Value* v = top.find("model_type"); v && v->is_string()) mt = v->as_string();
  ModelConfig c;
  if (mt.rfind("gemma3", 0) == 0) c.architecture = "gemma3";
  else if (mt.rfind("gemma4", 0) == 0 && mt != "gemma4_unified") c.architecture = "gemma4";
  else throw FormatError(f.path() + "/config.json: model_type '" + mt +
                         "' is not supported (Gemma 3 and Gemma 4 text models are)");
  const bool g4 = c.is_gemma4();
  const Value cfg = with_hf_defaults(file_cfg, g4);
  Keys k(cfg, f.path() + "/config.json", "");
  c.vocab_size = k.positive("vocab_size", 1 << 22);
  c.hidden_size = k.positive("hidden_size");
  c.n_layers = k.positive("num_hidden_layers", 4096);
  c.n_heads = k.positive("num_attention_heads", 4096);
  const int n_kv = k.size("num_key_value_heads", c.n_heads);
  const int hd = k.in_range("head_dim", k.i("head_dim", c.hidden_size / c.n_heads), 1, 65536);
  const int inter = k.positive("intermediate_size");
  c.context_length = k.size("max_position_embeddings", 8192);
  c.rms_eps = static_cast<float>(k.real("rms_norm_eps", 1e-6, true));
  c.sliding_window = k.size("sliding_window", 0);
  c.final_softcap = static_cast<float>(k.real("final_logit_softcapping", 0.0, true));

  // Layer types: an explicit list, or Gemma's default pattern.
  std::vector<bool> swa(c.n_layers);
  const Value* lt = cfg.find("layer_types");
  if (lt && lt->is_array()) {
    if (static_cast<int>(lt->as_array().size()) != c.n_layers)
      k.fail("layer_types", "length differs from num_hidden_layers");
    for (int i = 0; i < c.n_layers; ++i) {
      const Value& t = lt->as_array()[i];
      if (!t.is_string()) k.fail("layer_types", "entries must be strings");
      swa[i] = t.as_string() == "sliding_attention";
    }
  } else {
    const int64_t period = k.i("sliding_window_pattern", 6);
    for (int i = 0; i < c.n_layers; ++i) swa[i] = period <= 0 || ((i + 1) % period != 0);
  }
  if (g4) swa[c.n_layers - 1] = false;  // transformers forces the last Gemma 4 layer to full
  if (c.sliding_window <= 0)
    for (int i = 0; i < c.n_layers; ++i) swa[i] = false;

  // Rope parameters: transformers 5 "rope_parameters" per layer type, or the older flat keys.
  double theta_full = k.real("rope_theta", 1e6, false), theta_swa = k.real("rope_local_base_freq", 1e4, false);
  double factor_full = 1.0, partial_full = 1.0;
  if (const Value* rs = cfg.find("rope_scaling"); rs && rs->is_object()) {
    const Value* t = rs->find("rope_type");
    if (!t) t = rs->find("type");
    if (t && t->is_string() && t->as_string() == "linear")
      if (const Value* fv = rs->find("factor"))
        factor_full = k.checked_real("rope_scaling.factor", k.number(*fv, "rope_scaling.factor"), false);
  }
  if (const Value* rp = cfg.find("rope_parameters"); rp && rp->is_object()) {
    auto read = [&](const char* type, double& theta, double* factor, double* partial) {
      const Value* p = rp->find(type);
      const std::string at = p && p->is_object() ? std::string("rope_parameters.") + type + "." : "rope_parameters.";
      if (!p || !p->is_object()) p = rp->find("rope_theta") ? rp : nullptr;
      if (!p) return;
      if (const Value* v = p->find("rope_theta")) theta = k.checked_real(at + "rope_theta", k.number(*v, at + "rope_theta"), false);
      std::string rt;
      if (const Value* v = p->find("rope_type"); v && v->is_string()) rt = v->as_string();
      if (factor && (rt == "linear" || rt == "proportional"))
        if (const Value* v = p->find("factor")) *factor = k.checked_real(at + "factor", k.number(*v, at + "factor"), false);
      if (partial && rt == "proportional")
        if (const Value* v = p->find("partial_rotary_factor")) {
          *partial = k.number(*v, at + "partial_rotary_factor");
          if (!(*partial > 0 && *partial <= 1)) k.fail(at + "partial_rotary_factor", "must be in (0, 1]");
        }
    };
    read("sliding_attention", theta_swa, nullptr, nullptr);
    read("full_attention", theta_full, &factor_full, &partial_full);
  }

  int hd_full = hd, kv_full = n_kv;
  bool k_eq_v = false;
  if (g4) {
    hd_full = k.size("global_head_dim", hd);
    k_eq_v = k.b("attention_k_eq_v", false);
    if (k_eq_v) kv_full = k.size("num_global_key_value_heads", n_kv);
  }
  c.layers.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    LayerConfig& l = c.layers[i];
    l.sliding = swa[i];
    l.head_dim = l.sliding ? hd : hd_full;
    l.n_kv_heads = l.sliding ? n_kv : kv_full;
    l.ffn_dim = inter;
    l.kv_layer = i;
  }
  // transformers re-saves global_head_dim / num_global_key_value_heads as per_layer_config.
  if (const Value* plc = cfg.find("per_layer_config"); plc && plc->is_object()) {
    for (const auto& [key, entry] : plc->as_object()) {
      int idx = -1;
      try { idx = std::stoi(key); } catch (const std::exception&) {}
      if (idx < 0 || idx >= c.n_layers) k.fail("per_layer_config", "bad layer index '" + key + "'");
      const std::string at = "per_layer_config." + key + ".";
      if (const Value* v = entry.find("head_dim"))
        c.layers[idx].head_dim = k.checked_size(at + "head_dim", k.integer(*v, at + "head_dim"));
      if (const Value* v = entry.find("num_key_value_heads"); v && k_eq_v)
        c.layers[idx].n_kv_heads = k.checked_size(at + "num_key_value_heads", k.integer(*v, at + "num_key_value_heads"));
    }
  }
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerConfig& l = c.layers[i];
    if (l.head_dim <= 0 || l.head_dim % 2) k.fail("head_dim", "must be positive and even");
    if (l.n_kv_heads <= 0 || c.n_heads % l.n_kv_heads)
      k.fail("num_key_value_heads", "must divide num_attention_heads");
  }
  const int hd_swa_eff = hd;
  c.embed_scale = std::sqrt(static_cast<float>(c.hidden_size));
  if (g4) {
    c.v_norm = true;
    c.attn_scale = 1.0f;
    c.n_kv_shared_layers = k.size("num_kv_shared_layers", 0);
    c.ple_dim = k.size("hidden_size_per_layer_input", 256);
    if (k.b("enable_moe_block", false)) {
      c.n_experts = k.size("num_experts");
      c.n_experts_used = k.size("top_k_experts");
      c.expert_ffn_dim = k.size("moe_intermediate_size");
    }
    for (int i = 0; i < c.n_layers; ++i) c.layers[i].v_from_k = k_eq_v && !c.layers[i].sliding;
    assign_kv_layers(c, /*llama_cpp_rule=*/false, k);
    const bool wide = k.b("use_double_wide_mlp", false);
    for (int i = c.n_layers - c.n_kv_shared_layers; i < c.n_layers; ++i) {
      if (wide) c.layers[i].ffn_dim = 2 * inter;
      c.layers[i].v_from_k = false;
    }
    int hd_f = hd;
    for (const LayerConfig& l : c.layers) if (!l.sliding) hd_f = l.head_dim;
    const int rotated = static_cast<int>(partial_full * hd_f / 2);
    c.rope_inv_freq_sliding = rope_freqs(hd_swa_eff, theta_swa, 1.0, hd_swa_eff / 2);
    c.rope_inv_freq_full = rope_freqs(hd_f, theta_full, factor_full, rotated);
  } else {
    c.attn_scale = static_cast<float>(1.0 / std::sqrt(k.real("query_pre_attn_scalar", hd, false)));
    c.rope_inv_freq_sliding = rope_freqs(hd, theta_swa, 1.0, hd / 2);
    c.rope_inv_freq_full = rope_freqs(hd, theta_full, factor_full, hd / 2);
  }
  return c;
}

}  // namespace

ModelConfig parse_model_config(const ModelFile& f) {
  ModelConfig c = f.is_gguf() ? from_gguf(f) : from_hf(f);
  if (c.n_experts < 0 || c.n_experts_used < 0 || c.n_experts_used > c.n_experts ||
      (c.n_experts > 0 && (c.n_experts_used == 0 || c.expert_ffn_dim <= 0)))
    throw FormatError(f.path() + ": inconsistent expert counts (" + std::to_string(c.n_experts) +
                      " experts, " + std::to_string(c.n_experts_used) + " used)");
  if (c.ple_dim < 0) throw FormatError(f.path() + ": negative per-layer input width");
  if (c.context_length <= 0) c.context_length = 8192;
  return c;
}

}  // namespace markbase
