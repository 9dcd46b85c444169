// Logits-sized gradient buffers for the fused cross-entropy backward (internal; what the
// cache holds and its release are public: hyper_parallel/loss/gradient_buffers.h).
//
// A fresh multi-MiB CPU allocation comes from mmap, so every step would first-touch new
// 4 KiB pages: on the machines measured that fault costs more than the kernel itself.
// Instead each thread keeps its last buffer and hands it out again once nobody else holds
// it (the previous step's gradient has been consumed); a new buffer is backed by
// transparent huge pages where the kernel allows (madvise MADV_HUGEPAGE).
#pragma once

#include <ATen/core/Tensor.h>

#include "hyper_parallel/loss/gradient_buffers.h"

namespace hyper_parallel {

// An uninitialised [rows, cols] tensor of `dtype` on the CPU, reused across calls on this
// thread when the previous one is free again.
at::Tensor reusable_gradient_buffer(int64_t rows, int64_t cols, at::ScalarType dtype);

}  // namespace hyper_parallel
