// The few Sleef functions ATen's vector types call in our kernels (Vectorized<double>::exp,
// Vectorized<float/double>::tanh on AVX2 and AVX512: the float64 kernels' exp and the logit
// soft-cap's tanh), for the framework-free library where no libsleef is found (CMakeLists.txt
// beside it). libhyper_parallel takes Sleef's from libtorch_cpu; this library must not need
// LibTorch, so each is the C library's function lane by lane: glibc's exp within 1 ulp as Sleef's
// u10, its tanh within 2 ulp, much slower (these paths only; the float kernels' exp is the kernel's
// own, cross_entropy_cpu_kernel_impl.h). Hidden, so that a process that also loads
// LibTorch keeps Sleef's for LibTorch. (x86 only: the variants other CPUs would take call other
// Sleef functions, not provided here.)
#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>

#define HP_SLEEF_LANES(NAME, TARGET, VEC, SCALAR, LANES, LOAD, STORE, FN)            \
  extern "C" __attribute__((visibility("hidden"), target(TARGET))) VEC NAME(VEC x) { \
    alignas(64) SCALAR v[LANES];                                                     \
    STORE(v, x);                                                                     \
    for (SCALAR & e : v) e = std::FN(e);                                             \
    return LOAD(v);                                                                  \
  }

HP_SLEEF_LANES(Sleef_expd4_u10, "avx2", __m256d, double, 4, _mm256_load_pd, _mm256_store_pd, exp)
HP_SLEEF_LANES(Sleef_tanhd4_u10, "avx2", __m256d, double, 4, _mm256_load_pd, _mm256_store_pd, tanh)
HP_SLEEF_LANES(Sleef_tanhf8_u10, "avx2", __m256, float, 8, _mm256_load_ps, _mm256_store_ps, tanh)
HP_SLEEF_LANES(Sleef_expd8_u10, "avx512f", __m512d, double, 8, _mm512_load_pd, _mm512_store_pd, exp)
HP_SLEEF_LANES(Sleef_tanhd8_u10, "avx512f", __m512d, double, 8, _mm512_load_pd, _mm512_store_pd, tanh)
HP_SLEEF_LANES(Sleef_tanhf16_u10, "avx512f", __m512, float, 16, _mm512_load_ps, _mm512_store_ps, tanh)
#endif
