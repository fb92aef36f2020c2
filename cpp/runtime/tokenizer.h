// Tokenizer built from a GGUF vocabulary, giving exactly llama.cpp's token ids.
// Two kinds: SentencePiece-style with scores (tokenizer.ggml.model "llama", Gemma 3) and BPE with
// merges (tokenizer.ggml.model "gemma4", Gemma 4, llama.cpp's gemma4 pre-tokenizer).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace markbase {

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6
};

// Everything the tokenizer needs from the file, copied out of the GGUF metadata.
struct VocabData {
  std::string model;                 // tokenizer.ggml.model: "llama" or "gemma4"
  std::string pre;                   // tokenizer.ggml.pre (may be empty)
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens
  std::vector<float> scores;         // tokenizer.ggml.scores (may be empty for BPE)
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type (may be empty: all Normal)
  std::vector<std::string> merges;   // tokenizer.ggml.merges ("a b" per entry; BPE only)
  // -1 where the key is absent. As in llama.cpp, an absent bos/eos of a "llama" vocabulary means
  // 1/2, and an absent eot/eom is found by token text (<end_of_turn>, <|eom_id|>, ...).
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1, eot_id = -1, eom_id = -1;
  bool add_bos = true;               // tokenizer.ggml.add_bos_token (forced true for "gemma4")
  // tokenizer.ggml.add_space_prefix; where the key is absent llama.cpp uses true for "llama"
  // and false for "gemma4": the loader should fill it that way.
  bool add_space_prefix = false;
};

class Tokenizer {
 public:
  // Throws FormatError (cpp/formats/error.h) for an inconsistent or unsupported vocabulary.
  explicit Tokenizer(VocabData vocab);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Same ids as llama.cpp's llama_tokenize(text, add_special=add_bos, parse_special=special).
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool special) const;
  // Raw bytes of one token, as llama.cpp's llama_token_to_piece(id, lstrip=0, special): byte
  // tokens give their byte, '▁' becomes ' ', control and unknown tokens give their text, or
  // nothing with special = false (what llama.cpp's programs stream as generated text: decode's
  // clean-up of spaces before punctuation is not applied).
  std::string piece(int32_t id, bool special = true) const;
  // Concatenated bytes of the ids as llama.cpp's llama_detokenize(remove_special=false,
  // unparse_special=false): control tokens produce no text. May end in a partial UTF-8 sequence.
  std::string decode(const std::vector<int32_t>& ids) const;
  // End-of-generation tokens, as llama.cpp marks them (eos, eot, eom, and vocabulary tokens such as
  // <end_of_turn>, </s>, <|im_end|> ... that llama.cpp's vocab loader adds to its EOG set).
  bool is_eog(int32_t id) const;
  const std::vector<int32_t>& eog_ids() const;
  int32_t bos_id() const;
  bool add_bos() const;
  size_t size() const;
  TokenType type(int32_t id) const;
  const std::string& text(int32_t id) const;  // the vocabulary string as stored

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace markbase
