#include "bench/memory_probe.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace {

class CountingAllocator;
CountingAllocator* probe = nullptr;
std::once_flag installed;

// The context of every DataPtr it returns is the data pointer itself (what
// Allocator::raw_allocate requires: oneDNN's bf16 matmul scratch comes through it); the base
// allocation and its size are kept in a table keyed by that pointer.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    if (data == nullptr) return inner;  // nothing allocated, nothing to count
    const c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_.emplace(data, Entry{std::move(inner), n});
    }
    const int64_t now = current_ += static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &release, device};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void reset_peak() { peak_ = current_.load(); }
  int64_t current() const { return current_; }
  int64_t peak() const { return peak_; }

 private:
  struct Entry {
    c10::DataPtr inner;
    size_t bytes;
  };
  static void release(void* data) {
    Entry e{};
    {
      std::lock_guard<std::mutex> lock(probe->mu_);
      auto it = probe->live_.find(data);
      if (it == probe->live_.end()) return;
      e = std::move(it->second);
      probe->live_.erase(it);
    }
    probe->current_ -= static_cast<int64_t>(e.bytes);
    // e.inner frees the base allocation here, outside the lock.
  }
  c10::Allocator* base_;
  std::atomic<int64_t> current_{0}, peak_{0};
  std::mutex mu_;
  std::unordered_map<void*, Entry> live_;
};

CountingAllocator& the_probe() {
  std::call_once(installed, [] {
    static CountingAllocator allocator(c10::GetCPUAllocator());
    probe = &allocator;
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
  });
  return *probe;
}

}  // namespace

extern "C" {
void hp_memory_probe_install() { the_probe(); }
int64_t hp_memory_probe_current_bytes() { return the_probe().current(); }
int64_t hp_memory_probe_peak_bytes() { return the_probe().peak(); }
void hp_memory_probe_reset_peak() { the_probe().reset_peak(); }
}

namespace hyper_parallel::bench {

namespace {
c10::CachingAllocator::Stat allocated(c10::Device device) {
  auto stats = c10::getDeviceAllocator(device.type())->getDeviceStats(device.index());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
}
}  // namespace

void reset_peak_memory(c10::Device device) {
  if (device.is_cpu()) return hp_memory_probe_reset_peak();
  c10::getDeviceAllocator(device.type())->resetPeakStats(device.index());
}

int64_t current_memory_bytes(c10::Device device) {
  return device.is_cpu() ? hp_memory_probe_current_bytes() : allocated(device).current;
}

int64_t peak_memory_bytes(c10::Device device) {
  return device.is_cpu() ? hp_memory_probe_peak_bytes() : allocated(device).peak;
}

void synchronize(c10::Device device) {
  if (!device.is_cpu()) c10::impl::VirtualGuardImpl(device.type()).synchronizeDevice(device.index());
}

}  // namespace hyper_parallel::bench
