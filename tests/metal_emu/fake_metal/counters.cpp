// counters.cpp -- the fake Metal runtime's activity counters (msl_emu/counters.h).
#include "counters_impl.h"

#include <atomic>

namespace fake_objc {
namespace {
std::atomic<uint64_t> g_committed{0}, g_waits{0}, g_dispatches{0}, g_indirect{0}, g_blits{0};
}  // namespace

void count_commit() { ++g_committed; }
void count_wait() { ++g_waits; }
void count_dispatch(bool indirect) {
  ++g_dispatches;
  if (indirect) ++g_indirect;
}
void count_blit() { ++g_blits; }

}  // namespace fake_objc

extern "C" {
__attribute__((visibility("default"))) MslEmuCounters msl_emu_counters(void) {
  using namespace fake_objc;
  return MslEmuCounters{g_committed.load(), g_waits.load(), g_dispatches.load(), g_indirect.load(), g_blits.load()};
}
__attribute__((visibility("default"))) void msl_emu_reset_counters(void) {
  using namespace fake_objc;
  g_committed = 0;
  g_waits = 0;
  g_dispatches = 0;
  g_indirect = 0;
  g_blits = 0;
}
}
