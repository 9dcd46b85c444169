// The fused cross-entropy CUDA kernels: the CPU kernels' algorithm on a grid of
// (row, piece of the row) blocks. Forward: each thread keeps an online (max, sum-exp)
// over its strided share of its block's classes (one exp per element), the block merges
// the threads' states; when a row is split over several blocks (few rows, many classes:
// a block per row would leave most of the GPU idle) a second kernel merges the pieces'
// states per row in piece order, as the ranks' statistics are merged across TP.
// Backward: one pass, the gradient computed in fp32 (double for double) and rounded once.
// Both read (and backward writes) 16 bytes per thread and instruction where the row's
// address allows, scalars for the unaligned head and the tail. No host synchronisation:
// the pieces' states live in a caching-allocator buffer on the stream.
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "loss/kernel/cross_entropy_cpu_kernel.h"
#include "loss/kernel/logits_dtype_dispatch.h"
#include "loss/kernel/running_logsumexp.h"

namespace hyper_parallel::ce_kernel {

namespace {

constexpr int kThreads = 256;
constexpr int kVecBytes = 16;
constexpr int64_t kMaxPieces = 64;

// 16 bytes of consecutive elements: one vector load or store.
template <typename scalar_t>
struct alignas(kVecBytes) Pack {
  static constexpr int kSize = kVecBytes / static_cast<int>(sizeof(scalar_t));
  scalar_t v[kSize];
};

// A block's classes [begin, end) of a row split into an unaligned scalar head, whole
// 16-byte packs, and a scalar tail. `also` is a second row (the gradient) that must share
// the packs' alignment; when it does not, everything is scalar.
struct Span {
  int64_t begin, head_end, packs_end, end;
};
template <typename scalar_t>
__device__ __forceinline__ Span split_span(const scalar_t* row, const scalar_t* also, int64_t begin, int64_t end) {
  constexpr int64_t kSize = Pack<scalar_t>::kSize;
  const auto addr = reinterpret_cast<uintptr_t>(row + begin);
  if (also && (reinterpret_cast<uintptr_t>(also + begin) - addr) % kVecBytes != 0) return {begin, end, end, end};
  const int64_t misaligned = static_cast<int64_t>(addr % kVecBytes) / static_cast<int64_t>(sizeof(scalar_t));
  const int64_t head_end = std::min(end, begin + (misaligned ? kSize - misaligned : 0));
  return {begin, head_end, head_end + (end - head_end) / kSize * kSize, end};
}

// Thread t's share of a span: one(j) for head and tail elements t, t + kThreads, ...;
// pack(j) for the packs starting at j, packs t, t + kThreads, ... (consecutive threads,
// consecutive addresses).
template <int kPackSize, typename One, typename Packed>
__device__ __forceinline__ void for_each_in_span(const Span& span, One&& one, Packed&& pack) {
  for (int64_t j = span.begin + threadIdx.x; j < span.head_end; j += kThreads) one(j);
  for (int64_t j = span.head_end + threadIdx.x * kPackSize; j < span.packs_end; j += kThreads * kPackSize) pack(j);
  for (int64_t j = span.packs_end + threadIdx.x; j < span.end; j += kThreads) one(j);
}

template <typename acc_t>
__device__ __forceinline__ acc_t capped(acc_t x, acc_t cap) {
  return cap > acc_t(0) ? cap * tanh(x / cap) : x;
}

// One thread's, block's or piece's share of a row: the running (max, sum-exp), V1, and the
// relative sum V2 with its weight U (running_logsumexp.h).
template <typename acc_t>
struct RowState {
  acc_t m, s, v1, v2, u;
};

template <typename acc_t>
__device__ __forceinline__ RowState<acc_t> empty_state() {
  return {-std::numeric_limits<acc_t>::infinity(), acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
}

// a <- a and b merged. Every merge order is fixed (threads by a tree, pieces in order), so
// results are deterministic.
template <typename acc_t>
__device__ __forceinline__ void merge(RowState<acc_t>& a, const RowState<acc_t>& b) {
  const acc_t m_a = a.m;
  running_lse_merge(a.m, a.s, b.m, b.s);
  relative_sum_merge(a.v2, a.u, m_a, b.v2, b.u, b.m, a.m);
  a.v1 += b.v1;
}

// The block's states merged into thread 0's.
template <typename acc_t>
__device__ RowState<acc_t> block_merge(RowState<acc_t> st) {
  __shared__ RowState<acc_t> shared[kThreads];
  const int t = threadIdx.x;
  shared[t] = st;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (t < stride) merge(shared[t], shared[t + stride]);
    __syncthreads();
  }
  return shared[0];
}

template <typename acc_t>
struct ForwardRow {
  const ForwardArgs& args;
  const acc_t* w;
  const acc_t* q;  // this row's probability targets, or null
  acc_t cap, q_scale, q_shift;

  // Class j of logit value x into the thread's state.
  __device__ __forceinline__ void push(RowState<acc_t>& st, int64_t j, acc_t x) const {
    const acc_t y = capped(x, cap);
    const acc_t m_before = st.m;
    running_lse_push(st.m, st.s, y);
    if (q) {
      acc_t wq = q[j] * q_scale + q_shift;
      if (w) wq *= w[j];
      st.v1 += wq;
      relative_sum_push(st.v2, st.u, m_before, st.m, y, wq);
    } else if (args.smoothing_sum) {
      relative_sum_push(st.v2, st.u, m_before, st.m, y, w ? w[j] : acc_t(1));
    }
  }

  // Classes j .. j + N - 1 at once: the state as N pushes leave it, with one rescale per
  // pack (running_lse_push_pack) rather than a compare and branch per element.
  template <int N>
  __device__ __forceinline__ void push_pack(RowState<acc_t>& st, int64_t j, const acc_t (&x)[N]) const {
    acc_t y[N];
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = capped(x[i], cap);
    const acc_t m_before = st.m;
    running_lse_push_pack(st.m, st.s, y);
    if (!q && !args.smoothing_sum) return;
    const acc_t ref = relative_sum_reference(st.m);
    rebase_relative_sum(st.v2, st.u, relative_sum_reference(m_before), ref);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      acc_t wq = q ? q[j + i] * q_scale + q_shift : acc_t(1);
      if (w) wq *= w[j + i];
      if (q) st.v1 += wq;
      st.v2 += wq * (y[i] - ref);
      st.u += wq;
    }
  }
};

// The row's statistics from its merged state (index targets: V1 is the target's logit).
template <typename scalar_t, typename acc_t>
__device__ void write_stats(const ForwardArgs& args, int64_t r, RowState<acc_t> st) {
  const scalar_t* x = static_cast<const scalar_t*>(args.x) + r * args.ldx;
  if (!args.q) {
    const int64_t t = args.target_col ? args.target_col[r] : -1;
    st.v1 = t >= 0 ? capped(static_cast<acc_t>(x[t]), static_cast<acc_t>(args.logit_softcap)) : acc_t(0);
  }
  const bool relative = args.q || args.smoothing_sum;
  acc_t* stats = static_cast<acc_t*>(args.stats);
  stats[kMax * args.rows + r] = st.m;
  stats[kSumExp * args.rows + r] = st.s;
  stats[kV1 * args.rows + r] = st.v1;
  stats[kV2 * args.rows + r] = relative ? st.v2 : acc_t(0);
  stats[kU * args.rows + r] = relative ? st.u : acc_t(0);
}

// Block (r, p): row r's classes [p * piece, (p + 1) * piece). One piece per row writes the
// statistics; several write their states to `pieces` ([pieces, rows]) for merge_pieces.
template <typename scalar_t>
__global__ void forward_kernel(ForwardArgs args, int64_t piece, RowState<at::opmath_type<scalar_t>>* pieces) {
  using acc_t = at::opmath_type<scalar_t>;
  using P = Pack<scalar_t>;
  const int64_t r = blockIdx.x;
  const int64_t begin = blockIdx.y * piece, end = std::min(args.cols, begin + piece);
  const scalar_t* x = static_cast<const scalar_t*>(args.x) + r * args.ldx;
  const ForwardRow<acc_t> row{args,
                              static_cast<const acc_t*>(args.weight),
                              args.q ? static_cast<const acc_t*>(args.q) + r * args.ldq : nullptr,
                              static_cast<acc_t>(args.logit_softcap),
                              static_cast<acc_t>(args.q_scale),
                              static_cast<acc_t>(args.q_shift)};
  RowState<acc_t> st = empty_state<acc_t>();
  for_each_in_span<P::kSize>(
      split_span(x, static_cast<const scalar_t*>(nullptr), begin, end),
      [&](int64_t j) { row.push(st, j, static_cast<acc_t>(x[j])); },
      [&](int64_t j) {
        const P pk = *reinterpret_cast<const P*>(x + j);
        acc_t v[P::kSize];
#pragma unroll
        for (int i = 0; i < P::kSize; ++i) v[i] = static_cast<acc_t>(pk.v[i]);
        row.push_pack(st, j, v);
      });
  st = block_merge(st);
  if (threadIdx.x != 0) return;
  if (pieces)
    pieces[blockIdx.y * args.rows + r] = st;
  else
    write_stats<scalar_t>(args, r, st);
}

// A thread per row: the row's pieces merged in order, then its statistics.
template <typename scalar_t>
__global__ void merge_pieces_kernel(ForwardArgs args, int64_t n_pieces,
                                    const RowState<at::opmath_type<scalar_t>>* pieces) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= args.rows) return;
  auto st = pieces[r];
  for (int64_t p = 1; p < n_pieces; ++p) merge(st, pieces[p * args.rows + r]);
  write_stats<scalar_t>(args, r, st);
}

template <typename acc_t>
struct BackwardRow {
  const acc_t* w;
  const acc_t* q;
  acc_t a, b, c, tc, row_max, log_sum, cap;
  int64_t t;

  // The gradient of class j with logit x; cap' = 1 - tanh^2 from the tanh itself, as the
  // CPU kernel and ATen's tanh backward (recovering it as y / cap rounds again).
  __device__ __forceinline__ acc_t grad(int64_t j, acc_t x) const {
    acc_t y = x, th = 0;
    if (cap > 0) {
      th = tanh(x / cap);
      y = cap * th;
    }
    acc_t g = a * running_exp((y - row_max) - log_sum);
    if (b != 0 || c != 0) g -= (q ? b + c * q[j] : b) * (w ? w[j] : acc_t(1));
    if (j == t) g -= tc;
    if (cap > 0) g *= acc_t(1) - th * th;
    return g;
  }
};

// Block (r, p): the gradient of row r's classes [p * piece, (p + 1) * piece). Each element
// is read and written by the same thread in the same instruction's lanes: out may be x.
template <typename scalar_t>
__global__ void backward_kernel(BackwardArgs args, int64_t piece) {
  using acc_t = at::opmath_type<scalar_t>;
  using P = Pack<scalar_t>;
  const int64_t r = blockIdx.x;
  const int64_t begin = blockIdx.y * piece, end = std::min(args.cols, begin + piece);
  const scalar_t* x = static_cast<const scalar_t*>(args.x) + r * args.ldx;
  scalar_t* out = static_cast<scalar_t*>(args.out) + r * args.ldo;
  const BackwardRow<acc_t> row{static_cast<const acc_t*>(args.weight),
                               args.q ? static_cast<const acc_t*>(args.q) + r * args.ldq : nullptr,
                               static_cast<const acc_t*>(args.a)[r],
                               args.b ? static_cast<const acc_t*>(args.b)[r] : acc_t(0),
                               args.c ? static_cast<const acc_t*>(args.c)[r] : acc_t(0),
                               args.t_coef ? static_cast<const acc_t*>(args.t_coef)[r] : acc_t(0),
                               static_cast<const acc_t*>(args.row_max)[r],
                               static_cast<const acc_t*>(args.log_sum)[r],
                               static_cast<acc_t>(args.logit_softcap),
                               args.target_col ? args.target_col[r] : -1};
  const bool zero_row = row.a == 0 && row.b == 0 && row.c == 0 && row.tc == 0;
  // Ignored rows (and rows the loss does not depend on): exactly 0, as ATen gives.
  auto value = [&](int64_t j, scalar_t xj) {
    return zero_row ? scalar_t(0) : static_cast<scalar_t>(row.grad(j, static_cast<acc_t>(xj)));
  };
  for_each_in_span<P::kSize>(
      split_span(x, static_cast<const scalar_t*>(out), begin, end), [&](int64_t j) { out[j] = value(j, x[j]); },
      [&](int64_t j) {
        const P in = *reinterpret_cast<const P*>(x + j);
        P pk;
#pragma unroll
        for (int i = 0; i < P::kSize; ++i) pk.v[i] = value(j + i, in.v[i]);
        *reinterpret_cast<P*>(out + j) = pk;
      });
}

// Pieces per row: enough blocks to fill the GPU several times over when rows are few,
// each piece still a few packs per thread; the piece length a whole number of packs, so
// that every piece starts at the row's alignment (all have the same scalar head, or none).
struct Grid {
  int64_t pieces, piece;
};
Grid grid_for(int64_t rows, int64_t cols, int64_t elem_size, c10::DeviceIndex device) {
  const int64_t pack = kVecBytes / elem_size;
  const int64_t min_piece = int64_t{kThreads} * pack * 4;
  const int64_t want_blocks = int64_t{4} * at::cuda::getDeviceProperties(device)->multiProcessorCount;
  int64_t pieces = rows >= want_blocks ? 1 : (want_blocks + rows - 1) / rows;
  pieces = std::clamp<int64_t>(std::min(pieces, cols / min_piece), 1, kMaxPieces);
  const int64_t piece = std::max<int64_t>(pack, ((cols + pieces - 1) / pieces + pack - 1) / pack * pack);
  return {std::max<int64_t>(1, (cols + piece - 1) / piece), piece};
}

}  // namespace

void cuda_forward_stats(const ForwardArgs& args, c10::DeviceIndex device) {
  if (args.rows == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device);
  fused_ce::dispatch_logits_dtype(args.dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    using State = RowState<at::opmath_type<scalar_t>>;
    const Grid g = grid_for(args.rows, args.cols, sizeof(scalar_t), device);
    // Several pieces per row: their states in a stream-ordered buffer from the caching
    // allocator; one piece writes the statistics itself.
    at::Tensor buffer;
    if (g.pieces > 1)
      buffer = at::empty({static_cast<int64_t>(g.pieces * args.rows * sizeof(State))},
                         at::TensorOptions().dtype(at::kByte).device(at::Device(at::kCUDA, device)));
    auto* pieces = buffer.defined() ? reinterpret_cast<State*>(buffer.data_ptr()) : nullptr;
    forward_kernel<scalar_t><<<dim3(args.rows, g.pieces), kThreads, 0, stream>>>(args, g.piece, pieces);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (!pieces) return;
    const int64_t threads = 128;
    merge_pieces_kernel<scalar_t>
        <<<static_cast<unsigned>((args.rows + threads - 1) / threads), threads, 0, stream>>>(args, g.pieces, pieces);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void cuda_backward(const BackwardArgs& args, c10::DeviceIndex device) {
  if (args.rows == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  fused_ce::dispatch_logits_dtype(args.dtype, [&](auto tag) {
    using scalar_t = decltype(tag);
    const Grid g = grid_for(args.rows, args.cols, sizeof(scalar_t), device);
    backward_kernel<scalar_t>
        <<<dim3(args.rows, g.pieces), kThreads, 0, at::cuda::getCurrentCUDAStream(device)>>>(args, g.piece);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace hyper_parallel::ce_kernel
