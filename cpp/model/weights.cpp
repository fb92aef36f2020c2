#include "model/weights.h"

#include <cstring>
#include <stdexcept>

#include "formats/error.h"
#include "formats/quants.h"

namespace markbase {
namespace {

// Hugging Face (transformers) names -> llama.cpp GGUF names, after the "model." or
// "model.language_model." prefix is removed.
const std::map<std::string, std::string>& hf_layer_names() {
  static const std::map<std::string, std::string> m = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
      {"pre_feedforward_layernorm_2.weight", "pre_ffw_norm_2.weight"},
      {"post_feedforward_layernorm_1.weight", "post_ffw_norm_1.weight"},
      {"post_feedforward_layernorm_2.weight", "post_ffw_norm_2.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"layer_scalar", "layer_output_scale.weight"},
      {"per_layer_input_gate.weight", "inp_gate.weight"},
      {"per_layer_projection.weight", "proj.weight"},
      {"post_per_layer_input_norm.weight", "post_norm.weight"},
      {"router.proj.weight", "ffn_gate_inp.weight"},
      {"router.scale", "ffn_gate_inp.scale"},
      {"router.per_expert_scale", "ffn_down_exps.scale"},
      {"experts.gate_up_proj", "ffn_gate_up_exps.weight"},
      {"experts.down_proj", "ffn_down_exps.weight"},
  };
  return m;
}

const std::map<std::string, std::string>& hf_global_names() {
  static const std::map<std::string, std::string> m = {
      {"embed_tokens.weight", "token_embd.weight"},
      {"norm.weight", "output_norm.weight"},
      {"embed_tokens_per_layer.weight", "per_layer_token_embd.weight"},
      {"per_layer_model_projection.weight", "per_layer_model_proj.weight"},
      {"per_layer_projection_norm.weight", "per_layer_proj_norm.weight"},
  };
  return m;
}

// The GGUF name of a Hugging Face tensor, or "" for tensors the text decoder does not use. The
// decoder's tensors are under "model." (Gemma3ForCausalLM, Gemma4ForCausalLM),
// "model.language_model." (Gemma4ForConditionalGeneration) or "language_model.model." (the
// published Gemma3ForConditionalGeneration checkpoints).
std::string gguf_name(const std::string& hf) {
  if (hf == "lm_head.weight" || hf == "language_model.lm_head.weight") return "output.weight";
  std::string s;
  for (const char* p : {"model.language_model.", "language_model.model.", "model."})
    if (hf.rfind(p, 0) == 0) { s = hf.substr(std::strlen(p)); break; }
  if (s.empty()) return "";
  if (s.rfind("layers.", 0) == 0) {
    size_t dot = s.find('.', 7);
    if (dot == std::string::npos) return "";
    const std::string idx = s.substr(7, dot - 7);
    auto it = hf_layer_names().find(s.substr(dot + 1));
    if (it == hf_layer_names().end()) return "";
    return "blk." + idx + "." + it->second;
  }
  auto it = hf_global_names().find(s);
  return it == hf_global_names().end() ? "" : it->second;
}

bool is_norm(const std::string& gguf) {
  return gguf.find("norm") != std::string::npos;
}

// Matrices that the quant-on-load option converts (weights read by matrix products).
bool is_matrix(const std::string& gguf, const TensorView& t) {
  if (t.shape.size() < 2 || is_norm(gguf)) return false;
  return gguf.find("scale") == std::string::npos;
}

// Throws where a decoder tensor contradicts the metadata in a way that would otherwise go unseen:
// the tensor would just not be read, and the model would run without it. A layer past the layer
// count (block_count / num_hidden_layers smaller than the file's layers), and per-layer-embedding
// tensors where the metadata gives no per-layer width. llama.cpp refuses such files too (its
// loader counts the tensors it did not use).
void check_tensor_fits_config(const std::string& path, const std::string& name, const ModelConfig& c) {
  if (name.rfind("blk.", 0) == 0) {
    const size_t dot = name.find('.', 4);
    const std::string idx = name.substr(4, dot == std::string::npos ? std::string::npos : dot - 4);
    const bool digits = !idx.empty() && idx.size() <= 9 && idx.find_first_not_of("0123456789") == std::string::npos;
    if (digits && std::stoll(idx) >= c.n_layers)
      throw FormatError(path + ": tensor '" + name + "' is of layer " + idx + ", but the metadata gives " +
                        std::to_string(c.n_layers) + " layers");
  }
  if (c.ple_dim == 0) {
    const bool ple = name.rfind("per_layer_", 0) == 0 ||
                     (name.rfind("blk.", 0) == 0 &&
                      (name.find(".inp_gate.") != std::string::npos || name.find(".proj.") != std::string::npos));
    if (ple)
      throw FormatError(path + ": tensor '" + name + "' holds per-layer embeddings, but the metadata gives "
                        "no per-layer input width");
  }
}

}  // namespace

const TensorView& WeightSet::own(TensorView t, std::vector<uint8_t> data) {
  owned_.push_back(std::move(data));
  t.data = owned_.back().data();
  t.nbytes = owned_.back().size();
  t.mapping = nullptr;
  t.mapping_bytes = 0;
  auto [it, inserted] = tensors_.insert_or_assign(t.name, std::move(t));
  return it->second;
}

WeightSet::WeightSet(const ModelFile& f, const ModelConfig& c, const std::string& quant) : path_(f.path()) {
  if (!quant.empty() && quant != "q8_0" && quant != "q4_0")
    throw std::invalid_argument("quant must be None, 'q8_0' or 'q4_0', not '" + quant + "'");
  if (f.is_gguf()) {
    if (!quant.empty())
      throw std::invalid_argument("quant= applies to Hugging Face float weights; this GGUF file is "
                                  "already stored in its own types");
    for (const TensorView& t : f.tensors()) {
      check_tensor_fits_config(path_, t.name, c);
      tensors_.emplace(t.name, t);
    }
    return;
  }
  const TensorType qt = quant == "q4_0" ? TensorType::Q4_0 : TensorType::Q8_0;
  for (const TensorView& src : f.tensors()) {
    std::string name = gguf_name(src.name);
    if (name.empty()) continue;
    check_tensor_fits_config(path_, name, c);
    TensorView t = src;
    t.name = name;
    const bool plus_one = !c.is_gemma4() && is_norm(name);  // Gemma 3 checkpoints store w, use 1+w
    if (plus_one || (!quant.empty() && is_matrix(name, t) && t.cols() % 32 == 0)) {
      std::vector<float> x(static_cast<size_t>(t.numel()));
      if (!x.empty()) dequantize_tensor(src, x.data());
      if (plus_one) {
        for (float& v : x) v += 1.0f;
        std::vector<uint8_t> bytes(x.size() * 4);
        std::memcpy(bytes.data(), x.data(), bytes.size());
        t.type = TensorType::F32;
        own(t, std::move(bytes));
      } else {
        const int64_t cols = t.cols(), rows = t.rows();
        const size_t rb = row_bytes(qt, cols);
        std::vector<uint8_t> bytes(rb * rows);
        for (int64_t r = 0; r < rows; ++r) {
          if (qt == TensorType::Q8_0) quantize_row_q8_0(x.data() + r * cols, bytes.data() + r * rb, cols);
          else quantize_row_q4_0(x.data() + r * cols, bytes.data() + r * rb, cols);
        }
        t.type = qt;
        own(t, std::move(bytes));
      }
      continue;
    }
    tensors_.insert_or_assign(name, t);
  }
}

const TensorView* WeightSet::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorView& WeightSet::get(const std::string& name, std::vector<int64_t> shape) const {
  const TensorView* t = find(name);
  if (!t) throw FormatError(path_ + ": tensor '" + name + "' is missing");
  bool ok = t->shape.size() == shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] == t->shape[i];
  // 1-element tensors (layer scalars) may be stored as [1] or as a scalar.
  if (!ok && shape.size() == 1 && shape[0] == 1 && t->numel() == 1) ok = true;
  if (!ok) {
    auto fmt = [](const std::vector<int64_t>& s) {
      std::string o = "(";
      for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
      return o + ")";
    };
    throw FormatError(path_ + ": tensor '" + name + "' has shape " + fmt(t->shape) +
                      ", expected " + fmt(shape));
  }
  return *t;
}

size_t WeightSet::bytes() const {
  size_t n = 0;
  for (const auto& [k, t] : tensors_) n += t.nbytes;
  return n;
}

}  // namespace markbase
