#include "models/non_finite_values.h"

#include <ATen/ops/argmax.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/isnan.h>

#include <vector>

namespace hyper_parallel::hf {

namespace {

std::vector<int64_t> unravel(int64_t flat, c10::IntArrayRef shape) {
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

}  // namespace

int64_t first_non_finite_code(const at::Tensor& t) {
  const std::vector<int64_t> zeros(t.dim(), 0);
  return first_non_finite_code(t, zeros, t.sizes());
}

int64_t first_non_finite_code(const at::Tensor& piece, c10::IntArrayRef offset, c10::IntArrayRef global_shape) {
  if (piece.numel() == 0 || !piece.is_floating_point()) return -1;
  const at::Tensor bad = at::isfinite(piece).logical_not_().reshape({-1});
  // argmax returns the first maximum: the first bad element, if the maximum is 1.
  const int64_t local = at::argmax(bad.to(at::kByte)).item<int64_t>();
  if (!bad[local].item<bool>()) return -1;
  const at::Tensor value = piece.reshape({-1})[local];
  const int64_t kind = at::isnan(value).item<bool>() ? 0 : (value.item<double>() > 0 ? 1 : 2);
  int64_t flat = 0;
  const std::vector<int64_t> index = unravel(local, piece.sizes());
  for (size_t d = 0; d < index.size(); ++d) flat = flat * global_shape[d] + offset[d] + index[d];
  return flat * 4 + kind;
}

std::string describe_non_finite_code(int64_t code, c10::IntArrayRef shape) {
  static const char* kinds[] = {"NaN", "inf", "-inf"};
  std::string where = "[";
  const std::vector<int64_t> index = unravel(code / 4, shape);
  for (size_t d = 0; d < index.size(); ++d) where += (d ? ", " : "") + std::to_string(index[d]);
  return std::string(kinds[code % 4]) + " at " + where + "]";
}

}  // namespace hyper_parallel::hf
