// Error types shared by every layer. The bindings translate each to its Python exception:
// FormatError -> markbase.FormatError, BackendError -> markbase.BackendError,
// std::invalid_argument -> ValueError, std::out_of_range -> IndexError.
#pragma once
#include <stdexcept>
#include <string>

namespace markbase {

// A model file is corrupt, truncated or uses something we do not support.
// The message names the file, the tensor or key, and what is wrong.
struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A backend is not available on this machine or failed.
struct BackendError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace markbase
