// Runtime bindings (Tokenizer, Model): filled in as the engine lands.
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace markbase {

void init_runtime(py::module_& m) {}

}  // namespace markbase
