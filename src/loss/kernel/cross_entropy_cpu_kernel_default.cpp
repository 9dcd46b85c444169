// The fused cross-entropy CPU kernels for CPU capability DEFAULT (flags set in CMake).
#define CPU_CAPABILITY DEFAULT

#include "loss/kernel/cross_entropy_cpu_kernel_impl.h"
