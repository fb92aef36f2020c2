// markbase._core.ModelFile: the model-file readers, for markbase.open().
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/convert.h"
#include "formats/model_file.h"
#include "formats/quants.h"

namespace py = pybind11;

namespace markbase {

void init_files(py::module_& m) {
  py::class_<ModelFile, std::shared_ptr<ModelFile>>(m, "ModelFile")
      .def(py::init([](const std::string& path) {
             py::gil_scoped_release nogil;
             return ModelFile::open(path);
           }),
           py::arg("path"))
      .def_property_readonly("path", &ModelFile::path)
      .def_property_readonly("is_gguf", &ModelFile::is_gguf)
      .def("metadata", [](const ModelFile& f) {
        py::dict d;
        for (const auto& [k, v] : f.metadata()) d[to_pystr(k)] = to_python(v);
        return d;
      })
      .def("tensor_infos", [](const ModelFile& f) {
        // [(name, type, shape, nbytes)] in file order
        py::list out;
        for (const TensorView& t : f.tensors())
          out.append(py::make_tuple(to_pystr(t.name), type_name(t.type),
                                    py::tuple(py::cast(t.shape)), t.nbytes));
        return out;
      })
      .def("read", [](const ModelFile& f, const std::string& name) {
        const TensorView* t = f.tensor(name);
        if (!t) throw py::key_error(f.path() + ": no tensor named '" + name + "'");
        py::array_t<float> a(t->shape);
        {
          py::gil_scoped_release nogil;
          if (t->numel() > 0) dequantize_tensor(*t, a.mutable_data());
        }
        return a;
      }, py::arg("name"));

  // Quantization helpers (float32 rows -> GGML blocks), used by tests and by load-time quant.
  m.def("quantize", [](py::array_t<float, py::array::c_style | py::array::forcecast> x,
                       const std::string& type) {
    const TensorType t = type_from_name(type);
    if (x.ndim() < 1) throw std::invalid_argument("quantize: need at least one dimension");
    const int64_t cols = x.shape(x.ndim() - 1);
    const int64_t rows = cols == 0 ? 0 : x.size() / cols;
    if (t != TensorType::Q8_0 && t != TensorType::Q4_0)
      throw std::invalid_argument("quantize: only Q8_0 and Q4_0 are supported, not " + type);
    if (cols % 32 != 0)
      throw std::invalid_argument("quantize: rows of " + std::to_string(cols) +
                                  " values are not a whole number of 32-value blocks; keep this "
                                  "tensor in float");
    const size_t rb = row_bytes(t, cols);
    py::array_t<uint8_t> out({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(rb)});
    const float* src = x.data();
    uint8_t* dst = out.mutable_data();
    py::gil_scoped_release nogil;
    for (int64_t r = 0; r < rows; ++r) {
      if (t == TensorType::Q8_0) quantize_row_q8_0(src + r * cols, dst + r * rb, cols);
      else quantize_row_q4_0(src + r * cols, dst + r * rb, cols);
    }
    return out;
  }, py::arg("x"), py::arg("type"));

  m.def("dequantize", [](py::array_t<uint8_t, py::array::c_style | py::array::forcecast> raw,
                         const std::string& type, int64_t n) {
    const TensorType t = type_from_name(type);
    const int64_t be = traits(t).block_elems;
    if (n < 0 || n % be != 0)
      throw std::invalid_argument("dequantize: element count must be a multiple of " +
                                  std::to_string(be));
    if (static_cast<size_t>(raw.size()) != row_bytes(t, n))
      throw std::invalid_argument("dequantize: " + std::to_string(n) + " " + type_name(t) +
                                  " values need " + std::to_string(row_bytes(t, n)) + " bytes, got " +
                                  std::to_string(raw.size()));
    py::array_t<float> out(n);
    const uint8_t* src = raw.data();
    float* dst = out.mutable_data();
    py::gil_scoped_release nogil;
    if (n > 0) dequantize_row(t, src, dst, n);
    return out;
  }, py::arg("raw"), py::arg("type"), py::arg("n"));
}

}  // namespace markbase
