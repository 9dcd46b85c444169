// The fused cross-entropy CUDA kernels (internal; built when LibTorch has CUDA): the same
// arguments and results as the CPU kernels (cross_entropy_cpu_kernel.h), pointers to memory
// of CUDA device `device`; they run under a guard for that device, on its current stream
// (whatever device is current in the calling thread).
#pragma once

#include <c10/core/Device.h>

#include "loss/kernel/cross_entropy_cpu_kernel.h"

namespace hyper_parallel::ce_kernel {

void cuda_forward_stats(const ForwardArgs& args, c10::DeviceIndex device);
void cuda_backward(const BackwardArgs& args, c10::DeviceIndex device);

}  // namespace hyper_parallel::ce_kernel
