// A caching CPU allocator for training loops (public; opt-in, process-wide).
//
// LibTorch's CPU allocator hands every request to malloc. glibc serves a block above its
// mmap threshold (128 KiB, adapting up to 32 MiB) with a fresh mmap returned to the kernel
// on free, and trims its heap when the top is free: a training step then first-touches
// new 4 KiB pages, and the kernel zeroing them costs several microseconds a page. The
// allocator installed here keeps blocks of 128 KiB or more once freed and hands
// them out again to requests of the same rounded size (64 KiB granules below 2 MiB, whole
// 2 MiB pages above), so a step reuses the previous step's pages; a block of 2 MiB or more
// is mapped 2 MiB-aligned and advised MADV_HUGEPAGE, so even its first touch faults once
// per 2 MiB where transparent huge pages are available. Smaller requests go to the
// allocator that was installed before. Free blocks beyond 2 GiB are unmapped again.
//
// hp-train's Trainer installs it; other programs call install_caching_cpu_allocator()
// before their first step. Installing twice is a no-op; it stays installed for the life of
// the process (tensors allocated by it may outlive any scope).
#pragma once

#include <cstdint>
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

struct CachingCpuAllocatorStats {
  int64_t large_allocations = 0;  // requests served by the cache (>= the threshold)
  int64_t fresh_blocks = 0;       // of those, the ones that needed a new mapping
  int64_t reserved_bytes = 0;     // mapped now (in use + cached)
  int64_t cached_bytes = 0;       // mapped and free, kept for reuse
  int64_t in_use_bytes = 0;
};

// Installs the allocator as LibTorch's CPU allocator (idempotent, thread-safe).
void install_caching_cpu_allocator();
bool caching_cpu_allocator_installed();
CachingCpuAllocatorStats caching_cpu_allocator_stats();
// Unmaps every cached (free) block; blocks in use stay.
void empty_cpu_allocator_cache();

}  // namespace hyper_parallel

HP_PUBLIC_END
