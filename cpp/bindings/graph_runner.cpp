// markbase._core._GraphRunner: runs a small hand-built Graph on any backend, so the tests can
// check each GPU kernel (and each fusion) against the CPU backend's op on small shapes. Not a
// user API: graphs are described as plain Python values.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <deque>
#include <memory>

#include "backend/backend.h"
#include "formats/error.h"
#include "formats/tensor_types.h"

#ifdef MARKBASE_METAL_EMU
#include "msl_emu/runtime.h"
#endif

namespace py = pybind11;

namespace markbase {
namespace {

OpKind op_kind(const std::string& s) {
  static const std::pair<const char*, OpKind> kinds[] = {
      {"embed", OpKind::Embed}, {"rms_norm", OpKind::RmsNorm}, {"matmul", OpKind::MatMul},
      {"gelu_mul", OpKind::GeluMul}, {"add", OpKind::Add}, {"scale", OpKind::Scale},
      {"rope", OpKind::Rope}, {"store_kv", OpKind::StoreKV}, {"attention", OpKind::Attention},
      {"softcap", OpKind::Softcap}, {"moe_route", OpKind::MoeRoute},
      {"moe_experts", OpKind::MoeExperts}, {"last_row", OpKind::LastRow}};
  for (const auto& [name, k] : kinds)
    if (s == name) return k;
  throw std::invalid_argument("unknown op kind '" + s + "'");
}

class GraphRunner {
 public:
  GraphRunner(const std::string& backend, const std::string& kv_cache, bool precise, int threads,
              const std::vector<std::tuple<int, int, int, bool>>& caches) {
    BackendOptions o;
    o.threads = threads;
    o.precise = precise;
    if (kv_cache != "f16" && kv_cache != "f32") throw std::invalid_argument("kv_cache must be 'f16' or 'f32'");
    o.kv_f16 = kv_cache == "f16";
    backend_ = create_backend(backend, o);
    std::vector<CacheDesc> desc;
    for (const auto& [kvh, hd, cap, ring] : caches) desc.push_back({kvh, hd, cap, ring});
    caches_ = backend_->make_caches(desc);
  }

  // A weight: raw blocks of a tensor of `type` and numpy-order `shape`; returns its index.
  int add_weight(const std::string& type, const std::vector<int64_t>& shape, py::bytes raw) {
    storage_.push_back(raw);
    TensorView t;
    t.name = "w" + std::to_string(weights_.size());
    t.type = type_from_name(type);
    t.shape = shape;
    t.data = reinterpret_cast<const uint8_t*>(PyBytes_AsString(storage_.back().ptr()));
    t.nbytes = static_cast<size_t>(PyBytes_Size(storage_.back().ptr()));
    if (t.nbytes != row_bytes(t.type, t.cols()) * static_cast<size_t>(t.rows()))
      throw std::invalid_argument("weight bytes do not match type and shape");
    weights_.push_back(t);
    return static_cast<int>(weights_.size()) - 1;
  }

  // Runs graph `spec` for one step; returns the slot `result` (rows x cols, float32). `inputs`
  // fills slots before the run (slot index -> [rows, cols] array).
  py::array_t<float> run(const py::dict& spec, const std::vector<int>& tokens, int pos0) {
    Graph g;
    g.T = static_cast<int>(tokens.size());
    for (const auto& s : spec["slots"].cast<std::vector<std::tuple<int, bool, int>>>())
      g.add_slot(std::get<0>(s), std::get<1>(s), std::get<2>(s));
    if (spec.contains("rope_tables")) g.rope_tables = spec["rope_tables"].cast<std::vector<std::vector<float>>>();
    for (const py::handle h : spec["ops"]) {
      const py::dict d = py::reinterpret_borrow<py::dict>(h);
      Op op;
      op.kind = op_kind(d["kind"].cast<std::string>());
      auto geti = [&](const char* k, int def) { return d.contains(k) ? d[k].cast<int>() : def; };
      op.out = geti("out", -1); op.a = geti("a", -1); op.b = geti("b", -1);
      op.n = geti("n", 0); op.group = geti("group", 0); op.heads = geti("heads", 0);
      op.kv_heads = geti("kv_heads", 0); op.layer = geti("layer", -1); op.table = geti("table", -1);
      op.window = geti("window", 0); op.k = geti("k", 0); op.b_col = geti("b_col", 0);
      op.f = d.contains("f") ? d["f"].cast<float>() : 0.0f;
      const int w = geti("w", -1), w2 = geti("w2", -1);
      if (w >= 0) op.w = &weights_.at(w);
      if (w2 >= 0) op.w2 = &weights_.at(w2);
      op.label = d["kind"].cast<std::string>();
      g.ops.push_back(op);
    }
    g.logits = spec["result"].cast<int>();
    g.vocab = g.slots.at(g.logits).cols;
    Step st;
    st.tokens = tokens;
    st.pos0 = pos0;
    const float* out;
    {
      py::gil_scoped_release nogil;
      out = backend_->run(g, st, *caches_);
    }
    const int rows = g.rows(g.logits), cols = g.vocab;
    py::array_t<float> r({rows, cols});
    std::memcpy(r.mutable_data(), out, sizeof(float) * rows * cols);
    kernels_ = backend_->ops_last_run();
    waits_ = backend_->waits_last_run();
    backend_->release(g);
    return r;
  }

  int kernels() const { return kernels_; }
  int waits() const { return waits_; }

 private:
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KVCaches> caches_;
  std::deque<TensorView> weights_;
  std::deque<py::bytes> storage_;
  int kernels_ = 0, waits_ = 0;
};

}  // namespace

void init_graph_runner(py::module_& m) {
  py::class_<GraphRunner>(m, "_GraphRunner")
      .def(py::init<const std::string&, const std::string&, bool, int,
                    const std::vector<std::tuple<int, int, int, bool>>&>(),
           py::arg("backend"), py::arg("kv_cache") = "f32", py::arg("precise") = true,
           py::arg("threads") = 2, py::arg("caches") = std::vector<std::tuple<int, int, int, bool>>{})
      .def("add_weight", &GraphRunner::add_weight)
      .def("run", &GraphRunner::run, py::arg("spec"), py::arg("tokens"), py::arg("pos0") = 0)
      .def_property_readonly("kernels", &GraphRunner::kernels)
      .def_property_readonly("waits", &GraphRunner::waits);
#ifdef MARKBASE_METAL_EMU
  // The emulator's thread order for every later dispatch: "forward", "reverse" or "shuffle".
  m.def("_metal_emu_set_order", [](const std::string& order, uint64_t seed) {
    msl_emu::Options o = msl_emu::options();
    if (order == "forward") o.order = msl_emu::Order::Forward;
    else if (order == "reverse") o.order = msl_emu::Order::Reverse;
    else if (order == "shuffle") o.order = msl_emu::Order::Shuffle;
    else throw std::invalid_argument("order must be 'forward', 'reverse' or 'shuffle'");
    o.seed = seed;
    msl_emu::set_options(o);
  }, py::arg("order"), py::arg("seed") = 1);
#endif
  m.attr("_has_metal_emu") =
#ifdef MARKBASE_METAL_EMU
      true;
#else
      false;
#endif
}

}  // namespace markbase
