// Causal grouped-query attention with RoPE, in eager ATen ops (the order of operations of
// transformers' eager attention, so a family's checkpoint agrees with its own model).
#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel/models/decoder_blocks.h"
#include "hyper_parallel/nn/parameters_on_meta.h"
#include "models/module_input.h"

namespace hyper_parallel {

namespace {

// true where query q may not read key k: the future, and under a window w keys k <= q - w.
at::Tensor hidden_keys_mask(int64_t s, int64_t window, at::Device device) {
  const at::Tensor q = at::arange(s, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(1);
  const at::Tensor k = q.view({1, s});
  const at::Tensor future = k > q;
  return window > 0 ? at::logical_or(future, k <= q - window) : future;
}

}  // namespace

GroupedQueryAttentionImpl::GroupedQueryAttentionImpl(const AttentionOptions& o) : options_(o) {
  TORCH_CHECK(o.n_heads > 0 && o.n_kv_heads > 0 && o.n_heads % o.n_kv_heads == 0, "GroupedQueryAttention: n_heads ",
              o.n_heads, " must be a multiple of n_kv_heads ", o.n_kv_heads);
  TORCH_CHECK(o.head_dim > 0 && o.head_dim % 2 == 0, "GroupedQueryAttention: head_dim ", o.head_dim,
              " must be even for RoPE");
  auto make = [&](const char* name, int64_t in, int64_t out) { return register_module(name, new_linear(in, out)); };
  wq = make("wq", o.dim, o.n_heads * o.head_dim);
  wk = make("wk", o.dim, o.n_kv_heads * o.head_dim);
  wv = make("wv", o.dim, o.n_kv_heads * o.head_dim);
  wo = make("wo", o.n_heads * o.head_dim, o.dim);
  if (o.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(o.head_dim, o.qk_norm_eps));
    k_norm = register_module("k_norm", RMSNorm(o.head_dim, o.qk_norm_eps));
  }
}

at::Tensor GroupedQueryAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const AttentionOptions& o = options_;
  const int64_t b = x.size(0), s = x.size(1);
  // Under TP each rank sees only its own heads: -1 heads.
  auto heads = [&](const at::Tensor& t) { return t.view({b, s, -1, o.head_dim}); };
  const at::Tensor in = shared_input(x, {wq.get(), wk.get(), wv.get()});
  at::Tensor q = heads(parallel_forward(wq, in)), k = heads(parallel_forward(wk, in));
  if (q_norm) {  // each head normalised over head_dim, before RoPE (Qwen3)
    q = parallel_forward(q_norm, q);
    k = parallel_forward(k_norm, k);
  }
  q = apply_rope(q, cos, sin, o.rope_layout).transpose(1, 2);
  k = apply_rope(k, cos, sin, o.rope_layout).transpose(1, 2);
  at::Tensor v = heads(parallel_forward(wv, in)).transpose(1, 2);
  if (const int64_t group = o.n_heads / o.n_kv_heads; group > 1) {
    // Query head h reads key/value head h / group, as transformers' repeat_kv (under TP the
    // local query heads read the local key/value heads).
    k = k.repeat_interleave(group, 1);
    v = v.repeat_interleave(group, 1);
  }
  const at::Tensor qk = at::matmul(q, k.transpose(-2, -1));
  // Scaled, then soft-capped, then masked, as transformers' eager attention.
  const at::Tensor scores = soft_cap(
      o.score_scale > 0 ? qk * o.score_scale : qk / std::sqrt(static_cast<double>(o.head_dim)), o.score_softcap);
  const at::Tensor masked =
      scores.masked_fill(hidden_keys_mask(s, o.sliding_window, x.device()), -std::numeric_limits<double>::infinity());
  const bool widen = o.softmax_in_float32 && at::isReducedFloatingType(x.scalar_type());
  const at::Tensor p = widen ? at::softmax(masked, -1, at::kFloat).to(x.scalar_type()) : at::softmax(masked, -1);
  return parallel_forward(wo, at::matmul(p, v).transpose(1, 2).reshape({b, s, -1}));
}

}  // namespace hyper_parallel
