// Peak CPU memory as LibTorch allocates it, measured the same way for our code and for
// PyTorch's: a counting wrapper around LibTorch's CPU allocator. hp-bench links it; the
// Python side of the side-by-side benchmark loads the same library with ctypes, so both
// numbers come from one implementation. C linkage for that reason.
#pragma once

#include <cstdint>

extern "C" {
// Wraps the current CPU allocator (idempotent). Tensors allocated before are not counted.
void hp_memory_probe_install();
// Bytes allocated now through the wrapper and still alive.
int64_t hp_memory_probe_current_bytes();
// The highest value current_bytes reached since the last reset.
int64_t hp_memory_probe_peak_bytes();
// Starts a new peak at the current value.
void hp_memory_probe_reset_peak();
}

#include <c10/core/Device.h>

namespace hyper_parallel::bench {
// Peak memory on a device: the CPU through the probe above (install it first), a GPU
// through its caching allocator's statistics (what torch.cuda.max_memory_allocated reads).
void reset_peak_memory(c10::Device device);
int64_t current_memory_bytes(c10::Device device);
int64_t peak_memory_bytes(c10::Device device);
// Waits for the device's queued work (no-op on the CPU): timings need it.
void synchronize(c10::Device device);
}  // namespace hyper_parallel::bench
