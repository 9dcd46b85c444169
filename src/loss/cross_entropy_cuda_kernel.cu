// The fused cross-entropy CUDA kernels: the CPU kernels' algorithm with a row per thread
// block. Forward: each thread keeps an online (max, sum-exp) over its strided share of
// the row (one exp per element), then the block merges the pairs; backward: one pass, the
// gradient computed in fp32 (double for double) and rounded once. Loads are coalesced
// scalar loads (consecutive threads, consecutive classes).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cuda_runtime.h>

#include <limits>

#include "loss/cross_entropy_cpu_kernel.h"
#include "loss/logits_dtype_dispatch.h"
#include "loss/running_logsumexp.h"

namespace hyper_parallel::ce_kernel {

namespace {

constexpr int kThreads = 256;

template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};

template <typename acc_t>
__device__ __forceinline__ acc_t capped(acc_t x, acc_t cap) {
  return cap > acc_t(0) ? cap * tanh(x / cap) : x;
}

// Block-wide merge of (m, s), the sum v1, and the relative sum v2 with its weight u
// (running_logsumexp.h); the result lands in thread 0.
template <typename acc_t>
__device__ void block_reduce(acc_t& m, acc_t& s, acc_t& v1, acc_t& v2, acc_t& u) {
  __shared__ acc_t sm[kThreads], ss[kThreads], s1[kThreads], s2[kThreads], su[kThreads];
  const int t = threadIdx.x;
  sm[t] = m;
  ss[t] = s;
  s1[t] = v1;
  s2[t] = v2;
  su[t] = u;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (t < stride) {
      acc_t mm = sm[t], sss = ss[t], vv = s2[t], uu = su[t];
      running_lse_merge(mm, sss, sm[t + stride], ss[t + stride]);
      relative_sum_merge(vv, uu, sm[t], s2[t + stride], su[t + stride], sm[t + stride], mm);
      sm[t] = mm;
      ss[t] = sss;
      s1[t] += s1[t + stride];
      s2[t] = vv;
      su[t] = uu;
    }
    __syncthreads();
  }
  m = sm[0];
  s = ss[0];
  v1 = s1[0];
  v2 = s2[0];
  u = su[0];
}

template <typename scalar_t>
__global__ void forward_kernel(ForwardArgs args) {
  using acc_t = typename Acc<scalar_t>::type;
  const int64_t r = blockIdx.x;
  const scalar_t* x = static_cast<const scalar_t*>(args.x) + r * args.ldx;
  const acc_t* w = static_cast<const acc_t*>(args.weight);
  const acc_t* q = args.q ? static_cast<const acc_t*>(args.q) + r * args.ldq : nullptr;
  const acc_t cap = static_cast<acc_t>(args.logit_softcap);
  const acc_t q_scale = static_cast<acc_t>(args.q_scale), q_shift = static_cast<acc_t>(args.q_shift);
  const acc_t ninf = -std::numeric_limits<acc_t>::infinity();
  acc_t m = ninf, s = 0, v1 = 0, v2 = 0, u = 0;
  for (int64_t j = threadIdx.x; j < args.cols; j += kThreads) {
    const acc_t y = capped(static_cast<acc_t>(x[j]), cap);
    const acc_t m_before = m;
    running_lse_push(m, s, y);
    if (q) {
      acc_t wq = q[j] * q_scale + q_shift;
      if (w) wq *= w[j];
      v1 += wq;
      relative_sum_push(v2, u, m_before, m, y, wq);
    } else if (args.smoothing_sum) {
      relative_sum_push(v2, u, m_before, m, y, w ? w[j] : acc_t(1));
    }
  }
  block_reduce(m, s, v1, v2, u);
  if (threadIdx.x != 0) return;
  acc_t* stats = static_cast<acc_t*>(args.stats);
  stats[kMax * args.rows + r] = m;
  stats[kSumExp * args.rows + r] = s;
  if (!q) {
    const int64_t t = args.target_col ? args.target_col[r] : -1;
    v1 = t >= 0 ? capped(static_cast<acc_t>(x[t]), cap) : acc_t(0);
  }
  const bool relative = q || args.smoothing_sum;
  stats[kV1 * args.rows + r] = v1;
  stats[kV2 * args.rows + r] = relative ? v2 : acc_t(0);
  stats[kU * args.rows + r] = relative ? u : acc_t(0);
}

template <typename scalar_t>
__global__ void backward_kernel(BackwardArgs args) {
  using acc_t = typename Acc<scalar_t>::type;
  const int64_t r = blockIdx.x;
  const scalar_t* x = static_cast<const scalar_t*>(args.x) + r * args.ldx;
  scalar_t* out = static_cast<scalar_t*>(args.out) + r * args.ldo;
  const acc_t* w = static_cast<const acc_t*>(args.weight);
  const acc_t* q = args.q ? static_cast<const acc_t*>(args.q) + r * args.ldq : nullptr;
  const acc_t a = static_cast<const acc_t*>(args.a)[r];
  const acc_t b = args.b ? static_cast<const acc_t*>(args.b)[r] : acc_t(0);
  const acc_t c = args.c ? static_cast<const acc_t*>(args.c)[r] : acc_t(0);
  const acc_t tc = args.t_coef ? static_cast<const acc_t*>(args.t_coef)[r] : acc_t(0);
  const acc_t row_max = static_cast<const acc_t*>(args.row_max)[r];
  const acc_t log_sum = static_cast<const acc_t*>(args.log_sum)[r];
  const int64_t t = args.target_col ? args.target_col[r] : -1;
  const acc_t cap = static_cast<acc_t>(args.logit_softcap);
  const bool zero_row = a == 0 && b == 0 && c == 0 && tc == 0;
  for (int64_t j = threadIdx.x; j < args.cols; j += kThreads) {
    if (zero_row) {
      out[j] = scalar_t(0);  // ignored rows: exactly 0, as ATen gives
      continue;
    }
    // Each element is read and written by the same thread: out may be x itself.
    const acc_t y = capped(static_cast<acc_t>(x[j]), cap);
    acc_t g = a * exp((y - row_max) - log_sum);
    if (b != 0 || c != 0) g -= (q ? b + c * q[j] : b) * (w ? w[j] : acc_t(1));
    if (j == t) g -= tc;
    if (cap > 0) g *= acc_t(1) - (y / cap) * (y / cap);
    out[j] = static_cast<scalar_t>(g);
  }
}

}  // namespace

void cuda_forward_stats(const ForwardArgs& args, c10::DeviceIndex device) {
  if (args.rows == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  fused_ce::dispatch_logits_dtype(args.dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    forward_kernel<scalar_t><<<args.rows, kThreads, 0, at::cuda::getCurrentCUDAStream(device)>>>(args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void cuda_backward(const BackwardArgs& args, c10::DeviceIndex device) {
  if (args.rows == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  fused_ce::dispatch_logits_dtype(args.dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    backward_kernel<scalar_t><<<args.rows, kThreads, 0, at::cuda::getCurrentCUDAStream(device)>>>(args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace hyper_parallel::ce_kernel
