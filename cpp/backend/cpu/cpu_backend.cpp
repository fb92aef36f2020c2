// The CPU backend: executes every op of a Graph with a persistent thread pool, reading weights
// of every tensor type straight from their blocks (decode dots rows in place; prefill unpacks
// eight rows at a time into a small per-thread panel; never a whole tensor).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <thread>

#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/llamacpp_exact.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/thread_pool.h"
#include "formats/error.h"
#include "formats/half.h"
#include "formats/model_file.h"
#include "formats/quants.h"

namespace markbase {
namespace {

// The machine's physical memory in bytes (0 where unknown).
size_t physical_memory() {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return static_cast<size_t>(pages) * static_cast<size_t>(page);
#endif
  return 0;
}

class CpuCaches : public KVCaches {
 public:
  CpuCaches(const std::vector<CacheDesc>& d, bool f16) : desc(d), f16(f16) {
    // A max_context whose cache cannot fit in memory is the caller's mistake: say so, instead of
    // zero-filling until the kernel kills the process.
    double bytes = 0;
    for (const CacheDesc& c : d) bytes += 2.0 * c.kv_heads * c.capacity * c.head_dim * (f16 ? 2 : 4);
    if (const size_t mem = physical_memory(); mem > 0 && bytes > static_cast<double>(mem))
      throw std::invalid_argument("max_context: the KV cache would take " + std::to_string(bytes / (1 << 30)) +
                                  " GiB, more than this machine's " + std::to_string(mem >> 30) + " GiB of memory");
    for (const CacheDesc& c : d) {
      const size_t n = static_cast<size_t>(c.kv_heads) * c.capacity * c.head_dim;
      if (f16) { k16.emplace_back(n); v16.emplace_back(n); k32.emplace_back(); v32.emplace_back(); }
      else { k32.emplace_back(n); v32.emplace_back(n); k16.emplace_back(); v16.emplace_back(); }
    }
  }
  std::vector<CacheDesc> desc;
  bool f16;
  std::vector<std::vector<uint16_t>> k16, v16;
  std::vector<std::vector<float>> k32, v32;
};

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& o)
      : opt_(o), pool_(o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency())) {
    if (o.llamacpp_exact && !cpu::llx::available())
      throw std::runtime_error("match_llamacpp: llama.cpp's arithmetic is reproduced for x86-64 CPUs with AVX2, FMA and F16C only");
  }

  std::string name() const override { return "cpu"; }
  std::unique_ptr<KVCaches> make_caches(const std::vector<CacheDesc>& d) override {
    return std::make_unique<CpuCaches>(d, opt_.kv_f16);
  }
  void release(const Graph& g) override {
    buffers_.erase(&g);
    rope_.erase(&g);
  }
  int ops_last_run() const override { return ops_; }
  // llama.cpp's default micro-batch: its Q4_K and Q6_K kernels depend on the rows of a batch.
  int preferred_prefill_chunk() const override { return opt_.llamacpp_exact ? 512 : 256; }
  int waits_last_run() const override { return 0; }

  const float* run(const Graph& g, const Step& step, KVCaches& kv) override {
    CpuCaches& caches = static_cast<CpuCaches&>(kv);
    if (static_cast<int>(step.tokens.size()) != g.T)
      throw std::logic_error("step has " + std::to_string(step.tokens.size()) + " tokens, graph " +
                             std::to_string(g.T));
    auto& bufs = buffers_[&g];
    bufs.resize(g.slots.size());
    for (size_t i = 0; i < g.slots.size(); ++i) {
      const size_t n = static_cast<size_t>(g.rows(static_cast<int>(i))) * g.slots[i].cols;
      if (bufs[i].size() != n) bufs[i].assign(n, 0.0f);
    }
    ops_ = 0;
    moe_exact_ = opt_.llamacpp_exact && moe_exact_ok(g);
    static const char* dump = std::getenv("MARKBASE_CPU_DUMP");
    for (const Op& op : g.ops) {
      exec(g, op, step, caches, bufs);
      if (dump && op.out >= 0) {
        const int r = g.rows(op.out), c = g.slots[op.out].cols;
        const std::string f = std::string(dump) + "/" + std::to_string(1000 + ops_).substr(1) + "_" + op.label +
                              "_" + std::to_string(r) + "x" + std::to_string(c) + ".f32";
        if (FILE* fp = std::fopen(f.c_str(), "wb")) {
          std::fwrite(bufs[op.out].data(), sizeof(float), static_cast<size_t>(r) * c, fp);
          std::fclose(fp);
        }
      }
      ++ops_;
    }
    return bufs[g.logits].data();
  }

 private:
  using Bufs = std::vector<std::vector<float>>;

  // A float copy of a small weight (norm scales), made once.
  const float* small_f32(const TensorView* t) {
    if (t->type == TensorType::F32) return reinterpret_cast<const float*>(t->data);
    auto it = small_.find(t->data);
    if (it == small_.end()) {
      std::vector<float> v(static_cast<size_t>(t->numel()));
      dequantize_tensor(*t, v.data());
      it = small_.emplace(t->data, std::move(v)).first;
    }
    return it->second.data();
  }

  void matmul(const TensorView& w, const float* a, int a_stride, int T, float* out, int out_stride,
              int N) {
    cpu::matmul(pool_, scratch_, w, a, a_stride, T, out, out_stride, N, opt_.precise);
  }

  void exec(const Graph& g, const Op& op, const Step& step, CpuCaches& kv, Bufs& bufs) {
    const int T = g.T;
    float* out = op.out >= 0 ? bufs[op.out].data() : nullptr;
    const int os = op.out >= 0 ? g.slots[op.out].cols : 0;
    const float* a = op.a >= 0 ? bufs[op.a].data() : nullptr;
    const int as = op.a >= 0 ? g.slots[op.a].cols : 0;
    const int rows = op.out >= 0 ? g.rows(op.out) : T;
    switch (op.kind) {
      case OpKind::Embed: {
        const TensorView& w = *op.w;
        for (int t = 0; t < T; ++t) {
          const int id = step.tokens[t];
          if (id < 0 || id >= w.shape[0]) throw std::out_of_range("token id " + std::to_string(id) + " out of range");
          dequantize_row(w.type, w.data + static_cast<size_t>(id) * w.row_stride(), out + t * os, w.cols());
          for (int j = 0; j < op.n; ++j) out[t * os + j] *= op.f;
        }
        break;
      }
      case OpKind::RmsNorm: {
        const float* w = op.w ? small_f32(op.w) : nullptr;
        const int G = op.group, groups = op.n / G;
        pool_.parallel_for(static_cast<int64_t>(rows) * groups, 16, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            const int t = static_cast<int>(i / groups), gi = static_cast<int>(i % groups);
            const float* x = a + t * as + gi * G;
            float* y = out + t * os + gi * G;
            double ss = 0.0;
            if (opt_.llamacpp_exact) {  // ggml's order: float squares into a double, one by one
              for (int j = 0; j < G; ++j) ss += static_cast<double>(x[j] * x[j]);
            } else {
              ss = cpu::sum_squares(x, G);
            }
            const float r = 1.0f / std::sqrt(static_cast<float>(ss / G) + op.f);
            for (int j = 0; j < G; ++j) y[j] = w ? (x[j] * r) * w[j] : x[j] * r;
          }
        });
        break;
      }
      case OpKind::MatMul:
        if (opt_.llamacpp_exact && cpu::llx::matmul_supported(op.w->type))
          cpu::llx::matmul(pool_, *op.w, a, as, rows, out, os, op.n);
        else
          matmul(*op.w, a, as, rows, out, os, op.n);
        break;
      case OpKind::GeluMul: {
        const float* b = bufs[op.b].data();
        const int bs = g.slots[op.b].cols;
        rows_parallel(rows, op.n, [&](int t) {
          if (opt_.llamacpp_exact) cpu::llx::geglu(a + t * as, b + t * bs + op.b_col, out + t * os, op.n);
          else cpu::gelu_mul(a + t * as, b + t * bs + op.b_col, out + t * os, op.n);
        });
        break;
      }
      case OpKind::Add: {
        const float* b = bufs[op.b].data();
        const int bs = g.slots[op.b].cols;
        rows_parallel(rows, op.n, [&](int t) {
          for (int j = 0; j < op.n; ++j) out[t * os + j] = a[t * as + j] + b[t * bs + j];
        });
        break;
      }
      case OpKind::Scale:
        rows_parallel(rows, op.n, [&](int t) {
          for (int j = 0; j < op.n; ++j) out[t * os + j] = a[t * as + j] * op.f;
        });
        break;
      case OpKind::Softcap:
        if (opt_.llamacpp_exact) {  // llama.cpp: scale by 1/cap, tanhf, scale by cap
          const float inv = 1.0f / op.f;
          for (int t = 0; t < rows; ++t)
            pool_.parallel_for(op.n, 8192, [&](int64_t j0, int64_t j1) {
              for (int64_t j = j0; j < j1; ++j) out[t * os + j] = tanhf(a[t * as + j] * inv) * op.f;
            });
          break;
        }
        for (int t = 0; t < rows; ++t)
          pool_.parallel_for(op.n, 8192, [&](int64_t j0, int64_t j1) {
            cpu::softcap(a + t * as + j0, out + t * os + j0, j1 - j0, op.f);
          });
        break;
      case OpKind::LastRow:
        std::memcpy(out, a + static_cast<size_t>(T - 1) * as, op.n * sizeof(float));
        break;
      case OpKind::Rope: rope(g, op, step, a, as, out, os); break;
      case OpKind::StoreKV: store_kv(g, op, step, kv, bufs); break;
      case OpKind::Attention: attention(g, op, step, kv, a, as, out, os); break;
      case OpKind::MoeRoute:
        if (moe_exact_) {
          // llama.cpp scales each expert's output before weighting it: the scale stays apart.
          for (int t = 0; t < rows; ++t) cpu::llx::moe_route(a + t * as, op.group, op.k, out + t * os);
          route_scale_ = op.w2 ? small_f32(op.w2) : nullptr;
        } else {
          moe_route(op, a, as, out, os, rows);
        }
        break;
      case OpKind::MoeExperts:
        if (moe_exact_) {
          cpu::llx::moe_experts(pool_, *op.w, *op.w2, op.k, a, as, bufs[op.b].data(), g.slots[op.b].cols, op.heads,
                                route_scale_, rows, out, os, op.n);
        } else {
          moe_experts(g, op, a, as, bufs, out, os, rows);
        }
        break;
    }
  }

  // The llama.cpp-exact MoE path: all MoE ops of a graph take it or none (the route's weights
  // leave the per-expert scale to the experts op), decided by the experts' types.
  static bool moe_exact_ok(const Graph& g) {
    for (const Op& o : g.ops)
      if (o.kind == OpKind::MoeExperts &&
          !(cpu::llx::moe_supported(o.w->type, o.w2->type) && o.n % 32 == 0 && o.k % 32 == 0))
        return false;
    return true;
  }

  // fn(t) for every row t, rows split across threads when there is enough work.
  template <class F>
  void rows_parallel(int rows, int cols, const F& fn) {
    const int64_t grain = std::max<int64_t>(1, 8192 / std::max(1, cols));
    pool_.parallel_for(rows, grain, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) fn(static_cast<int>(t));
    });
  }

  // cos and sin of every (token, frequency) of the step for one table, computed once per step
  // and shared by the q and k rotations of every layer that uses the table.
  struct RopeAngles {
    int pos0 = -1, T = 0, n = 0;  // n: frequencies of the table
    std::vector<float> cs, sn;    // [T, n]
  };

  const RopeAngles& rope_angles(const Graph& g, int table, const Step& step) {
    RopeAngles& r = rope_[&g][table];
    if (r.pos0 == step.pos0 && r.T == g.T) return r;
    const std::vector<float>& inv = g.rope_tables[table];
    const int half = static_cast<int>(inv.size());
    r.n = half;
    r.cs.resize(static_cast<size_t>(g.T) * half);
    r.sn.resize(r.cs.size());
    rows_parallel(g.T, 4 * half, [&](int t) {
      const float pos = static_cast<float>(step.pos0 + t);
      for (int j = 0; j < half; ++j) {
        const float ang = pos * inv[j];
        r.cs[static_cast<size_t>(t) * half + j] = static_cast<float>(std::cos(static_cast<double>(ang)));
        r.sn[static_cast<size_t>(t) * half + j] = static_cast<float>(std::sin(static_cast<double>(ang)));
      }
    });
    r.pos0 = step.pos0;
    r.T = g.T;
    return r;
  }

  void rope(const Graph& g, const Op& op, const Step& step, const float* a, int as, float* out, int os) {
    const int d = op.group, half = d / 2;
    // llama.cpp's angles (repeated multiplication, its frequency factors) where the graph says
    // how llama.cpp forms them.
    if (opt_.llamacpp_exact && op.table < static_cast<int>(g.rope_specs.size())) {
      const RopeSpec& spec = g.rope_specs[op.table];
      if (spec.theta_scale > 0.0f && (spec.factors.empty() || static_cast<int>(spec.factors.size()) >= half)) {
        rows_parallel(g.T, op.heads * d, [&](int t) {
          cpu::llx::rope(a + t * as, out + t * os, op.heads, d, step.pos0 + t, spec.theta_scale, spec.freq_scale,
                         spec.factors.empty() ? nullptr : spec.factors.data());
        });
        return;
      }
    }
    const RopeAngles& r = rope_angles(g, op.table, step);
    if (r.n < half) throw std::logic_error("rope table shorter than half the head dim");
    rows_parallel(g.T, op.heads * d, [&](int t) {
      const float* cs = &r.cs[static_cast<size_t>(t) * r.n];
      const float* sn = &r.sn[static_cast<size_t>(t) * r.n];
      for (int h = 0; h < op.heads; ++h) {
        const float* x = a + t * as + h * d;
        float* y = out + t * os + h * d;
        for (int j = 0; j < half; ++j) {
          const float x0 = x[j], x1 = x[j + half];
          y[j] = x0 * cs[j] - x1 * sn[j];
          y[j + half] = x1 * cs[j] + x0 * sn[j];
        }
      }
    });
  }

  static int cache_slot(const CacheDesc& c, int pos) { return c.ring ? pos % c.capacity : pos; }

  void store_kv(const Graph& g, const Op& op, const Step& step, CpuCaches& kv, Bufs& bufs) {
    const CacheDesc& c = kv.desc[op.layer];
    const float* k = bufs[op.a].data();
    const float* v = bufs[op.b].data();
    const int ks = g.slots[op.a].cols, vs = g.slots[op.b].cols, d = op.group;
    for (int t = 0; t < g.T; ++t) {
      const int pos = step.pos0 + t;
      if (!c.ring && pos >= c.capacity) throw std::out_of_range("KV cache full");
      const int s = cache_slot(c, pos);
      for (int h = 0; h < op.kv_heads; ++h) {
        const size_t off = (static_cast<size_t>(h) * c.capacity + s) * d;
        const float* kr = k + t * ks + h * d;
        const float* vr = v + t * vs + h * d;
        if (kv.f16) {
          for (int j = 0; j < d; ++j) {
            kv.k16[op.layer][off + j] = fp32_to_fp16(kr[j]);
            kv.v16[op.layer][off + j] = fp32_to_fp16(vr[j]);
          }
        } else {
          std::memcpy(&kv.k32[op.layer][off], kr, d * sizeof(float));
          std::memcpy(&kv.v32[op.layer][off], vr, d * sizeof(float));
        }
      }
    }
  }

  void attention(const Graph& g, const Op& op, const Step& step, CpuCaches& kv, const float* q,
                 int qs, float* out, int os) {
    const CacheDesc& c = kv.desc[op.layer];
    cpu::AttentionArgs args;
    args.q = q;
    args.q_stride = qs;
    args.out = out;
    args.out_stride = os;
    args.T = g.T;
    args.pos0 = step.pos0;
    args.heads = op.heads;
    args.kv_heads = op.kv_heads;
    args.d = op.group;
    args.window = op.window;
    args.scale = op.f;
    args.f16 = kv.f16;
    args.k = kv.f16 ? static_cast<const void*>(kv.k16[op.layer].data()) : kv.k32[op.layer].data();
    args.v = kv.f16 ? static_cast<const void*>(kv.v16[op.layer].data()) : kv.v32[op.layer].data();
    args.capacity = c.capacity;
    args.ring = c.ring;
    if (opt_.llamacpp_exact && kv.f16 && op.group % 32 == 0) cpu::llx::attention(pool_, args);
    else cpu::attention(pool_, args);
  }

  // softmax over all experts, top-k, renormalise, times the per-expert scale.
  void moe_route(const Op& op, const float* a, int as, float* out, int os, int rows) {
    const float* pes = op.w2 ? small_f32(op.w2) : nullptr;
    for (int t = 0; t < rows; ++t) {
      const float* l = a + t * as;
      const int ne = op.group;  // number of experts
      float mx = -std::numeric_limits<float>::infinity();
      for (int e = 0; e < ne; ++e) mx = std::max(mx, l[e]);
      thread_local std::vector<float> p;
      thread_local std::vector<int> idx;
      p.resize(ne);
      idx.resize(ne);
      float sum = 0.0f;
      for (int e = 0; e < ne; ++e) { p[e] = std::exp(l[e] - mx); sum += p[e]; }
      for (int e = 0; e < ne; ++e) { p[e] /= sum; idx[e] = e; }
      std::partial_sort(idx.begin(), idx.begin() + op.k, idx.end(),
                        [&](int x, int y) { return p[x] > p[y] || (p[x] == p[y] && x < y); });
      float ws = 0.0f;
      for (int j = 0; j < op.k; ++j) ws += p[idx[j]];
      for (int j = 0; j < op.k; ++j) {
        const int e = idx[j];
        out[t * os + 2 * j] = p[e] / ws * (pes ? pes[e] : 1.0f);
        out[t * os + 2 * j + 1] = static_cast<float>(e);
      }
    }
  }

  // One decoded token: the k experts' gate/up rows in ONE parallel pass and their down rows in
  // another (per-expert matmuls were 2k passes, each with its own start and join), 8-bit
  // activations quantized once per pass. Same kernels, row groups and summation order (by
  // expert id) as the general path below, so the results are identical.
  bool moe_decode_q8(const Op& op, const float* x, const float* route, float* out) {
    const TensorView& gu = *op.w;
    const TensorView& dn = *op.w2;
    const int Ie = op.k, H = op.n, K = op.heads, E = static_cast<int>(gu.shape[0]);
    if (opt_.precise || !cpu::has_q8_dot(gu.type) || !cpu::has_q8_dot(dn.type) || H % 32 ||
        Ie % 32 || (2 * Ie) % 4 || H % 4)
      return false;
    std::vector<std::pair<int, float>> sel(K);
    for (int j = 0; j < K; ++j) {
      const int e = static_cast<int>(route[2 * j + 1]);
      if (e < 0 || e >= E) throw std::logic_error("expert id out of range");
      sel[j] = {e, route[2 * j]};
    }
    std::sort(sel.begin(), sel.end());
    const int64_t nbx = H / 32, nba = Ie / 32;
    moe_q8_.resize(static_cast<size_t>(std::max<int64_t>(nbx, K * nba)));
    cpu::quantize_act_q8(x, moe_q8_.data(), H);
    moe_hg_.resize(static_cast<size_t>(K) * 2 * Ie);
    const size_t gurb = gu.row_stride(), dnrb = dn.row_stride();
    const int gq = 2 * Ie / 4;  // row quads per expert
    pool_.parallel_for(static_cast<int64_t>(K) * gq, 4, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int j = static_cast<int>(i / gq), r = static_cast<int>(i % gq) * 4;
        const uint8_t* w = gu.data + (static_cast<size_t>(sel[j].first) * 2 * Ie + r) * gurb;
        cpu::dot_q8_rows4(gu.type, w, gurb, moe_q8_.data(), nbx, &moe_hg_[static_cast<size_t>(j) * 2 * Ie + r]);
      }
    });
    moe_act_.resize(static_cast<size_t>(K) * Ie);
    for (int j = 0; j < K; ++j) {
      cpu::gelu_mul(&moe_hg_[static_cast<size_t>(j) * 2 * Ie], &moe_hg_[static_cast<size_t>(j) * 2 * Ie + Ie],
                    &moe_act_[static_cast<size_t>(j) * Ie], Ie);
      cpu::quantize_act_q8(&moe_act_[static_cast<size_t>(j) * Ie], &moe_q8_[j * nba], Ie);
    }
    moe_y_.resize(static_cast<size_t>(K) * H);
    const int dq = H / 4;
    pool_.parallel_for(static_cast<int64_t>(K) * dq, 4, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int j = static_cast<int>(i / dq), r = static_cast<int>(i % dq) * 4;
        const uint8_t* w = dn.data + (static_cast<size_t>(sel[j].first) * H + r) * dnrb;
        cpu::dot_q8_rows4(dn.type, w, dnrb, &moe_q8_[j * nba], nba, &moe_y_[static_cast<size_t>(j) * H + r]);
      }
    });
    std::fill(out, out + H, 0.0f);
    for (int j = 0; j < K; ++j)
      for (int r = 0; r < H; ++r) out[r] += sel[j].second * moe_y_[static_cast<size_t>(j) * H + r];
    return true;
  }

  // Tokens are grouped by expert, so each expert's weights are read once per step.
  void moe_experts(const Graph& g, const Op& op, const float* a, int as, Bufs& bufs, float* out,
                   int os, int rows) {
    const TensorView& gu = *op.w;
    const TensorView& dn = *op.w2;
    const int E = static_cast<int>(gu.shape[0]), Ie = op.k, H = op.n, K = op.heads;
    const float* route = bufs[op.b].data();
    const int rs = g.slots[op.b].cols;
    if (rows == 1 && moe_decode_q8(op, a, route, out)) return;
    std::vector<std::vector<std::pair<int, float>>> by_expert(E);
    for (int t = 0; t < rows; ++t)
      for (int j = 0; j < K; ++j) {
        const int e = static_cast<int>(route[t * rs + 2 * j + 1]);
        if (e < 0 || e >= E) throw std::logic_error("expert id out of range");
        by_expert[e].push_back({t, route[t * rs + 2 * j]});
      }
    for (int t = 0; t < rows; ++t) std::fill(out + t * os, out + t * os + H, 0.0f);
    std::vector<float> x, hg, act, y;
    for (int e = 0; e < E; ++e) {
      const auto& toks = by_expert[e];
      if (toks.empty()) continue;
      const int n = static_cast<int>(toks.size());
      x.resize(static_cast<size_t>(n) * H);
      for (int j = 0; j < n; ++j) std::memcpy(&x[j * H], a + toks[j].first * as, H * sizeof(float));
      hg.resize(static_cast<size_t>(n) * 2 * Ie);
      TensorView gue = gu;
      gue.data = gu.data + static_cast<size_t>(e) * 2 * Ie * gu.row_stride();
      matmul(gue, x.data(), H, n, hg.data(), 2 * Ie, 2 * Ie);
      act.resize(static_cast<size_t>(n) * Ie);
      for (int j = 0; j < n; ++j) cpu::gelu_mul(&hg[j * 2 * Ie], &hg[j * 2 * Ie + Ie], &act[j * Ie], Ie);
      y.resize(static_cast<size_t>(n) * H);
      TensorView dne = dn;
      dne.data = dn.data + static_cast<size_t>(e) * H * dn.row_stride();
      matmul(dne, act.data(), Ie, n, y.data(), H, H);
      for (int j = 0; j < n; ++j) {
        float* o = out + toks[j].first * os;
        const float wgt = toks[j].second;
        for (int r = 0; r < H; ++r) o[r] += wgt * y[j * H + r];
      }
    }
  }

  BackendOptions opt_;
  ThreadPool pool_;
  std::map<const Graph*, Bufs> buffers_;
  std::map<const Graph*, std::map<int, RopeAngles>> rope_;
  std::map<const uint8_t*, std::vector<float>> small_;
  cpu::MatmulScratch scratch_;
  std::vector<cpu::BlockQ8> moe_q8_;
  std::vector<float> moe_hg_, moe_act_, moe_y_;
  int ops_ = 0;
  bool moe_exact_ = false;
  const float* route_scale_ = nullptr;  // the last exact MoeRoute's per-expert scale
};

}  // namespace

std::unique_ptr<Backend> create_cpu_backend(const BackendOptions& o) {
  return std::make_unique<CpuBackend>(o);
}

}  // namespace markbase
