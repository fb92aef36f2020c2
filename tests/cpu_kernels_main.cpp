// A command-line driver for the CPU backend's kernels, without Python: the NEON paths are tested
// by cross-compiling this file with the backend for AArch64 and running it under qemu-user
// (tests/test_cpu_neon.py), where no AArch64 Python is at hand. Arrays travel as raw files.
//   cpu_kernels_main matmul TYPE ROWS COLS T PRECISE raw.bin x.bin out.bin
//       out[T, ROWS] = x[T, COLS] . W[ROWS, COLS]^T, W given as ROWS rows of TYPE blocks
//   cpu_kernels_main vec N s cap a.bin b.bin h.bin out.bin
//       a, b float32[N], h float16[N] -> out = [dot_f32(a, b), dot_f16(a, h),
//       a + s * h, a + s * b, gelu_tanh(a) * b, cap * tanh(a / cap)] (1 + 1 + 4N floats)
//   cpu_kernels_main engine MODEL PRECISE N_GEN ids.bin logits.bin gen.bin
//       the whole engine on the CPU backend (2 threads, f32 KV cache): logits of the int32 ids
//       (prefill in chunks of 16) and N_GEN greedy tokens after them (int32)
// Prints the SIMD path the dispatcher picked.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/thread_pool.h"
#include "formats/tensor.h"
#include "runtime/engine.h"

using namespace markbase;

namespace {

template <class T>
std::vector<T> read_file(const char* path, size_t n) {
  std::vector<T> v(n);
  FILE* f = std::fopen(path, "rb");
  if (!f || std::fread(v.data(), sizeof(T), n, f) != n) throw std::runtime_error(std::string("cannot read ") + path);
  std::fclose(f);
  return v;
}

template <class T>
void write_file(const char* path, const std::vector<T>& v) {
  FILE* f = std::fopen(path, "wb");
  if (!f || std::fwrite(v.data(), sizeof(T), v.size(), f) != v.size()) throw std::runtime_error(std::string("cannot write ") + path);
  std::fclose(f);
}

int matmul_cmd(char** argv) {
  TensorView w;
  w.type = type_from_name(argv[0]);
  const int rows = std::atoi(argv[1]), T = std::atoi(argv[3]);
  const int64_t cols = std::atoll(argv[2]);
  const bool precise = std::atoi(argv[4]) != 0;
  const std::vector<uint8_t> raw = read_file<uint8_t>(argv[5], rows * row_bytes(w.type, cols));
  const std::vector<float> x = read_file<float>(argv[6], static_cast<size_t>(T) * cols);
  w.shape = {rows, cols};
  w.data = raw.data();
  w.nbytes = raw.size();
  std::vector<float> out(static_cast<size_t>(T) * rows);
  ThreadPool pool(2);
  cpu::MatmulScratch scratch;
  cpu::matmul(pool, scratch, w, x.data(), static_cast<int>(cols), T, out.data(), rows, rows, precise);
  write_file(argv[7], out);
  return 0;
}

int vec_cmd(char** argv) {
  const int64_t n = std::atoll(argv[0]);
  const float s = std::strtof(argv[1], nullptr), cap = std::strtof(argv[2], nullptr);
  const std::vector<float> a = read_file<float>(argv[3], n), b = read_file<float>(argv[4], n);
  const std::vector<uint16_t> h = read_file<uint16_t>(argv[5], n);
  std::vector<float> out(2 + 4 * n);
  out[0] = cpu::dot_f32(a.data(), b.data(), n);
  out[1] = cpu::dot_f16(a.data(), h.data(), n);
  float* y = out.data() + 2;
  for (int k = 0; k < 2; ++k) std::copy(a.begin(), a.end(), y + k * n);
  cpu::axpy_f16(s, h.data(), y, n);
  cpu::axpy_f32(s, b.data(), y + n, n);
  cpu::gelu_mul(a.data(), b.data(), y + 2 * n, n);
  cpu::softcap(a.data(), y + 3 * n, n, cap);
  write_file(argv[6], out);
  return 0;
}

int engine_cmd(char** argv) {
  EngineOptions o;
  o.backend = "cpu";
  o.threads = 2;
  o.max_context = 512;
  o.kv_cache = "f32";
  o.precise = std::atoi(argv[1]) != 0;
  o.prefill_chunk = 16;
  Engine e(argv[0], o);
  const int n_gen = std::atoi(argv[2]);
  FILE* f = std::fopen(argv[3], "rb");
  if (!f) throw std::runtime_error(std::string("cannot read ") + argv[3]);
  std::vector<int32_t> ids;
  for (int32_t v; std::fread(&v, 4, 1, f) == 1;) ids.push_back(v);
  std::fclose(f);
  write_file(argv[4], e.logits(std::vector<int>(ids.begin(), ids.end())));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<int32_t> gen;
  for (int i = 0; i < n_gen; ++i) gen.push_back(i == 0 ? e.begin(std::vector<int>(ids.begin(), ids.end()), greedy) : e.next());
  write_file(argv[5], gen);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    int rc;
    if (cmd == "matmul" && argc == 10) rc = matmul_cmd(argv + 2);
    else if (cmd == "vec" && argc == 9) rc = vec_cmd(argv + 2);
    else if (cmd == "engine" && argc == 8) rc = engine_cmd(argv + 2);
    else {
      std::fprintf(stderr, "usage: see the comment at the top of tests/cpu_kernels_main.cpp\n");
      return 2;
    }
    std::printf("%s\n", cpu::simd_path());
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
