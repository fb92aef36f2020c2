#include "runtime/engine.h"

#include <cstdlib>
#include <stdexcept>

#include "formats/error.h"

namespace markbase {

VocabData vocab_from_gguf(const ModelFile& f) {
  VocabData v;
  auto str = [&](const char* key) -> std::string {
    const Value* x = f.find(key);
    return x && x->is_string() ? x->as_string() : std::string();
  };
  auto id = [&](const char* key) -> int32_t {
    const Value* x = f.find(key);
    if (!x) return -1;
    try { return static_cast<int32_t>(x->as_int()); } catch (const std::exception&) {
      throw FormatError(f.path() + ": " + key + " is not an integer");
    }
  };
  const Value* toks = f.find("tokenizer.ggml.tokens");
  if (!toks || !toks->is_array())
    throw FormatError(f.path() + ": no tokenizer vocabulary (tokenizer.ggml.tokens)");
  v.model = str("tokenizer.ggml.model");
  v.pre = str("tokenizer.ggml.pre");
  try {
    for (const Value& t : toks->as_array()) v.tokens.push_back(t.as_string());
    if (const Value* s = f.find("tokenizer.ggml.scores"))
      for (const Value& x : s->as_array()) v.scores.push_back(static_cast<float>(x.as_double()));
    if (const Value* s = f.find("tokenizer.ggml.token_type"))
      for (const Value& x : s->as_array()) v.token_types.push_back(static_cast<int32_t>(x.as_int()));
    if (const Value* s = f.find("tokenizer.ggml.merges"))
      for (const Value& x : s->as_array()) v.merges.push_back(x.as_string());
  } catch (const std::invalid_argument& e) {
    throw FormatError(f.path() + ": malformed tokenizer arrays: " + e.what());
  }
  v.bos_id = id("tokenizer.ggml.bos_token_id");
  v.eos_id = id("tokenizer.ggml.eos_token_id");
  v.unk_id = id("tokenizer.ggml.unknown_token_id");
  v.pad_id = id("tokenizer.ggml.padding_token_id");
  v.eot_id = id("tokenizer.ggml.eot_token_id");
  v.eom_id = id("tokenizer.ggml.eom_token_id");
  if (const Value* b = f.find("tokenizer.ggml.add_bos_token")) v.add_bos = b->as_bool();
  // llama.cpp's default: SentencePiece-style vocabularies add a space prefix unless told not to.
  v.add_space_prefix = v.model == "llama";
  if (const Value* b = f.find("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = b->as_bool();
  return v;
}

Engine::Engine(const std::string& path, const EngineOptions& opt) : opt_(opt) {
  if (opt.max_context < 1) throw std::invalid_argument("max_context must be >= 1");
  if (opt.prefill_chunk < 0) throw std::invalid_argument("prefill_chunk must be >= 1 (or 0: the backend's choice)");
  if (opt.threads < 0) throw std::invalid_argument("threads must be >= 0");
  if (opt.kv_cache != "f16" && opt.kv_cache != "f32")
    throw std::invalid_argument("kv_cache must be 'f16' or 'f32', not '" + opt.kv_cache + "'");
  BackendOptions bo;
  bo.threads = opt.threads;
  bo.kv_f16 = opt.kv_cache == "f16";
  bo.precise = opt.precise;
  bo.llamacpp_exact = opt.llamacpp_exact;
  if (opt.llamacpp_exact && opt.precise) throw std::invalid_argument("match_llamacpp and precise exclude each other");
  if (opt.llamacpp_exact && !bo.kv_f16) throw std::invalid_argument("match_llamacpp needs kv_cache='f16' (llama.cpp's default)");
  backend_ = create_backend(opt.backend, bo);  // fails fast on an unavailable backend
  backend_name_ = backend_->name();
  if (opt.llamacpp_exact && backend_name_ != "cpu")
    throw std::invalid_argument("match_llamacpp is an option of the CPU backend, not of '" + backend_name_ + "'");
  if (opt_.prefill_chunk == 0) opt_.prefill_chunk = backend_->preferred_prefill_chunk();
  // MARKBASE_HOST_SAMPLING=1 samples on the host even where the backend could on the device.
  const char* hs = std::getenv("MARKBASE_HOST_SAMPLING");
  device_sampling_ = backend_->samples_on_device() && !(hs && *hs && std::string(hs) != "0");
  file_ = ModelFile::open(path);
  model_ = std::make_unique<GemmaModel>(file_, opt.quant);
  if (file_->is_gguf()) tokenizer_ = std::make_unique<Tokenizer>(vocab_from_gguf(*file_));
  session_ = std::make_unique<Session>(*model_, *backend_, opt_.max_context, opt_.prefill_chunk);
}

std::vector<float> Engine::logits(const std::vector<int>& ids) {
  if (ids.empty()) throw std::invalid_argument("logits: need at least one token");
  if (static_cast<int64_t>(ids.size()) > opt_.max_context)
    throw std::length_error("logits: " + std::to_string(ids.size()) +
                            " tokens exceed the context of " + std::to_string(opt_.max_context) +
                            " tokens (max_context)");
  Session s(*model_, *backend_, static_cast<int>(ids.size()), opt_.prefill_chunk);
  std::vector<float> out(ids.size() * static_cast<size_t>(config().vocab_size));
  s.forward(ids, out.data());
  return out;
}

int Engine::begin(const std::vector<int>& prompt, const SamplingParams& p) {
  if (prompt.empty()) throw std::invalid_argument("the prompt is empty");
  if (static_cast<int64_t>(prompt.size()) > opt_.max_context)
    throw std::length_error("the prompt has " + std::to_string(prompt.size()) +
                            " tokens, longer than the context of " +
                            std::to_string(opt_.max_context) + " tokens (max_context)");
  sampler_ = std::make_unique<Sampler>(p);
  session_->reset();
  history_ = prompt;
  last_ = step(prompt);
  history_.push_back(last_);
  return last_;
}

// Runs tokens and draws the next one: on the device when the backend can (only the id comes
// back), else from the last logits on the host.
int Engine::step(const std::vector<int>& tokens) {
  if (device_sampling_) return session_->forward_sample(tokens, sampler_->device_params(history_));
  std::vector<float> l = session_->forward(tokens);
  return sampler_->sample(l.data(), config().vocab_size, history_);
}

int Engine::next() {
  if (!sampler_) throw std::logic_error("next() before begin()");
  if (session_->pos() >= opt_.max_context)
    throw std::length_error("the context of " + std::to_string(opt_.max_context) + " tokens is full");
  last_ = step({last_});
  decode_ops_ = session_->ops_per_step();
  history_.push_back(last_);
  return last_;
}

}  // namespace markbase
