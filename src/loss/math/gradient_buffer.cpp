#include "loss/math/gradient_buffer.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cstdint>

#include <sys/mman.h>

namespace hyper_parallel {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
// Below this, the allocator's own free lists serve repeated requests without faults.
constexpr size_t kMinCachedBytes = size_t{1} << 20;

thread_local at::Tensor cached;

// From LibTorch's allocator (so memory accounting sees it), with huge pages asked for on
// the 2 MiB-aligned part of it before anything touches it.
at::Tensor huge_page_tensor(int64_t rows, int64_t cols, at::ScalarType dtype) {
  at::Tensor t = at::empty({rows, cols}, at::TensorOptions().dtype(dtype));
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t first = (begin + kHugePage - 1) / kHugePage * kHugePage;
  const uintptr_t last = (begin + t.nbytes()) / kHugePage * kHugePage;
  // Advice only: without THP (or with it disabled) this is an ordinary buffer.
  if (last > first) (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  return t;
}

}  // namespace

at::Tensor reusable_gradient_buffer(int64_t rows, int64_t cols, at::ScalarType dtype) {
  const size_t bytes = static_cast<size_t>(rows) * static_cast<size_t>(cols) * c10::elementSize(dtype);
  if (bytes < kMinCachedBytes) return at::empty({rows, cols}, at::TensorOptions().dtype(dtype));
  // Free again when this cache holds the only reference to the tensor and its storage.
  if (cached.defined() && cached.scalar_type() == dtype && cached.numel() == rows * cols && cached.use_count() == 1 &&
      cached.storage().use_count() == 1) {
    return cached.view({rows, cols});
  }
  cached = huge_page_tensor(rows, cols, dtype);
  return cached;
}

void release_gradient_buffers() { cached = at::Tensor(); }

int64_t cached_gradient_buffer_bytes() { return cached.defined() ? static_cast<int64_t>(cached.nbytes()) : 0; }

}  // namespace hyper_parallel
