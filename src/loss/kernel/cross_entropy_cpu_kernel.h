// The fused cross-entropy CPU kernels on raw rows (internal): one pass over the logits
// in forward (per-row statistics), one pass in backward (read logits, write gradient).
// Compiled once per CPU capability (DEFAULT, AVX2, AVX512, AVX512_BF16 on x86) and dispatched at run
// time like ATen's own kernels, so the library does not require AVX at build time.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace hyper_parallel::ce_kernel {

// Per-row statistics, [kStats, rows] in the compute type (float for float/half/bfloat16,
// double for double): what the ranks exchange in the forward's one all-gather.
enum Stat : int64_t {
  kMax = 0,     // max over this rank's classes of y (y = softcap(x); not divided by a temperature)
  kSumExp = 1,  // sum of exp((y - max) / T) over them (T: the temperature, 1 but for log-probabilities)
  kV1 = 2,      // index targets: y at the target when this rank owns it, else 0 (not divided by T)
                // probability targets: A = sum_c w_c q'_c
  kV2 = 3,      // index + label smoothing: sum_c w_c (y_c - ref); probability targets:
                // sum_c w_c q'_c (y_c - ref); ref = relative_sum_reference(max) (running_logsumexp.h);
                // entropy_sum: sum_c exp(d_c) d_c, d_c = (y_c - max) / T: the entropy's numerator
  kU = 4,       // the weight summed into kV2: sum_c w_c, or sum_c w_c q'_c (0 when kV2 is unused
                // or holds the entropy sum)
  kStats = 5,
};

// The entropy's terms exp(d) * (...d...) for d = y - max <= 0 take d clamped to this: below it
// exp(d) is exactly 0 in float and double, so the product is 0 where an unclamped -inf (a
// masked logit) would make it NaN, and a finite factor times -1000 cannot overflow. (The
// kernels and the raw combine, cross_entropy_combine.h.)
constexpr double kZeroProbabilityDifference = -1000;

struct ForwardArgs {
  c10::ScalarType dtype;  // of x
  const void* x;          // [rows, cols] with row stride ldx, unit class stride
  int64_t rows = 0, cols = 0, ldx = 0;
  double logit_softcap = 0;             // > 0: y = cap * tanh(x / cap)
  double inv_temperature = 1;           // 1 / T: scales y - max, never y (the log-probabilities')
  const int64_t* target_col = nullptr;  // [rows], local column or -1 (index targets)
  bool smoothing_sum = false;           // fill kV2 and kU (index targets)
  bool entropy_sum = false;             // fill kV2 with the entropy sum (index targets, no smoothing)
  const void* weight = nullptr;         // [cols] compute type, or null (all ones)
  const void* q = nullptr;              // probability targets [rows, cols], compute type, row stride ldq
  int64_t ldq = 0;
  double q_scale = 1, q_shift = 0;  // q' = q * q_scale + q_shift (label smoothing)
  void* stats = nullptr;            // [kStats, rows], compute type
};

// grad_j = cap'(x_j) * (p_j (a_r + e_r d_j) - w_j (b_r + c_r q_j) - [j == t_r] t_coef_r),
// with d_j = (y_j - max_r) * inv_temperature, p_j = exp(d_j - log_sum_r), y_j = softcap(x_j) and
// cap' = 1 - tanh^2(x/cap) (1 without soft-capping); the e term is the entropy's (1 / T is
// the caller's to fold into the coefficients). The difference is taken before it is scaled:
// at a small T, y / T rounded first would put an error of 1 / T ulps of y into every d_j.
// Rows with a = b = c = e = t_coef = 0 get exact zeros. out may be x itself (the gradient
// written over the logits).
// The log-sum-exp travels as (max, log_sum), never as their rounded sum: y - max is exact
// near the max, so the softmax keeps its relative accuracy at any logit scale (a float
// lse of 3e4 is already 1e-3 off, which every exp(y - lse) would carry), as ATen's.
struct BackwardArgs {
  c10::ScalarType dtype;  // of x and out
  const void* x;
  void* out;
  int64_t rows = 0, cols = 0, ldx = 0, ldo = 0;
  double logit_softcap = 0;
  double inv_temperature = 1;
  const void* row_max = nullptr;        // [rows] compute type: max_c y_c over all classes
  const void* log_sum = nullptr;        // [rows] compute type: log sum_c exp((y_c - max) / T)
  const void* a = nullptr;              // [rows] compute type
  const void* b = nullptr;              // [rows] or null (0)
  const void* c = nullptr;              // [rows] or null (0); needs q
  const void* e = nullptr;              // [rows] or null (0)
  const void* t_coef = nullptr;         // [rows] or null (0)
  const int64_t* target_col = nullptr;  // [rows] or null
  const void* weight = nullptr;         // [cols] or null (ones)
  const void* q = nullptr;
  int64_t ldq = 0;
};

void forward_stats(const ForwardArgs& args);
void backward(const BackwardArgs& args);

// Which variant runs here ("DEFAULT", "AVX2", "AVX512", "AVX512_BF16"): benchmarks print it.
const char* capability_name();

// forward_stats and backward run their rows in tasks on the library's threads (kernel_runtime.h:
// LibTorch's intra-op threads, at::get_num_threads(), in libhyper_parallel; OpenMP's in the
// framework-free libhyper_parallel_kernels). For the tests: an observer called at the start of every task, on
// the thread that runs it, with its rows [r0, r1); null (the default) calls none.
using RowTaskObserver = void (*)(int64_t r0, int64_t r1);
void set_row_task_observer(RowTaskObserver observer);
RowTaskObserver row_task_observer();
// Why this build's kernels run every row on the calling thread, or null where they use
// the library's threads (kernel_runtime.h).
const char* serial_rows_reason();

// The per-capability entry points (cross_entropy_cpu_kernel_impl.h instantiates them).
#define HP_CE_DECLARE(CAP)                                      \
  namespace CAP {                                               \
  void forward_stats(const ForwardArgs& args);                  \
  void backward(const BackwardArgs& args);                      \
  double exp_throughput_probe(float* buf, int64_t n, int reps); \
  double read_probe(const float* buf, int64_t n);               \
  void exp_values(const float* x, float* out, int64_t n);       \
  }
HP_CE_DECLARE(DEFAULT)
#if defined(HP_CE_HAVE_AVX2)
HP_CE_DECLARE(AVX2)
#endif
#if defined(HP_CE_HAVE_AVX512)
HP_CE_DECLARE(AVX512)
#endif
#if defined(HP_CE_HAVE_AVX512_BF16)
HP_CE_DECLARE(AVX512_BF16)
#endif
#undef HP_CE_DECLARE

// Sum over `reps` passes of exp(buf[i] - 1) with the kernel's own vectorised exp, for the
// benchmark's exp-throughput limit; returns the sum (so the work is not optimised away).
double exp_throughput_probe(float* buf, int64_t n, int reps);
// Sum of buf[0, n) with vectorised loads on ATen's threads: the benchmark's read bandwidth.
double read_probe(const float* buf, int64_t n);
// out[i] = exp(x[i]) by the kernel's own float exp, for x <= 0 (tests measure its error).
void exp_values(const float* x, float* out, int64_t n);

}  // namespace hyper_parallel::ce_kernel
