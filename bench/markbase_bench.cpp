// markbase-bench: prefill and decode speed of a model, as API.md specifies.
//   markbase-bench --model PATH [--backend B] [--threads N] [--prompt-tokens N]
//                  [--gen-tokens N] [--repeats N] [--json]
// The prompt is random token ids (seeded), so no tokenizer is involved; decode is greedy.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace {

struct Args {
  std::string model, backend = "auto";
  int threads = 0, prompt_tokens = 512, gen_tokens = 128, repeats = 3;
  bool json = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "markbase-bench: %s\nusage: markbase-bench --model PATH [--backend auto|cpu|metal|cuda] "
               "[--threads N] [--prompt-tokens N] [--gen-tokens N] [--repeats N] [--json]\n",
               why.c_str());
  std::exit(2);
}

int parse_int(const std::string& flag, const char* v, int lo) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (!*v || *end || x < lo || x > 10000000) usage("bad value for " + flag + ": " + v);
  return static_cast<int>(x);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) usage("missing value for " + f);
      return argv[++i];
    };
    if (f == "--model") a.model = val();
    else if (f == "--backend") a.backend = val();
    else if (f == "--threads") a.threads = parse_int(f, val(), 0);
    else if (f == "--prompt-tokens") a.prompt_tokens = parse_int(f, val(), 1);
    else if (f == "--gen-tokens") a.gen_tokens = parse_int(f, val(), 1);
    else if (f == "--repeats") a.repeats = parse_int(f, val(), 1);
    else if (f == "--json") a.json = true;
    else if (f == "-h" || f == "--help") usage("help");
    else usage("unknown argument " + f);
  }
  if (a.model.empty()) usage("--model is required");
  if (a.backend != "auto" && a.backend != "cpu" && a.backend != "metal" && a.backend != "cuda")
    usage("--backend must be auto, cpu, metal or cuda");
  return a;
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
    markbase::Engine e(a.model, o);
    const int V = e.config().vocab_size;
    std::mt19937 rng(0);
    std::vector<int> prompt(a.prompt_tokens);
    for (int& t : prompt) t = 10 + static_cast<int>(rng() % static_cast<unsigned>(std::max(1, V - 10)));
    if (e.tokenizer() && e.tokenizer()->bos_id() >= 0) prompt[0] = e.tokenizer()->bos_id();
    markbase::SamplingParams sp;
    sp.temperature = 0.0f;
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
    if (a.json) {
      std::printf("{\"model\": \"%s\", \"backend\": \"%s\", \"threads\": %d, \"prompt_tokens\": %d, "
                  "\"gen_tokens\": %d, \"repeats\": %d, \"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, "
                  "\"peak_rss_mib\": %.1f, \"host_waits_per_token\": %d, \"kernels_per_token\": %d}\n",
                  a.model.c_str(), e.backend_name().c_str(), a.threads, a.prompt_tokens, a.gen_tokens,
                  a.repeats, p, d, peak_mib, e.waits_per_token(), e.ops_per_token());
    } else {
      std::printf("model: %s\nbackend: %s\nprefill: %.1f tok/s (%d tokens)\ndecode: %.1f tok/s "
                  "(%d tokens)\npeak memory: %.1f MiB\nhost waits per token: %d\nkernels per token: %d\n",
                  a.model.c_str(), e.backend_name().c_str(), p, a.prompt_tokens, d, a.gen_tokens,
                  peak_mib, e.waits_per_token(), e.ops_per_token());
    }
    return 0;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "markbase-bench: error: %s\n", ex.what());
    return 1;
  }
}
