// hp-bench-dispatch: what the DTensor dispatcher costs per op, against the same op on a
// plain tensor of the local piece's size, measured in the same run.
//
// Small tensors make the op itself cheap, so the ratio shows the dispatcher's overhead:
// argument boxing, rule resolution, the layout-cache lookup, redistribution checks and
// wrapping the result. Ranks are threads of this process (one world each); rounds
// alternate DTensor and plain timings so machine noise hits both alike, and the median
// round is reported. On a GPU ("cuda") the tensors live on the one device every rank shares
// (Gloo: the cases make no collective) and each round ends by waiting for the device, so a
// round is what the host spends issuing the ops.
// Usage: hp-bench-dispatch [ops per round] [rounds] [case name filter] [cpu|cuda]
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "hyper_parallel/hyper_parallel.h"

namespace hp = hyper_parallel;

namespace {

struct Case {
  const char* name;
  std::function<void(const at::Tensor&)> op;
};

// `sync`: a plain tensor on the cases' device; copying it to the host waits for the device.
double time_per_op_us(const std::function<void(const at::Tensor&)>& op, const at::Tensor& x, int iters,
                      const at::Tensor& sync) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) op(x);
  if (sync.is_cuda()) (void)sync.to(at::kCPU);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// False when a rank failed (its error printed).
bool run_world(int world, int iters, int rounds, const std::string& only, const std::string& device) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        hp::InitOptions o;
        o.per_thread = true;
        o.device_type = device;
        if (device == "cuda") o.backend = "gloo";  // ranks share the one GPU
        hp::init_process_group(store, r, world, o);
        auto mesh = hp::init_device_mesh(device, {world}, {"tp"});
        const at::Tensor dt =
            hp::distribute_tensor(at::ones({8 * world, 8}, at::TensorOptions().device(device)), mesh, {hp::Shard(0)});
        const at::Tensor plain = at::ones({8, 8}, at::TensorOptions().device(device));
        const std::vector<Case> cases = {
            {"add [8,8]", [](const at::Tensor& x) { (void)at::add(x, x); }},
            {"mul_ scalar", [](const at::Tensor& x) { const_cast<at::Tensor&>(x).mul_(1.0); }},
            {"transpose", [](const at::Tensor& x) { (void)x.transpose(0, 1); }},
            {"sum(dim 1)", [](const at::Tensor& x) { (void)x.sum(1); }},
        };
        for (const auto& c : cases) {
          if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
          std::vector<double> dts, plains;
          for (int i = 0; i < 200; ++i) {
            c.op(dt);
            c.op(plain);
          }  // warm the cache and allocator
          for (int k = 0; k < rounds; ++k) {
            dts.push_back(time_per_op_us(c.op, dt, iters, plain));
            plains.push_back(time_per_op_us(c.op, plain, iters, plain));
          }
          if (r == 0) {
            const double d = median(dts), p = median(plains);
            std::printf("%-12s world %d  %s  DTensor %6.2f us  plain %6.2f us  ratio %.2fx\n", c.name, world,
                        device.c_str(), d, p, d / p);
          }
        }
        hp::destroy_process_group();
      } catch (const std::exception& e) {
        const auto* error = dynamic_cast<const c10::Error*>(&e);
        std::fprintf(stderr, "hp-bench-dispatch: rank %d: %s\n", r, error ? error->what_without_backtrace() : e.what());
        failed = true;
      }
    });
  }
  for (auto& t : threads) t.join();
  return !failed;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::stoi(argv[1]) : 20000;
  const int rounds = argc > 2 ? std::stoi(argv[2]) : 9;
  const std::string only = argc > 3 ? argv[3] : "";  // run only the cases whose name contains this
  const std::string device = argc > 4 ? argv[4] : "cpu";
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "hp-bench-dispatch: device '%s': expected cpu or cuda\n", device.c_str());
    return 2;
  }
  at::set_num_threads(1);
  std::printf("hp-bench-dispatch: %d ops x %d rounds per case, median round (ranks are threads)\n", iters, rounds);
  if (!run_world(1, iters, rounds, only, device)) return 1;
  return run_world(2, iters, rounds, only, device) ? 0 : 1;
}
