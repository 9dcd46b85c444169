#include "harness/build_paths.h"
#include "harness/rank_harness.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <array>
#include <cstdio>
#include <exception>
#include <thread>
#include <vector>

#include "hyper_parallel/core/distributed.h"

namespace hyper_parallel::testing {

namespace {
void run_rank_threads(int64_t world_size, const std::function<void(int64_t)>& fn, std::chrono::milliseconds timeout,
                      const InitOptions& base) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(timeout);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        InitOptions opts = base;
        opts.per_thread = true;
        opts.timeout = timeout;
        init_process_group(store, r, world_size, opts);
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
      destroy_process_group();
    });
  }
  for (auto& t : threads) t.join();
  for (int64_t r = 0; r < world_size; ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const c10::Error& e) {
      ADD_FAILURE() << "rank " << r << " of " << world_size << " threw: " << e.what_without_backtrace();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " of " << world_size << " threw: " << e.what();
    }
  }
}

}  // namespace

void run_ranks(int64_t world_size, const std::function<void(int64_t)>& fn, std::chrono::milliseconds timeout) {
  run_rank_threads(world_size, fn, timeout, InitOptions{});
}

void run_cuda_ranks(int64_t world_size, const std::function<void(int64_t)>& fn, std::chrono::milliseconds timeout) {
  InitOptions opts;
  opts.device_type = "cuda";
  opts.backend = "gloo";
  run_rank_threads(world_size, fn, timeout, opts);
}

bool has_cuda() { return at::globalContext().hasCUDA() && at::detail::getCUDAHooks().getNumGPUs() > 0; }

at::Tensor random_tensor(c10::IntArrayRef shape, uint64_t seed, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

std::string binary_path(const std::string& name) { return binary_dir() + "/" + name; }

CommandResult run_command(const std::string& command) {
  const auto start = std::chrono::steady_clock::now();
  std::string full = command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return {-1, "popen failed", 0.0};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  int status = pclose(pipe);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return {code, out, secs};
}

}  // namespace hyper_parallel::testing
