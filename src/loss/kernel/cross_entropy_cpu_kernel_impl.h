// The fused cross-entropy CPU kernels, written once and compiled per CPU capability:
// each cross_entropy_cpu_kernel_<cap>.cpp defines CPU_CAPABILITY (and its
// CPU_CAPABILITY_* macro, as ATen's own kernel files do) and includes this file.
//
// Forward: per row, blocks of kBlock classes are converted to the compute type (and
// soft-capped) into an L1-resident buffer while taking their max, then exp-summed from
// that buffer relative to the running max (rescaled when a block raises it). The logits
// are read from memory once; each element costs one exp (two with soft-capping: tanh).
// Backward: one pass, read logits, write gradient, one exp per element, of (y - max) -
// log_sum as ATen's log_softmax forms it (cross_entropy_cpu_kernel.h says why). Every exp
// has an argument <= 0, which lets the kernel take its own exp (exp_of_nonpositive).
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>

#include "loss/kernel/cross_entropy_cpu_kernel.h"
#include "loss/kernel/kernel_runtime.h"
#include "loss/kernel/logits_dtype_dispatch.h"
#include "loss/kernel/running_logsumexp.h"

#ifndef CPU_CAPABILITY
#error "define CPU_CAPABILITY before including cross_entropy_cpu_kernel_impl.h"
#endif

namespace hyper_parallel::ce_kernel::CPU_CAPABILITY {

namespace {

using at::vec::Vectorized;

#if defined(CPU_CAPABILITY_AVX2)
// 16 bf16 values as two float vectors, the even-indexed and the odd-indexed ones: each
// is one instruction on the 32-bit lanes (a bf16 is a float's high half), where widening
// them in order takes five. For loops whose result does not depend on the order
// (elementwise, a max, a sum); store_bf16_pairs puts each value back in its place.
inline void load_bf16_pairs(const c10::BFloat16* p, Vectorized<float>& even, Vectorized<float>& odd) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
#elif defined(CPU_CAPABILITY_AVX512)
// The same for 32 bf16 values on AVX512: two instructions where widening them in order takes
// four (two zero-extensions, two shifts).
inline void load_bf16_pairs(const c10::BFloat16* p, Vectorized<float>& even, Vectorized<float>& odd) {
  const __m512i v = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
#endif

#if defined(HP_CE_HARDWARE_BF16)
// 32 floats (a, then b) as bfloat16 rounded to nearest even by the hardware (AVX512-BF16's
// vcvtne2ps2bf16): one instruction where ATen's integer rounding takes about twenty. It
// flushes float32 denormals (below 2^-126) to zero, where ATen keeps the bits bf16 has room
// for: within 2^-126 of ATen's value.
inline __m512i bf16_of(const Vectorized<float>& a, const Vectorized<float>& b) {
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
}
#endif

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
// fp16 <-> float a half vector at a time, straight from and to memory. vcvtph2ps with a memory
// operand is one arithmetic instruction; ATen's load_to_float loads the whole vector, extracts
// its upper half and converts both from registers, where each conversion also crosses lanes
// (on Intel cores a second micro-op, on the port the exps' FMAs use), five in all per two
// vectors instead of two. Stores likewise skip the insert that joins the halves. The same
// conversions and rounding (to nearest even): the same values.
#if defined(CPU_CAPABILITY_AVX512)
using HalfOfVector = __m256i;
inline Vectorized<float> float_of_half(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline HalfOfVector half_of_float(const Vectorized<float>& v) {
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline void store_half(c10::Half* p, HalfOfVector h) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h); }
inline void stream_half(c10::Half* p, HalfOfVector h) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h); }
#else
using HalfOfVector = __m128i;
inline Vectorized<float> float_of_half(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline HalfOfVector half_of_float(const Vectorized<float>& v) {
  return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline void store_half(c10::Half* p, HalfOfVector h) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h); }
inline void stream_half(c10::Half* p, HalfOfVector h) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), h); }
#endif
#define HP_CE_HALF_FROM_MEMORY
#endif

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
#if defined(HP_CE_HALF_FROM_MEMORY)
    } else if constexpr (std::is_same_v<scalar_t, c10::Half>) {
      a = float_of_half(p);
      b = float_of_half(p + Vec::size());
#endif
    } else {
      at::vec::load_to_float(p, a, b);
    }
  }
  static void store2(scalar_t* p, const Vec& a, const Vec& b) {
    if constexpr (std::is_same_v<scalar_t, acc_t>) {
      a.store(p);
      b.store(p + Vec::size());
#if defined(HP_CE_HARDWARE_BF16)
    } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      _mm512_storeu_si512(p, bf16_of(a, b));
#endif
#if defined(HP_CE_HALF_FROM_MEMORY)
    } else if constexpr (std::is_same_v<scalar_t, c10::Half>) {
      store_half(p, half_of_float(a));
      store_half(p + Vec::size(), half_of_float(b));
#endif
    } else {
      at::vec::convert_from_float<scalar_t>(a, b).store(p);
    }
  }
  // load2 for a caller that needs the values but not their order (a max, a sum):
  // bf16 on AVX2 loads them as even and odd halves (load_bf16_pairs), cheaper.
  static void load2_in_any_order(const scalar_t* p, Vec& a, Vec& b) {
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16>)
      load_bf16_pairs(p, a, b);
    else
      load2(p, a, b);
#else
    load2(p, a, b);
#endif
  }
#if defined(CPU_CAPABILITY_AVX512)
  // store2 past the caches (p 64-byte aligned): streaming_stores says when.
  static void stream2(scalar_t* p, const Vec& a, const Vec& b) {
    if constexpr (std::is_same_v<scalar_t, float>) {
      _mm512_stream_ps(p, a);
      _mm512_stream_ps(p + Vec::size(), b);
    } else if constexpr (std::is_same_v<scalar_t, double>) {
      _mm512_stream_pd(p, a);
      _mm512_stream_pd(p + Vec::size(), b);
#if defined(HP_CE_HARDWARE_BF16)
    } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(p), bf16_of(a, b));
#endif
    } else if constexpr (std::is_same_v<scalar_t, c10::Half>) {
      stream_half(p, half_of_float(a));
      stream_half(p + Vec::size(), half_of_float(b));
    } else {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(p), at::vec::convert_from_float<scalar_t>(a, b));
    }
  }
#endif
#if defined(CPU_CAPABILITY_AVX2)
  // store2 past the caches (p 32-byte aligned): streaming_stores says when.
  static void stream2(scalar_t* p, const Vec& a, const Vec& b) {
    if constexpr (std::is_same_v<scalar_t, float>) {
      _mm256_stream_ps(p, a);
      _mm256_stream_ps(p + Vec::size(), b);
    } else if constexpr (std::is_same_v<scalar_t, double>) {
      _mm256_stream_pd(p, a);
      _mm256_stream_pd(p + Vec::size(), b);
    } else if constexpr (std::is_same_v<scalar_t, c10::Half>) {
      stream_half(p, half_of_float(a));
      stream_half(p + Vec::size(), half_of_float(b));
    } else {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), at::vec::convert_from_float<scalar_t>(a, b));
    }
  }
#endif
};

// A gradient larger than the caches is written with streaming (non-temporal) stores: a
// plain store first reads each line it fills (its owner may hold other bytes of it), a
// third pass over memory the streaming store skips. Smaller ones stay in the caches for
// whoever reads them next (the fused linear loss's matmul reads its chunk right away).
inline bool streaming_stores(const BackwardArgs& args, int64_t element_size) {
  return args.rows * args.cols * element_size >= (int64_t{8} << 20);
}

// 2^n for vectors t = x * log2(e) + kExpMagic (exp_of_nonpositive below): the magic
// constant, 1.5 * 2^23 + 127, makes t's low mantissa bits the integer n + 127, so shifting
// t's bits left by 23 moves exactly n + 127 into the exponent field (0 for n = -127: 0.0).
constexpr float kExpMagic = 12583039.0f;  // 1.5 * 2^23 + 127
inline Vectorized<float> pow2_of_magic(const Vectorized<float>& t) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(t), 23));
#elif defined(CPU_CAPABILITY_AVX2)
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23));
#else
  alignas(64) float lanes[Vectorized<float>::size()];
  t.store(lanes);
  for (float& l : lanes) {
    uint32_t bits;
    std::memcpy(&bits, &l, 4);
    bits <<= 23;
    std::memcpy(&l, &bits, 4);
  }
  return Vectorized<float>::loadu(lanes);
#endif
}

// exp(x) for float vectors with x <= 0 (up to a few units above 0 is fine; above 88 is not):
// the only arguments this kernel takes, y - max and y - log-sum-exp. The domain spares
// the overflow clamp and the scaling tricks general exps need: a lower clamp (x < -88
// gives exactly 0, as do -inf, as ATen's exps flush below FLT_MIN), n = round(x log2 e)
// and 2^n from one FMA and one shift, r = x - n ln 2 in two FMAs (Cody-Waite), and
// e^r ~ 1 + r + r^2 q(r), q of degree 4 fitted for the least relative error on
// |r| <= ln 2 / 2 (3.1e-9; scripts/exp_polynomial.py): six FMAs where the Taylor polynomial
// of degree 7 takes seven for 7.5e-9. Within 1 ulp with a fused FMA (0.84 worst), 1.5
// without (FusedCrossEntropyKernel.ItsExpIsWithinAnUlp* measures it), at 13 vector
// instructions, where ATen's polynomial exp takes 17 for ~2 ulp and Sleef's 1-ulp exp
// about twice as many. On AVX512, 12: vscalefps applies 2^n (for the
// shift and the multiply), and a mask gives exactly 0 below ln(FLT_MIN) in place of the
// clamp (-inf's NaN included; no denormal results, which take the slow path) — the same
// values where they are normal; it is what the 16-bit kernels, bound by their exps rather
// than by memory, gain most from. NaN is not propagated: the callers handle rows with a
// NaN before they reach it.
inline Vectorized<float> exp_of_nonpositive(const Vectorized<float>& x) {
  using Vec = Vectorized<float>;
#if defined(CPU_CAPABILITY_AVX512)
  const Vec xc = x;
#else
  const Vec xc = at::vec::clamp_min(x, Vec(-88.0f));
#endif
  const Vec t = at::vec::fmadd(xc, Vec(1.44269504088896341f), Vec(kExpMagic));
  const Vec n = t - Vec(kExpMagic);
  Vec r = at::vec::fmadd(n, Vec(-0.693145751953125f), xc);  // ln 2's high 16 bits: n * hi exact
  r = at::vec::fmadd(n, Vec(-1.42860682030941723212e-6f), r);
  Vec p(0.0013814583942447865f);
  p = at::vec::fmadd(p, r, Vec(0.008368723934910892f));
  p = at::vec::fmadd(p, r, Vec(0.04166838873132871f));
  p = at::vec::fmadd(p, r, Vec(0.16666520573579802f));
  p = at::vec::fmadd(p, r, Vec(0.49999993443874075f));
  p = at::vec::fmadd(p, r, Vec(1.0f));
  p = at::vec::fmadd(p, r, Vec(1.0f));
#if defined(CPU_CAPABILITY_AVX512)
  const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3365402f), _CMP_GE_OQ);  // ln(FLT_MIN)
  return _mm512_maskz_scalef_ps(normal, p, n);
#else
  return p * pow2_of_magic(t);
#endif
}

// The kernel's exp: the one above for float, Sleef's 1-ulp exp for double.
template <typename V>
inline V vexp(const V& v) {
  if constexpr (std::is_same_v<V, Vectorized<float>>)
    return exp_of_nonpositive(v);
  else
    return v.exp();
}

#if defined(CPU_CAPABILITY_AVX2)
// Stores the even- and odd-indexed values of 16 (load_bf16_pairs' order), each of
// magnitude below 2^100, as bf16 rounded to nearest even as ATen rounds: Veltkamp's split
// h = t - (t - g), t = g (2^16 + 1), is g rounded to 8 significant bits (bf16's), so h's
// high half is the rounded bf16. 8 instructions per 16 values where ATen's integer rounding
// and narrowing take 16 (the bf16 backward's largest cost after the exp). ATen's bits for
// every normal float (checked on 3 M random floats, a third of them ties); a float32
// denormal below 2^-126 keeps bits bf16 has no room for and is truncated, within 2^-133 of
// ATen's value. The magnitude bound keeps t finite.
template <bool kStream>
inline void store_bf16_pairs(c10::BFloat16* p, const Vectorized<float>& even, const Vectorized<float>& odd) {
  // g and t must be rounded floats: GCC contracts a product into a later subtraction (an
  // FMA) by default, and the split of an unrounded g or t is not g's rounding.
  __m256 ge = even, go = odd;
  __asm__("" : "+x"(ge), "+x"(go));
  const __m256 k = _mm256_set1_ps(65537.0f);
  __m256 te = _mm256_mul_ps(ge, k), to = _mm256_mul_ps(go, k);
  __asm__("" : "+x"(te), "+x"(to));
  const __m256 he = _mm256_sub_ps(te, _mm256_sub_ps(te, ge)), ho = _mm256_sub_ps(to, _mm256_sub_ps(to, go));
  // Each 32-bit lane: the even value's bf16 in its low half, the odd value's in its high.
  const __m256i lanes =
      _mm256_blend_epi16(_mm256_srli_epi32(_mm256_castps_si256(he), 16), _mm256_castps_si256(ho), 0xAA);
  if constexpr (kStream)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), lanes);
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), lanes);
}
#endif

// The max of a block's vectors. at::vec::maximum propagates NaN in four instructions whose
// chain, carried from vector to vector, costs about nine cycles per step: more than the
// conversion it follows. Here plain max instructions carry the max, a NaN is remembered
// apart (an unordered compare, off the chain), and value() gives NaN if one was seen.
template <typename acc_t>
struct BlockMax {
  using Vec = Vectorized<acc_t>;
  Vec m = Vec(-std::numeric_limits<acc_t>::infinity());
  void add(const Vec& a, const Vec& b) { m = at::vec::maximum(m, at::vec::maximum(a, b)); }
  Vec value() const { return m; }
};
#if defined(CPU_CAPABILITY_AVX512)
template <>
struct BlockMax<float> {
  __m512 m0 = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), m1 = m0;
  __mmask16 nan = 0;
  void add(const Vectorized<float>& a, const Vectorized<float>& b) {
    nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(m0, a);
    m1 = _mm512_max_ps(m1, b);
  }
  Vectorized<float> value() const {
    return nan ? Vectorized<float>(std::numeric_limits<float>::quiet_NaN()) : Vectorized<float>(_mm512_max_ps(m0, m1));
  }
};
#elif defined(CPU_CAPABILITY_AVX2)
template <>
struct BlockMax<float> {
  __m256 m0 = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), m1 = m0, nan = _mm256_setzero_ps();
  void add(const Vectorized<float>& a, const Vectorized<float>& b) {
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
    m0 = _mm256_max_ps(m0, a);
    m1 = _mm256_max_ps(m1, b);
  }
  Vectorized<float> value() const {
    return _mm256_movemask_ps(nan) ? Vectorized<float>(std::numeric_limits<float>::quiet_NaN())
                                   : Vectorized<float>(_mm256_max_ps(m0, m1));
  }
};
#endif

// x / cap, not x * (1 / cap): the reciprocal is one more rounding, and near saturation
// 1 - tanh^2 turns one ulp of x / cap into hundreds in the gradient (ATen divides).
template <typename acc_t>
inline acc_t softcapped(acc_t x, acc_t cap) {
  return cap > 0 ? cap * std::tanh(x / cap) : x;
}

// Rows per runtime::parallel_for task: at least 64 K logits, twice ATen's own grain
// (at::internal::GRAIN_SIZE), so that a task amortises waking another thread; a call below one
// task (8 x 4000 is 32 K logits) runs on the calling thread and starts no parallel region.
inline int64_t grain_rows(int64_t cols) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, cols));
}

// Rows [0, rows) in tasks on the library's threads (kernel_runtime.h: LibTorch's intra-op
// threads, at::get_num_threads(), or OpenMP's in the framework-free library), each a
// contiguous range of at least grain_rows(cols) rows; fn(r0, r1) does one. A call made inside
// another parallel region runs on its thread (ATen's rule: no nested teams).
// row_task_observer() lets the tests see which threads run which rows.
template <typename Fn>
void parallel_rows(int64_t rows, int64_t cols, const Fn& fn) {
  runtime::parallel_for(0, rows, grain_rows(cols), [&](int64_t r0, int64_t r1) {
    if (const RowTaskObserver observe = row_task_observer()) observe(r0, r1);
    fn(r0, r1);
  });
}

constexpr int64_t kBlock = 2048;  // classes per block: 8 KiB of float in L1

// How far ahead of the logits being read both passes prefetch: the hardware's prefetcher
// alone leaves the loads waiting on memory. Measured on an AVX512 Xeon, 4096 x 32000, one
// thread: forward bf16 26.5 -> 22.5 ms, float 41 -> 39 ms (prefetching the next block at no
// lead vs 2 KiB past it); backward bf16 47 -> 37 ms, float 71 -> 61 ms (none vs 2 KiB ahead).
constexpr int64_t kPrefetchLead = 2048;
// The forward's exp pass prefetches the next block further ahead: 8 KiB past the logits it
// stands for (the same Xeon, 4096 x 16000, one thread, medians of alternating runs: forward
// bf16 19.0 -> 17.2 ms, fp16 20.3 -> 17.7, float 31.2 -> 29.7; 16 KiB: bf16 17.4 -> 18.1).
constexpr int64_t kForwardPrefetchLead = 8192;

template <typename scalar_t>
void forward_rows(const ForwardArgs& args, int64_t r0, int64_t r1) {
  using IO = Io<scalar_t>;
  using acc_t = typename IO::acc_t;
  using Vec = typename IO::Vec;
  constexpr int64_t VS = Vec::size();
  constexpr int64_t kStep = IO::kStep;
  static_assert(kBlock % kStep == 0);
  alignas(64) acc_t buf[kBlock];
  const acc_t cap = static_cast<acc_t>(args.logit_softcap);
  const Vec vcap(cap);
  const auto* x_all = static_cast<const scalar_t*>(args.x);
  const auto* w = static_cast<const acc_t*>(args.weight);
  const auto* q_all = static_cast<const acc_t*>(args.q);
  auto* stats = static_cast<acc_t*>(args.stats);
  const acc_t q_scale = static_cast<acc_t>(args.q_scale), q_shift = static_cast<acc_t>(args.q_shift);
  const acc_t ninf = -std::numeric_limits<acc_t>::infinity();
  // A temperature scales each difference from the max as it is exponentiated, (z - m) / T,
  // never z / T itself: z / T is rounded at its own scale (at T = 1e-3 an ulp of x / T is 1e3
  // ulps of x), and the differences that decide the softmax, taken after that rounding, would
  // carry an error growing as 1 / T; z - m is exact near the max at any T.
  const acc_t inv_t = static_cast<acc_t>(args.inv_temperature);
  const bool scaled = inv_t != acc_t(1);
  const Vec vinv_t(inv_t);
  const bool entropy = args.entropy_sum;
  const int64_t C = args.cols;
  // Without probability targets or a smoothing sum, buf feeds only the max and the sums of
  // exps, so its order within a block is free (Io::load2_in_any_order).
  const bool any_order = !q_all && !args.smoothing_sum;
  for (int64_t r = r0; r < r1; ++r) {
    const scalar_t* x = x_all + r * args.ldx;
    const acc_t* q = q_all ? q_all + r * args.ldq : nullptr;
    acc_t m = ninf;
    Vec vs(0), v1(0), v2(0);
    acc_t s_tail = 0, t1 = 0, t2 = 0;
    Vec vh(0);  // entropy_sum: sum of exp(y - m) (y - m), relative to the running max m
    acc_t h_tail = 0;
    acc_t u = 0;  // the weight summed into v2 so far (running_logsumexp.h: relative sums)
    for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
      const int64_t n = std::min(kBlock, C - c0);
      const int64_t nv = n - n % kStep;
      // Pass 1 (memory): convert, soft-cap, keep in buf; block max. One loop per way of
      // loading and transforming, so that no test runs per vector.
      // Two maxima taking steps in turn: one alone waits a max instruction's latency per
      // step, longer than the step's conversion takes.
      BlockMax<acc_t> max_even, max_odd;
      auto convert = [&](auto load, auto transform) {
        auto step = [&](int64_t j, BlockMax<acc_t>& block_max) {
          Vec a, b;
          load(x + c0 + j, a, b);
          transform(a);
          transform(b);
          a.store(buf + j);
          b.store(buf + j + VS);
          block_max.add(a, b);
        };
        int64_t j = 0;
        for (; j + 2 * kStep <= nv; j += 2 * kStep) {
          step(j, max_even);
          step(j + kStep, max_odd);
        }
        if (j < nv) step(j, max_even);
      };
      auto load = [](const scalar_t* p, Vec& a, Vec& b) { IO::load2(p, a, b); };
      if (cap > 0) {
        convert(load, [&](Vec& v) { v = vcap * (v / vcap).tanh(); });
      } else if (any_order) {
        convert([](const scalar_t* p, Vec& a, Vec& b) { IO::load2_in_any_order(p, a, b); }, [](Vec&) {});
      } else {
        convert(load, [](Vec&) {});
      }
      // NaN if either saw one (at::vec::maximum propagates it).
      acc_t bm = at::vec::vec_reduce_all<acc_t>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); },
                                                at::vec::maximum(max_even.value(), max_odd.value()));
      for (int64_t j = nv; j < n; ++j) {
        buf[j] = softcapped(static_cast<acc_t>(x[c0 + j]), cap);
        bm = (std::isnan(buf[j]) || buf[j] > bm) ? buf[j] : bm;
      }
      // A larger (or NaN) block max rescales what was summed so far, and moves the
      // reference the relative sum v2 is kept against.
      if (!(bm <= m)) {
        const acc_t shift = (m - bm) * inv_t, f = std::exp(shift);
        if (entropy && m != ninf) {
          // With d = (z - m) / T and s = (m - bm) / T: sum e^(d + s) (d + s) = f (sum e^d d + s sum e^d);
          // s clamped as d is (f is 0 below it), so that an overflowing s times 0 is not NaN.
          const acc_t sc = std::max(shift, static_cast<acc_t>(kZeroProbabilityDifference));
          vh = (vh + vs * Vec(sc)) * Vec(f);
          h_tail = (h_tail + s_tail * sc) * f;
        }
        vs = vs * Vec(f);
        s_tail *= f;
        rebase_relative_sum(t2, u, relative_sum_reference(m), relative_sum_reference(bm));
        m = bm;
      }
      // Pass 2 (L1): sum of exp(y - m); all -inf so far contributes nothing. Meanwhile the
      // next block (or the next row's first) is prefetched at the exps' pace, the vector at j
      // fetching the logits kForwardPrefetchLead bytes past j of the next block, so that memory
      // traffic overlaps these exps instead of following them.
      constexpr int64_t kVectorBytes = VS * static_cast<int64_t>(sizeof(scalar_t));
      const bool last_block = c0 + kBlock >= C;
      const char* next = !last_block  ? reinterpret_cast<const char*>(x + c0 + kBlock)
                         : r + 1 < r1 ? reinterpret_cast<const char*>(x_all + (r + 1) * args.ldx)
                                      : nullptr;
      const int64_t next_bytes =
          next ? std::min(kBlock, last_block ? C : C - c0 - kBlock) * static_cast<int64_t>(sizeof(scalar_t)) : 0;
      if (m != ninf && entropy) {
        // The entropy's numerator beside the sum (d clamped: kZeroProbabilityDifference).
        const Vec vmax(m), vfloor(static_cast<acc_t>(kZeroProbabilityDifference));
        // One loop per scaling: at T = 1 no multiply per vector (the log-probabilities' usual T).
        auto entropy_pass = [&](auto scale) {
          for (int64_t j = 0, line = 0; j < nv; j += VS, line += kVectorBytes) {
            if (line < next_bytes && line % 64 == 0) __builtin_prefetch(next + line + kForwardPrefetchLead);
            const Vec d = scale(Vec::loadu(buf + j) - vmax);
            const Vec e = vexp(d);
            vs = vs + e;
            vh = at::vec::fmadd(e, at::vec::clamp_min(d, vfloor), vh);
          }
        };
        if (scaled)
          entropy_pass([&](const Vec& v) { return v * vinv_t; });
        else
          entropy_pass([](const Vec& v) { return v; });
        for (int64_t j = nv; j < n; ++j) {
          const acc_t d = (buf[j] - m) * inv_t, e = std::exp(d);
          s_tail += e;
          h_tail += e * std::max(d, static_cast<acc_t>(kZeroProbabilityDifference));
        }
      } else if (m != ninf && scaled) {
        const Vec vmax(m);
        for (int64_t j = 0, line = 0; j < nv; j += VS, line += kVectorBytes) {
          if (line < next_bytes && line % 64 == 0) __builtin_prefetch(next + line + kForwardPrefetchLead);
          vs = vs + vexp((Vec::loadu(buf + j) - vmax) * vinv_t);
        }
        for (int64_t j = nv; j < n; ++j) s_tail += std::exp((buf[j] - m) * inv_t);
      } else if (m != ninf) {
        const Vec vmax(m);
        for (int64_t j = 0, line = 0; j < nv; j += VS, line += kVectorBytes) {
          if (line < next_bytes && line % 64 == 0) __builtin_prefetch(next + line + kForwardPrefetchLead);
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
        relative  ? at::vec::vec_reduce_all<acc_t>([](Vec& a, Vec& b) { return a + b; }, v2) + t2
        : entropy ? at::vec::vec_reduce_all<acc_t>([](Vec& a, Vec& b) { return a + b; }, vh) + h_tail
                  : acc_t(0);
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
  const auto* E = static_cast<const acc_t*>(args.e);
  const acc_t inv_t = static_cast<acc_t>(args.inv_temperature);
  const bool scaled = inv_t != acc_t(1);
  const Vec vinv_t(inv_t), vfloor(static_cast<acc_t>(kZeroProbabilityDifference));
  const auto* B = static_cast<const acc_t*>(args.b);
  const auto* Cc = static_cast<const acc_t*>(args.c);
  const auto* T = static_cast<const acc_t*>(args.t_coef);
  const auto* w = static_cast<const acc_t*>(args.weight);
  const auto* q_all = static_cast<const acc_t*>(args.q);
  const int64_t C = args.cols;
  const int64_t nv = C - C % kStep;
  [[maybe_unused]] const bool stream = streaming_stores(args, sizeof(scalar_t));
  for (int64_t r = r0; r < r1; ++r) {
    const scalar_t* x = static_cast<const scalar_t*>(args.x) + r * args.ldx;
    scalar_t* out = static_cast<scalar_t*>(args.out) + r * args.ldo;
    const acc_t* q = q_all ? q_all + r * args.ldq : nullptr;
    const acc_t a = A[r], b = B ? B[r] : acc_t(0), c = Cc ? Cc[r] : acc_t(0), tc = T ? T[r] : acc_t(0);
    const acc_t e = E ? E[r] : acc_t(0);
    const int64_t t = args.target_col ? args.target_col[r] : -1;
    if (a == 0 && b == 0 && c == 0 && tc == 0 && e == 0) {
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
    const Vec vmax(mr), vlog_sum(lr), va(a), vb(b), vc(c), ve(e);
    auto grad = [&](Vec xv, int64_t j) {
      // cap' = 1 - tanh^2 from the tanh itself, as ATen's tanh backward: recovering it as
      // y / cap rounds again, and near saturation 1 - th^2 keeps only that rounding.
      Vec z = xv, th(0);
      if (cap > 0) {
        th = (xv / vcap).tanh();
        z = vcap * th;
      }
      // d = (z - max) / T: the difference first, then scaled (forward_rows says why).
      Vec d = z - vmax;
      if (scaled) d = d * vinv_t;
      Vec g;
      if (e != 0) {
        // The entropy's term: p (a + e d), d clamped (kZeroProbabilityDifference).
        g = vexp(d - vlog_sum) * at::vec::fmadd(ve, at::vec::clamp_min(d, vfloor), va);
      } else {
        g = va * vexp(d - vlog_sum);
      }
      if (b != 0 || c != 0) {
        Vec sub = q ? at::vec::fmadd(vc, Vec::loadu(q + j), vb) : vb;
        if (w) sub = sub * Vec::loadu(w + j);
        g = g - sub;
      }
      if (cap > 0) g = g * (vone - th * th);
      return g;
    };
    // The row's vectors: loaded, their gradient taken, stored, each in one of the ways below.
    auto vectors = [&](auto load, auto store, auto gradient) {
      for (int64_t j = 0; j < nv; j += kStep) {
        for (int64_t line = 0; line < kStep * static_cast<int64_t>(sizeof(scalar_t)); line += 64)
          __builtin_prefetch(reinterpret_cast<const char*>(x + j) + kPrefetchLead + line);
        Vec x0, x1;
        load(x + j, x0, x1);
        store(out + j, gradient(x0, j), gradient(x1, j + VS));
      }
    };
    auto load = [](const scalar_t* p, Vec& v0, Vec& v1) { IO::load2(p, v0, v1); };
    auto store = [](scalar_t* p, const Vec& v0, const Vec& v1) { IO::store2(p, v0, v1); };
    // A plain row (no smoothing, weights' term or soft-cap) takes a exp(..) only: no
    // per-vector tests, and registers to spare.
    const bool plain_row = b == 0 && c == 0 && e == 0 && !scaled && !(cap > 0);
    auto plain_grad = [&](const Vec& xv, int64_t) { return va * vexp((xv - vmax) - vlog_sum); };
    if (!plain_row) {
      vectors(load, store, grad);
    } else {
#if defined(CPU_CAPABILITY_AVX2)
      const bool streaming = stream && reinterpret_cast<uintptr_t>(out) % 32 == 0;
      bool pairs = false;
      if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
        // Elementwise, and below 2^100 when |a| is: values in pairs (load_bf16_pairs),
        // rounded by splitting (store_bf16_pairs).
        pairs = std::abs(a) < acc_t(1e30);
        auto load_pairs = [](const scalar_t* p, Vec& v0, Vec& v1) { load_bf16_pairs(p, v0, v1); };
        if (pairs && streaming)
          vectors(
              load_pairs, [](scalar_t* p, const Vec& v0, const Vec& v1) { store_bf16_pairs<true>(p, v0, v1); },
              plain_grad);
        else if (pairs)
          vectors(
              load_pairs, [](scalar_t* p, const Vec& v0, const Vec& v1) { store_bf16_pairs<false>(p, v0, v1); },
              plain_grad);
      }
      if (!pairs && streaming)
        vectors(
            load, [](scalar_t* p, const Vec& v0, const Vec& v1) { IO::stream2(p, v0, v1); }, plain_grad);
      else if (!pairs)
        vectors(load, store, plain_grad);
      // The streamed lines reach memory before the row's scalar stores below, and before
      // another thread reads the gradient.
      if (streaming) _mm_sfence();
#elif defined(CPU_CAPABILITY_AVX512)
      if (stream && reinterpret_cast<uintptr_t>(out) % 64 == 0) {
        vectors(
            load, [](scalar_t* p, const Vec& v0, const Vec& v1) { IO::stream2(p, v0, v1); }, plain_grad);
        _mm_sfence();  // as on AVX2
      } else {
        vectors(load, store, plain_grad);
      }
#else
      vectors(load, store, plain_grad);
#endif
    }
    auto scalar_grad = [&](acc_t xv, int64_t j, bool is_target) {
      const acc_t th = cap > 0 ? std::tanh(xv / cap) : acc_t(0);
      const acc_t d = ((cap > 0 ? cap * th : xv) - mr) * inv_t, p = std::exp(d - lr);
      acc_t g = e != 0 ? p * (a + e * std::max(d, static_cast<acc_t>(kZeroProbabilityDifference))) : a * p;
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
    parallel_rows(args.rows, args.cols, [&](int64_t r0, int64_t r1) { forward_rows<scalar_t>(args, r0, r1); });
  });
}

void backward(const BackwardArgs& args) {
  fused_ce::dispatch_logits_dtype(args.dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    parallel_rows(args.rows, args.cols, [&](int64_t r0, int64_t r1) { backward_rows<scalar_t>(args, r0, r1); });
  });
}

double exp_throughput_probe(float* buf, int64_t n, int reps) {
  using Vec = Vectorized<float>;
  double total = 0;
  std::mutex mu;
  runtime::parallel_for(0, n, 1 << 16, [&](int64_t i0, int64_t i1) {
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
  runtime::parallel_for(0, n, 1 << 16, [&](int64_t i0, int64_t i1) {
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

void exp_values(const float* x, float* out, int64_t n) {
  using Vec = Vectorized<float>;
  alignas(64) float lanes[Vec::size()];
  for (int64_t i = 0; i < n; i += Vec::size()) {
    const int64_t k = std::min<int64_t>(Vec::size(), n - i);
    exp_of_nonpositive(Vec::loadu(x + i, k)).store(lanes);
    std::copy(lanes, lanes + k, out + i);
  }
}

}  // namespace hyper_parallel::ce_kernel::CPU_CAPABILITY
