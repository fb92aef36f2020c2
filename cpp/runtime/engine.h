// Engine: one loaded model ready to run: the file, its graph builder, a backend, a tokenizer
// (GGUF vocabularies) and the generation session. The Python Model wraps exactly this.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/gemma.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "runtime/tokenizer.h"

namespace markbase {

struct EngineOptions {
  std::string backend = "auto";
  int threads = 0;
  int max_context = 4096;
  std::string quant;           // "", "q8_0", "q4_0"
  std::string kv_cache = "f16";
  bool precise = false;
  bool llamacpp_exact = false;  // CPU only: compute as llama.cpp's CPU backend, bit for bit
  int prefill_chunk = 0;       // tokens per prefill step; 0: the backend's choice
};

class Engine {
 public:
  Engine(const std::string& path, const EngineOptions& opt);

  const ModelConfig& config() const { return model_->config(); }
  const GemmaModel& model() const { return *model_; }
  const ModelFile& file() const { return *file_; }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const std::string& backend_name() const { return backend_name_; }
  int max_context() const { return opt_.max_context; }

  // Logits of every position of ids, from an empty cache ([n, vocab]); the generation session
  // is not touched.
  std::vector<float> logits(const std::vector<int>& ids);

  // Generation: begin() prefills the prompt and samples the first token; next() feeds the last
  // sampled token and samples another. Both return the token id.
  int begin(const std::vector<int>& prompt, const SamplingParams& p);
  int next();
  int position() const { return session_->pos(); }
  int ops_per_token() const { return decode_ops_; }
  int waits_per_token() const { return backend_->waits_last_run(); }

 private:
  EngineOptions opt_;
  std::shared_ptr<ModelFile> file_;
  std::unique_ptr<GemmaModel> model_;
  std::unique_ptr<Backend> backend_;
  std::string backend_name_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<Sampler> sampler_;
  bool device_sampling_ = false;  // the backend draws tokens on the device (see step())
  int step(const std::vector<int>& tokens);
  std::vector<int> history_;
  int last_ = -1;
  int decode_ops_ = 0;
};

// The tokenizer data of a GGUF file's tokenizer.ggml.* keys; throws FormatError when absent.
VocabData vocab_from_gguf(const ModelFile& f);

}  // namespace markbase
