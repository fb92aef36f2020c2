#include "formats/json.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "formats/error.h"
#include "formats/mapped_file.h"

namespace markbase {
namespace {

constexpr int kMaxDepth = 64;

class JsonParser {
 public:
  JsonParser(std::string_view s, const std::string& what) : s_(s), what_(what) {}

  Value document() {
    Value v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    throw FormatError(what_ + ": invalid JSON: " + problem + " at byte " + std::to_string(pos_));
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' ||
                                s_[pos_] == '\r'))
      ++pos_;
  }
  char peek() {
    if (pos_ >= s_.size()) fail("unexpected end of input");
    return s_[pos_];
  }
  void expect_word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) fail("unexpected token");
    pos_ += w.size();
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than 64 levels");
    skip_ws();
    char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Value(string());
    if (c == 't') { expect_word("true"); return Value(true); }
    if (c == 'f') { expect_word("false"); return Value(false); }
    if (c == 'n') { expect_word("null"); return Value(); }
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    // Python's json module writes these for non-finite floats; accept them as it does.
    if (c == 'N') { expect_word("NaN"); return Value(std::nan("")); }
    if (c == 'I') { expect_word("Infinity"); return Value(HUGE_VAL); }
    fail(std::string("unexpected character '") + c + "'");
  }

  Value object(int depth) {
    ++pos_;  // '{'
    ValueObject obj;
    skip_ws();
    if (peek() == '}') { ++pos_; return Value(std::move(obj)); }
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a string key");
      std::string key = string();
      skip_ws();
      if (peek() != ':') fail("expected ':'");
      ++pos_;
      Value v = value(depth + 1);
      obj.insert_or_assign(std::move(key), std::move(v));
      skip_ws();
      char c = peek();
      ++pos_;
      if (c == '}') break;
      if (c != ',') fail("expected ',' or '}'");
    }
    return Value(std::move(obj));
  }

  Value array(int depth) {
    ++pos_;  // '['
    ValueArray arr;
    skip_ws();
    if (peek() == ']') { ++pos_; return Value(std::move(arr)); }
    for (;;) {
      arr.push_back(value(depth + 1));
      skip_ws();
      char c = peek();
      ++pos_;
      if (c == ']') break;
      if (c != ',') fail("expected ',' or ']'");
    }
    return Value(std::move(arr));
  }

  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    uint32_t cp = 0;
    for (int i = 0; i < 4; ++i) {
      char h = s_[pos_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') cp |= h - '0';
      else if (h >= 'a' && h <= 'f') cp |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') cp |= h - 'A' + 10;
      else fail("bad hex digit in \\u escape");
    }
    return cp;
  }

  std::string string() {
    ++pos_;  // '"'
    std::string out;
    for (;;) {
      char c = peek();
      ++pos_;
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') { out += c; continue; }
      char e = peek();
      ++pos_;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(pos_, 2) == "\\u") {
            size_t save = pos_;
            pos_ += 2;
            uint32_t lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else pos_ = save;
          }
          put_utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  Value number() {
    size_t start = pos_;
    bool is_float = false;
    if (s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == 'I') { expect_word("Infinity"); return Value(-HUGE_VAL); }
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c >= '0' && c <= '9') { ++pos_; continue; }
      if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') { is_float = true; ++pos_; continue; }
      break;
    }
    std::string tok(s_.substr(start, pos_ - start));
    if (tok == "-" || tok.empty()) fail("bad number");
    char* end = nullptr;
    errno = 0;
    if (!is_float) {
      if (tok[0] == '-') {
        long long x = std::strtoll(tok.c_str(), &end, 10);
        if (errno == 0 && end == tok.c_str() + tok.size()) return Value(static_cast<int64_t>(x));
      } else {
        unsigned long long x = std::strtoull(tok.c_str(), &end, 10);
        if (errno == 0 && end == tok.c_str() + tok.size()) {
          if (x <= static_cast<unsigned long long>(INT64_MAX)) return Value(static_cast<int64_t>(x));
          return Value(static_cast<uint64_t>(x));
        }
      }
      errno = 0;
    }
    double d = std::strtod(tok.c_str(), &end);
    if (end != tok.c_str() + tok.size()) fail("bad number '" + tok + "'");
    return Value(d);
  }

  std::string_view s_;
  const std::string& what_;
  size_t pos_ = 0;
};

}  // namespace

Value parse_json(std::string_view text, const std::string& what) {
  return JsonParser(text, what).document();
}

Value read_json_file(const std::string& path) {
  MappedFile f(path);
  return parse_json(std::string_view(reinterpret_cast<const char*>(f.data()), f.size()), path);
}

}  // namespace markbase
