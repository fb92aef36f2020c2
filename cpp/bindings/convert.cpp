#include "bindings/convert.h"

namespace py = pybind11;

namespace markbase {

py::str to_pystr(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::object to_python(const Value& v) {
  switch (v.v.index()) {
    case 0: return py::none();
    case 1: return py::bool_(std::get<bool>(v.v));
    case 2: return py::int_(std::get<int64_t>(v.v));
    case 3: return py::int_(std::get<uint64_t>(v.v));
    case 4: return py::float_(std::get<double>(v.v));
    case 5: return to_pystr(std::get<std::string>(v.v));
    case 6: {
      const ValueArray& a = std::get<ValueArray>(v.v);
      py::list l(a.size());
      for (size_t i = 0; i < a.size(); ++i) l[i] = to_python(a[i]);
      return std::move(l);
    }
    default: {
      py::dict d;
      for (const auto& [k, x] : std::get<ValueObject>(v.v)) d[to_pystr(k)] = to_python(x);
      return std::move(d);
    }
  }
}

}  // namespace markbase
