// options.cpp -- process-wide schedule options; the environment is read once, at first use,
// so that a test run can be repeated in another order without rebuilding:
//   MSL_EMU_ORDER=forward|reverse|shuffle  MSL_EMU_SEED=<n>  MSL_EMU_WORKERS=<n>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "msl_emu/runtime.h"

namespace msl_emu {
namespace {
std::mutex g_mu;
bool g_loaded = false;
Options g_options;

[[noreturn]] void bad_env(const char* name, const char* value, const char* expected) {
  // A typo in a test environment must not silently fall back to the default order.
  fprintf(stderr, "msl_emu: %s=%s is not valid (expected %s)\n", name, value, expected);
  abort();
}

Options from_env() {
  Options o;
  if (const char* v = getenv("MSL_EMU_ORDER"); v && *v) {
    if (!strcmp(v, "forward")) o.order = Order::Forward;
    else if (!strcmp(v, "reverse")) o.order = Order::Reverse;
    else if (!strcmp(v, "shuffle")) o.order = Order::Shuffle;
    else bad_env("MSL_EMU_ORDER", v, "forward, reverse or shuffle");
  }
  if (const char* v = getenv("MSL_EMU_SEED"); v && *v) {
    char* end;
    unsigned long long s = strtoull(v, &end, 0);
    if (*end) bad_env("MSL_EMU_SEED", v, "an integer");
    o.seed = s;
  }
  if (const char* v = getenv("MSL_EMU_WORKERS"); v && *v) {
    char* end;
    long n = strtol(v, &end, 0);
    if (*end || n < 0 || n > 1024) bad_env("MSL_EMU_WORKERS", v, "an integer from 0 to 1024");
    o.workers = (int)n;
  }
  return o;
}
}  // namespace

void set_options(const Options& o) {
  std::lock_guard<std::mutex> l(g_mu);
  g_options = o;
  g_loaded = true;
}

Options options() {
  std::lock_guard<std::mutex> l(g_mu);
  if (!g_loaded) {
    g_options = from_env();
    g_loaded = true;
  }
  return g_options;
}

const char* order_name(Order o) {
  switch (o) {
    case Order::Forward: return "forward";
    case Order::Reverse: return "reverse";
    default: return "shuffle";
  }
}

}  // namespace msl_emu
