// The logits-sized gradient buffer the fused cross-entropy keeps per thread between steps
// (a fresh multi-MiB buffer every step would first-touch new pages, which costs more than
// the loss itself): what it holds, and a way to give it back.
#pragma once

#include <cstdint>

#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// Drops this thread's cached buffer (for callers short of memory, and tests).
void release_gradient_buffers();

// Bytes this thread's cache holds between steps (benchmarks count them as the loss's).
int64_t cached_gradient_buffer_bytes();

}  // namespace hyper_parallel

HP_PUBLIC_END
