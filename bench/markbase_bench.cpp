// markbase-bench: prefill and decode speed of a model, as ../API.md specifies.
//   markbase-bench --model PATH [--backend B] [--threads N] [--prompt-tokens N]
//                  [--gen-tokens N] [--json]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "formats/error.h"
#include "formats/model_file.h"

namespace {

struct Args {
  std::string model, backend = "auto";
  int threads = 0, prompt_tokens = 512, gen_tokens = 128;
  bool json = false;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "markbase-bench: %s\nusage: markbase-bench --model PATH [--backend auto|cpu|metal|cuda] "
               "[--threads N] [--prompt-tokens N] [--gen-tokens N] [--json]\n",
               why);
  std::exit(2);
}

int parse_int(const char* flag, const char* v) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (!*v || *end || x < 0 || x > 1000000) usage((std::string("bad value for ") + flag).c_str());
  return static_cast<int>(x);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value for " + f).c_str());
      return argv[++i];
    };
    if (f == "--model") a.model = val();
    else if (f == "--backend") a.backend = val();
    else if (f == "--threads") a.threads = parse_int("--threads", val());
    else if (f == "--prompt-tokens") a.prompt_tokens = parse_int("--prompt-tokens", val());
    else if (f == "--gen-tokens") a.gen_tokens = parse_int("--gen-tokens", val());
    else if (f == "--json") a.json = true;
    else if (f == "-h" || f == "--help") usage("help");
    else usage(("unknown argument " + f).c_str());
  }
  if (a.model.empty()) usage("--model is required");
  if (a.backend != "auto" && a.backend != "cpu" && a.backend != "metal" && a.backend != "cuda")
    usage("--backend must be auto, cpu, metal or cuda");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  try {
    auto f = markbase::ModelFile::open(a.model);
    std::fprintf(stderr, "markbase-bench: %s opened (%zu tensors); no model support yet\n",
                 a.model.c_str(), f->tensors().size());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "markbase-bench: %s\n", e.what());
    return 1;
  }
}
