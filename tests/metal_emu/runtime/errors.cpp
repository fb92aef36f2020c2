// errors.cpp -- KernelError: one message that names the kernel, threadgroup, thread and the
// .metal file:line, plus the same facts as fields for tests.
#include "msl_emu/runtime.h"

namespace msl_emu {
namespace {
std::string format(const std::string& message, const std::string& kernel, Dim3 tg, int64_t thread,
                   const std::string& file, int line) {
  std::string s = "msl_emu: " + message;
  if (!kernel.empty()) {
    s += " [kernel " + kernel + ", threadgroup (" + std::to_string(tg.x) + "," + std::to_string(tg.y) + "," +
         std::to_string(tg.z) + ")";
    if (thread >= 0) s += ", thread_index_in_threadgroup " + std::to_string(thread);
    s += "]";
  }
  if (!file.empty()) s += " at " + file + ":" + std::to_string(line);
  return s;
}
}  // namespace

KernelError::KernelError(std::string message_, std::string kernel_, Dim3 threadgroup_, int64_t thread_,
                         std::string file_, int line_)
    : std::runtime_error(format(message_, kernel_, threadgroup_, thread_, file_, line_)),
      message(std::move(message_)),
      kernel(std::move(kernel_)),
      threadgroup(threadgroup_),
      thread(thread_),
      file(std::move(file_)),
      line(line_) {}

}  // namespace msl_emu
