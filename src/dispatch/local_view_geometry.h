// The local piece's view remade from recorded geometry (internal).
//
// A view op on a strided tensor (transpose, permute, unsqueeze, squeeze ...) derives new
// sizes, strides and a storage offset from its input's and makes a TensorImpl on the same
// storage. For a small DTensor view, running the local op through LibTorch's dispatcher to
// its kernel was a third of the whole call (hp-bench-dispatch's transpose). So the memo of
// the view kernels (unboxed_kernels.cpp, layout_cache.h) keeps, beside the output layout,
// the geometry the op made of the local piece last time, and a later call on a piece of the
// same sizes and strides makes that view with ATen's own as_strided kernel
// (compat/strided_view.h, bounds check included). Recorded and remade only where the local
// call goes straight to the CPU or CUDA kernel (no dispatch mode, autocast, conjugate bit
// or other key in front of it, no symbolic sizes) and the op made a plain view of the same
// storage with the input's keys.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>

#include <array>
#include <cstddef>
#include <cstdint>

namespace hyper_parallel {

// True when the schema's result is a view of its first argument (`Tensor(a) self ... ->
// Tensor(a)`): the ops whose geometry may be recorded.
bool returns_view_of_self(const c10::FunctionSchema& schema);

// What one view op (with fixed arguments) made of a local piece of one geometry.
class LocalViewGeometry {
 public:
  // The view of `local`, when recorded for its sizes and strides and the local call (below
  // autograd) would go straight to the kernel; an undefined tensor otherwise (the caller
  // then runs the op and records what it made). No dispatch: no guard needed around it.
  at::Tensor remake(const at::Tensor& local) const;
  // Records what the op made of `local` (forgets the earlier record when it does not qualify).
  void record(const at::Tensor& local, const at::Tensor& view);

 private:
  // Views of more dims take the op's own path.
  static constexpr size_t kMaxDims = 8;
  struct Geometry {
    size_t dim = 0;
    std::array<int64_t, kMaxDims> sizes{}, strides{};
  };
  bool recorded_ = false;
  Geometry input_, output_;
  int64_t offset_shift_ = 0;  // the view's storage offset minus the input's
};

}  // namespace hyper_parallel
