// kernel_runtime.h for libhyper_parallel_kernels (no LibTorch at run time): OpenMP's threads
// (OMP_NUM_THREADS, or hpk_set_num_threads) split as at::parallel_for splits them, and standard
// exceptions, which the C interface turns into status codes.
#pragma once

#if !defined(HP_KERNELS_SERIAL)
#include <omp.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <sstream>
#include <stdexcept>

namespace hyper_parallel::ce_kernel::runtime {

// The threads the kernels use: set by the C interface's hpk_set_num_threads for every thread
// of the process (omp_set_num_threads would set the calling thread's only); 0: OpenMP's own
// (OMP_NUM_THREADS, else the cores).
inline std::atomic<int>& requested_threads() {
  static std::atomic<int> threads{0};
  return threads;
}

// At most one task per `grain` elements, one per thread, contiguous; inside another parallel
// region, or for a range of one task, fn runs on the calling thread (no nested teams).
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const Fn& fn) {
  if (begin >= end) return;
#if defined(HP_KERNELS_SERIAL)
  fn(begin, end);
#else
  const int64_t range = end - begin;
  const int requested = requested_threads().load(std::memory_order_relaxed);
  const int threads = requested > 0 ? requested : omp_get_max_threads();
  const int64_t tasks = std::min<int64_t>(threads, (range + grain - 1) / std::max<int64_t>(1, grain));
  if (tasks <= 1 || omp_in_parallel()) {
    fn(begin, end);
    return;
  }
  const int64_t chunk = (range + tasks - 1) / tasks;
  // An exception must not leave an OpenMP region (std::terminate): the first is rethrown here.
  std::exception_ptr error;
#pragma omp parallel num_threads(static_cast <int>(tasks))
  {
    const int64_t b = begin + omp_get_thread_num() * chunk;
    if (b < end) {
      try {
        fn(b, std::min(end, b + chunk));
      } catch (...) {
#pragma omp critical(hp_kernel_runtime_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
#endif
}

template <typename... Args>
[[noreturn]] void fail(const Args&... message) {
  std::ostringstream text;
  (text << ... << message);
  throw std::invalid_argument(text.str());
}

// HP_KERNELS_SERIAL: a compiler without OpenMP (src/kernels_c/CMakeLists.txt).
inline const char* serial_reason() {
#if defined(HP_KERNELS_SERIAL)
  return "this build's compiler has no OpenMP: the kernels run every row on the calling thread";
#else
  return nullptr;
#endif
}

}  // namespace hyper_parallel::ce_kernel::runtime
