// A training batch and where a step's batch comes from: what the Trainer feeds the train
// spec's loss, and what a program may hand the Trainer instead of its corpus
// (Trainer::use_training_batches).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel::train {

// One training batch: int64 [batch, seq_len]; target[b, t] is the token that
// follows input[b, t] in the stream (input shifted left by one token).
struct Batch {
  at::Tensor input;
  at::Tensor target;
};

// Where a step's batch comes from: a pure function of the step, so that a resumed run
// sees the same batches and every tensor-parallel rank builds the same batch.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // int64 CPU tensors [rows, seq_len]; step must be >= 0.
  virtual Batch batch_at(int64_t step) const = 0;
};

}  // namespace hyper_parallel::train

HP_PUBLIC_END
