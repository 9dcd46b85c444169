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

// Same random tensor on every rank (seeded generator, independent of thread state).
at::Tensor random_tensor(c10::IntArrayRef shape, uint64_t seed,
                         at::ScalarType dtype = at::kDouble);

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
