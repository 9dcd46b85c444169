// What one decoder block keeps for backward, as its family counts it: the per-block term of
// hp-dry-run's activation estimate (train/memory_formula.h adds what lies outside the blocks
// and what activation checkpointing keeps instead). A family gives it through
// ModelFamily::block_activation_bytes; one that does not gets no estimate (hp-dry-run
// --measure measures any family).
#pragma once

#include <cstdint>

#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// One micro-batch as a block sees it on one rank.
struct BlockActivationShape {
  int64_t rows = 0;             // sequences
  int64_t seq = 0;              // tokens per sequence
  int64_t residual_tokens = 0;  // tokens of the residual stream here (rows * seq; its piece under sequence parallel)
  int64_t tp = 1;               // tensor-parallel degree: heads and the MLP's hidden size are split over it
  int64_t element_bytes = 4;    // of the training dtype
  int64_t widened_bytes = 4;    // what norms and softmaxes widen to: max(element_bytes, 4)
  int64_t tokens() const { return rows * seq; }
};

}  // namespace hyper_parallel

HP_PUBLIC_END
