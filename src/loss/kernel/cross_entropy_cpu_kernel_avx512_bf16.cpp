// The fused cross-entropy CPU kernels for AVX512 CPUs with AVX512-BF16 (Cooper Lake,
// Sapphire Rapids, Zen 4): the AVX512 kernels, with bfloat16 rounded by the hardware's own
// conversion (vcvtne2ps2bf16) instead of integer arithmetic (flags set in CMake).
#define CPU_CAPABILITY AVX512_BF16
#define CPU_CAPABILITY_AVX512
#define HP_CE_HARDWARE_BF16
#include "loss/kernel/cross_entropy_cpu_kernel_impl.h"
