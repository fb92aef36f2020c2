// The markbase._core extension: registers the exception types, then each area's bindings.
#include <pybind11/pybind11.h>

#include "formats/error.h"
#include "formats/mapped_file.h"

namespace py = pybind11;

namespace markbase {
void init_files(py::module_& m);
void init_runtime(py::module_& m);
}  // namespace markbase

PYBIND11_MODULE(_core, m) {
  m.doc() = "MarkBase C++ core";
  py::register_exception<markbase::FormatError>(m, "FormatError", PyExc_ValueError);
  py::register_exception<markbase::BackendError>(m, "BackendError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const markbase::FileNotFound& e) {
      PyErr_SetString(PyExc_FileNotFoundError, e.what());
    }
  });
  markbase::init_files(m);
  markbase::init_runtime(m);
}
