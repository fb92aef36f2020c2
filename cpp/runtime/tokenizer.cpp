// Tokenizer that reproduces llama.cpp's (0.3.36, src/llama-vocab.cpp) token ids for two vocabulary
// kinds:
//   "llama"  SentencePiece-style: the text is split into UTF-8 characters, then the adjacent pair
//            whose concatenation is the highest-scoring vocabulary token is merged, repeatedly;
//            what is left over and is not a token becomes <0xXX> byte tokens. Spaces are written
//            as U+2581 before merging; a space is prepended when add_space_prefix is set.
//   "gemma4" BPE with merge ranks over raw UTF-8 (no GPT-2 byte mapping): spaces become U+2581,
//            the text is cut into runs of '\n' and runs of everything else, and each run is merged
//            pair by pair in merge-rank order; leftovers become <0xXX> byte tokens.
// Before either, the text is partitioned around special tokens as llama.cpp does: user-defined
// tokens always match in raw text, control and unknown tokens only when special=true; tokens are
// tried longest text first, each splitting every raw fragment at its leftmost occurrences.
// Written from a reading of llama.cpp's algorithms; the code is our own.
#include "tokenizer.h"

#include <algorithm>
#include <cstring>
#include <queue>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "../formats/error.h"

namespace markbase {

namespace {

// ------------------------------------------------------------------------------------------------
// Token attributes: llama.cpp's llama_token_attr bits. A token's attributes start from its
// TokenType and may gain bits (control, unused) from the loader's text-based rules below.
// ------------------------------------------------------------------------------------------------
enum Attr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
};

uint32_t attr_from_type(int32_t type) {
  switch (static_cast<TokenType>(type)) {
    case TokenType::Unknown: return kAttrUnknown;
    case TokenType::Unused: return kAttrUnused;
    case TokenType::Normal: return kAttrNormal;
    case TokenType::Control: return kAttrControl;
    case TokenType::UserDefined: return kAttrUserDefined;
    case TokenType::Byte: return kAttrByte;
    case TokenType::Undefined: return kAttrUndefined;
  }
  return kAttrUndefined;
}

const char kSpaceMark[] = "\xe2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's space

std::string escape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  for (char c : text) {
    if (c == ' ') out += kSpaceMark;
    else out += c;
  }
  return out;
}

void unescape_spaces(std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 3, kSpaceMark) == 0) {
      out += ' ';
      i += 3;
    } else {
      out += s[i++];
    }
  }
  s.swap(out);
}

// Length of a UTF-8 sequence from its first byte, as llama.cpp counts it (by the high nibble; a
// stray continuation byte counts as 1).
inline size_t utf8_len(unsigned char c) {
  static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lookup[c >> 4];
}

// Decode one code point the way llama.cpp's unicode_cpt_from_utf8 does (checks continuation
// bytes only; accepts overlong forms and surrogates). Returns false for an invalid sequence.
bool decode_cpt(std::string_view s, size_t& off, uint32_t& cpt) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[off + i]); };
  const auto cont = [&](size_t i) { return off + i < s.size() && (b(i) & 0xc0) == 0x80; };
  const unsigned char c = b(0);
  if (!(c & 0x80)) { cpt = c; off += 1; return true; }
  if (!(c & 0x40)) return false;
  if (!(c & 0x20)) {
    if (!cont(1)) return false;
    cpt = ((c & 0x1fu) << 6) | (b(1) & 0x3fu);
    off += 2;
    return true;
  }
  if (!(c & 0x10)) {
    if (!cont(1) || !cont(2)) return false;
    cpt = ((c & 0x0fu) << 12) | ((b(1) & 0x3fu) << 6) | (b(2) & 0x3fu);
    off += 3;
    return true;
  }
  if (!(c & 0x08)) {
    if (!cont(1) || !cont(2) || !cont(3)) return false;
    cpt = ((c & 0x07u) << 18) | ((b(1) & 0x3fu) << 12) | ((b(2) & 0x3fu) << 6) | (b(3) & 0x3fu);
    off += 4;
    return true;
  }
  return false;
}

void append_utf8(std::string& out, uint32_t cpt) {
  if (cpt <= 0x7f) {
    out += static_cast<char>(cpt);
  } else if (cpt <= 0x7ff) {
    out += static_cast<char>(0xc0 | (cpt >> 6));
    out += static_cast<char>(0x80 | (cpt & 0x3f));
  } else if (cpt <= 0xffff) {
    out += static_cast<char>(0xe0 | (cpt >> 12));
    out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cpt & 0x3f));
  } else if (cpt <= 0x10ffff) {
    out += static_cast<char>(0xf0 | (cpt >> 18));
    out += static_cast<char>(0x80 | ((cpt >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cpt & 0x3f));
  } else {
    throw std::invalid_argument("[tokenizer] text contains an invalid UTF-8 sequence (code point "
                                "above U+10FFFF)");
  }
}

// llama.cpp's BPE pre-tokenizer passes the text through code points: invalid sequences become
// U+FFFD (one per bad byte) and every code point is re-encoded canonically.
std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t off = 0;
  while (off < s.size()) {
    uint32_t cpt = 0;
    if (decode_cpt(s, off, cpt)) {
      append_utf8(out, cpt);
    } else {
      off += 1;
      out += "\xef\xbf\xbd";
    }
  }
  return out;
}

inline bool is_c_space(char c) {  // isspace() in the C locale
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// 64-bit hash of a byte string (8-byte words, multiply-xorshift mixing, murmur3 finalizer).
inline uint64_t hash_bytes(std::string_view s, uint64_t seed = 0x9e3779b97f4a7c15ull) {
  const auto mix = [](uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
  };
  uint64_t h = seed ^ (s.size() * 0x87c37b91114253d5ull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ mix(w)) * 0x4cf5ad432745937full;
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  return mix(h ^ w ^ (static_cast<uint64_t>(s.size() - i) << 59));
}

// Open-addressing hash index from keys to int32 values. Keys are not stored: the caller's
// `equal(value)` says whether a slot's value belongs to the key being looked up.
class FlatIndex {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, Slot{0, -1});
    mask_ = cap - 1;
  }
  // Inserts unless `equal` matches an existing value; returns that value, or -1 if inserted.
  template <class Equal>
  int32_t insert(uint64_t hash, int32_t value, Equal equal) {
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.value < 0) {
        slot = Slot{hash, value};
        return -1;
      }
      if (slot.hash == hash && equal(slot.value)) return slot.value;
    }
  }
  template <class Equal>
  int32_t find(uint64_t hash, Equal equal) const {
    if (slots_.empty()) return -1;
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.value < 0) return -1;
      if (slot.hash == hash && equal(slot.value)) return slot.value;
    }
  }

 private:
  struct Slot {
    uint64_t hash;
    int32_t value;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// A piece of the input: raw text (offset/length into the caller's text) or one special token.
struct Fragment {
  int32_t token;  // -1 for raw text
  size_t offset, length;
};

// A symbol of the merge loops: a slice of the text being merged, in a doubly linked list.
struct Symbol {
  int prev, next;
  size_t start, n;  // n == 0 once merged into its left neighbour
};

// One symbol per UTF-8 character (a truncated last character is one symbol), linked in order:
// where both merge loops start.
std::vector<Symbol> utf8_symbols(std::string_view text) {
  std::vector<Symbol> sym;
  sym.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(utf8_len(static_cast<unsigned char>(text[off])), text.size() - off);
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + len == text.size() ? -1 : idx + 1, off, len});
    off += len;
  }
  return sym;
}

}  // namespace

// -------------------------------------------------------------------------------------------------
// Tokenizer state, built once.
// -------------------------------------------------------------------------------------------------
struct Tokenizer::Impl {
  enum class Kind { Spm, Gemma4 };
  Kind kind = Kind::Spm;

  std::vector<std::string> texts;
  std::vector<float> scores;
  std::vector<TokenType> types;
  std::vector<uint32_t> attrs;
  FlatIndex token_index;  // text -> id
  std::vector<std::string> merges;                                    // "left right"
  std::vector<std::pair<std::string_view, std::string_view>> merge_parts;  // views into merges
  FlatIndex merge_index;  // (left, right) -> rank (the first of a repeated pair)
  int32_t byte_tokens[256];  // id of <0xXX> (or of the raw byte's text, SPM), -1 if none

  int32_t bos = -1, eos = -1, eot = -1, eom = -1;
  bool add_bos = true;
  bool add_space_prefix = false;
  bool clean_spaces = false;  // llama.cpp's detokenizer space clean-up (BPE vocabularies)

  std::vector<int32_t> special_sorted;  // control/user-defined/unknown ids, longest text first
  // Trie over the special tokens' texts, to find which ones occur in a text at all.
  std::unordered_map<uint64_t, int32_t> trie_edges;  // (node << 8 | byte) -> child node
  std::vector<int32_t> trie_token;                   // node -> token id ending there, or -1
  std::vector<uint32_t> special_rank;                // token id -> position in special_sorted

  std::vector<std::string> pieces;  // token_to_piece(id, special=true)
  std::vector<int32_t> eog;         // sorted
  std::vector<uint8_t> is_eog;

  int32_t find(std::string_view text) const {
    return token_index.find(hash_bytes(text), [&](int32_t id) { return texts[id] == text; });
  }

  void load(VocabData& v);
  void apply_loader_rules();
  void build_special_index();
  std::string make_piece(int32_t id) const;

  void partition(std::string_view text, bool special, std::vector<Fragment>& frags) const;
  void encode_spm(std::string_view raw, std::vector<int32_t>& out) const;
  void encode_gemma4(std::string_view raw, std::vector<int32_t>& out) const;
  void bpe_word(std::string_view word, std::vector<int32_t>& out) const;
  void push_bytes(std::string_view bytes, std::vector<int32_t>& out, bool skip_missing) const;
};

// -------------------------------------------------------------------------------------------------
// Loading: validate, then apply llama.cpp's defaults and text-based rules.
// -------------------------------------------------------------------------------------------------
void Tokenizer::Impl::load(VocabData& v) {
  const std::string where = "[tokenizer] ";
  if (v.model == "llama") {
    kind = Kind::Spm;
  } else if (v.model == "gemma4") {
    kind = Kind::Gemma4;
  } else {
    throw FormatError(where + "unsupported tokenizer.ggml.model '" + v.model +
                      "' (supported: 'llama', 'gemma4')");
  }
  const size_t n = v.tokens.size();
  if (n == 0) throw FormatError(where + "tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) throw FormatError(where + "too many tokens");
  if (!v.scores.empty() && v.scores.size() != n) {
    throw FormatError(where + "tokenizer.ggml.scores has " + std::to_string(v.scores.size()) +
                      " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  }
  if (!v.token_types.empty() && v.token_types.size() != n) {
    throw FormatError(where + "tokenizer.ggml.token_type has " +
                      std::to_string(v.token_types.size()) +
                      " entries but tokenizer.ggml.tokens has " +
                      std::to_string(n));
  }

  texts = std::move(v.tokens);
  scores = v.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(v.scores);
  types.assign(n, TokenType::Normal);
  attrs.assign(n, kAttrNormal);
  for (size_t i = 0; i < n; ++i) {
    if (!v.token_types.empty()) {
      const int32_t t = v.token_types[i];
      if (t < 0 || t > static_cast<int32_t>(TokenType::Byte)) {
        throw FormatError(where + "token " + std::to_string(i) + " has unknown token type " +
                          std::to_string(t));
      }
      types[i] = static_cast<TokenType>(t);
      attrs[i] = attr_from_type(t);
    }
    if (texts[i].empty()) texts[i] = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp does
  }
  token_index.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = texts[i];
    const int32_t dup = token_index.insert(hash_bytes(t), static_cast<int32_t>(i),
                                           [&](int32_t id) { return texts[id] == t; });
    if (dup >= 0) {
      throw FormatError(where + "token text of id " + std::to_string(i) + " duplicates id " +
                        std::to_string(dup));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if ((attrs[i] & kAttrByte) && texts[i].size() < 4) {
      throw FormatError(where + "byte token " + std::to_string(i) + " has text '" + texts[i] +
                        "' (expected <0xXX>)");
    }
  }

  // Byte fallback tokens.
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
    int32_t id = find(std::string_view(buf, 6));
    if (id < 0 && kind == Kind::Spm) {
      const char raw = static_cast<char>(b);
      id = find(std::string_view(&raw, 1));
    }
    byte_tokens[b] = id;
  }

  // Merges ("left right", split at the first space after the first character; llama.cpp keeps
  // the first rank of a repeated pair).
  if (kind == Kind::Gemma4) {
    merges = std::move(v.merges);
    merge_parts.reserve(merges.size());
    merge_index.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const std::string_view m = merges[i];
      const size_t pos = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
      if (pos == std::string_view::npos) merge_parts.emplace_back();
      else merge_parts.emplace_back(m.substr(0, pos), m.substr(pos + 1));
      const auto& key = merge_parts.back();
      merge_index.insert(hash_bytes(key.second, hash_bytes(key.first)), static_cast<int32_t>(i),
                         [&](int32_t r) { return merge_parts[r] == key; });
    }
  }

  // Special ids: llama.cpp's defaults for a key that is absent (-1 here), then range checks.
  auto check_id = [&](int32_t id, const char* key) {
    if (id < -1 || id >= static_cast<int32_t>(n)) {
      throw FormatError(where + key + " = " + std::to_string(id) + " is outside the vocabulary (" +
                        std::to_string(n) + " tokens)");
    }
    return id;
  };
  bos = check_id(v.bos_id, "tokenizer.ggml.bos_token_id");
  eos = check_id(v.eos_id, "tokenizer.ggml.eos_token_id");
  check_id(v.unk_id, "tokenizer.ggml.unknown_token_id");
  check_id(v.pad_id, "tokenizer.ggml.padding_token_id");
  eot = check_id(v.eot_id, "tokenizer.ggml.eot_token_id");
  eom = check_id(v.eom_id, "tokenizer.ggml.eom_token_id");
  if (kind == Kind::Spm) {
    if (bos < 0 && n > 1) bos = 1;
    if (eos < 0 && n > 2) eos = 2;
  }

  add_space_prefix = v.add_space_prefix;
  add_bos = v.add_bos;
  if (kind == Kind::Gemma4) {
    add_bos = true;  // llama.cpp forces add_bos_token for gemma4
    clean_spaces = true;
  }
  if (add_bos && bos < 0) {
    throw FormatError(where + "the vocabulary asks for a BOS token (add_bos_token) but has no "
                      "tokenizer.ggml.bos_token_id");
  }
}

// llama.cpp's loader marks tokens by their text: end-of-turn / fill-in-the-middle tokens become
// control tokens, "unused" control tokens become unused, and a fixed list of texts (plus eos,
// eot, eom) form the end-of-generation set.
void Tokenizer::Impl::apply_loader_rules() {
  using List = std::initializer_list<std::string_view>;
  const auto in = [](std::string_view s, List list) {
    return std::find(list.begin(), list.end(), s) != list.end();
  };
  // Every text the rules look for starts with one of these bytes and is short.
  const auto maybe_named = [](std::string_view s) {
    if (s.size() < 3 || s.size() > 32) return false;
    const char c = s[0];
    return c == '<' || c == '[' || c == '_' || c == '\xe2';
  };
  const auto make_control = [&](int32_t id) { attrs[id] |= kAttrControl; };
  const std::string_view eos_deepseek =
      "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>";

  // Tokens of each kind, found by text. Where a vocabulary holds several candidates of one kind,
  // llama.cpp keeps the first one its hash map (token_to_id) yields; ours is built the same way.
  enum Named { kEot, kEom, kFimPre, kFimSuf, kFimMid, kFimPad, kFimRep, kFimSep, kKinds };
  const List kind_texts[kKinds] = {
      {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
       "<EOT>", "_<EOT>", "[EOT]", eos_deepseek, "<end_of_utterance>"},
      {"<|eom_id|>"},
      {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
       "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>", "\xe2\x96\x81<PRE>",
       "<|code_prefix|>", "<|prefix|>"},
      {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
       "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>", "<SUF>", "\xe2\x96\x81<SUF>",
       "<|code_suffix|>", "<|suffix|>"},
      {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
       "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>", "\xe2\x96\x81<MID>",
       "<|code_middle|>", "<|middle|>"},
      {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"},
      {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"},
      {"<|file_sep|>"},
  };
  std::vector<int32_t> candidates[kKinds];
  for (size_t id = 0; id < texts.size(); ++id) {
    const std::string_view s = texts[id];
    if (!maybe_named(s)) continue;
    for (int k = 0; k < kKinds; ++k) {
      if (in(s, kind_texts[k])) candidates[k].push_back(static_cast<int32_t>(id));
    }
  }
  int32_t found[kKinds] = {eot, eom, -1, -1, -1, -1, -1, -1};
  for (int k = 0; k < kKinds; ++k) {
    if (found[k] >= 0 || candidates[k].empty()) continue;  // eot/eom given by the metadata
    found[k] = candidates[k][0];
    if (candidates[k].size() > 1) {
      // llama.cpp's token_to_id: an unordered_map filled in id order. Built only in this rare case.
      std::unordered_map<std::string_view, int32_t> token_to_id;
      for (size_t i = 0; i < texts.size(); ++i) token_to_id[texts[i]] = static_cast<int32_t>(i);
      for (const auto& t : token_to_id) {
        const auto& c = candidates[k];
        if (std::find(c.begin(), c.end(), t.second) != c.end()) {
          found[k] = t.second;
          break;
        }
      }
    }
    make_control(found[k]);
  }
  eot = found[kEot];
  eom = found[kEom];
  const int32_t fim_pad = found[kFimPad], fim_rep = found[kFimRep], fim_sep = found[kFimSep];
  for (size_t id = 0; id < texts.size(); ++id) {
    if ((attrs[id] & kAttrControl) && texts[id].find("unused") != std::string::npos) {
      attrs[id] |= kAttrUnused;
    }
  }

  std::set<int32_t> eog_set;
  for (int32_t id : {fim_pad, fim_rep, fim_sep}) {
    if (id >= 0) eog_set.insert(id);
  }
  for (size_t i = 0; i < texts.size(); ++i) {
    const int32_t id = static_cast<int32_t>(i);
    if (maybe_named(texts[i]) &&
        in(texts[i], {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
                      "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
                      "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
                      "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                      eos_deepseek, "[e~["})) {
      eog_set.insert(id);
      make_control(id);
    }
  }
  // gpt-oss: these are always rendered.
  for (size_t i = 0; i < texts.size(); ++i) {
    if (maybe_named(texts[i]) &&
        in(texts[i], {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})) {
      attrs[i] = kAttrUserDefined;
    }
  }
  for (int32_t id : {eos, eot, eom}) {
    if (id >= 0) eog_set.insert(id);
  }
  // o200k_harmony / solar-open: "<|end|>" is not end-of-generation there.
  {
    bool has_return = false, has_call = false, has_flush = false, has_end = false;
    int32_t end_id = -1;
    for (int32_t id : eog_set) {
      const std::string& s = texts[id];
      if (s == "<|return|>") has_return = true;
      else if (s == "<|call|>" || s == "<|calls|>") has_call = true;
      else if (s == "<|flush|>") has_flush = true;
      else if (s == "<|end|>") { has_end = true; end_id = id; }
    }
    if ((has_return && has_call && has_end) || (has_call && has_flush && has_end)) {
      eog_set.erase(end_id);
      attrs[end_id] = kAttrUserDefined;
    }
  }
  // gemma4 / plamo: "</s>" is an ordinary token there.
  {
    bool has_marker = false;
    int32_t s_id = -1;
    for (int32_t id : eog_set) {
      const std::string& s = texts[id];
      if (s == "<|tool_response>" || s == "<|plamo:eos|>") has_marker = true;
      else if (s == "</s>") s_id = id;
    }
    if (has_marker && s_id >= 0) {
      eog_set.erase(s_id);
      attrs[s_id] = kAttrNormal;
    }
  }
  eog.assign(eog_set.begin(), eog_set.end());
  is_eog.assign(texts.size(), 0);
  for (int32_t id : eog) is_eog[id] = 1;
}

void Tokenizer::Impl::build_special_index() {
  for (int32_t id = 0; id < static_cast<int32_t>(texts.size()); ++id) {
    if (attrs[id] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) special_sorted.push_back(id);
  }
  // Same call as llama.cpp (std::sort is not stable: equal lengths keep the library's order).
  std::sort(special_sorted.begin(), special_sorted.end(),
            [&](int32_t a, int32_t b) { return texts[a].size() > texts[b].size(); });
  special_rank.assign(texts.size(), UINT32_MAX);
  trie_token.assign(1, -1);
  for (size_t r = 0; r < special_sorted.size(); ++r) {
    const int32_t id = special_sorted[r];
    special_rank[id] = static_cast<uint32_t>(r);
    int32_t node = 0;
    for (unsigned char c : texts[id]) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | c;
      auto it = trie_edges.find(key);
      if (it == trie_edges.end()) {
        const int32_t child = static_cast<int32_t>(trie_token.size());
        trie_token.push_back(-1);
        it = trie_edges.emplace(key, child).first;
      }
      node = it->second;
    }
    trie_token[node] = id;
  }
}

// llama.cpp's token_to_piece(id, lstrip=0, special=true).
std::string Tokenizer::Impl::make_piece(int32_t id) const {
  const uint32_t a = attrs[id];
  const std::string& text = texts[id];
  if (a & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return text;
  if (a & kAttrNormal) {
    std::string s = text;
    unescape_spaces(s);  // both kinds store spaces as U+2581
    return s;
  }
  if (a & kAttrByte) {
    // strtol(text.substr(3, 2), 16)
    unsigned value = 0;
    for (size_t i = 3; i < 5 && i < text.size(); ++i) {
      const char c = text[i];
      int d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else break;
      value = value * 16 + static_cast<unsigned>(d);
    }
    return std::string(1, static_cast<char>(value));
  }
  return std::string();  // undefined / unused: no text
}

// -------------------------------------------------------------------------------------------------
// Special-token partition (llama.cpp's tokenizer_st_partition).
// -------------------------------------------------------------------------------------------------
void Tokenizer::Impl::partition(std::string_view text, bool special,
                                std::vector<Fragment>& frags) const {
  frags.clear();
  if (text.empty()) return;
  frags.push_back({-1, 0, text.size()});

  // Which special tokens occur anywhere in the text? Only those can split a fragment, since every
  // raw fragment is a substring of the text.
  std::vector<uint32_t> present;
  std::vector<uint8_t> seen(special_sorted.size(), 0);
  for (size_t i = 0; i < text.size(); ++i) {
    int32_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[j]);
      auto it = trie_edges.find(key);
      if (it == trie_edges.end()) break;
      node = it->second;
      const int32_t id = trie_token[node];
      if (id >= 0 && !seen[special_rank[id]] &&
          (special || !(attrs[id] & (kAttrControl | kAttrUnknown)))) {
        seen[special_rank[id]] = 1;
        present.push_back(special_rank[id]);
      }
    }
  }
  if (present.empty()) return;
  std::sort(present.begin(), present.end());

  std::vector<Fragment> next;
  for (uint32_t rank : present) {
    const int32_t id = special_sorted[rank];
    const std::string_view tok = texts[id];
    bool changed = false;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t start = f.offset;
      const size_t end = f.offset + f.length;
      const std::string_view window = text.substr(0, end);
      while (start < end) {
        const size_t match = window.find(tok, start);
        if (match == std::string_view::npos) break;
        if (match > start) next.push_back({-1, start, match - start});
        next.push_back({id, 0, 0});
        start = match + tok.size();
        changed = true;
      }
      if (start < end) next.push_back({-1, start, end - start});
    }
    if (changed) frags.swap(next);
  }
}

void Tokenizer::Impl::push_bytes(std::string_view bytes, std::vector<int32_t>& out,
                                 bool skip_missing) const {
  for (char c : bytes) {
    const int32_t id = byte_tokens[static_cast<unsigned char>(c)];
    if (id >= 0) {
      out.push_back(id);
    } else if (!skip_missing) {
      static const char* hex = "0123456789ABCDEF";
      const unsigned char b = static_cast<unsigned char>(c);
      throw FormatError(std::string("[tokenizer] the vocabulary has no byte token <0x") +
                        hex[b >> 4] + hex[b & 15] + "> needed to encode this text");
    }
  }
}

// -------------------------------------------------------------------------------------------------
// SentencePiece-style merging by score (llama.cpp's llm_tokenizer_spm_session).
// -------------------------------------------------------------------------------------------------
void Tokenizer::Impl::encode_spm(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<Symbol> sym = utf8_symbols(text);

  struct Bigram {
    int left, right;
    float score;
    size_t size;
  };
  // Highest score first; equal scores: leftmost first.
  const auto cmp = [](const Bigram& l, const Bigram& r) {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(cmp)> queue(cmp);
  const auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t size = sym[left].n + sym[right].n;
    const int32_t id = find(text.substr(sym[left].start, size));
    if (id < 0) return;
    queue.push({left, right, scores[id], size});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[i].next) {
    const std::string_view piece = text.substr(sym[i].start, sym[i].n);
    const int32_t id = find(piece);
    if (id >= 0) out.push_back(id);
    else push_bytes(piece, out, /*skip_missing=*/false);
  }
}

// -------------------------------------------------------------------------------------------------
// Gemma 4 BPE (llama.cpp's llm_tokenizer_bpe_session with the gemma4 pre-tokenizer).
// -------------------------------------------------------------------------------------------------
void Tokenizer::Impl::encode_gemma4(std::string_view text, std::vector<int32_t>& out) const {
  // The pre-tokenizer regex "[^\n]+|[\n]+" cuts the text into runs of '\n' and of other
  // characters. Code points are re-encoded on the way (invalid bytes become U+FFFD).
  const std::string clean = sanitize_utf8(text);
  size_t i = 0;
  while (i < clean.size()) {
    const bool nl = clean[i] == '\n';
    size_t j = i;
    while (j < clean.size() && (clean[j] == '\n') == nl) ++j;
    bpe_word(std::string_view(clean).substr(i, j - i), out);
    i = j;
  }
}

void Tokenizer::Impl::bpe_word(std::string_view word, std::vector<int32_t>& out) const {
  // A whole run of newlines that is a token stays one token.
  std::vector<Symbol> sym = word.find_first_not_of('\n') == std::string_view::npos && find(word) >= 0
                                ? std::vector<Symbol>{{-1, -1, 0, word.size()}}
                                : utf8_symbols(word);

  struct Bigram {
    int left, right;
    int32_t rank;
    size_t size;
  };
  // Lowest rank first; equal ranks: leftmost first.
  const auto cmp = [](const Bigram& l, const Bigram& r) {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(cmp)> queue(cmp);
  const auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const std::string_view a = word.substr(sym[left].start, sym[left].n);
    const std::string_view b = word.substr(sym[right].start, sym[right].n);
    const auto key = std::make_pair(a, b);
    const int32_t rank = merge_index.find(hash_bytes(b, hash_bytes(a)),
                                          [&](int32_t r) { return merge_parts[r] == key; });
    if (rank < 0) return;
    queue.push({left, right, rank, a.size() + b.size()});
  };
  for (int k = 1; k < static_cast<int>(sym.size()); ++k) try_add(k - 1, k);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    // Symbols are adjacent slices of the word, so the pair still spells the bigram's text
    // exactly when the lengths still add up.
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  for (const Symbol& s : sym) {
    if (s.n == 0) continue;
    const std::string_view piece = word.substr(s.start, s.n);
    const int32_t id = find(piece);
    if (id >= 0) out.push_back(id);
    else push_bytes(piece, out, /*skip_missing=*/true);
  }
}

// -------------------------------------------------------------------------------------------------
// Public interface
// -------------------------------------------------------------------------------------------------
Tokenizer::Tokenizer(VocabData vocab) : impl_(std::make_unique<Impl>()) {
  impl_->load(vocab);
  impl_->apply_loader_rules();
  impl_->build_special_index();
  impl_->pieces.resize(impl_->texts.size());
  for (size_t id = 0; id < impl_->texts.size(); ++id) {
    impl_->pieces[id] = impl_->make_piece(static_cast<int32_t>(id));
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  std::vector<Fragment> frags;
  m.partition(text, special, frags);

  if (add_bos && m.add_bos) out.push_back(m.bos);
  bool prev_special = true;  // SPM: a space is prepended to text that starts or follows a token
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    std::string piece;
    if (m.kind == Impl::Kind::Spm && m.add_space_prefix && prev_special) piece = " ";
    piece.append(text.substr(f.offset, f.length));
    piece = escape_spaces(piece);
    if (m.kind == Impl::Kind::Spm) m.encode_spm(piece, out);
    else m.encode_gemma4(piece, out);
    prev_special = false;
  }
  return out;
}

std::string Tokenizer::piece(int32_t id, bool special) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->pieces.size()) {
    throw std::out_of_range("[tokenizer] token id " + std::to_string(id) + " is outside the " +
                            "vocabulary (" + std::to_string(impl_->pieces.size()) + " tokens)");
  }
  if (!special && (impl_->attrs[id] & (kAttrUnknown | kAttrControl))) return {};
  return impl_->pieces[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& m = *impl_;
  std::string text;
  bool remove_space = m.add_space_prefix;  // the first piece loses one leading space
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= m.pieces.size()) {
      throw std::out_of_range("[tokenizer] token id " + std::to_string(id) + " is outside the " +
                              "vocabulary (" + std::to_string(m.pieces.size()) + " tokens)");
    }
    const bool first = remove_space;
    remove_space = false;
    if (m.attrs[id] & (kAttrUnknown | kAttrControl)) continue;
    const std::string& p = m.pieces[id];
    if (first && !p.empty() && p[0] == ' ') text.append(p, 1, std::string::npos);
    else text += p;
  }
  if (!m.clean_spaces || text.empty()) return text;

  // llama.cpp's clean-up passes for BPE vocabularies.
  std::string& t = text;
  // " ?", " !", " .", " ," lose the space.
  size_t total = 1;
  for (size_t i = 1; i < t.size(); ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
    t[total++] = x;
  }
  t.resize(total);
  // " ' " loses both spaces.
  total = t.empty() ? 0 : 1;
  const size_t total2 = t.size();
  for (size_t i = 1; i < total2; ++i) {
    const char x = t[i];
    if (x == '\'' && i + 1 < total2 && t[i - 1] == ' ' && t[i + 1] == ' ') {
      --total;
      t[++i] = '\0';
    }
    t[total++] = x;
  }
  t.resize(total);
  // " 's", " 'm", " 're", " 've" lose the space.
  total = t.empty() ? 0 : 1;
  const size_t total3 = t.size();
  for (size_t i = 1; i < total3; ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
      const char x1 = t[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < total3) {
        const char x2 = t[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    t[total++] = x;
  }
  t.resize(total);
  return text;
}

bool Tokenizer::is_eog(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->is_eog.size() && impl_->is_eog[id];
}

const std::vector<int32_t>& Tokenizer::eog_ids() const { return impl_->eog; }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
size_t Tokenizer::size() const { return impl_->texts.size(); }

TokenType Tokenizer::type(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->types.size()) {
    throw std::out_of_range("[tokenizer] token id " + std::to_string(id) +
                            " is outside the vocabulary");
  }
  return impl_->types[id];
}

const std::string& Tokenizer::text(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->texts.size()) {
    throw std::out_of_range("[tokenizer] token id " + std::to_string(id) +
                            " is outside the vocabulary");
  }
  return impl_->texts[id];
}

}  // namespace markbase
