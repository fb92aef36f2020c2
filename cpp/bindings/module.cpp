// The markbase._core extension: registers the exception types, then each area's bindings.
#include <pybind11/pybind11.h>

#include <cstring>

#include "formats/error.h"
#include "formats/mapped_file.h"

namespace py = pybind11;

namespace markbase {
void init_files(py::module_& m);
void init_runtime(py::module_& m);
void init_graph_runner(py::module_& m);

namespace {
// Messages may quote bytes from a corrupt file (a tensor name, a key): never let an invalid
// UTF-8 sequence turn the error into a UnicodeDecodeError.
void set_error(PyObject* type, const char* what) {
  PyObject* msg = PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)), "replace");
  if (!msg) return;
  PyErr_SetObject(type, msg);
  Py_DECREF(msg);
}
}  // namespace
}  // namespace markbase

PYBIND11_MODULE(_core, m) {
  m.doc() = "MarkBase C++ core";
  static PyObject* format_error =
      PyErr_NewException("markbase.FormatError", PyExc_ValueError, nullptr);
  static PyObject* backend_error =
      PyErr_NewException("markbase.BackendError", PyExc_RuntimeError, nullptr);
  m.attr("FormatError") = py::handle(format_error);
  m.attr("BackendError") = py::handle(backend_error);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const markbase::FileNotFound& e) {
      markbase::set_error(PyExc_FileNotFoundError, e.what());
    } catch (const markbase::FormatError& e) {
      markbase::set_error(format_error, e.what());
    } catch (const markbase::BackendError& e) {
      markbase::set_error(backend_error, e.what());
    } catch (const std::invalid_argument& e) {
      markbase::set_error(PyExc_ValueError, e.what());
    } catch (const std::length_error& e) {
      markbase::set_error(PyExc_ValueError, e.what());
    }
  });
  markbase::init_files(m);
  markbase::init_runtime(m);
  markbase::init_graph_runner(m);
}
