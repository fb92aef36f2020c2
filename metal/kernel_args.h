// Argument blocks that the Metal host code passes with setBytes and the kernels read as
// `constant X& args`. Included by MSL and by C++: only int and float members (no 3-component
// vectors, which MSL pads), so both sides lay them out identically.
#pragma once

// Embed: out[t, 0:n] = dequant(W[token[t]]) * scale.
struct EmbedArgs { int type, n, row_bytes, out_stride; float scale; };

// RmsNorm over groups of `group` columns of `n`; has_weight: multiply by w. In the fused
// norm-add form out2 += norm(a) (the normalised row is also written back to out).
struct NormArgs { int n, group, a_stride, out_stride, out2_stride, has_weight; float eps; int res_stride; };

// Elementwise ops over rows x n (GeluMul reads b from column b_col).
struct EltArgs { int n, a_stride, b_stride, out_stride, b_col, rows; float f; };

// RoPE over `heads` heads of head_dim at positions pos0 + t (pos0 from the step buffer); in the
// fused form the rows are RMS-normalised per head first (has_norm, eps, norm weight).
struct RopeArgs { int heads, head_dim, a_stride, out_stride, has_norm; float eps; };

// StoreKV: k/v rows of kv_heads x head_dim into the cache at pos0 + t (ring: modulo capacity).
// In the fused form v is RMS-normalised without weight first (v_norm).
struct KVArgs { int kv_heads, head_dim, k_stride, v_stride, ko_stride, vo_stride, capacity, ring, v_norm; float eps; };

// Attention of T query rows (heads x head_dim) over the cache, causal, optionally windowed.
struct AttnArgs { int heads, kv_heads, head_dim, q_stride, out_stride, capacity, ring, window; float scale; };

// MatMul: out[t, r] = dot(W[r], a[t]) for r < n rows of k columns; softcap > 0 caps the result.
// GeGLU form: out[t, r] = gelu(dot(Wg[r], a[t])) * dot(Wu[r], a[t]). has_norm (matvec only): a[t]
// is first RMS-normalised over its k columns and scaled by the norm weight (the norm fused in).
struct MatArgs { int type, n, k, row_bytes, T, a_stride, out_stride; float softcap; int has_norm; float eps; };

// MoE routing: softmax over n_experts logits, top-k, renormalised, times the per-expert scale.
struct RouteArgs { int n_experts, k, a_stride, out_stride, has_scale; };

// MoE experts: gate_up [E][2*ffn][hidden], down [E][hidden][ffn]; route rows [w, id] x k.
// Prefill plans per-expert lists of (token, slot) pairs in tiles of 32 pairs.
struct MoeArgs { int type_gu, type_dn, hidden, ffn, k, T, gu_row_bytes, dn_row_bytes,
                 a_stride, route_stride, out_stride, n_experts; };
