#include "train/metrics/mfu.h"

#include "hyper_parallel/core/cpu_allocator.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace hyper_parallel::train {

namespace {

void wait_for_device(c10::Device device) {
  if (!device.is_cpu()) c10::impl::VirtualGuardImpl(device.type()).synchronizeDevice(device.index());
}

// Seconds of one n x n x n matmul (inputs made beforehand; a device's queue drained first).
double timed_matmul(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  wait_for_device(a.device());
  const auto start = std::chrono::steady_clock::now();
  at::mm_out(out, a, b);
  wait_for_device(a.device());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string training_dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat:
      return "float32";
    case c10::kDouble:
      return "float64";
    case c10::kBFloat16:
      return "bfloat16";
    default:
      return c10::toString(dtype);
  }
}

PeakFlops time_matmuls(c10::ScalarType dtype, c10::Device device) {
  constexpr double kLongEnough = 0.05;  // s: well above the timer's and the launch's resolution
  const int64_t largest = device.is_cpu() ? 4096 : 16384;
  // Constant inputs: no draw from the global generator, which the job's own randomness uses.
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  int64_t n = 256;
  double best = 0;
  for (;; n *= 2) {
    const at::Tensor a = at::full({n, n}, 0.5, options), b = at::full({n, n}, 0.5, options);
    at::Tensor out = at::empty({n, n}, options);
    at::mm_out(out, a, b);  // first call: library set-up and the output's first touch
    best = timed_matmul(a, b, out);
    if (best >= kLongEnough || n >= largest) {
      for (int repeat = 0; repeat < 2; ++repeat) best = std::min(best, timed_matmul(a, b, out));
      break;
    }
  }
  // hp's caching CPU allocator would keep the matrices' blocks for the whole run, for
  // requests of their sizes only.
  if (device.is_cpu()) empty_cpu_allocator_cache();
  PeakFlops peak;
  peak.tflops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best / 1e12;
  peak.source = "measured (" + std::to_string(n) + "^3 " + training_dtype_name(dtype) + " matmul on " + device.str() +
                ", best of 3)";
  return peak;
}

}  // namespace

PeakFlops measure_matmul_peak(c10::ScalarType dtype, c10::Device device) {
  static std::mutex mutex;
  static std::map<std::tuple<c10::ScalarType, std::string, int>, PeakFlops> measured;
  const auto key = std::make_tuple(dtype, device.str(), at::get_num_threads());
  std::lock_guard<std::mutex> lock(mutex);
  auto it = measured.find(key);
  if (it == measured.end()) it = measured.emplace(key, time_matmuls(dtype, device)).first;
  return it->second;
}

PeakFlops peak_flops(double given_tflops, c10::ScalarType dtype, c10::Device device) {
  if (given_tflops > 0) return {given_tflops, "given (metrics.peak_tflops)"};
  return measure_matmul_peak(dtype, device);
}

ModelFlopsUtilization::ModelFlopsUtilization(int64_t flops_per_token, int64_t ranks, PeakFlops peak)
    : flops_per_token_(flops_per_token), ranks_(ranks), peak_(std::move(peak)) {
  if (flops_per_token <= 0 || ranks <= 0 || !(peak_.tflops > 0)) {
    std::ostringstream os;
    os << "ModelFlopsUtilization: expected positive FLOPs per token, ranks and peak, got " << flops_per_token << ", "
       << ranks << ", " << peak_.tflops << " TFLOPs";
    throw std::invalid_argument(os.str());
  }
}

double ModelFlopsUtilization::tflops_per_rank(double tokens_per_s) const {
  return static_cast<double>(flops_per_token_) * tokens_per_s / static_cast<double>(ranks_) / 1e12;
}

double ModelFlopsUtilization::mfu_pct(double tokens_per_s) const {
  return 100.0 * tflops_per_rank(tokens_per_s) / peak_.tflops;
}

}  // namespace hyper_parallel::train
