#include "backend/backend.h"

#include "formats/error.h"

namespace markbase {

std::unique_ptr<Backend> create_cpu_backend(const BackendOptions& o);
#ifdef MARKBASE_HAVE_CUDA
// Throws BackendError when no usable NVIDIA GPU is present.
std::unique_ptr<Backend> create_cuda_backend(const BackendOptions& o);
bool cuda_device_present();
#endif
#ifdef MARKBASE_HAVE_METAL
// Throws BackendError when no Metal device is present.
std::unique_ptr<Backend> create_metal_backend(const BackendOptions& o);
bool metal_device_native();  // a real Apple GPU (false under the emulated runtime)
#endif

std::string auto_backend() {
#ifdef MARKBASE_HAVE_CUDA
  if (cuda_device_present()) return "cuda";
#endif
#ifdef MARKBASE_HAVE_METAL
  if (metal_device_native()) return "metal";
#endif
  return "cpu";
}

std::unique_ptr<Backend> create_backend(const std::string& name, const BackendOptions& opt) {
  const std::string n = name == "auto" ? auto_backend() : name;
  if (n == "cpu") return create_cpu_backend(opt);
  if (n == "metal") {
#ifdef MARKBASE_HAVE_METAL
    return create_metal_backend(opt);
#else
    throw BackendError("backend 'metal' is not available: this build has no Metal backend (it is "
                       "built on macOS, or on Linux with CMAKE_ARGS=-DMARKBASE_METAL_EMU=ON)");
#endif
  }
  if (n == "cuda") {
#ifdef MARKBASE_HAVE_CUDA
    return create_cuda_backend(opt);
#else
    throw BackendError("backend 'cuda' is not available: this build has no CUDA backend "
                       "(build with CMAKE_ARGS=-DMARKBASE_CUDA=ON)");
#endif
  }
  throw std::invalid_argument("backend must be 'auto', 'cpu', 'metal' or 'cuda', not '" + name + "'");
}

}  // namespace markbase
