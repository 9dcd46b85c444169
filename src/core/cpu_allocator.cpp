#include "hyper_parallel/core/cpu_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include <sys/mman.h>

namespace hyper_parallel {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
// Below this, malloc's own free lists serve repeated requests from pages already touched
// (glibc's heap serves requests under its initial mmap threshold, 128 KiB).
constexpr size_t kMinCachedBytes = size_t{128} << 10;
// Blocks under 2 MiB are rounded to this (they cannot hold a huge page anyway); larger
// ones to whole huge pages. Steps repeat their shapes, so exact-size reuse hits.
constexpr size_t kSmallGranule = size_t{64} << 10;
// Free blocks kept beyond what is in use: a step's working set is reused whole; more than
// this (a validation pass, a checkpoint) is unmapped again.
constexpr size_t kMaxCachedBytes = size_t{2} << 30;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

class CachingCpuAllocator final : public c10::Allocator {
 public:
  explicit CachingCpuAllocator(c10::Allocator* fallback) : fallback_(fallback) {}

  c10::DataPtr allocate(size_t n) override {
    if (n < kMinCachedBytes) return fallback_->allocate(n);
    const size_t size = n < kHugePage ? round_up(n, kSmallGranule) : round_up(n, kHugePage);
    void* p = take(size);
    if (!p) {
      p = map(size);
      std::lock_guard<std::mutex> lock(mu_);
      live_.emplace(p, size);
    }
    // The context is the data pointer itself, as LibTorch's own allocator does: a
    // "simple" data pointer, which copy-on-write clones (at::_lazy_clone) require.
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count) std::memcpy(dest, src, count);
  }

  // oneDNN (bfloat16 matmuls, for one) allocates with raw_allocate and frees with
  // raw_deallocate, i.e. through raw_deleter(): it must free blocks of either origin,
  // ours and the small ones the fallback allocator made. (Without it, LibTorch's assert
  // stopped bfloat16 training.)
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  CachingCpuAllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, p] : free_) unmap(p, size);
    free_.clear();
    stats_.cached_bytes = 0;
  }

 private:
  static void release(void* ctx);

  // A cached block of exactly `size` bytes (now in use), or null.
  void* take(size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.large_allocations;
    stats_.in_use_bytes += static_cast<int64_t>(size);
    auto it = free_.find(size);
    if (it == free_.end()) {
      ++stats_.fresh_blocks;
      stats_.reserved_bytes += static_cast<int64_t>(size);
      return nullptr;
    }
    void* p = it->second;
    free_.erase(it);
    live_.emplace(p, size);
    stats_.cached_bytes -= static_cast<int64_t>(size);
    return p;
  }

  // False when `p` is not a block of ours (a small one from the fallback allocator).
  bool give_back(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return false;
    const size_t size = it->second;
    live_.erase(it);
    stats_.in_use_bytes -= static_cast<int64_t>(size);
    free_.emplace(size, p);
    stats_.cached_bytes += static_cast<int64_t>(size);
    // Over the bound: drop the largest free blocks first (the rarest sizes).
    while (stats_.cached_bytes > static_cast<int64_t>(kMaxCachedBytes) && !free_.empty()) {
      auto last = std::prev(free_.end());
      stats_.cached_bytes -= static_cast<int64_t>(last->first);
      unmap(last->second, last->first);
      free_.erase(last);
    }
    return true;
  }

  // Caller holds mu_.
  void unmap(void* p, size_t size) {
    ::munmap(p, size);
    stats_.reserved_bytes -= static_cast<int64_t>(size);
  }

  // A new mapping of `size` bytes; from 2 MiB on (a multiple of 2 MiB) 2 MiB-aligned, with
  // huge pages asked for.
  void* map(size_t size) {
    const bool huge = size >= kHugePage;
    const size_t request = huge ? size + kHugePage : size;
    void* raw = ::mmap(nullptr, request, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
      empty_cache();  // what is cached may be all that stands in the way
      raw = ::mmap(nullptr, request, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (raw == MAP_FAILED) {
      const int err = errno;
      {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.in_use_bytes -= static_cast<int64_t>(size);
        stats_.reserved_bytes -= static_cast<int64_t>(size);
      }
      TORCH_CHECK_WITH(OutOfMemoryError, false, "hyper_parallel CPU allocator: cannot map ", size,
                       " bytes: ", std::strerror(err));
    }
    if (!huge) return raw;
    const auto begin = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = round_up(begin, kHugePage);
    if (aligned > begin) ::munmap(raw, aligned - begin);
    const uintptr_t end = begin + size + kHugePage;
    if (end > aligned + size) ::munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
    // Advice only: without transparent huge pages this is an ordinary mapping.
    (void)::madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
    return reinterpret_cast<void*>(aligned);
  }

  c10::Allocator* fallback_;
  std::mutex mu_;
  std::multimap<size_t, void*> free_;       // size -> free block
  std::unordered_map<void*, size_t> live_;  // block in use -> its size
  CachingCpuAllocatorStats stats_;
};

// Never destroyed: tensors it allocated may be freed during static destruction.
CachingCpuAllocator* g_allocator = nullptr;
std::once_flag g_once;

void CachingCpuAllocator::release(void* ctx) {
  if (g_allocator->give_back(ctx)) return;
  // Only raw_deallocate hands us a block we did not map: the fallback made it.
  const c10::DeleterFnPtr fallback = g_allocator->fallback_->raw_deleter();
  TORCH_INTERNAL_ASSERT(fallback != nullptr,
                        "hyper_parallel CPU allocator: freeing a block it does not hold, and "
                        "the allocator beneath it cannot free raw blocks");
  fallback(ctx);
}

}  // namespace

void install_caching_cpu_allocator() {
  std::call_once(g_once, [] {
    g_allocator = new CachingCpuAllocator(c10::GetCPUAllocator());
    // Priority above LibTorch's default registration (0), so that it stays ours.
    c10::SetCPUAllocator(g_allocator, /*priority=*/1);
  });
}

bool caching_cpu_allocator_installed() { return g_allocator != nullptr && c10::GetCPUAllocator() == g_allocator; }

CachingCpuAllocatorStats caching_cpu_allocator_stats() {
  return g_allocator ? g_allocator->stats() : CachingCpuAllocatorStats{};
}

void empty_cpu_allocator_cache() {
  if (g_allocator) g_allocator->empty_cache();
}

}  // namespace hyper_parallel
