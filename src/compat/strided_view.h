// ATen's as_strided kernel for CPU and CUDA tensors, called without the dispatcher: a view
// on the tensor's storage with the given sizes, strides and storage offset, bounds-checked
// against the storage as at::as_strided checks it. LibTorch registers this one native
// function for both devices; its name and header are LibTorch's internals, hence here.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/as_strided_native.h>

#include <cstdint>

namespace hyper_parallel::compat {

inline at::Tensor strided_view(const at::Tensor& t, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                               int64_t storage_offset) {
  return at::native::as_strided_tensorimpl(t, sizes, strides, storage_offset);
}

}  // namespace hyper_parallel::compat
