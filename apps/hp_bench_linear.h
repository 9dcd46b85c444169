// hp-bench --linear DIM: fused linear + cross-entropy against the head matmul + fused
// cross-entropy, same run, same inputs (apps/hp_bench_linear.cpp).
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/ScalarType.h>

#include "hyper_parallel/core/device_mesh.h"

namespace hp_bench {

struct LinearArgs {
  int64_t tokens = 4096, vocab = 32000, dim = 256;
  int iters = 3;
  c10::ScalarType dtype = c10::kFloat;
  int64_t chunk_tokens = 0, vocab_block = 0;  // 0: the loss's automatic sizes
};

// Prints (rank 0) median time, peak memory and their ratios; returns the exit status.
int run_linear_bench(const LinearArgs& args, const hyper_parallel::DeviceMesh& mesh);

}  // namespace hp_bench
