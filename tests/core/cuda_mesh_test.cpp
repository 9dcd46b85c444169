// cuda_mesh_test.cpp — worlds of CUDA ranks: rank threads sharing the GPU(s) over Gloo (NCCL
// refuses two ranks on one GPU), a one-rank NCCL mesh, and the error without a GPU.
// Every test skips, saying why, where no GPU is present: they compile everywhere and run
// through scripts/gpu_check.sh on a GPU machine.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

namespace cuda_mesh_test {

using namespace hyper_parallel;
using hyper_parallel::testing::run_cuda_ranks;

TEST(CudaMesh, RankThreadsShareTheGpuOverGloo) {
  HP_REQUIRE_CUDA();
  run_cuda_ranks(3, [](int64_t rank) {
    auto mesh = init_device_mesh("cuda", {3}, {"tp"});
    ASSERT_TRUE(mesh.device().is_cuda());
    const Communicator& comm = mesh.comm(0);
    at::Tensor t = at::full({5}, static_cast<double>(rank + 1), at::TensorOptions(mesh.device()).dtype(at::kDouble));
    comm.all_reduce_(t, ReduceOp::Sum);
    EXPECT_TRUE(t.is_cuda());
    EXPECT_EQ(t.cpu().sum().item<double>(), 5 * 6.0);
    at::Tensor g = comm.all_gather(t.narrow(0, 0, rank + 1), 0, {1, 2, 3});
    EXPECT_EQ(g.size(0), 6);
    // Gloo has no CUDA reduce_scatter: the Communicator all-reduces and keeps its piece.
    at::Tensor rs = comm.reduce_scatter(at::ones({7, 2}, t.options()), 0, ReduceOp::Sum);
    EXPECT_EQ(rs.size(0), chunk_range(7, 3, rank).length);
    EXPECT_EQ(rs.cpu().max().item<double>(), 3.0);
  });
}

TEST(CudaMesh, OneRankNcclMeshRunsCollectives) {
  HP_REQUIRE_CUDA();
  auto store = c10::make_intrusive<c10d::HashStore>();
  InitOptions opts;
  opts.per_thread = true;
  opts.device_type = "cuda";
  opts.backend = "nccl";
  init_process_group(store, 0, 1, opts);
  auto mesh = init_device_mesh("cuda", {1}, {"tp"});
  at::Tensor t = at::ones({4}, at::TensorOptions(mesh.device()));
  at::Tensor d = distribute_tensor(t, mesh, {Shard(0)});
  EXPECT_TRUE(full_tensor(redistribute(d, {Replicate()})).equal(t));
  destroy_process_group();
}

TEST(CudaMesh, ACudaWorldWithoutAGpuIsAClearError) {
  if (hyper_parallel::testing::has_cuda()) GTEST_SKIP() << "a GPU is present: this checks the error without one";
  auto store = c10::make_intrusive<c10d::HashStore>();
  InitOptions opts;
  opts.per_thread = true;
  opts.device_type = "cuda";
  try {
    init_process_group(store, 0, 1, opts);
    ADD_FAILURE() << "a cuda world without a GPU should be refused";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no GPU is visible"), std::string::npos) << e.what();
  }
  destroy_process_group();
}

}  // namespace cuda_mesh_test
