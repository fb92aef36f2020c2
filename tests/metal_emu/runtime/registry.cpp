// registry.cpp -- kernels register themselves by name from their generated .cpp (static
// initialisers), and the host (or the fake Metal library) finds them by name.
#include <map>
#include <mutex>

#include "msl_emu/runtime.h"

namespace msl_emu {
namespace {
// Function-local statics: registrations run during static initialisation, in any order.
std::map<std::string, Kernel>& registry() {
  static std::map<std::string, Kernel> r;
  return r;
}
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

KernelReg::KernelReg(const char* name, EntryFn entry, const char* file, int line, uint32_t static_tg_bytes,
                     uint32_t max_total_threads) {
  std::lock_guard<std::mutex> l(registry_mutex());
  // A second registration of one name means two .metal files define the same kernel: the
  // first one wins, as a Metal library would refuse the duplicate anyway.
  registry().emplace(name, Kernel{name, entry, file, line, static_tg_bytes, max_total_threads});
}

const Kernel* find_kernel(const std::string& name) {
  std::lock_guard<std::mutex> l(registry_mutex());
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : &it->second;
}

std::vector<std::string> kernel_names() {
  std::lock_guard<std::mutex> l(registry_mutex());
  std::vector<std::string> v;
  for (auto& kv : registry()) v.push_back(kv.first);
  return v;
}

}  // namespace msl_emu
