// What the CPU kernels take from the library they are compiled into, and the only thing that
// differs between the two: the threads that run their rows, and how a broken precondition is
// reported. libhyper_parallel takes LibTorch's (kernel_runtime_libtorch.h); the framework-free
// libhyper_parallel_kernels, which must not need LibTorch at run time, takes OpenMP and the
// standard library's (kernel_runtime_standalone.h, chosen by HP_KERNELS_STANDALONE). Each
// defines, in hyper_parallel::ce_kernel::runtime:
//   parallel_for(begin, end, grain, fn)  fn(b, e) over contiguous ranges of at least `grain`,
//                                        at::parallel_for's contract (no nested teams)
//   fail(parts...)                       throws their text (c10::Error / std::invalid_argument)
//   serial_reason()                      why rows run on the calling thread only, or null
#pragma once

#if defined(HP_KERNELS_STANDALONE)
#include "loss/kernel/kernel_runtime_standalone.h"
#else
#include "loss/kernel/kernel_runtime_libtorch.h"
#endif
