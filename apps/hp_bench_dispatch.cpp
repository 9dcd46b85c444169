// hp-bench-dispatch: what the DTensor dispatcher costs per op, against the same op on a
// plain tensor of the local piece's size, measured in the same run.
//
// Small tensors make the op itself cheap, so the ratio shows the dispatcher's overhead:
// argument boxing, rule resolution, the layout-cache lookup, redistribution checks and
// wrapping the result. Ranks are threads of this process (one world each); rounds
// alternate DTensor and plain timings so machine noise hits both alike, and the median
// round is reported. Usage: hp-bench-dispatch [ops per round] [rounds] [case name filter]
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
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

double time_per_op_us(const std::function<void(const at::Tensor&)>& op, const at::Tensor& x, int iters) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) op(x);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run_world(int world, int iters, int rounds, const std::string& only) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      hp::InitOptions o;
      o.per_thread = true;
      hp::init_process_group(store, r, world, o);
      auto mesh = hp::init_device_mesh("cpu", {world}, {"tp"});
      const at::Tensor dt = hp::distribute_tensor(at::ones({8 * world, 8}), mesh, {hp::Shard(0)});
      const at::Tensor plain = at::ones({8, 8});
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
          dts.push_back(time_per_op_us(c.op, dt, iters));
          plains.push_back(time_per_op_us(c.op, plain, iters));
        }
        if (r == 0) {
          const double d = median(dts), p = median(plains);
          std::printf("%-12s world %d  DTensor %6.2f us  plain %6.2f us  ratio %.2fx\n", c.name, world, d, p, d / p);
        }
      }
      hp::destroy_process_group();
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::stoi(argv[1]) : 20000;
  const int rounds = argc > 2 ? std::stoi(argv[2]) : 9;
  const std::string only = argc > 3 ? argv[3] : "";  // run only the cases whose name contains this
  at::set_num_threads(1);
  std::printf("hp-bench-dispatch: %d ops x %d rounds per case, median round (ranks are threads)\n", iters, rounds);
  run_world(1, iters, rounds, only);
  run_world(2, iters, rounds, only);
  return 0;
}
