// The fused cross-entropy CPU kernels for CPU capability AVX512 (flags set in CMake).
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#include "loss/kernel/cross_entropy_cpu_kernel_impl.h"
