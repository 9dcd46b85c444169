// cuda_redistribute_test.cpp — DTensors of CUDA tensors: every placement pair redistributes
// to the same full tensor.
// Every test skips, saying why, where no GPU is present: they compile everywhere and run
// through scripts/gpu_check.sh on a GPU machine.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "harness/rank_harness.h"
#include "harness/rounding_bound.h"
#include "hyper_parallel/hyper_parallel.h"

namespace cuda_redistribute_test {

using namespace hyper_parallel;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::relative_error;
using hyper_parallel::testing::run_cuda_ranks;

namespace {

std::vector<Placements> placements_1d() { return {{Shard(0)}, {Shard(1)}, {Replicate()}, {Partial(ReduceOp::Sum)}}; }

}  // namespace

TEST(CudaRedistribute, AllPlacementPairsGiveTheSameFullTensor) {
  HP_REQUIRE_CUDA();
  for (int64_t tp : {2, 3}) {
    run_cuda_ranks(tp, [&](int64_t) {
      auto mesh = init_device_mesh("cuda", {tp}, {"tp"});
      at::Tensor full = random_tensor({7, 5}, 11).to(mesh.device());
      for (const auto& from : placements_1d()) {
        for (const auto& to : placements_1d()) {
          if (to[0].is_partial()) continue;
          at::Tensor d = distribute_tensor(full, mesh, from);
          at::Tensor r = redistribute(d, to);
          EXPECT_TRUE(to_local(r).is_cuda());
          EXPECT_LE(relative_error(full_tensor(r), full), 1e-12) << to_string(from) << " -> " << to_string(to);
        }
      }
    });
  }
}

}  // namespace cuda_redistribute_test
