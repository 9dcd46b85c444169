// Finding NaN and infinities in weights: a checkpoint that holds one trains into NaN or,
// in a row no batch uses, writes checkpoints a resume refuses; so loads and exports check.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace hyper_parallel::hf {

// The first element of `t` (row-major) that is NaN or +-inf, encoded as
// flat_index * 4 + kind (kind 0 NaN, 1 +inf, 2 -inf) so that the smallest code over several
// pieces is the first bad element; -1 when every element is finite.
int64_t first_non_finite_code(const at::Tensor& t);
// The same code for the local `piece` of a tensor of `global_shape`, the piece's element 0
// sitting at `offset` in it: the flat index is the global one.
int64_t first_non_finite_code(const at::Tensor& piece, c10::IntArrayRef offset, c10::IntArrayRef global_shape);
// "NaN at [3, 0]", "inf at [0]", "-inf at []": a code of a tensor of `shape` in words.
std::string describe_non_finite_code(int64_t code, c10::IntArrayRef shape);

}  // namespace hyper_parallel::hf
