// Dev driver: loads a vocabulary dump (dump_vocab.py) and serves requests on stdin (binary):
//   'T' u8 add_bos u8 special u32 len bytes  -> u32 n, n x i32 ids
//   'D' u32 n, n x i32                        -> u32 len, bytes   (decode)
//   'P' i32 id                                -> u32 len, bytes   (piece)
//   'E'                                       -> u32 n, n x i32   (eog ids)
//   'B' u32 len bytes u32 reps                -> f64 ms per encode (special=false)
// Errors: u32 0xFFFFFFFF, u32 len, message.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>

#include "../../cpp/formats/error.h"
#include "../../cpp/runtime/tokenizer.h"

using namespace markbase;

static std::string read_all(const char* path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

struct Reader {
  const std::string& b;
  size_t p = 0;
  template <class T> T get() { T v; std::memcpy(&v, b.data() + p, sizeof(T)); p += sizeof(T); return v; }
  std::string str() { uint32_t n = get<uint32_t>(); std::string s = b.substr(p, n); p += n; return s; }
};

static bool rd(void* dst, size_t n) { return fread(dst, 1, n, stdin) == n; }
static void wr(const void* src, size_t n) { fwrite(src, 1, n, stdout); }
static void wr_u32(uint32_t v) { wr(&v, 4); }
static void wr_str(const std::string& s) { wr_u32(uint32_t(s.size())); wr(s.data(), s.size()); }

int main(int argc, char** argv) {
  if (argc < 2) { fprintf(stderr, "usage: driver vocab.bin\n"); return 2; }
  std::string buf = read_all(argv[1]);
  if (buf.compare(0, 8, "MBVOCAB1") != 0) { fprintf(stderr, "bad dump\n"); return 2; }
  Reader r{buf, 8};
  VocabData v;
  v.model = r.str();
  v.pre = r.str();
  uint32_t n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) v.tokens.push_back(r.str());
  n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) v.scores.push_back(r.get<float>());
  n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) v.token_types.push_back(r.get<int32_t>());
  n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) v.merges.push_back(r.str());
  v.bos_id = r.get<int32_t>(); v.eos_id = r.get<int32_t>(); v.unk_id = r.get<int32_t>();
  v.pad_id = r.get<int32_t>(); v.eot_id = r.get<int32_t>(); v.eom_id = r.get<int32_t>();
  v.add_bos = r.get<uint8_t>(); v.add_space_prefix = r.get<uint8_t>();

  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Tokenizer> owned;
  try {
    owned = std::make_unique<Tokenizer>(std::move(v));
  } catch (const FormatError& e) {
    fprintf(stderr, "FormatError: %s\n", e.what());
    return 3;
  }
  Tokenizer& tok = *owned;
  auto t1 = std::chrono::steady_clock::now();
  fprintf(stderr, "driver: loaded %zu tokens in %.1f ms\n", tok.size(),
          std::chrono::duration<double, std::milli>(t1 - t0).count());

  char op;
  while (rd(&op, 1)) {
    try {
      if (op == 'T') {
        uint8_t ab, sp; uint32_t len;
        rd(&ab, 1); rd(&sp, 1); rd(&len, 4);
        std::string text(len, '\0'); rd(&text[0], len);
        auto ids = tok.encode(text, ab, sp);
        wr_u32(uint32_t(ids.size())); wr(ids.data(), ids.size() * 4);
      } else if (op == 'D') {
        uint32_t k; rd(&k, 4);
        std::vector<int32_t> ids(k); rd(ids.data(), k * 4);
        wr_str(tok.decode(ids));
      } else if (op == 'P') {
        int32_t id; rd(&id, 4);
        wr_str(tok.piece(id));
      } else if (op == 'E') {
        auto& e = tok.eog_ids();
        wr_u32(uint32_t(e.size())); wr(e.data(), e.size() * 4);
      } else if (op == 'B') {
        uint32_t len, reps; rd(&len, 4);
        std::string text(len, '\0'); rd(&text[0], len); rd(&reps, 4);
        auto a = std::chrono::steady_clock::now();
        size_t total = 0;
        for (uint32_t i = 0; i < reps; ++i) total += tok.encode(text, true, false).size();
        auto b = std::chrono::steady_clock::now();
        double ms = std::chrono::duration<double, std::milli>(b - a).count() / reps;
        wr(&ms, 8);
        (void)total;
      } else {
        fprintf(stderr, "bad op %d\n", op); return 2;
      }
    } catch (const std::exception& e) {
      wr_u32(0xFFFFFFFFu); wr_str(e.what());
    }
    fflush(stdout);
  }
  return 0;
}
