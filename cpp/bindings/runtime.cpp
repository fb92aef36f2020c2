// markbase._core.Engine and markbase._core.Tokenizer: the runtime, for markbase.Model.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "bindings/convert.h"
#include "formats/error.h"
#include "runtime/engine.h"

namespace py = pybind11;

namespace markbase {
namespace {

py::dict config_dict(const ModelConfig& c) {
  py::dict d;
  d["architecture"] = c.architecture;
  d["vocab_size"] = c.vocab_size;
  d["hidden_size"] = c.hidden_size;
  d["n_layers"] = c.n_layers;
  d["n_heads"] = c.n_heads;
  d["context_length"] = c.context_length;
  d["sliding_window"] = c.sliding_window;
  d["n_experts"] = c.n_experts;
  d["n_experts_used"] = c.n_experts_used;
  d["expert_ffn_dim"] = c.expert_ffn_dim;
  d["per_layer_input_dim"] = c.ple_dim;
  d["n_kv_shared_layers"] = c.n_kv_shared_layers;
  d["final_logit_softcapping"] = c.final_softcap;
  d["rms_norm_eps"] = c.rms_eps;
  py::list layers;
  for (const LayerConfig& l : c.layers) {
    py::dict ld;
    ld["type"] = l.sliding ? "sliding_attention" : "full_attention";
    ld["head_dim"] = l.head_dim;
    ld["n_kv_heads"] = l.n_kv_heads;
    ld["ffn_dim"] = l.ffn_dim;
    ld["kv_layer"] = l.kv_layer;
    ld["v_from_k"] = l.v_from_k;
    layers.append(ld);
  }
  d["layers"] = layers;
  return d;
}

SamplingParams params(float temperature, int top_k, float top_p, float min_p, float repeat_penalty,
                      py::object seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repeat_penalty = repeat_penalty;
  if (!seed.is_none()) {
    p.seed = seed.cast<uint64_t>();
    p.has_seed = true;
  }
  p.validate();
  return p;
}

void bind_tokenizer_methods(py::class_<Tokenizer, std::shared_ptr<Tokenizer>>& c) {
  c.def("tokenize", [](const Tokenizer& t, const std::string& text, bool add_bos, bool special) {
     py::gil_scoped_release nogil;
     return t.encode(text, add_bos, special);
   }, py::arg("text"), py::arg("add_bos") = true, py::arg("special") = false)
   .def("detokenize", [](const Tokenizer& t, const std::vector<int32_t>& ids) {
     for (int32_t id : ids)
       if (id < 0 || static_cast<size_t>(id) >= t.size())
         throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary");
     return to_pystr(t.decode(ids));
   }, py::arg("ids"))
   .def("detokenize_bytes", [](const Tokenizer& t, const std::vector<int32_t>& ids) {
     for (int32_t id : ids)
       if (id < 0 || static_cast<size_t>(id) >= t.size())
         throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary");
     return py::bytes(t.decode(ids));
   }, py::arg("ids"))
   .def("piece", [](const Tokenizer& t, int32_t id) {
     if (id < 0 || static_cast<size_t>(id) >= t.size())
       throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary");
     return py::bytes(t.piece(id));
   }, py::arg("id"))
   .def_property_readonly("eog_ids", [](const Tokenizer& t) { return t.eog_ids(); })
   .def_property_readonly("bos_id", &Tokenizer::bos_id)
   .def_property_readonly("add_bos", &Tokenizer::add_bos)
   .def("__len__", &Tokenizer::size);
}

}  // namespace

void init_runtime(py::module_& m) {
  py::class_<Tokenizer, std::shared_ptr<Tokenizer>> tok(m, "Tokenizer");
  tok.def(py::init([](const std::string& path) {
    py::gil_scoped_release nogil;
    auto f = ModelFile::open(path);
    if (!f->is_gguf())
      throw FormatError(path + ": markbase.Tokenizer reads GGUF vocabularies; Hugging Face "
                        "directories use tokenizer.json");
    return std::make_shared<Tokenizer>(vocab_from_gguf(*f));
  }), py::arg("path"));
  bind_tokenizer_methods(tok);

  m.def("simd_path", &cpu::simd_path);
  // The CPU backend's matrix product on raw weight blocks, for kernel tests:
  // raw [rows, row_bytes] of `type`, x [T, cols] -> [T, rows].
  m.def("_cpu_matmul", [](py::array_t<uint8_t, py::array::c_style | py::array::forcecast> raw,
                          const std::string& type, int64_t cols,
                          py::array_t<float, py::array::c_style | py::array::forcecast> x,
                          bool precise, int threads) {
    TensorView w;
    w.type = type_from_name(type);
    const int64_t be = traits(w.type).block_elems;
    if (cols <= 0 || cols % be) throw std::invalid_argument("cols must be a positive multiple of the block size");
    if (raw.ndim() != 2 || static_cast<size_t>(raw.shape(1)) != row_bytes(w.type, cols))
      throw std::invalid_argument("raw must be [rows, row_bytes(type, cols)]");
    if (x.ndim() != 2 || x.shape(1) != cols) throw std::invalid_argument("x must be [T, cols]");
    const int rows = static_cast<int>(raw.shape(0)), T = static_cast<int>(x.shape(0));
    w.shape = {rows, cols};
    w.data = raw.data();
    w.nbytes = raw.size();
    py::array_t<float> out({T, rows});
    float* o = out.mutable_data();
    const float* xa = x.data();
    {
      py::gil_scoped_release nogil;
      ThreadPool pool(threads);
      cpu::MatmulScratch scratch;
      cpu::matmul(pool, scratch, w, xa, static_cast<int>(cols), T, o, rows, rows, precise);
    }
    return out;
  }, py::arg("raw"), py::arg("type"), py::arg("cols"), py::arg("x"), py::arg("precise"),
     py::arg("threads") = 2);
  m.def("check_sampling", [](float temperature, int top_k, float top_p, float min_p,
                             float repeat_penalty, py::object seed) {
    params(temperature, top_k, top_p, min_p, repeat_penalty, seed);
  });

  py::class_<Engine>(m, "Engine")
      .def(py::init([](const std::string& path, const std::string& backend, int threads,
                       int max_context, const std::string& quant, const std::string& kv_cache,
                       bool precise, int prefill_chunk, bool match_llamacpp) {
             EngineOptions o;
             o.backend = backend; o.threads = threads; o.max_context = max_context;
             o.quant = quant; o.kv_cache = kv_cache; o.precise = precise;
             o.prefill_chunk = prefill_chunk;
             o.llamacpp_exact = match_llamacpp;
             py::gil_scoped_release nogil;
             return std::make_unique<Engine>(path, o);
           }),
           py::arg("path"), py::arg("backend") = "auto", py::arg("threads") = 0,
           py::arg("max_context") = 4096, py::arg("quant") = "", py::arg("kv_cache") = "f16",
           py::arg("precise") = false, py::arg("prefill_chunk") = 0,
           py::arg("match_llamacpp") = false)
      .def_property_readonly("config", [](const Engine& e) { return config_dict(e.config()); })
      .def_property_readonly("backend", &Engine::backend_name)
      .def_property_readonly("max_context", &Engine::max_context)
      .def_property_readonly("position", &Engine::position)
      .def_property_readonly("ops_per_token", &Engine::ops_per_token)
      .def_property_readonly("waits_per_token", &Engine::waits_per_token)
      .def("has_tokenizer", [](const Engine& e) { return e.tokenizer() != nullptr; })
      .def("tokenize", [](const Engine& e, const std::string& text, bool add_bos, bool special) {
        py::gil_scoped_release nogil;
        return e.tokenizer()->encode(text, add_bos, special);
      })
      .def("detokenize_bytes", [](const Engine& e, const std::vector<int32_t>& ids) {
        for (int32_t id : ids)
          if (id < 0 || static_cast<size_t>(id) >= e.tokenizer()->size())
            throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary");
        return py::bytes(e.tokenizer()->decode(ids));
      })
      .def("token_piece_bytes", [](const Engine& e, int32_t id) {
        if (id < 0 || static_cast<size_t>(id) >= e.tokenizer()->size())
          throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary");
        return py::bytes(e.tokenizer()->piece(id, /*special=*/false));
      })
      .def("eog_ids", [](const Engine& e) { return e.tokenizer()->eog_ids(); })
      .def("bos_id", [](const Engine& e) { return e.tokenizer()->bos_id(); })
      .def("token_text", [](const Engine& e, int32_t id) { return to_pystr(e.tokenizer()->text(id)); })
      .def("add_bos", [](const Engine& e) { return e.tokenizer()->add_bos(); })
      .def("metadata_value", [](const Engine& e, const std::string& key) -> py::object {
        const Value* v = e.file().find(key);
        return v ? to_python(*v) : py::none();
      })
      .def("logits", [](Engine& e, const std::vector<int>& ids) {
        std::vector<float> l;
        {
          py::gil_scoped_release nogil;
          l = e.logits(ids);
        }
        const py::ssize_t V = e.config().vocab_size;
        py::array_t<float> a({static_cast<py::ssize_t>(ids.size()), V});
        std::memcpy(a.mutable_data(), l.data(), l.size() * sizeof(float));
        return a;
      }, py::arg("ids"))
      .def("begin", [](Engine& e, const std::vector<int>& ids, float temperature, int top_k,
                       float top_p, float min_p, float repeat_penalty, py::object seed) {
        SamplingParams p = params(temperature, top_k, top_p, min_p, repeat_penalty, seed);
        py::gil_scoped_release nogil;
        return e.begin(ids, p);
      }, py::arg("ids"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
         py::arg("min_p"), py::arg("repeat_penalty"), py::arg("seed"))
      .def("next", [](Engine& e) {
        py::gil_scoped_release nogil;
        return e.next();
      });
}

}  // namespace markbase
