#include "backend/backend.h"

#include "formats/error.h"

namespace markbase {

std::unique_ptr<Backend> create_cpu_backend(const BackendOptions& o);

std::string auto_backend() { return "cpu"; }

std::unique_ptr<Backend> create_backend(const std::string& name, const BackendOptions& opt) {
  const std::string n = name == "auto" ? auto_backend() : name;
  if (n == "cpu") return create_cpu_backend(opt);
  if (n == "metal")
    throw BackendError("backend 'metal' is not available: this build has no Metal backend "
                       "(it is not implemented yet; see README)");
  if (n == "cuda")
    throw BackendError("backend 'cuda' is not available: this build has no CUDA backend "
                       "(it is not implemented yet; see README)");
  throw std::invalid_argument("backend must be 'auto', 'cpu', 'metal' or 'cuda', not '" + name + "'");
}

}  // namespace markbase
