// markbase-bench: prefill and decode speed of a model, as API.md specifies.
//   markbase-bench --model PATH [--backend B] [--threads N] [--prompt-tokens N]
//                  [--gen-tokens N] [--repeats N] [--json] [--temperature T --top-k K --top-p P
//                  --min-p P --repeat-penalty R]
// The prompt is random token ids (seeded), so no tokenizer is involved. Decode is greedy unless a
// temperature is given; the draws are seeded, so runs repeat. Sampling is part of a token's time
// (on the GPU backends it runs on the device).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"

namespace {

struct Args {
  std::string model, backend = "auto";
  int threads = 0, prompt_tokens = 512, gen_tokens = 128, repeats = 3, prefill_chunk = 0;
  bool json = false, bandwidth = false;
  double device_gbs = 0.0;  // --read-bandwidth-gbs: a bandwidth measured elsewhere (a GPU's)
  markbase::SamplingParams sampling;  // parse(): greedy unless --temperature, seed 0
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "markbase-bench: %s\nusage: markbase-bench --model PATH [--backend auto|cpu|metal|cuda] "
               "[--threads N] [--prompt-tokens N] [--gen-tokens N] [--repeats N] [--prefill-chunk N] [--json] [--bandwidth | "
               "--read-bandwidth-gbs GBS] [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R]\n",
               why.c_str());
  std::exit(2);
}

int parse_int(const std::string& flag, const char* v, int lo) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (!*v || *end || x < lo || x > 10000000) usage("bad value for " + flag + ": " + v);
  return static_cast<int>(x);
}

double parse_real(const std::string& flag, const char* v) {
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (!*v || *end) usage("bad value for " + flag + ": " + v);
  return x;
}

Args parse(int argc, char** argv) {
  Args a;
  a.sampling.temperature = 0.0f;
  a.sampling.seed = 0;
  a.sampling.has_seed = true;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) usage("missing value for " + f);
      return argv[++i];
    };
    auto real = [&] { return static_cast<float>(parse_real(f, val())); };  // a sampling setting
    if (f == "--model") a.model = val();
    else if (f == "--backend") a.backend = val();
    else if (f == "--threads") a.threads = parse_int(f, val(), 0);
    else if (f == "--prompt-tokens") a.prompt_tokens = parse_int(f, val(), 1);
    else if (f == "--gen-tokens") a.gen_tokens = parse_int(f, val(), 1);
    else if (f == "--repeats") a.repeats = parse_int(f, val(), 1);
    else if (f == "--prefill-chunk") a.prefill_chunk = parse_int(f, val(), 1);
    else if (f == "--json") a.json = true;
    else if (f == "--bandwidth") a.bandwidth = true;
    else if (f == "--read-bandwidth-gbs") {
      const char* v = val();
      a.device_gbs = parse_real(f, v);
      if (!(a.device_gbs > 0.0 && a.device_gbs < 1e6)) usage("bad value for " + f + ": " + v);
    }
    else if (f == "--temperature") a.sampling.temperature = real();
    else if (f == "--top-k") a.sampling.top_k = parse_int(f, val(), 0);
    else if (f == "--top-p") a.sampling.top_p = real();
    else if (f == "--min-p") a.sampling.min_p = real();
    else if (f == "--repeat-penalty") a.sampling.repeat_penalty = real();
    else if (f == "-h" || f == "--help") usage("help");
    else usage("unknown argument " + f);
  }
  if (a.model.empty()) usage("--model is required");
  try {
    a.sampling.validate();
  } catch (const std::invalid_argument& e) {
    usage(e.what());
  }
  if (a.bandwidth && a.device_gbs > 0) usage("--bandwidth and --read-bandwidth-gbs exclude each other");
  if (a.backend != "auto" && a.backend != "cpu" && a.backend != "metal" && a.backend != "cuda")
    usage("--backend must be auto, cpu, metal or cuda");
  return a;
}

// Read bandwidth of this machine with n threads: the best of several passes summing a buffer
// much larger than the caches (the decode floor is bytes per token over this).
double read_bandwidth_gbs(int threads) {
  const size_t n = size_t(1) << 27;  // 1 GiB of uint64
  std::vector<uint64_t> buf(n, 1);
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    std::vector<std::thread> ts;
    std::vector<uint64_t> sums(threads);
    auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        const size_t b = n * t / threads, e = n * (t + 1) / threads;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = b; i + 4 <= e; i += 4) { s0 += buf[i]; s1 += buf[i + 1]; s2 += buf[i + 2]; s3 += buf[i + 3]; }
        sums[t] = s0 + s1 + s2 + s3;
      });
    for (auto& th : ts) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    uint64_t total = 0;
    for (uint64_t x : sums) total += x;
    if (total == 0) std::fprintf(stderr, " ");  // keeps the loop from being optimised away
    best = std::max(best, n * 8.0 / s / 1e9);
  }
  return best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  try {
    markbase::EngineOptions o;
    o.backend = a.backend;
    o.threads = a.threads;
    o.max_context = a.prompt_tokens + a.gen_tokens + 1;
    o.prefill_chunk = a.prefill_chunk;  // 0: the backend's choice
    markbase::Engine e(a.model, o);
    // --bandwidth measures this machine's RAM, which is the floor's bandwidth only on the CPU; a GPU
    // backend's floor takes the device's bandwidth, measured elsewhere (--read-bandwidth-gbs).
    if (a.bandwidth && e.backend_name() != "cpu")
      throw std::runtime_error("--bandwidth measures this machine's RAM, not the " + e.backend_name() +
                               " device's memory: pass the device's read bandwidth with --read-bandwidth-gbs");
    const int V = e.config().vocab_size;
    std::mt19937 rng(0);
    std::vector<int> prompt(a.prompt_tokens);
    for (int& t : prompt) t = 10 + static_cast<int>(rng() % static_cast<unsigned>(std::max(1, V - 10)));
    if (e.tokenizer() && e.tokenizer()->bos_id() >= 0) prompt[0] = e.tokenizer()->bos_id();
    const markbase::SamplingParams& sp = a.sampling;
    std::vector<double> pre, dec;
    using clk = std::chrono::steady_clock;
    for (int r = 0; r < a.repeats; ++r) {
      auto t0 = clk::now();
      e.begin(prompt, sp);
      auto t1 = clk::now();
      for (int i = 1; i < a.gen_tokens; ++i) e.next();
      auto t2 = clk::now();
      pre.push_back(a.prompt_tokens / std::chrono::duration<double>(t1 - t0).count());
      if (a.gen_tokens > 1)
        dec.push_back((a.gen_tokens - 1) / std::chrono::duration<double>(t2 - t1).count());
    }
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    const double peak_mib = ru.ru_maxrss / 1024.0;
    const double p = median(pre), d = dec.empty() ? 0.0 : median(dec);
    const double wbytes = static_cast<double>(e.model().decode_weight_bytes());
    const int bw_threads = a.threads > 0 ? a.threads : static_cast<int>(std::thread::hardware_concurrency());
    const double bw = a.bandwidth ? read_bandwidth_gbs(bw_threads) : a.device_gbs;
    // Floor: weight bytes of one decode step over the measured bandwidth (KV cache not counted).
    const double floor_tok_s = bw > 0 ? bw * 1e9 / wbytes : 0.0;
    if (a.json) {
      std::printf("{\"model\": \"%s\", \"backend\": \"%s\", \"threads\": %d, \"prompt_tokens\": %d, "
                  "\"prefill_chunk\": %d, \"gen_tokens\": %d, \"repeats\": %d, \"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, "
                  "\"peak_rss_mib\": %.1f, \"host_waits_per_token\": %d, \"kernels_per_token\": %d, "
                  "\"decode_weight_bytes\": %.0f, \"read_bandwidth_gbs\": %.2f, \"decode_floor_tok_s\": %.2f, "
                  "\"temperature\": %g, \"top_k\": %d, \"top_p\": %g, \"min_p\": %g, \"repeat_penalty\": %g}\n",
                  a.model.c_str(), e.backend_name().c_str(), a.threads, a.prompt_tokens, a.prefill_chunk, a.gen_tokens,
                  a.repeats, p, d, peak_mib, e.waits_per_token(), e.ops_per_token(), wbytes, bw, floor_tok_s,
                  sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.repeat_penalty);
    } else {
      std::printf("model: %s\nbackend: %s\nprefill: %.1f tok/s (%d tokens)\ndecode: %.1f tok/s "
                  "(%d tokens)\npeak memory: %.1f MiB\nhost waits per token: %d\nkernels per token: %d\n"
                  "weight bytes per decode token: %.1f MiB\n",
                  a.model.c_str(), e.backend_name().c_str(), p, a.prompt_tokens, d, a.gen_tokens,
                  peak_mib, e.waits_per_token(), e.ops_per_token(), wbytes / 1048576.0);
      if (sp.temperature > 0.0f)
        std::printf("sampling: temperature %g, top-k %d, top-p %g, min-p %g, repeat penalty %g (seed 0)\n",
                    sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.repeat_penalty);
      else
        std::printf("sampling: greedy\n");
      if (bw > 0)
        std::printf("read bandwidth: %.2f GB/s (%s)\ndecode floor: %.1f tok/s\n", bw,
                    a.bandwidth ? (std::to_string(bw_threads) + " threads").c_str() : "given", floor_tok_s);
    }
    return 0;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "markbase-bench: error: %s\n", ex.what());
    return 1;
  }
}
