// The fused cross-entropy CUDA kernels (internal; built when LibTorch has CUDA): the same
// arguments and results as the CPU kernels (cross_entropy_cpu_kernel.h), on the current
// CUDA stream, pointers to device memory.
#pragma once

#include "loss/cross_entropy_cpu_kernel.h"

namespace hyper_parallel::ce_kernel {

void cuda_forward_stats(const ForwardArgs& args);
void cuda_backward(const BackwardArgs& args);

}  // namespace hyper_parallel::ce_kernel
