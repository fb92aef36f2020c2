// Where the build installed the compiled kernels: markbase.metallib beside the module that holds
// this code (the Python extension). Empty when the build compiled none (the kernels' source is
// then compiled at load time).
#include <dlfcn.h>

#include <string>
#include <sys/stat.h>

#include "backend/metal/metal_device.h"

namespace markbase::metal {

std::string metallib_path() {
#ifdef MARKBASE_METALLIB_NAME
  Dl_info info;
  if (dladdr(reinterpret_cast<const void*>(&metallib_path), &info) && info.dli_fname) {
    std::string dir = info.dli_fname;
    dir = dir.substr(0, dir.find_last_of('/') + 1);
    const std::string path = dir + MARKBASE_METALLIB_NAME;
    struct stat st;
    if (stat(path.c_str(), &st) == 0) return path;
  }
#endif
  return "";
}

}  // namespace markbase::metal
