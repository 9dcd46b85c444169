// at::parallel_for for our files, checked to be ATen's parallel one: include this, not
// <ATen/Parallel.h>. With ATen's OpenMP backend (AT_PARALLEL_OPENMP, the PyPI wheels)
// at::parallel_for is an inline `#pragma omp parallel` (ATen/ParallelOpenMP.h) that a file
// compiled without OpenMP drops: every task would run on the calling thread, whatever
// at::set_num_threads says, and nothing would fail. cmake/aten_parallel_backend.cmake compiles
// the library with the flags ATen's backend needs; this stops a file that lacks them.
#pragma once

#include <ATen/Parallel.h>

#if !defined(INTRA_OP_PARALLEL) && !defined(HP_INTRA_OP_SERIAL)
#error \
    "at::parallel_for would run on the calling thread only: ATen's parallel backend is OpenMP (AT_PARALLEL_OPENMP) and this file is compiled without OpenMP (cmake/aten_parallel_backend.cmake gives the library the flag)"
#endif

namespace hyper_parallel::compat {

// Why at::parallel_for runs every task on the calling thread in this build, or null where it
// runs them on LibTorch's intra-op threads. HP_INTRA_OP_SERIAL: a compiler that cannot compile
// OpenMP for the runtime LibTorch loads (clang against the wheel's libgomp: the sanitizer build).
inline const char* intra_op_serial_reason() {
#if defined(INTRA_OP_PARALLEL)
  return nullptr;
#else
  return "this build's compiler cannot compile OpenMP for the runtime LibTorch loads (clang against "
         "libgomp; cmake/aten_parallel_backend.cmake), so at::parallel_for runs on the calling thread";
#endif
}

}  // namespace hyper_parallel::compat
