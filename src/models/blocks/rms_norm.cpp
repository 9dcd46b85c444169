// RMSNorm scaling by w (Llama's, Qwen3's) or by 1 + w (Gemma 2's), each in its family's
// order of roundings.
#include <ATen/ATen.h>

#include "hyper_parallel/models/decoder_blocks.h"
#include "hyper_parallel/nn/parameters_on_meta.h"

namespace hyper_parallel {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, NormScale scale) : eps_(eps), scale_(scale) {
  // Real under ParametersOnMeta (unless MetaScope::Everything): dim elements, and TP leaves
  // norms as plain tensors, which materialize_parameters cannot turn from meta in place.
  const at::Tensor identity = scale == NormScale::weight ? at::ones({dim}) : at::zeros({dim});
  weight = register_parameter("weight", on_meta_when_everything_is(identity));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const bool reduced = at::isReducedFloatingType(x.scalar_type());
  const at::Tensor xf = reduced ? x.to(at::kFloat) : x;
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps_);
  if (scale_ == NormScale::weight) return normed.to(x.scalar_type()) * weight;
  // transformers' Gemma 2: scaled by (1 + w) in float32, cast after.
  const at::Tensor w = reduced ? weight.to(at::kFloat) : weight;
  return (normed * (w + 1.0)).to(x.scalar_type());
}

}  // namespace hyper_parallel
