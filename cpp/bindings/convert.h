// Conversions between MarkBase's C++ values and Python objects, shared by the binding files.
#pragma once
#include <pybind11/pybind11.h>

#include "formats/value.h"

namespace markbase {

// str from bytes that may not be valid UTF-8 (token texts): invalid bytes survive as
// surrogate escapes instead of raising.
pybind11::str to_pystr(const std::string& s);
pybind11::object to_python(const Value& v);

}  // namespace markbase
