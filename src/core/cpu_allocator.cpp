#include "hyper_parallel/cpu_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

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

struct Block {
  void* ptr;
  size_t size;
};

class CachingCpuAllocator final : public c10::Allocator {
 public:
  explicit CachingCpuAllocator(c10::Allocator* fallback) : fallback_(fallback) {}

  c10::DataPtr allocate(size_t n) override {
    if (n < kMinCachedBytes) return fallback_->allocate(n);
    const size_t size = n < kHugePage ? round_up(n, kSmallGranule) : round_up(n, kHugePage);
    Block* b = take(size);
    if (!b) b = new Block{map(size), size};
    return {b->ptr, b, &release, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count) std::memcpy(dest, src, count);
  }

  CachingCpuAllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, b] : free_) unmap(b);
    free_.clear();
    stats_.cached_bytes = 0;
  }

 private:
  static void release(void* ctx);

  // A cached block of exactly `size` bytes, or null.
  Block* take(size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.large_allocations;
    stats_.in_use_bytes += static_cast<int64_t>(size);
    auto it = free_.find(size);
    if (it == free_.end()) {
      ++stats_.fresh_blocks;
      stats_.reserved_bytes += static_cast<int64_t>(size);
      return nullptr;
    }
    Block* b = it->second;
    free_.erase(it);
    stats_.cached_bytes -= static_cast<int64_t>(size);
    return b;
  }

  void give_back(Block* b) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use_bytes -= static_cast<int64_t>(b->size);
    free_.emplace(b->size, b);
    stats_.cached_bytes += static_cast<int64_t>(b->size);
    // Over the bound: drop the largest free blocks first (the rarest sizes).
    while (stats_.cached_bytes > static_cast<int64_t>(kMaxCachedBytes) && !free_.empty()) {
      auto last = std::prev(free_.end());
      stats_.cached_bytes -= static_cast<int64_t>(last->first);
      unmap(last->second);
      free_.erase(last);
    }
  }

  // Caller holds mu_.
  void unmap(Block* b) {
    ::munmap(b->ptr, b->size);
    stats_.reserved_bytes -= static_cast<int64_t>(b->size);
    delete b;
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
      TORCH_CHECK_WITH(OutOfMemoryError, false, "hyper_parallel CPU allocator: cannot map ", size, " bytes: ",
                       std::strerror(err));
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
  std::multimap<size_t, Block*> free_;
  CachingCpuAllocatorStats stats_;
};

// Never destroyed: tensors it allocated may be freed during static destruction.
CachingCpuAllocator* g_allocator = nullptr;
std::once_flag g_once;

void CachingCpuAllocator::release(void* ctx) { g_allocator->give_back(static_cast<Block*>(ctx)); }

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
