// cuda_ops_test.cpp — the sharded op families on CUDA DTensors: a column- then row-wise MLP,
// values and gradients, gives what one process computes.
// Every test skips, saying why, where no GPU is present: they compile everywhere and run
// through scripts/gpu_check.sh on a GPU machine.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "harness/rank_harness.h"
#include "harness/rounding_bound.h"
#include "hyper_parallel/hyper_parallel.h"

namespace cuda_ops_test {

using namespace hyper_parallel;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::relative_error;
using hyper_parallel::testing::run_cuda_ranks;

TEST(CudaOps, ColwiseRowwiseMlpMatchesOneProcess) {
  HP_REQUIRE_CUDA();
  run_cuda_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cuda", {2}, {"tp"});
    const at::Device dev = mesh.device();
    at::Tensor x = random_tensor({4, 8}, 1).to(dev);
    at::Tensor w1 = random_tensor({16, 8}, 2).to(dev), w2 = random_tensor({8, 16}, 3).to(dev);
    // One process.
    at::Tensor rw1 = w1.clone().set_requires_grad(true), rw2 = w2.clone().set_requires_grad(true);
    at::Tensor ref = at::linear(at::relu(at::linear(x, rw1)), rw2);
    ref.sum().backward();
    // Colwise -> Rowwise.
    at::Tensor dw1 = distribute_tensor(w1, mesh, {Shard(0)}).set_requires_grad(true);
    at::Tensor dw2 = distribute_tensor(w2, mesh, {Shard(1)}).set_requires_grad(true);
    at::Tensor dx = distribute_tensor(x, mesh, {Replicate()});
    at::Tensor out = at::linear(at::relu(at::linear(dx, dw1)), dw2);
    full_tensor(out).sum().backward();
    EXPECT_LE(relative_error(full_tensor(out), ref), 1e-12);
    EXPECT_LE(relative_error(full_tensor(dw1.grad()), rw1.grad()), 1e-12);
    EXPECT_LE(relative_error(full_tensor(dw2.grad()), rw2.grad()), 1e-12);
  });
}

}  // namespace cuda_ops_test
