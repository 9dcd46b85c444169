// Runs a test body on N ranks: as threads of this process (a shared HashStore, one
// world per thread) for unit tests, or as real processes through hp-run.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <string>

namespace hyper_parallel::testing {

// Calls fn(rank) on `world_size` threads, each with its own default process group.
// A failure on one rank is reported with its rank; the others are bounded by
// `timeout` in any collective they are left waiting in.
void run_ranks(int64_t world_size, const std::function<void(int64_t rank)>& fn,
               std::chrono::milliseconds timeout = std::chrono::seconds(30));

// The same with CUDA worlds: every rank-thread on cuda:(rank mod #GPUs), over Gloo so that
// several ranks may share one GPU (NCCL refuses that). Call only when has_cuda().
void run_cuda_ranks(int64_t world_size, const std::function<void(int64_t rank)>& fn,
                    std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Whether a CUDA device is usable here; CUDA tests skip with `kNoCudaReason` otherwise.
bool has_cuda();
inline constexpr const char* kNoCudaReason =
    "no CUDA device here (LibTorch without CUDA, or no GPU visible); the CUDA tests run on a "
    "GPU machine through scripts/gpu_check.sh";
#define HP_REQUIRE_CUDA() \
  if (!::hyper_parallel::testing::has_cuda()) GTEST_SKIP() << ::hyper_parallel::testing::kNoCudaReason

// Same random tensor on every rank (seeded generator, independent of thread state).
at::Tensor random_tensor(c10::IntArrayRef shape, uint64_t seed, at::ScalarType dtype = at::kDouble);

// Path of a built binary (hp-run, hp-example ...), from the build's bin directory.
std::string binary_path(const std::string& name);

// Runs a shell command, returns its exit status and combined output.
struct CommandResult {
  int exit_code;
  std::string output;
  double seconds;
};
CommandResult run_command(const std::string& command);

}  // namespace hyper_parallel::testing
