// Builds against the installed headers and library; runs a 1-rank mesh end to end.
#include <hyper_parallel/hyper_parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <ATen/ops/add.h>
#include <ATen/ops/ones.h>
#include <iostream>

int main() {
  hp::init_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1);
  auto mesh = hp::init_device_mesh("cpu", {1}, {"tp"});
  at::Tensor d = hp::distribute_tensor(at::ones({4, 3}), mesh, {hp::Shard(1)});
  at::Tensor sum = hp::full_tensor(at::add(d, d));
  std::cout << "consumer OK: " << sum.sizes() << " " << hp::placements_of(d) << std::endl;
  return sum.sizes() == c10::IntArrayRef({4, 3}) ? 0 : 1;
}
