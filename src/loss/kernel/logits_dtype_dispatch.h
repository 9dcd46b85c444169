// Calls fn(scalar_t{}) for the logits dtypes the fused cross-entropy kernels support
// (shared by the CPU and CUDA kernels, internal).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "loss/kernel/kernel_runtime.h"

namespace hyper_parallel::fused_ce {

namespace runtime = ce_kernel::runtime;

template <typename Fn>
void dispatch_logits_dtype(c10::ScalarType t, Fn&& fn) {
  switch (t) {
    case c10::ScalarType::Float:
      return fn(float{});
    case c10::ScalarType::Double:
      return fn(double{});
    case c10::ScalarType::BFloat16:
      return fn(c10::BFloat16{});
    case c10::ScalarType::Half:
      return fn(c10::Half{});
    default:
      runtime::fail("fused cross-entropy: unsupported logits dtype ", t);
  }
}

}  // namespace hyper_parallel::fused_ce
