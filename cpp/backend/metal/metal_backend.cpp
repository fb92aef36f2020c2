// The Metal backend: encodes a whole step (every op of a Graph) into ONE command buffer and waits
// for it once. Consecutive ops that touch the same data are fused into one kernel (see plan()).
// MoE routing stays on the GPU: decode expert kernels read the expert ids from the route buffer;
// prefill builds per-expert pair lists and dispatch sizes on the GPU and dispatches indirectly.
// Weights are wrapped zero-copy from the mapped model file where alignment allows.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <stdexcept>

#include "backend/backend.h"
#include "backend/metal/metal_device.h"
#include "formats/error.h"
#include "formats/model_file.h"
#include "formats/quants.h"
#include "../../../metal/kernel_args.h"
#ifdef MARKBASE_METAL_EMU
#include "msl_emu/counters.h"
#endif

namespace markbase {
namespace {

using metal::Device;
template <class T> using Ref = NS::SharedPtr<T>;

constexpr int kMaxMatvecTokens = 8;  // MV_MAX_T of matvec.metal: more tokens use mul_mm

struct Bound {
  MTL::Buffer* buf = nullptr;
  size_t off = 0;
};

class MetalCaches : public KVCaches {
 public:
  std::vector<CacheDesc> desc;
  std::vector<Ref<MTL::Buffer>> k, v;
};

// One unit of encoding: a single op or a fused run of consecutive ops.
enum class Fuse { Single, NormAdd, NormRope, NormRopeStore, Geglu, MatSoftcap, Skip };
struct PlanItem {
  Fuse kind;
  int first;     // index of the first op
  int count;     // ops covered
  bool v_norm = false;
  int norm = -1;  // products: the RmsNorm op fused into this matvec (its output is never stored)
};

// Per graph: activation slots, the step buffer, RoPE tables, MoE scratch, and the fused plan.
struct GraphState {
  std::vector<Ref<MTL::Buffer>> slots;
  Ref<MTL::Buffer> step;  // int32: [pos0, token 0 .. token T-1]
  std::vector<Ref<MTL::Buffer>> rope;
  Ref<MTL::Buffer> act, hg, y, pairs, counts, tiles, dispatch;
  std::vector<PlanItem> plan;
};

std::string type_tag(TensorType t) {
  std::string s = type_name(t);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int tg_threads(int work) { return std::min(256, std::max(32, (work + 31) / 32 * 32)); }
int div_up(int a, int b) { return (a + b - 1) / b; }

class MetalBackend : public Backend {
 public:
  explicit MetalBackend(const BackendOptions& o) : opt_(o) {}

  std::string name() const override { return "metal"; }
  int ops_last_run() const override { return kernels_; }
  int waits_last_run() const override { return waits_; }
  void release(const Graph& g) override { states_.erase(&g); }

  std::unique_ptr<KVCaches> make_caches(const std::vector<CacheDesc>& d) override {
    auto c = std::make_unique<MetalCaches>();
    c->desc = d;
    const size_t es = opt_.kv_f16 ? 2 : 4;
    for (const CacheDesc& cd : d) {
      const size_t n = static_cast<size_t>(cd.kv_heads) * cd.capacity * cd.head_dim;
      c->k.push_back(n ? dev_.new_buffer(n * es) : Ref<MTL::Buffer>());
      c->v.push_back(n ? dev_.new_buffer(n * es) : Ref<MTL::Buffer>());
    }
    return c;
  }

  const float* run(const Graph& g, const Step& st, KVCaches& kv) override;

 private:
  GraphState& state(const Graph& g);
  std::vector<PlanItem> plan(const Graph& g) const;
  void fuse_norms_into_products(const Graph& g, std::vector<PlanItem>& plan) const;
  Bound weight(const TensorView* t);
  Bound vec_f32(const TensorView* t);
  Bound slot(GraphState& s, int i) { return {s.slots[i].get(), 0}; }
  void encode(MTL::ComputeCommandEncoder* enc, const Graph& g, GraphState& s, const PlanItem& p,
              MetalCaches& kv);
  void encode_matmul(MTL::ComputeCommandEncoder* enc, const Graph& g, GraphState& s, const Op& op,
                     float softcap, const Op* norm);
  void encode_moe(MTL::ComputeCommandEncoder* enc, const Graph& g, GraphState& s, const Op& op);

  void use(MTL::ComputeCommandEncoder* enc, const std::string& kernel) {
    enc->setComputePipelineState(dev_.pipeline(kernel));
    ++dispatches_;
  }
  template <class A>
  static void args(MTL::ComputeCommandEncoder* enc, const A& a) { enc->setBytes(&a, sizeof a, 0); }
  static void bind(MTL::ComputeCommandEncoder* enc, int index, Bound b) {
    enc->setBuffer(b.buf, b.off, index);
  }
  static void grid(MTL::ComputeCommandEncoder* enc, int x, int y, int threads) {
    enc->dispatchThreadgroups(MTL::Size(x, y, 1), MTL::Size(threads, 1, 1));
  }

  Device dev_;
  BackendOptions opt_;
  std::map<const uint8_t*, std::pair<Ref<MTL::Buffer>, size_t>> weights_;
  std::map<const uint8_t*, Ref<MTL::Buffer>> vectors_;
  std::map<const Graph*, GraphState> states_;
  int kernels_ = 0, waits_ = 0, dispatches_ = 0;
};

Bound MetalBackend::weight(const TensorView* t) {
  auto it = weights_.find(t->data);
  if (it == weights_.end()) {
    size_t off = 0;
    Ref<MTL::Buffer> b = dev_.wrap(t->data, t->nbytes, t->mapping, t->mapping_bytes, &off);
    it = weights_.emplace(t->data, std::make_pair(b, off)).first;
  }
  return {it->second.first.get(), it->second.second};
}

// Norm scales and per-expert scales as float32 (they are small; matrices are never converted).
Bound MetalBackend::vec_f32(const TensorView* t) {
  if (t->type == TensorType::F32) return weight(t);
  auto it = vectors_.find(t->data);
  if (it == vectors_.end()) {
    std::vector<float> v(static_cast<size_t>(t->numel()));
    dequantize_tensor(*t, v.data());
    it = vectors_.emplace(t->data, dev_.copy_buffer(v.data(), v.size() * 4)).first;
  }
  return {it->second.get(), 0};
}

// Fusions over consecutive ops, each checked against exactly the slots the ops use, so a graph
// of another shape falls back to single ops instead of being fused wrongly.
std::vector<PlanItem> MetalBackend::plan(const Graph& g) const {
  std::vector<PlanItem> out;
  const std::vector<Op>& ops = g.ops;
  const int n = static_cast<int>(ops.size());
  auto is = [&](int i, OpKind k) { return i < n && ops[i].kind == k; };
  for (int i = 0; i < n;) {
    const Op& o = ops[i];
    if (o.kind == OpKind::RmsNorm && is(i + 1, OpKind::Add)) {
      const Op& a = ops[i + 1];
      // a.out = a.a + o.out, in place or not (the residual read from a.a)
      if (o.group == o.n && a.b == o.out && a.a != o.out && a.n == o.n && a.out != o.out &&
          a.out != o.a && g.rows(a.out) == g.rows(o.out) && g.rows(a.a) == g.rows(o.out)) {
        out.push_back({Fuse::NormAdd, i, 2});
        i += 2;
        continue;
      }
    }
    if (o.kind == OpKind::RmsNorm && o.w && is(i + 1, OpKind::Rope)) {
      const Op& r = ops[i + 1];
      if (r.a == o.out && r.out == o.out && r.group == o.group && o.n == r.heads * r.group) {
        // The K path: a StoreKV of this slot follows (after V's weightless norm, maybe).
        int j = i + 2;
        bool v_norm = false;
        if (is(j, OpKind::RmsNorm) && !ops[j].w && ops[j].group == o.group && is(j + 1, OpKind::StoreKV) &&
            ops[j + 1].b == ops[j].out && ops[j].out != o.out && ops[j].a != o.out) {
          v_norm = true;
          ++j;
        }
        if (is(j, OpKind::StoreKV) && ops[j].a == o.out && ops[j].group == o.group &&
            ops[j].kv_heads == r.heads && ops[j].b != o.out) {
          PlanItem p{Fuse::NormRopeStore, i, j - i + 1};
          p.v_norm = v_norm;
          out.push_back(p);
          i = j + 1;
          continue;
        }
        out.push_back({Fuse::NormRope, i, 2});
        i += 2;
        continue;
      }
    }
    if (o.kind == OpKind::MatMul && is(i + 1, OpKind::MatMul) && is(i + 2, OpKind::GeluMul)) {
      const Op& u = ops[i + 1];
      const Op& gm = ops[i + 2];
      if (u.a == o.a && gm.out == o.out && gm.a == o.out && gm.b == u.out && gm.b_col == 0 &&
          gm.n == o.n && u.n == o.n && o.w->type == u.w->type && o.w->cols() == u.w->cols() &&
          u.out != o.out && u.out != o.a && g.rows(o.out) <= kMaxMatvecTokens) {
        out.push_back({Fuse::Geglu, i, 3});
        i += 3;
        continue;
      }
    }
    if (o.kind == OpKind::MatMul && is(i + 1, OpKind::Softcap) && ops[i + 1].a == o.out &&
        ops[i + 1].out == o.out && ops[i + 1].n == o.n && g.rows(o.out) <= kMaxMatvecTokens) {
      out.push_back({Fuse::MatSoftcap, i, 2});
      i += 2;
      continue;
    }
    out.push_back({Fuse::Single, i, 1});
    ++i;
  }
  fuse_norms_into_products(g, out);
  return out;
}

// The norm before the products that read it (q/k/v after attn_norm, gate/up after ffn_norm, the
// router after its norm, the head after the final norm): for short steps every matvec
// normalises its input row itself, and the norm's own dispatch goes. The products need not be
// adjacent (Gemma's q product comes before k and v, with q's norm and RoPE between), but every
// other read of the normalised slot must be gone: scanning on, nothing but such products may read
// it, nothing may change the norm's input before the last of them, and the slot must be
// overwritten (or never touched again) afterwards.
void MetalBackend::fuse_norms_into_products(const Graph& g, std::vector<PlanItem>& plan) const {
  const std::vector<Op>& ops = g.ops;
  auto reads = [&](const PlanItem& c, int slot) {
    for (int i = c.first; i < c.first + c.count; ++i)
      if (ops[i].a == slot || ops[i].b == slot) return true;
    return false;
  };
  auto writes = [&](const PlanItem& c, int slot) {
    for (int i = c.first; i < c.first + c.count; ++i)
      if (ops[i].out == slot) return true;
    return false;
  };
  for (size_t p = 0; p < plan.size(); ++p) {
    if (plan[p].kind != Fuse::Single) continue;
    const Op& nm = ops[plan[p].first];
    if (nm.kind != OpKind::RmsNorm || !nm.w || nm.group != nm.n || nm.out == nm.a ||
        g.rows(nm.out) > kMaxMatvecTokens)
      continue;
    const int h = nm.out, x = nm.a;
    std::vector<size_t> consumers;
    bool ok = h != g.logits, x_changed = false;
    for (size_t q = p + 1; q < plan.size() && ok; ++q) {
      const PlanItem& c = plan[q];
      const Op& o = ops[c.first];
      const bool product = (c.kind == Fuse::Single || c.kind == Fuse::Geglu || c.kind == Fuse::MatSoftcap) &&
                           o.kind == OpKind::MatMul && o.a == h && o.w->cols() == nm.n;
      if (product) {
        if (x_changed || writes(c, h) || writes(c, x)) ok = false;
        else consumers.push_back(q);
        continue;
      }
      if (reads(c, h)) ok = false;
      else if (writes(c, h)) break;  // the normalised values are dead from here on
      else if (writes(c, x)) x_changed = true;
    }
    if (!ok || consumers.empty()) continue;
    plan[p].kind = Fuse::Skip;
    for (size_t c : consumers) plan[c].norm = plan[p].first;
  }
}

GraphState& MetalBackend::state(const Graph& g) {
  auto it = states_.find(&g);
  if (it != states_.end()) return it->second;
  GraphState s;
  for (size_t i = 0; i < g.slots.size(); ++i)
    s.slots.push_back(dev_.new_buffer(static_cast<size_t>(g.rows(static_cast<int>(i))) * g.slots[i].cols * 4));
  s.step = dev_.new_buffer(4 * (g.T + 1));
  for (const std::vector<float>& t : g.rope_tables) s.rope.push_back(dev_.copy_buffer(t.data(), t.size() * 4));
  for (const Op& op : g.ops) {
    if (op.kind != OpKind::MoeExperts || s.act) continue;
    const int rows = g.rows(op.out), K = op.heads, ffn = op.k, H = op.n;
    const int E = static_cast<int>(op.w->shape[0]), P = rows * K;
    s.act = dev_.new_buffer(static_cast<size_t>(P) * ffn * 4);
    s.hg = dev_.new_buffer(static_cast<size_t>(P) * 2 * ffn * 4);
    s.y = dev_.new_buffer(static_cast<size_t>(P) * H * 4);
    s.pairs = dev_.new_buffer(static_cast<size_t>(P) * 4);
    s.counts = dev_.new_buffer(static_cast<size_t>(E) * 4);
    s.tiles = dev_.new_buffer(static_cast<size_t>(3) * (P / 32 + E + 1) * 4);
    s.dispatch = dev_.new_buffer(6 * 4);
  }
  s.plan = plan(g);
  return states_.emplace(&g, std::move(s)).first->second;
}

const float* MetalBackend::run(const Graph& g, const Step& st, KVCaches& kvb) {
  MetalCaches& kv = static_cast<MetalCaches&>(kvb);
  if (static_cast<int>(st.tokens.size()) != g.T)
    throw std::logic_error("step has " + std::to_string(st.tokens.size()) + " tokens, graph " + std::to_string(g.T));
  for (const CacheDesc& c : kv.desc)
    if (c.capacity > 0 && !c.ring && st.pos0 + g.T > c.capacity) throw std::out_of_range("KV cache full");
  GraphState& s = state(g);
  int32_t* step = static_cast<int32_t*>(s.step->contents());
  step[0] = st.pos0;
  for (int t = 0; t < g.T; ++t) step[1 + t] = st.tokens[t];

#ifdef MARKBASE_METAL_EMU
  const MslEmuCounters before = msl_emu_counters();
#endif
  dispatches_ = 0;
  {
    Ref<NS::AutoreleasePool> pool = NS::TransferPtr(NS::AutoreleasePool::alloc()->init());
    MTL::CommandBuffer* cb = dev_.queue()->commandBuffer();
    // A serial encoder: each dispatch sees the writes of the ones before it.
    MTL::ComputeCommandEncoder* enc = cb->computeCommandEncoder();
    for (const PlanItem& p : s.plan) encode(enc, g, s, p, kv);
    enc->endEncoding();
    cb->commit();
    cb->waitUntilCompleted();
    if (cb->status() == MTL::CommandBufferStatusError) {
      NS::Error* e = cb->error();
      throw BackendError(std::string("[metal] command buffer failed: ") +
                         (e && e->localizedDescription() ? e->localizedDescription()->utf8String() : "unknown error"));
    }
  }
#ifdef MARKBASE_METAL_EMU
  // In the emulated build the counts come from the fake Metal runtime, not from this file.
  const MslEmuCounters after = msl_emu_counters();
  kernels_ = static_cast<int>((after.dispatches - before.dispatches) + (after.indirect_dispatches - before.indirect_dispatches));
  waits_ = static_cast<int>(after.waits - before.waits);
#else
  kernels_ = dispatches_;
  waits_ = 1;
#endif
  return static_cast<const float*>(s.slots[g.logits]->contents());
}

void MetalBackend::encode_matmul(MTL::ComputeCommandEncoder* enc, const Graph& g, GraphState& s,
                                 const Op& op, float softcap, const Op* norm) {
  const TensorView& w = *op.w;
  const int rows = g.rows(op.out), k = static_cast<int>(w.cols());
  if (k % 4 != 0)
    throw BackendError("[metal] " + op.label + ": rows of " + std::to_string(k) + " columns (a multiple of 4 is needed)");
  const int in = norm ? norm->a : op.a;  // a fused norm reads the norm's input
  MatArgs a{static_cast<int>(w.type), op.n, k, static_cast<int>(w.row_stride()), rows,
            g.slots[in].cols, g.slots[op.out].cols, softcap, norm != nullptr, norm ? norm->f : 0.0f};
  const bool mv = rows <= kMaxMatvecTokens;
  use(enc, (mv ? "mul_mv_" : "mul_mm_") + type_tag(w.type));
  args(enc, a);
  bind(enc, 1, weight(op.w));
  bind(enc, 2, slot(s, in));
  bind(enc, 3, slot(s, op.out));
  if (mv) {
    bind(enc, 4, norm ? vec_f32(norm->w) : slot(s, in));
    grid(enc, div_up(op.n, 4), 1, 128);
  } else {
    grid(enc, div_up(op.n, 32), div_up(rows, 32), 128);
  }
}

void MetalBackend::encode_moe(MTL::ComputeCommandEncoder* enc, const Graph& g, GraphState& s, const Op& op) {
  const TensorView& gu = *op.w;
  const TensorView& dn = *op.w2;
  const int rows = g.rows(op.out), K = op.heads, ffn = op.k, H = op.n;
  const int E = static_cast<int>(gu.shape[0]);
  if (H % 4 || ffn % 4) throw BackendError("[metal] " + op.label + ": widths must be multiples of 4");
  MoeArgs m{static_cast<int>(gu.type), static_cast<int>(dn.type), H, ffn, K, rows,
            static_cast<int>(gu.row_stride()), static_cast<int>(dn.row_stride()), g.slots[op.a].cols,
            g.slots[op.b].cols, g.slots[op.out].cols, E};
  if (rows <= kMaxMatvecTokens) {
    use(enc, "moe_gate_up");
    args(enc, m);
    bind(enc, 1, weight(op.w));
    bind(enc, 2, slot(s, op.a));
    bind(enc, 3, slot(s, op.b));
    bind(enc, 4, {s.act.get(), 0});
    grid(enc, div_up(ffn, 4), rows * K, 128);
    use(enc, "moe_down_sum");
    args(enc, m);
    bind(enc, 1, weight(op.w2));
    bind(enc, 2, {s.act.get(), 0});
    bind(enc, 3, slot(s, op.b));
    bind(enc, 4, slot(s, op.out));
    grid(enc, div_up(H, 4), rows, 128);
    return;
  }
  use(enc, "moe_plan");
  args(enc, m);
  bind(enc, 1, slot(s, op.b));
  bind(enc, 2, {s.pairs.get(), 0});
  bind(enc, 3, {s.counts.get(), 0});
  bind(enc, 4, {s.tiles.get(), 0});
  bind(enc, 5, {s.dispatch.get(), 0});
  grid(enc, 1, 1, std::min(1024, std::max(32, div_up(E, 32) * 32)));
  // gate_up over the GPU-built tiles, dispatched with the sizes moe_plan wrote.
  const std::string tg = type_tag(gu.type), td = type_tag(dn.type);
  MatArgs a1{static_cast<int>(gu.type), 2 * ffn, H, static_cast<int>(gu.row_stride()), rows,
             g.slots[op.a].cols, 2 * ffn, 0.0f};
  use(enc, "moe_mm_" + tg);
  args(enc, a1);
  bind(enc, 1, weight(op.w));
  bind(enc, 2, slot(s, op.a));
  bind(enc, 3, {s.hg.get(), 0});
  bind(enc, 4, {s.tiles.get(), 0});
  bind(enc, 5, {s.pairs.get(), 0});
  enc->setBytes(&K, sizeof K, 6);
  enc->dispatchThreadgroups(s.dispatch.get(), 0, MTL::Size(128, 1, 1));
  use(enc, "moe_geglu");
  args(enc, m);
  bind(enc, 1, {s.hg.get(), 0});
  bind(enc, 2, {s.act.get(), 0});
  grid(enc, div_up(ffn, 256), rows * K, 256);
  MatArgs a2{static_cast<int>(dn.type), H, ffn, static_cast<int>(dn.row_stride()), rows, ffn, H, 0.0f};
  const int one = 1;
  use(enc, "moe_mm_" + td);
  args(enc, a2);
  bind(enc, 1, weight(op.w2));
  bind(enc, 2, {s.act.get(), 0});
  bind(enc, 3, {s.y.get(), 0});
  bind(enc, 4, {s.tiles.get(), 0});
  bind(enc, 5, {s.pairs.get(), 0});
  enc->setBytes(&one, sizeof one, 6);
  enc->dispatchThreadgroups(s.dispatch.get(), 12, MTL::Size(128, 1, 1));
  use(enc, "moe_sum");
  args(enc, m);
  bind(enc, 1, {s.y.get(), 0});
  bind(enc, 2, slot(s, op.b));
  bind(enc, 3, slot(s, op.out));
  grid(enc, div_up(H, 256), rows, 256);
}

void MetalBackend::encode(MTL::ComputeCommandEncoder* enc, const Graph& g, GraphState& s,
                          const PlanItem& p, MetalCaches& kv) {
  const Op& op = g.ops[p.first];
  const int rows = op.out >= 0 ? g.rows(op.out) : g.T;
  const std::string kvt = opt_.kv_f16 ? "f16" : "f32";
  auto stride = [&](int sl) { return g.slots[sl].cols; };
  auto norm_weight = [&](const Op& o) { return o.w ? vec_f32(o.w) : slot(s, o.a); };  // unread if none
  switch (p.kind) {
    case Fuse::NormAdd: {
      const Op& add = g.ops[p.first + 1];
      NormArgs a{op.n, op.n, stride(op.a), stride(op.out), stride(add.out), op.w != nullptr, op.f, stride(add.a)};
      use(enc, "rms_norm_add");
      args(enc, a);
      bind(enc, 1, slot(s, op.a));
      bind(enc, 2, norm_weight(op));
      bind(enc, 3, slot(s, op.out));
      bind(enc, 4, slot(s, add.out));
      bind(enc, 5, slot(s, add.a));
      grid(enc, 1, rows, tg_threads(op.n));
      return;
    }
    case Fuse::NormRope: {
      const Op& r = g.ops[p.first + 1];
      RopeArgs a{r.heads, r.group, stride(op.a), stride(r.out), 1, op.f};
      use(enc, "rope_norm");
      args(enc, a);
      bind(enc, 1, slot(s, op.a));
      bind(enc, 2, vec_f32(op.w));
      bind(enc, 3, {s.rope[r.table].get(), 0});
      bind(enc, 4, {s.step.get(), 0});
      bind(enc, 5, slot(s, r.out));
      grid(enc, r.heads, rows, tg_threads(r.group));
      return;
    }
    case Fuse::NormRopeStore: {
      const Op& r = g.ops[p.first + 1];
      const Op& sk = g.ops[p.first + p.count - 1];
      const Op* vn = p.v_norm ? &g.ops[p.first + 2] : nullptr;
      const int v_raw = vn ? vn->a : sk.b;
      const CacheDesc& c = kv.desc[sk.layer];
      KVArgs a{sk.kv_heads, sk.group, stride(op.a), stride(v_raw), stride(op.out), stride(sk.b),
               c.capacity, c.ring ? 1 : 0, vn ? 1 : 0, op.f};
      use(enc, "norm_rope_store_kv_" + kvt);
      args(enc, a);
      bind(enc, 1, slot(s, op.a));
      bind(enc, 2, slot(s, v_raw));
      bind(enc, 3, vec_f32(op.w));
      bind(enc, 4, {s.rope[r.table].get(), 0});
      bind(enc, 5, {s.step.get(), 0});
      bind(enc, 6, slot(s, op.out));
      bind(enc, 7, slot(s, sk.b));
      bind(enc, 8, {kv.k[sk.layer].get(), 0});
      bind(enc, 9, {kv.v[sk.layer].get(), 0});
      grid(enc, sk.kv_heads, g.T, tg_threads(sk.group));
      // The K norm's eps: the fused kernel uses one eps for both norms, as Gemma's config has.
      return;
    }
    case Fuse::Geglu: {
      const Op& u = g.ops[p.first + 1];
      const TensorView& w = *op.w;
      const Op* nm = p.norm >= 0 ? &g.ops[p.norm] : nullptr;
      const int in = nm ? nm->a : op.a;
      MatArgs a{static_cast<int>(w.type), op.n, static_cast<int>(w.cols()), static_cast<int>(w.row_stride()),
                rows, stride(in), stride(op.out), 0.0f, nm != nullptr, nm ? nm->f : 0.0f};
      use(enc, "mul_mv_geglu_" + type_tag(w.type));
      args(enc, a);
      bind(enc, 1, weight(op.w));
      bind(enc, 2, weight(u.w));
      bind(enc, 3, slot(s, in));
      bind(enc, 4, slot(s, op.out));
      bind(enc, 5, nm ? vec_f32(nm->w) : slot(s, in));
      grid(enc, div_up(op.n, 4), 1, 128);
      return;
    }
    case Fuse::MatSoftcap:
      encode_matmul(enc, g, s, op, g.ops[p.first + 1].f, p.norm >= 0 ? &g.ops[p.norm] : nullptr);
      return;
    case Fuse::Skip:
      return;
    case Fuse::Single:
      break;
  }
  switch (op.kind) {
    case OpKind::Embed: {
      const TensorView& w = *op.w;
      if (op.n % 4 != 0 || w.cols() != op.n) throw BackendError("[metal] " + op.label + ": unsupported width");
      EmbedArgs a{static_cast<int>(w.type), op.n, static_cast<int>(w.row_stride()), stride(op.out), op.f};
      use(enc, "embed_rows");
      args(enc, a);
      bind(enc, 1, weight(op.w));
      bind(enc, 2, {s.step.get(), 4});
      bind(enc, 3, slot(s, op.out));
      grid(enc, div_up(op.n, 256), g.T, 64);
      return;
    }
    case OpKind::RmsNorm: {
      NormArgs a{op.n, op.group, stride(op.a), stride(op.out), 0, op.w != nullptr, op.f};
      use(enc, "rms_norm");
      args(enc, a);
      bind(enc, 1, slot(s, op.a));
      bind(enc, 2, norm_weight(op));
      bind(enc, 3, slot(s, op.out));
      grid(enc, op.n / op.group, rows, tg_threads(op.group));
      return;
    }
    case OpKind::MatMul:
      encode_matmul(enc, g, s, op, 0.0f, p.norm >= 0 ? &g.ops[p.norm] : nullptr);
      return;
    case OpKind::GeluMul:
    case OpKind::Add: {
      EltArgs a{op.n, stride(op.a), stride(op.b), stride(op.out), op.b_col, rows, op.f};
      use(enc, op.kind == OpKind::Add ? "add" : "gelu_mul");
      args(enc, a);
      bind(enc, 1, slot(s, op.a));
      bind(enc, 2, slot(s, op.b));
      bind(enc, 3, slot(s, op.out));
      grid(enc, div_up(op.n, 256), rows, 256);
      return;
    }
    case OpKind::Scale:
    case OpKind::Softcap:
    case OpKind::LastRow: {
      EltArgs a{op.n, stride(op.a), 0, stride(op.out), 0, g.rows(op.a), op.f};
      use(enc, op.kind == OpKind::Scale ? "scale" : op.kind == OpKind::Softcap ? "softcap" : "last_row");
      args(enc, a);
      bind(enc, 1, slot(s, op.a));
      bind(enc, 2, slot(s, op.out));
      grid(enc, div_up(op.n, 256), op.kind == OpKind::LastRow ? 1 : rows, 256);
      return;
    }
    case OpKind::Rope: {
      RopeArgs a{op.heads, op.group, stride(op.a), stride(op.out), 0, 0.0f};
      use(enc, "rope_norm");
      args(enc, a);
      bind(enc, 1, slot(s, op.a));
      bind(enc, 2, slot(s, op.a));  // no norm weight
      bind(enc, 3, {s.rope[op.table].get(), 0});
      bind(enc, 4, {s.step.get(), 0});
      bind(enc, 5, slot(s, op.out));
      grid(enc, op.heads, rows, tg_threads(op.group));
      return;
    }
    case OpKind::StoreKV: {
      const CacheDesc& c = kv.desc[op.layer];
      KVArgs a{op.kv_heads, op.group, stride(op.a), stride(op.b), 0, 0, c.capacity, c.ring ? 1 : 0, 0, 0.0f};
      use(enc, "store_kv_" + kvt);
      args(enc, a);
      bind(enc, 1, slot(s, op.a));
      bind(enc, 2, slot(s, op.b));
      bind(enc, 3, {s.step.get(), 0});
      bind(enc, 4, {kv.k[op.layer].get(), 0});
      bind(enc, 5, {kv.v[op.layer].get(), 0});
      grid(enc, op.kv_heads, g.T, tg_threads(op.group));
      return;
    }
    case OpKind::Attention: {
      const CacheDesc& c = kv.desc[op.layer];
      if (op.group > 512) throw BackendError("[metal] " + op.label + ": head_dim above 512");
      AttnArgs a{op.heads, op.kv_heads, op.group, stride(op.a), stride(op.out), c.capacity,
                 c.ring ? 1 : 0, op.window, op.f};
      use(enc, "attention_" + kvt);
      args(enc, a);
      bind(enc, 1, slot(s, op.a));
      bind(enc, 2, {kv.k[op.layer].get(), 0});
      bind(enc, 3, {kv.v[op.layer].get(), 0});
      bind(enc, 4, {s.step.get(), 0});
      bind(enc, 5, slot(s, op.out));
      grid(enc, op.heads, rows, 128);
      return;
    }
    case OpKind::MoeRoute: {
      if (op.k > 16 || op.group > 1024) throw BackendError("[metal] " + op.label + ": top-k above 16 or over 1024 experts");
      RouteArgs a{op.group, op.k, stride(op.a), stride(op.out), op.w2 != nullptr};
      use(enc, "moe_route");
      args(enc, a);
      bind(enc, 1, slot(s, op.a));
      bind(enc, 2, op.w2 ? vec_f32(op.w2) : slot(s, op.a));
      bind(enc, 3, slot(s, op.out));
      grid(enc, rows, 1, 32);
      return;
    }
    case OpKind::MoeExperts:
      encode_moe(enc, g, s, op);
      return;
  }
}

}  // namespace

std::unique_ptr<Backend> create_metal_backend(const BackendOptions& o) {
  return std::make_unique<MetalBackend>(o);
}

bool metal_device_native() {
#ifdef MARKBASE_METAL_EMU
  return false;
#else
  Ref<MTL::Device> d = NS::TransferPtr(MTL::CreateSystemDefaultDevice());
  return static_cast<bool>(d);
#endif
}

}  // namespace markbase
