// The RoPE tables and their application in both channel layouts.
#include "hyper_parallel/models/rope.h"

#include <ATen/ATen.h>

#include <cmath>

namespace hyper_parallel {

namespace {

// Inverse frequencies in float32, operation by operation as transformers computes them
// (compute_default_rope_parameters, _compute_llama3_parameters): Python's `a / t` is
// t.reciprocal() * a, so the same roundings happen here.
at::Tensor hf_inverse_frequencies(const RopeTableOptions& o) {
  const int64_t d = o.head_dim;
  at::Tensor exponent = at::arange(0, d, 2, at::kLong).to(at::kFloat) / static_cast<double>(d);
  at::Tensor inv = at::reciprocal(at::pow(o.theta, exponent));
  if (!o.llama3_scaling) return inv;
  const Llama3RopeScaling& s = *o.llama3_scaling;
  const double old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
  at::Tensor wavelen = at::reciprocal(inv) * (2 * M_PI);
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv / s.factor, inv);
  at::Tensor smooth =
      (at::reciprocal(wavelen) * old_len - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  at::Tensor smoothed = at::rsub(smooth, 1) * scaled / s.factor + smooth * scaled;
  at::Tensor medium = at::logical_not(wavelen < high_wavelen).logical_and(at::logical_not(wavelen > low_wavelen));
  return at::where(medium, smoothed, scaled);
}

// Channels (2i, 2i + 1) rotate together.
at::Tensor rotate_adjacent_pairs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t s = x.size(1);
  at::Tensor c = cos.narrow(0, 0, s).view({1, s, 1, -1}).to(x.scalar_type());
  at::Tensor n = sin.narrow(0, 0, s).view({1, s, 1, -1}).to(x.scalar_type());
  at::Tensor pairs = x.unflatten(-1, {-1, 2});
  at::Tensor even = pairs.select(-1, 0), odd = pairs.select(-1, 1);
  return at::stack({even * c - odd * n, even * n + odd * c}, -1).flatten(-2);
}

// transformers' x * cos + rotate_half(x) * sin: channel i pairs with i + head_dim / 2.
at::Tensor rotate_half(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t s = x.size(1);
  auto table = [&](const at::Tensor& t) {
    const at::Tensor rows = t.narrow(0, 0, s);
    return at::cat({rows, rows}, -1).view({1, s, 1, -1}).to(x.scalar_type());
  };
  const at::Tensor halves = x.unflatten(-1, {2, -1});
  const at::Tensor rotated = at::cat({-halves.select(-2, 1), halves.select(-2, 0)}, -1);
  return x * table(cos) + rotated * table(sin);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> rope_tables(const RopeTableOptions& o) {
  TORCH_CHECK(o.head_dim > 0 && o.head_dim % 2 == 0, "rope_tables: head_dim ", o.head_dim, " must be even and > 0");
  if (o.like_transformers || o.llama3_scaling) {
    // transformers: position_ids.float() * inv_freq, cos/sin in float32.
    at::Tensor angles =
        at::arange(o.max_seq_len, at::kLong).to(at::kFloat).unsqueeze(1) * hf_inverse_frequencies(o).unsqueeze(0);
    return {angles.cos(), angles.sin()};
  }
  const int64_t half = o.head_dim / 2;
  at::Tensor freqs = at::pow(o.theta, -at::arange(half, at::kDouble) * 2.0 / o.head_dim);
  at::Tensor angles = at::outer(at::arange(o.max_seq_len, at::kDouble), freqs);
  return {angles.cos().to(at::kFloat), angles.sin().to(at::kFloat)};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout) {
  return layout == RopeLayout::rotate_half ? rotate_half(x, cos, sin) : rotate_adjacent_pairs(x, cos, sin);
}

}  // namespace hyper_parallel
