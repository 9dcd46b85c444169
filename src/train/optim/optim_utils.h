// Optimisation helpers that must be right across tensor-parallel ranks: the global
// gradient norm and its clipping (the learning-rate schedule: lr_scheduler.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace hyper_parallel::train {

// The 2-norm of all gradients as one global vector: a sharded gradient's pieces are
// summed across its mesh dims (one all-reduce per mesh for all of them together), a
// replicated one is counted once, a Partial one is reduced first. Scales every
// gradient in place by max_norm / norm when the norm exceeds max_norm. Returns the norm.
double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm);

// The sum of squares of a plain tensor's elements accumulated in fp64, without
// materialising an fp64 copy of it (chunks are widened through a small scratch buffer).
double squared_norm_fp64(const at::Tensor& t);

}  // namespace hyper_parallel::train
