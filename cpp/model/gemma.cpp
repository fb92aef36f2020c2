#include "model/gemma.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/error.h"

namespace markbase {

GemmaModel::GemmaModel(std::shared_ptr<const ModelFile> file, const std::string& quant)
    : file_(std::move(file)), cfg_(parse_model_config(*file_)), weights_(*file_, cfg_, quant) {
  validate();
}

const TensorView* GemmaModel::derived(const std::string& name, std::vector<float> values) {
  derived_data_.push_back(std::move(values));
  TensorView t;
  t.name = name;
  t.type = TensorType::F32;
  t.shape = {static_cast<int64_t>(derived_data_.back().size())};
  t.data = reinterpret_cast<const uint8_t*>(derived_data_.back().data());
  t.nbytes = derived_data_.back().size() * 4;
  derived_.push_back(t);
  return &derived_.back();
}

// Checks every tensor the graph will read, so that a wrong file fails at load with the tensor's
// name instead of reading out of bounds later.
void GemmaModel::validate() {
  const ModelConfig& c = cfg_;
  const WeightSet& w = weights_;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  w.get("token_embd.weight", {V, H});
  w.get("output_norm.weight", {H});
  if (w.find("output.weight")) w.get("output.weight", {V, H});
  if (c.ple_dim > 0) {
    const int64_t LP = static_cast<int64_t>(c.n_layers) * c.ple_dim;
    w.get("per_layer_token_embd.weight", {V, LP});
    w.get("per_layer_model_proj.weight", {LP, H});
    w.get("per_layer_proj_norm.weight", {c.ple_dim});
  }
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerConfig& l = c.layers[i];
    const int64_t q = static_cast<int64_t>(c.n_heads) * l.head_dim, kv = static_cast<int64_t>(l.n_kv_heads) * l.head_dim;
    w.get(blk(i, "attn_norm.weight"), {H});
    w.get(blk(i, "attn_q.weight"), {q, H});
    w.get(blk(i, "attn_q_norm.weight"), {l.head_dim});
    if (l.kv_layer == i) {
      w.get(blk(i, "attn_k.weight"), {kv, H});
      w.get(blk(i, "attn_k_norm.weight"), {l.head_dim});
      if (!l.v_from_k) w.get(blk(i, "attn_v.weight"), {kv, H});
    }
    w.get(blk(i, "attn_output.weight"), {H, q});
    w.get(blk(i, "post_attention_norm.weight"), {H});
    w.get(blk(i, "ffn_norm.weight"), {H});
    w.get(blk(i, "ffn_gate.weight"), {l.ffn_dim, H});
    w.get(blk(i, "ffn_up.weight"), {l.ffn_dim, H});
    w.get(blk(i, "ffn_down.weight"), {H, l.ffn_dim});
    w.get(blk(i, "post_ffw_norm.weight"), {H});
    if (c.n_experts > 0) {
      const int64_t E = c.n_experts, Ie = c.expert_ffn_dim;
      w.get(blk(i, "ffn_gate_inp.weight"), {E, H});
      w.get(blk(i, "ffn_gate_up_exps.weight"), {E, 2 * Ie, H});
      w.get(blk(i, "ffn_down_exps.weight"), {E, H, Ie});
      w.get(blk(i, "pre_ffw_norm_2.weight"), {H});
      w.get(blk(i, "post_ffw_norm_1.weight"), {H});
      w.get(blk(i, "post_ffw_norm_2.weight"), {H});
      std::vector<float> s(H, 1.0f);
      if (w.find(blk(i, "ffn_gate_inp.scale")))
        dequantize_tensor(w.get(blk(i, "ffn_gate_inp.scale"), {H}), s.data());
      const float inv = 1.0f / std::sqrt(static_cast<float>(H));
      for (float& x : s) x *= inv;
      router_norm_.push_back(derived(blk(i, "router_norm"), std::move(s)));
      if (w.find(blk(i, "ffn_down_exps.scale"))) w.get(blk(i, "ffn_down_exps.scale"), {E});
    }
    if (c.ple_dim > 0) {
      w.get(blk(i, "inp_gate.weight"), {c.ple_dim, H});
      w.get(blk(i, "proj.weight"), {H, c.ple_dim});
      w.get(blk(i, "post_norm.weight"), {H});
    }
    float ls = 1.0f;
    if (const TensorView* t = w.find(blk(i, "layer_output_scale.weight"))) {
      if (t->numel() != 1) throw FormatError(w.path() + ": " + t->name + " must hold one value");
      dequantize_tensor(*t, &ls);
    }
    layer_scale_.push_back(ls);
  }
}

std::vector<CacheDesc> GemmaModel::caches(int max_context, int chunk) const {
  std::vector<CacheDesc> out(cfg_.n_layers);
  for (int i = 0; i < cfg_.n_layers; ++i) {
    const LayerConfig& l = cfg_.layers[i];
    if (l.kv_layer != i) continue;
    CacheDesc& d = out[i];
    d.kv_heads = l.n_kv_heads;
    d.head_dim = l.head_dim;
    // A sliding layer needs the window's W-1 past keys plus the chunk being written.
    if (l.sliding && cfg_.sliding_window - 1 + chunk < max_context) {
      d.ring = true;
      d.capacity = cfg_.sliding_window - 1 + chunk;
    } else {
      d.capacity = max_context;
    }
  }
  return out;
}

size_t GemmaModel::decode_weight_bytes(int T) const {
  const Graph g = build(T, false);
  double bytes = 0;
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::MatMul) bytes += op.w->nbytes;
    if (op.kind == OpKind::Embed) bytes += op.w->row_stride() * static_cast<double>(T);
    if (op.kind == OpKind::MoeExperts) {
      const double used = std::min(1.0, static_cast<double>(op.heads) * T / op.w->shape[0]);
      bytes += used * (op.w->nbytes + op.w2->nbytes);
    }
  }
  return static_cast<size_t>(bytes);
}

Graph GemmaModel::build(int T, bool all_logits) const {
  const ModelConfig& c = cfg_;
  const WeightSet& w = weights_;
  const int H = c.hidden_size, L = c.n_layers, P = c.ple_dim;
  int max_q = 0, max_kv = 0, max_ffn = 0;
  for (const LayerConfig& l : c.layers) {
    max_q = std::max(max_q, c.n_heads * l.head_dim);
    max_kv = std::max(max_kv, l.n_kv_heads * l.head_dim);
    max_ffn = std::max(max_ffn, l.ffn_dim);
  }
  Graph g;
  g.T = T;
  g.vocab = c.vocab_size;
  g.rope_tables = {c.rope_inv_freq_sliding, c.rope_inv_freq_full};
  g.rope_specs = {c.rope_spec_sliding, c.rope_spec_full};
  // Slots are reused by every layer: a layer's temporaries are dead once it ends. x holds the
  // residual between layers, xm within one (after the attention block), an the attention
  // output's post-norm: the ops from that norm to the feed-forward's input norms write no row
  // that they read, so a backend may run them side by side (cuda::chain_router's router blocks
  // read x and the attention output while its chain block writes an, xm and the norms).
  const int x = g.add_slot(H), xm = g.add_slot(H), an = g.add_slot(H), h = g.add_slot(H), q = g.add_slot(max_q),
            kr = g.add_slot(max_kv), k = g.add_slot(max_kv), vr = g.add_slot(max_kv), v = g.add_slot(max_kv),
            o = g.add_slot(max_q), ao = g.add_slot(H), gate = g.add_slot(max_ffn),
            up = g.add_slot(max_ffn), m = g.add_slot(H);
  auto op = [&](OpKind kind, int out, int a, int n, const TensorView* wt = nullptr,
                const std::string& label = "") -> Op& {
    Op o2{kind};
    o2.out = out; o2.a = a; o2.n = n; o2.w = wt; o2.label = label;
    g.ops.push_back(o2);
    return g.ops.back();
  };
  auto W = [&](const std::string& name) { return w.find(name); };
  auto matmul = [&](int out, int a, const std::string& name) {
    const TensorView* t = W(name);
    op(OpKind::MatMul, out, a, static_cast<int>(t->shape[0]), t, name);
  };
  auto norm = [&](int out, int a, int n, const TensorView* wt, int group, const std::string& label) {
    Op& r = op(OpKind::RmsNorm, out, a, n, wt, label);
    r.f = c.rms_eps;
    r.group = group;
  };
  auto add = [&](int out, int a, int b, int n) { op(OpKind::Add, out, a, n).b = b; };

  op(OpKind::Embed, x, -1, H, W("token_embd.weight"), "embed").f = c.embed_scale;
  int ple = -1;
  if (P > 0) {
    const int tok = g.add_slot(L * P);
    ple = g.add_slot(L * P);
    op(OpKind::Embed, tok, -1, L * P, W("per_layer_token_embd.weight"), "ple_embed").f =
        std::sqrt(static_cast<float>(P));
    matmul(ple, x, "per_layer_model_proj.weight");
    op(OpKind::Scale, ple, ple, L * P).f = 1.0f / std::sqrt(static_cast<float>(H));
    norm(ple, ple, L * P, W("per_layer_proj_norm.weight"), P, "ple_norm");
    add(ple, ple, tok, L * P);
    op(OpKind::Scale, ple, ple, L * P).f = 1.0f / std::sqrt(2.0f);
  }
  int rl = -1, route = -1, rn = -1, h2 = -1, m2 = -1, pg = -1;
  if (c.n_experts > 0) {
    rl = g.add_slot(c.n_experts);
    route = g.add_slot(2 * c.n_experts_used);
    rn = g.add_slot(H);
    h2 = g.add_slot(H);
    m2 = g.add_slot(H);
  }
  if (P > 0) pg = g.add_slot(P);

  for (int i = 0; i < L; ++i) {
    const LayerConfig& l = c.layers[i];
    const int nq = c.n_heads * l.head_dim, nkv = l.n_kv_heads * l.head_dim;
    const int table = l.sliding ? 0 : 1;
    // ---- attention
    norm(h, x, H, W(blk(i, "attn_norm.weight")), H, blk(i, "attn_norm"));
    matmul(q, h, blk(i, "attn_q.weight"));
    norm(q, q, nq, W(blk(i, "attn_q_norm.weight")), l.head_dim, blk(i, "q_norm"));
    Op& rq = op(OpKind::Rope, q, q, nq, nullptr, blk(i, "rope_q"));
    rq.group = l.head_dim; rq.heads = c.n_heads; rq.table = table;
    if (l.kv_layer == i) {
      matmul(kr, h, blk(i, "attn_k.weight"));
      int vsrc = kr;
      if (!l.v_from_k) { matmul(vr, h, blk(i, "attn_v.weight")); vsrc = vr; }
      norm(k, kr, nkv, W(blk(i, "attn_k_norm.weight")), l.head_dim, blk(i, "k_norm"));
      Op& rk = op(OpKind::Rope, k, k, nkv, nullptr, blk(i, "rope_k"));
      rk.group = l.head_dim; rk.heads = l.n_kv_heads; rk.table = table;
      int vout = vsrc;
      if (c.v_norm) { norm(v, vsrc, nkv, nullptr, l.head_dim, blk(i, "v_norm")); vout = v; }
      Op& s = op(OpKind::StoreKV, -1, k, nkv, nullptr, blk(i, "store_kv"));
      s.b = vout; s.layer = i; s.group = l.head_dim; s.kv_heads = l.n_kv_heads;
    }
    Op& at = op(OpKind::Attention, o, q, nq, nullptr, blk(i, "attention"));
    at.layer = l.kv_layer; at.group = l.head_dim; at.heads = c.n_heads;
    at.kv_heads = l.n_kv_heads; at.f = c.attn_scale; at.window = l.sliding ? c.sliding_window : 0;
    matmul(ao, o, blk(i, "attn_output.weight"));
    norm(an, ao, H, W(blk(i, "post_attention_norm.weight")), H, blk(i, "post_attention_norm"));
    add(xm, x, an, H);
    // ---- feed-forward: dense GeGLU MLP, and in MoE models the routed experts beside it
    // The three inputs of the feed-forward, all norms of the residual xm, in a row (one launch
    // where a backend chains row ops): the dense MLP's; in MoE models the router's (parameter-free
    // norm times router.scale / sqrt(H)) and the experts'.
    norm(h, xm, H, W(blk(i, "ffn_norm.weight")), H, blk(i, "ffn_norm"));
    if (c.n_experts > 0) {
      norm(rn, xm, H, router_norm_[i], H, blk(i, "router_norm"));
      norm(h2, xm, H, W(blk(i, "pre_ffw_norm_2.weight")), H, blk(i, "pre_ffw_norm_2"));
      // The routed experts read nothing the dense MLP writes: a backend may run the two branches
      // side by side. The experts come first, as the longer chain of dependent steps (product,
      // routing, then products on its result): a backend that runs the second branch on a second
      // queue keeps the first on its main one, where consecutive steps overlap their launches
      // (RESULTS.md, eleventh session: 2 % faster decode on the H200 than the other order).
      // Their post-norms and the sum follow both, in a row.
      matmul(rl, rn, blk(i, "ffn_gate_inp.weight"));
      Op& r = op(OpKind::MoeRoute, route, rl, 2 * c.n_experts_used, nullptr, blk(i, "moe_route"));
      r.k = c.n_experts_used; r.group = c.n_experts; r.w2 = W(blk(i, "ffn_down_exps.scale"));
      Op& e = op(OpKind::MoeExperts, m2, h2, H, W(blk(i, "ffn_gate_up_exps.weight")), blk(i, "moe_experts"));
      e.b = route; e.w2 = W(blk(i, "ffn_down_exps.weight")); e.k = c.expert_ffn_dim;
      e.heads = c.n_experts_used;
    }
    matmul(gate, h, blk(i, "ffn_gate.weight"));
    matmul(up, h, blk(i, "ffn_up.weight"));
    op(OpKind::GeluMul, gate, gate, l.ffn_dim, nullptr, blk(i, "geglu")).b = up;
    matmul(m, gate, blk(i, "ffn_down.weight"));
    if (c.n_experts > 0) {
      norm(m, m, H, W(blk(i, "post_ffw_norm_1.weight")), H, blk(i, "post_ffw_norm_1"));
      norm(m2, m2, H, W(blk(i, "post_ffw_norm_2.weight")), H, blk(i, "post_ffw_norm_2"));
      add(m, m, m2, H);
    }
    norm(m, m, H, W(blk(i, "post_ffw_norm.weight")), H, blk(i, "post_ffw_norm"));
    add(x, xm, m, H);
    // ---- per-layer embedding injection (E2B / E4B)
    if (P > 0) {
      matmul(pg, x, blk(i, "inp_gate.weight"));
      Op& gm = op(OpKind::GeluMul, pg, pg, P, nullptr, blk(i, "ple_gate"));
      gm.b = ple; gm.b_col = i * P;
      matmul(ao, pg, blk(i, "proj.weight"));
      norm(ao, ao, H, W(blk(i, "post_norm.weight")), H, blk(i, "ple_post_norm"));
      add(x, x, ao, H);
    }
    if (layer_scale_[i] != 1.0f) op(OpKind::Scale, x, x, H, nullptr, blk(i, "layer_scalar")).f = layer_scale_[i];
  }
  // ---- head
  int hx = x;
  if (!all_logits) {
    hx = g.add_slot(H, /*last_only=*/true);
    op(OpKind::LastRow, hx, x, H, nullptr, "last_row");
  }
  const int hn = g.add_slot(H, !all_logits);
  norm(hn, hx, H, W("output_norm.weight"), H, "output_norm");
  g.logits = g.add_slot(c.vocab_size, !all_logits);
  const TensorView* head = W("output.weight") ? W("output.weight") : W("token_embd.weight");
  op(OpKind::MatMul, g.logits, hn, c.vocab_size, head, "lm_head");
  if (c.final_softcap > 0)
    op(OpKind::Softcap, g.logits, g.logits, c.vocab_size, nullptr, "softcap").f = c.final_softcap;
  return g;
}

}  // namespace markbase
