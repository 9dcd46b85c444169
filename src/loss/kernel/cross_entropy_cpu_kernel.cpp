// Run-time choice of the fused cross-entropy CPU kernel: the CPU's best capability, or
// ATEN_CPU_CAPABILITY when set (as for ATen's own kernels), capped by what was built.
// (ATen's get_cpu_capability() is not exported from libtorch_cpu, so the CPU is asked here.)
#include "loss/kernel/cross_entropy_cpu_kernel.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "loss/kernel/kernel_runtime.h"

namespace hyper_parallel::ce_kernel {

namespace {

enum class Variant { Default, Avx2, Avx512, Avx512Bf16 };

Variant chosen() {
  static const Variant v = [] {
    const char* env = std::getenv("ATEN_CPU_CAPABILITY");
    const std::string wanted = env ? env : "";
    if (wanted == "default") return Variant::Default;
#if defined(HP_CE_HAVE_AVX512)
    // ATen's AVX512 kernels ask for these four, as the flags this variant is built with.
    if (wanted != "avx2" && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
#if defined(HP_CE_HAVE_AVX512_BF16)
      // ATEN_CPU_CAPABILITY=avx512 keeps the plain AVX512 variant (tests compare the two).
      if (wanted != "avx512" && __builtin_cpu_supports("avx512bf16")) return Variant::Avx512Bf16;
#endif
      return Variant::Avx512;
    }
#endif
#if defined(HP_CE_HAVE_AVX2)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Variant::Avx2;
#endif
    return Variant::Default;
  }();
  return v;
}

}  // namespace

#define HP_CE_DISPATCH(call)                       \
  switch (chosen()) {                              \
    case Variant::Avx512Bf16:                      \
      HP_CE_AVX512_BF16(return AVX512_BF16::call;) \
    case Variant::Avx512:                          \
      HP_CE_AVX512(return AVX512::call;)           \
    case Variant::Avx2:                            \
      HP_CE_AVX2(return AVX2::call;)               \
    case Variant::Default:                         \
      break;                                       \
  }                                                \
  return DEFAULT::call;

#if defined(HP_CE_HAVE_AVX512)
#define HP_CE_AVX512(x) x
#else
#define HP_CE_AVX512(x)
#endif
#if defined(HP_CE_HAVE_AVX512_BF16)
#define HP_CE_AVX512_BF16(x) x
#else
#define HP_CE_AVX512_BF16(x)
#endif
#if defined(HP_CE_HAVE_AVX2)
#define HP_CE_AVX2(x) x
#else
#define HP_CE_AVX2(x)
#endif

void forward_stats(const ForwardArgs& args) { HP_CE_DISPATCH(forward_stats(args)) }
void backward(const BackwardArgs& args) { HP_CE_DISPATCH(backward(args)) }
double exp_throughput_probe(float* buf, int64_t n, int reps) { HP_CE_DISPATCH(exp_throughput_probe(buf, n, reps)) }
double read_probe(const float* buf, int64_t n) { HP_CE_DISPATCH(read_probe(buf, n)) }
void exp_values(const float* x, float* out, int64_t n) { HP_CE_DISPATCH(exp_values(x, out, n)) }

namespace {
std::atomic<RowTaskObserver> the_row_task_observer{nullptr};
}  // namespace

void set_row_task_observer(RowTaskObserver observer) { the_row_task_observer.store(observer); }
RowTaskObserver row_task_observer() { return the_row_task_observer.load(std::memory_order_relaxed); }
const char* serial_rows_reason() { return runtime::serial_reason(); }

const char* capability_name() {
  switch (chosen()) {
    case Variant::Avx512Bf16:
      return "AVX512_BF16";
    case Variant::Avx512:
      return "AVX512";
    case Variant::Avx2:
      return "AVX2";
    case Variant::Default:
      break;
  }
  return "DEFAULT";
}

}  // namespace hyper_parallel::ce_kernel
