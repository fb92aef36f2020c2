// check.h -- the few helpers the self-test programs share: named checks that print one line
// each and a summary, so that pytest shows exactly which check failed.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "msl_emu/runtime.h"

namespace selftest {

inline int& failures() {
  static int n = 0;
  return n;
}
inline int& passes() {
  static int n = 0;
  return n;
}

inline void report(bool ok, const std::string& what, const std::string& detail = "") {
  (ok ? passes() : failures())++;
  printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what.c_str(), detail.empty() ? "" : ": ", detail.c_str());
}

// |got - want| <= atol + rtol * |want| elementwise (NaN fails).
inline void check_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                        float rtol = 1e-5f, float atol = 1e-6f) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    bool ok = std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]);
    if (!ok && bad++ == 0) first = i;
  }
  char d[200] = "";
  if (bad)
    snprintf(d, sizeof d, "%zu of %zu differ, first [%zu] = %.9g, want %.9g", bad, want.size(), first, got[first], want[first]);
  report(bad == 0, what, d);
}

inline const msl_emu::Kernel& kernel(const char* name) {
  const msl_emu::Kernel* k = msl_emu::find_kernel(name);
  if (!k) {
    printf("FAIL kernel %s is not registered\n", name);
    exit(2);
  }
  return *k;
}

// Runs f, which must throw a KernelError whose text contains `needle`.
template <class F> void expect_error(const std::string& what, const std::string& needle, F f) {
  try {
    f();
    report(false, what, "no error was reported");
  } catch (const msl_emu::KernelError& e) {
    bool ok = std::string(e.what()).find(needle) != std::string::npos;
    report(ok, what, ok ? std::string() : std::string("unexpected message: ") + e.what());
    if (ok) printf("     -> %s\n", e.what());
  }
}

inline int summary() {
  printf("%d passed, %d failed\n", passes(), failures());
  return failures() ? 1 : 0;
}

}  // namespace selftest
