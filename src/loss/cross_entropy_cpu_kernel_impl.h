// The fused cross-entropy CPU kernels, written once and compiled per CPU capability:
// each cross_entropy_cpu_kernel_<cap>.cpp defines CPU_CAPABILITY (and its
// CPU_CAPABILITY_* macro, as ATen's own kernel files do) and includes this file.
//
// Forward: per row, blocks of kBlock classes are converted to the compute type (and
// soft-capped) into an L1-resident buffer while taking their max, then exp-summed from
// that buffer relative to the running max (rescaled when a block raises it). The logits
// are read from memory once; each element costs one exp (two with soft-capping: tanh).
// Backward: one pass, read logits, write gradient, one exp per element, of (y - max) -
// log_sum as ATen's log_softmax forms it (cross_entropy_cpu_kernel.h says why).
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cmath>
#include <limits>
#include <mutex>

#include "loss/cross_entropy_cpu_kernel.h"
#include "loss/logits_dtype_dispatch.h"
#include "loss/running_logsumexp.h"

#ifndef CPU_CAPABILITY
#error "define CPU_CAPABILITY before including cross_entropy_cpu_kernel_impl.h"
#endif

namespace hyper_parallel::ce_kernel::CPU_CAPABILITY {

namespace {

using at::vec::Vectorized;

// Loads/stores two accumulator vectors' worth of elements (a 16-bit vector converts to
// exactly two float vectors), so every type steps by the same kStep.
template <typename scalar_t>
struct Io {
  using acc_t = at::opmath_type<scalar_t>;
  using Vec = Vectorized<acc_t>;
  static constexpr int64_t kStep = 2 * Vec::size();
  static void load2(const scalar_t* p, Vec& a, Vec& b) {
    if constexpr (std::is_same_v<scalar_t, acc_t>) {
      a = Vec::loadu(p);
      b = Vec::loadu(p + Vec::size());
    } else {
      at::vec::load_to_float(p, a, b);
    }
  }
  static void store2(scalar_t* p, const Vec& a, const Vec& b) {
    if constexpr (std::is_same_v<scalar_t, acc_t>) {
      a.store(p);
      b.store(p + Vec::size());
    } else {
      at::vec::convert_from_float<scalar_t>(a, b).store(p);
    }
  }
};

// ATen's polynomial exp for float (no libm call, ~2 ulp), Sleef's for double: for the
// forward's sums, where the errors of many terms average out.
template <typename V>
inline V vexp(const V& v) {
  if constexpr (std::is_same_v<V, Vectorized<float>>)
    return v.exp_u20();
  else
    return v.exp();
}

// The gradient's exp. float and double gradients: Sleef's 1-ulp exp, the one ATen's
// softmax uses: each gradient element is one exp, and the 2-ulp one left float32 gradients
// up to 3.5 ulp off where ATen's are 1.5 (LossAccuracy.*). bf16 / fp16 gradients: the
// polynomial one (it took a bf16 backward from 226 to 146 ms on an AVX2 core); its 2
// ulp of float (2^-22) vanish in the one rounding to 8 or 11 bits (LossAccuracy.* holds
// them to ATen's error in those dtypes).
template <typename scalar_t, typename V>
inline V vexp_gradient(const V& v) {
  if constexpr (sizeof(scalar_t) == 2)
    return vexp(v);
  else
    return v.exp();
}

// x / cap, not x * (1 / cap): the reciprocal is one more rounding, and near saturation
// 1 - tanh^2 turns one ulp of x / cap into hundreds in the gradient (ATen divides).
template <typename acc_t>
inline acc_t softcapped(acc_t x, acc_t cap) {
  return cap > 0 ? cap * std::tanh(x / cap) : x;
}

// Rows per at::parallel_for task: about 64 K elements, so tasks amortise their start.
inline int64_t grain_rows(int64_t cols) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, cols));
}

constexpr int64_t kBlock = 2048;  // classes per block: 8 KiB of float in L1

template <typename scalar_t>
void forward_rows(const ForwardArgs& args, int64_t r0, int64_t r1) {
  using IO = Io<scalar_t>;
  using acc_t = typename IO::acc_t;
  using Vec = typename IO::Vec;
  constexpr int64_t VS = Vec::size();
  constexpr int64_t kStep = IO::kStep;
  static_assert(kBlock % kStep == 0);
  alignas(64) acc_t buf[kBlock];
  alignas(64) acc_t lanes[VS];
  const acc_t cap = static_cast<acc_t>(args.logit_softcap);
  const Vec vcap(cap);
  const auto* x_all = static_cast<const scalar_t*>(args.x);
  const auto* w = static_cast<const acc_t*>(args.weight);
  const auto* q_all = static_cast<const acc_t*>(args.q);
  auto* stats = static_cast<acc_t*>(args.stats);
  const acc_t q_scale = static_cast<acc_t>(args.q_scale), q_shift = static_cast<acc_t>(args.q_shift);
  const acc_t ninf = -std::numeric_limits<acc_t>::infinity();
  const int64_t C = args.cols;
  for (int64_t r = r0; r < r1; ++r) {
    const scalar_t* x = x_all + r * args.ldx;
    const acc_t* q = q_all ? q_all + r * args.ldq : nullptr;
    acc_t m = ninf;
    Vec vs(0), v1(0), v2(0);
    acc_t s_tail = 0, t1 = 0, t2 = 0;
    acc_t u = 0;  // the weight summed into v2 so far (running_logsumexp.h: relative sums)
    for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
      const int64_t n = std::min(kBlock, C - c0);
      const int64_t nv = n - n % kStep;
      // Pass 1 (memory): convert, soft-cap, keep in buf; block max.
      Vec vm(ninf);
      for (int64_t j = 0; j < nv; j += kStep) {
        Vec a, b;
        IO::load2(x + c0 + j, a, b);
        if (cap > 0) {
          a = vcap * (a / vcap).tanh();
          b = vcap * (b / vcap).tanh();
        }
        a.store(buf + j);
        b.store(buf + j + VS);
        vm = at::vec::maximum(vm, at::vec::maximum(a, b));
      }
      vm.store(lanes);
      acc_t bm = ninf;
      for (int64_t l = 0; l < VS; ++l) bm = (std::isnan(lanes[l]) || lanes[l] > bm) ? lanes[l] : bm;
      for (int64_t j = nv; j < n; ++j) {
        buf[j] = softcapped(static_cast<acc_t>(x[c0 + j]), cap);
        bm = (std::isnan(buf[j]) || buf[j] > bm) ? buf[j] : bm;
      }
      // A larger (or NaN) block max rescales what was summed so far, and moves the
      // reference the relative sum v2 is kept against.
      if (!(bm <= m)) {
        const acc_t f = std::exp(m - bm);
        vs = vs * Vec(f);
        s_tail *= f;
        rebase_relative_sum(t2, u, relative_sum_reference(m), relative_sum_reference(bm));
        m = bm;
      }
      // Pass 2 (L1): sum of exp(y - m); all -inf so far contributes nothing. Meanwhile the
      // next block (or the next row's first) is prefetched, a cache line per vector of exps,
      // so that its memory traffic overlaps these exps instead of following them.
      const bool last_block = c0 + kBlock >= C;
      const char* next = !last_block  ? reinterpret_cast<const char*>(x + c0 + kBlock)
                         : r + 1 < r1 ? reinterpret_cast<const char*>(x_all + (r + 1) * args.ldx)
                                      : nullptr;
      const int64_t next_bytes =
          next ? std::min(kBlock, last_block ? C : C - c0 - kBlock) * static_cast<int64_t>(sizeof(scalar_t)) : 0;
      if (m != ninf) {
        const Vec vmax(m);
        for (int64_t j = 0, line = 0; j < nv; j += VS, line += 64) {
          if (line < next_bytes) __builtin_prefetch(next + line);
          vs = vs + vexp(Vec::loadu(buf + j) - vmax);
        }
        for (int64_t j = nv; j < n; ++j) s_tail += std::exp(buf[j] - m);
      }
      const acc_t ref = relative_sum_reference(m);
      const Vec vref(ref);
      if (q) {
        // A = sum w q', B = sum w q' (y - ref)
        const Vec vscale(q_scale), vshift(q_shift);
        Vec vu(0);
        acc_t tu = 0;
        for (int64_t j = 0; j < nv; j += VS) {
          Vec wq = at::vec::fmadd(Vec::loadu(q + c0 + j), vscale, vshift);
          if (w) wq = wq * Vec::loadu(w + c0 + j);
          vu = vu + wq;
          v2 = at::vec::fmadd(wq, Vec::loadu(buf + j) - vref, v2);
        }
        for (int64_t j = nv; j < n; ++j) {
          acc_t wq = q[c0 + j] * q_scale + q_shift;
          if (w) wq *= w[c0 + j];
          tu += wq;
          t2 += wq * (buf[j] - ref);
        }
        v1 = v1 + vu;
        t1 += tu;
        u += at::vec::vec_reduce_all<acc_t>([](Vec& a, Vec& b) { return a + b; }, vu) + tu;
      } else if (args.smoothing_sum) {
        Vec vu(0);
        for (int64_t j = 0; j < nv; j += VS) {
          const Vec y = Vec::loadu(buf + j) - vref;
          if (w) {
            const Vec wj = Vec::loadu(w + c0 + j);
            v2 = at::vec::fmadd(wj, y, v2);
            vu = vu + wj;
          } else {
            v2 = v2 + y;
          }
        }
        acc_t tu = w ? at::vec::vec_reduce_all<acc_t>([](Vec& a, Vec& b) { return a + b; }, vu) : acc_t(nv);
        for (int64_t j = nv; j < n; ++j) {
          t2 += w ? w[c0 + j] * (buf[j] - ref) : buf[j] - ref;
          tu += w ? w[c0 + j] : acc_t(1);
        }
        u += tu;
      }
    }
    const acc_t s = at::vec::vec_reduce_all<acc_t>([](Vec& a, Vec& b) { return a + b; }, vs) + s_tail;
    stats[kMax * args.rows + r] = m;
    stats[kSumExp * args.rows + r] = s;
    if (q) {
      stats[kV1 * args.rows + r] = at::vec::vec_reduce_all<acc_t>([](Vec& a, Vec& b) { return a + b; }, v1) + t1;
    } else {
      const int64_t t = args.target_col ? args.target_col[r] : -1;
      stats[kV1 * args.rows + r] = t >= 0 ? softcapped(static_cast<acc_t>(x[t]), cap) : acc_t(0);
    }
    const bool relative = q || args.smoothing_sum;
    stats[kV2 * args.rows + r] =
        relative ? at::vec::vec_reduce_all<acc_t>([](Vec& a, Vec& b) { return a + b; }, v2) + t2 : acc_t(0);
    stats[kU * args.rows + r] = relative ? u : acc_t(0);
  }
}

template <typename scalar_t>
void backward_rows(const BackwardArgs& args, int64_t r0, int64_t r1) {
  using IO = Io<scalar_t>;
  using acc_t = typename IO::acc_t;
  using Vec = typename IO::Vec;
  constexpr int64_t VS = Vec::size();
  constexpr int64_t kStep = IO::kStep;
  const acc_t cap = static_cast<acc_t>(args.logit_softcap);
  const Vec vcap(cap), vone(1);
  const auto* row_max = static_cast<const acc_t*>(args.row_max);
  const auto* log_sum = static_cast<const acc_t*>(args.log_sum);
  const auto* A = static_cast<const acc_t*>(args.a);
  const auto* B = static_cast<const acc_t*>(args.b);
  const auto* Cc = static_cast<const acc_t*>(args.c);
  const auto* T = static_cast<const acc_t*>(args.t_coef);
  const auto* w = static_cast<const acc_t*>(args.weight);
  const auto* q_all = static_cast<const acc_t*>(args.q);
  const int64_t C = args.cols;
  const int64_t nv = C - C % kStep;
  for (int64_t r = r0; r < r1; ++r) {
    const scalar_t* x = static_cast<const scalar_t*>(args.x) + r * args.ldx;
    scalar_t* out = static_cast<scalar_t*>(args.out) + r * args.ldo;
    const acc_t* q = q_all ? q_all + r * args.ldq : nullptr;
    const acc_t a = A[r], b = B ? B[r] : acc_t(0), c = Cc ? Cc[r] : acc_t(0), tc = T ? T[r] : acc_t(0);
    const int64_t t = args.target_col ? args.target_col[r] : -1;
    if (a == 0 && b == 0 && c == 0 && tc == 0) {
      // Ignored rows (and rows this loss does not depend on): exactly 0, as ATen gives.
      for (int64_t j = 0; j < C; ++j) out[j] = scalar_t(0);
      continue;
    }
    if (!std::isfinite(row_max[r] + log_sum[r])) {
      // A NaN or +inf logit (lse = max + log_sum NaN), or a row all -inf (lse -inf): its whole gradient is
      // NaN, as ATen's (the vectorised exp would turn exp(NaN) into inf).
      for (int64_t j = 0; j < C; ++j) out[j] = static_cast<scalar_t>(std::numeric_limits<acc_t>::quiet_NaN());
      continue;
    }
    // The target's logit, read before the vector loop may overwrite it (out == x).
    const acc_t x_t = t >= 0 ? static_cast<acc_t>(x[t]) : acc_t(0);
    const acc_t mr = row_max[r], lr = log_sum[r];
    const Vec vmax(mr), vlog_sum(lr), va(a), vb(b), vc(c);
    auto grad = [&](Vec xv, int64_t j) {
      // cap' = 1 - tanh^2 from the tanh itself, as ATen's tanh backward: recovering it as
      // y / cap rounds again, and near saturation 1 - th^2 keeps only that rounding.
      Vec y = xv, th(0);
      if (cap > 0) {
        th = (xv / vcap).tanh();
        y = vcap * th;
      }
      Vec g = va * vexp_gradient<scalar_t>((y - vmax) - vlog_sum);
      if (b != 0 || c != 0) {
        Vec sub = q ? at::vec::fmadd(vc, Vec::loadu(q + j), vb) : vb;
        if (w) sub = sub * Vec::loadu(w + j);
        g = g - sub;
      }
      if (cap > 0) g = g * (vone - th * th);
      return g;
    };
    for (int64_t j = 0; j < nv; j += kStep) {
      Vec x0, x1;
      IO::load2(x + j, x0, x1);
      IO::store2(out + j, grad(x0, j), grad(x1, j + VS));
    }
    auto scalar_grad = [&](acc_t xv, int64_t j, bool is_target) {
      const acc_t th = cap > 0 ? std::tanh(xv / cap) : acc_t(0);
      const acc_t y = cap > 0 ? cap * th : xv;
      acc_t g = a * std::exp((y - mr) - lr);
      if (b != 0 || c != 0) g -= (q ? b + c * q[j] : b) * (w ? w[j] : acc_t(1));
      if (is_target) g -= tc;
      if (cap > 0) g *= acc_t(1) - th * th;
      return g;
    };
    for (int64_t j = nv; j < C; ++j) out[j] = static_cast<scalar_t>(scalar_grad(static_cast<acc_t>(x[j]), j, j == t));
    // The target column, computed whole in acc_t and rounded once.
    if (t >= 0) out[t] = static_cast<scalar_t>(scalar_grad(x_t, t, true));
  }
}

}  // namespace

void forward_stats(const ForwardArgs& args) {
  fused_ce::dispatch_logits_dtype(args.dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    at::parallel_for(0, args.rows, grain_rows(args.cols),
                     [&](int64_t r0, int64_t r1) { forward_rows<scalar_t>(args, r0, r1); });
  });
}

void backward(const BackwardArgs& args) {
  fused_ce::dispatch_logits_dtype(args.dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    at::parallel_for(0, args.rows, grain_rows(args.cols),
                     [&](int64_t r0, int64_t r1) { backward_rows<scalar_t>(args, r0, r1); });
  });
}

double exp_throughput_probe(float* buf, int64_t n, int reps) {
  using Vec = Vectorized<float>;
  double total = 0;
  std::mutex mu;
  at::parallel_for(0, n, 1 << 16, [&](int64_t i0, int64_t i1) {
    Vec acc(0);
    const Vec one(1);
    float tail = 0;
    for (int rep = 0; rep < reps; ++rep) {
      int64_t i = i0;
      for (; i + Vec::size() <= i1; i += Vec::size()) acc = acc + vexp(Vec::loadu(buf + i) - one);
      for (; i < i1; ++i) tail += std::exp(buf[i] - 1.f);
    }
    const double part = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, acc) + tail;
    std::lock_guard<std::mutex> lock(mu);
    total += part;
  });
  return total;
}

double read_probe(const float* buf, int64_t n) {
  using Vec = Vectorized<float>;
  constexpr int64_t VS = Vec::size();
  double total = 0;
  std::mutex mu;
  at::parallel_for(0, n, 1 << 16, [&](int64_t i0, int64_t i1) {
    Vec a0(0), a1(0), a2(0), a3(0);  // four chains, so the adds keep up with the loads
    int64_t i = i0;
    for (; i + 4 * VS <= i1; i += 4 * VS) {
      a0 = a0 + Vec::loadu(buf + i);
      a1 = a1 + Vec::loadu(buf + i + VS);
      a2 = a2 + Vec::loadu(buf + i + 2 * VS);
      a3 = a3 + Vec::loadu(buf + i + 3 * VS);
    }
    float tail = 0;
    for (; i < i1; ++i) tail += buf[i];
    const Vec s = a0 + a1 + a2 + a3;
    const double part = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, s) + tail;
    std::lock_guard<std::mutex> lock(mu);
    total += part;
  });
  return total;
}

}  // namespace hyper_parallel::ce_kernel::CPU_CAPABILITY
