// The fused cross-entropy CPU kernels for CPU capability AVX2 (flags set in CMake).
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include "loss/kernel/cross_entropy_cpu_kernel_impl.h"
