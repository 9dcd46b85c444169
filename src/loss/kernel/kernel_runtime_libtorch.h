// kernel_runtime.h for libhyper_parallel: LibTorch's intra-op threads and c10's errors.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>

// CUDA files take fail() only: nvcc compiles them without the OpenMP flags
// compat/intra_op_parallel.h insists on.
#if !defined(__CUDACC__)
#include "compat/intra_op_parallel.h"
#endif

namespace hyper_parallel::ce_kernel::runtime {

#if !defined(__CUDACC__)
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const Fn& fn) {
  at::parallel_for(begin, end, grain, fn);
}

inline const char* serial_reason() { return compat::intra_op_serial_reason(); }
#endif

template <typename... Args>
[[noreturn]] void fail(const Args&... message) {
  TORCH_CHECK(false, message...);
}

}  // namespace hyper_parallel::ce_kernel::runtime
