// mfu.h — model FLOPs utilisation (PaLM's MFU, as TorchTitan reports it): the FLOPs the
// model needs per token (its family's count, TrainSpec::flops_per_token) times the tokens one
// rank trains per second, against that rank's peak: given by the user (metrics.peak_tflops)
// or measured once at start-up by a timed matmul in the training dtype on the rank's device.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace hyper_parallel::train {

struct PeakFlops {
  double tflops = 0;
  // Where it comes from, for the start-up line: "given (metrics.peak_tflops)", or
  // "measured (2048^3 float32 matmul, best of 3)".
  std::string source;
};

// `given_tflops` when > 0 (named as given), else measure_matmul_peak(dtype, device).
PeakFlops peak_flops(double given_tflops, c10::ScalarType dtype, c10::Device device);

// The TFLOPs of a square matmul in `dtype` on `device` with this thread's intra-op threads:
// the size doubles from 256 until one matmul takes >= 50 ms (at most 4096 on a CPU, 16384
// on a GPU), then the best of three at that size. Measured once per (dtype, device,
// threads) in a process: the answer is a property of the hardware, not of the job.
PeakFlops measure_matmul_peak(c10::ScalarType dtype, c10::Device device);

class ModelFlopsUtilization {
 public:
  // `ranks`: the world; each rank does 1 / ranks of the job's FLOPs (TP ranks share a
  // replica's tokens, data-parallel ranks split the batch: TorchTitan's tokens per device).
  ModelFlopsUtilization(int64_t flops_per_token, int64_t ranks, PeakFlops peak);
  // The TFLOPs one rank achieves while the job trains `tokens_per_s` tokens per second.
  double tflops_per_rank(double tokens_per_s) const;
  // Their share of the rank's peak, in %.
  double mfu_pct(double tokens_per_s) const;
  int64_t flops_per_token() const { return flops_per_token_; }
  const PeakFlops& peak() const { return peak_; }

 private:
  int64_t flops_per_token_;
  int64_t ranks_;
  PeakFlops peak_;
};

}  // namespace hyper_parallel::train
