// The dispatch entry: ATen ops on DTensors reach OpDispatcher and give the
// single-process result, with the placements PyTorch's DTensor would give.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

namespace dispatch_basic_test {

using namespace hyper_parallel;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;

TEST(DTensorBasics, ReportsGlobalShapeAndLocalDtype) {
  run_ranks(3, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {3});
    at::Tensor d = distribute_tensor(random_tensor({8, 5}, 1, at::kFloat), mesh, {Shard(0)});
    EXPECT_TRUE(is_dtensor(d));
    EXPECT_EQ(d.sizes(), c10::IntArrayRef({8, 5}));
    EXPECT_EQ(d.scalar_type(), at::kFloat);
    EXPECT_EQ(d.device(), at::Device(at::kCPU));
    EXPECT_EQ(to_local(d).size(0), rank < 2 ? 3 : 2);
    EXPECT_EQ(mesh_of(d), mesh);
    EXPECT_FALSE(is_dtensor(to_local(d)));
  });
}

TEST(DTensorBasics, PointwiseOpsFollowShardsAndBroadcast) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor a = random_tensor({4, 6}, 1), b = random_tensor({4, 6}, 2), bias = random_tensor({6}, 3);
    at::Tensor da = distribute_tensor(a, mesh, {Shard(1)});
    at::Tensor db = distribute_tensor(b, mesh, {Shard(1)});
    at::Tensor dbias = distribute_tensor(bias, mesh, {Replicate()});
    at::Tensor out = da * db + dbias;
    EXPECT_EQ(placements_of(out), Placements{Shard(1)});
    EXPECT_TRUE(at::allclose(full_tensor(out), a * b + bias));
    // Different shards: the second input is redistributed to the first one's layout.
    at::Tensor dc = distribute_tensor(b, mesh, {Shard(0)});
    at::Tensor mixed = da - dc;
    EXPECT_EQ(placements_of(mixed), Placements{Shard(1)});
    EXPECT_TRUE(at::allclose(full_tensor(mixed), a - b));
    // A plain tensor next to a DTensor is taken as replicated.
    EXPECT_TRUE(at::allclose(full_tensor(da + b), a + b));
    EXPECT_TRUE(at::allclose(full_tensor(da * 3.0), a * 3.0));
  });
}

TEST(DTensorBasics, PartialPassesThroughLinearOpsOnly) {
  run_ranks(2, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor x = random_tensor({3, 3}, 10 + rank), y = random_tensor({3, 3}, 20 + rank);
    at::Tensor full_x = random_tensor({3, 3}, 10) + random_tensor({3, 3}, 11);
    at::Tensor full_y = random_tensor({3, 3}, 20) + random_tensor({3, 3}, 21);
    at::Tensor px = DTensor::from_local(x, mesh, {Partial()});
    at::Tensor py = DTensor::from_local(y, mesh, {Partial()});
    at::Tensor sum = px + py;
    EXPECT_EQ(placements_of(sum), Placements{Partial()});
    EXPECT_TRUE(at::allclose(full_tensor(sum), full_x + full_y));
    at::Tensor scaled = px * 2.0;
    EXPECT_EQ(placements_of(scaled), Placements{Partial()});
    EXPECT_TRUE(at::allclose(full_tensor(scaled), full_x * 2.0));
    at::Tensor g = at::gelu(px);  // non-linear: reduced first
    EXPECT_EQ(placements_of(g), Placements{Replicate()});
    EXPECT_TRUE(at::allclose(full_tensor(g), at::gelu(full_x)));
    at::Tensor prod = px * py;  // Partial * Partial is not linear
    EXPECT_TRUE(at::allclose(full_tensor(prod), full_x * full_y));
    EXPECT_EQ(placements_of(at::ones_like(px)), Placements{Replicate()});
    EXPECT_TRUE(full_tensor(at::ones_like(px)).equal(at::ones({3, 3}, at::kDouble)));
    EXPECT_EQ(placements_of(px.clone()), Placements{Partial()});
  });
}

TEST(DTensorBasics, InPlaceOpsKeepTheCallersDTensor) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor a = random_tensor({5, 2}, 1), b = random_tensor({5, 2}, 2);
    at::Tensor da = distribute_tensor(a, mesh, {Shard(0)});
    at::Tensor db = distribute_tensor(b, mesh, {Replicate()});
    at::Tensor same = da.add_(db);
    EXPECT_TRUE(same.is_same(da));
    EXPECT_TRUE(at::allclose(full_tensor(da), a + b));
    da.zero_();
    EXPECT_TRUE(full_tensor(da).equal(at::zeros({5, 2}, at::kDouble)));
    at::Tensor px = DTensor::from_local(at::ones({2}), mesh, {Partial()});
    // Not linear: computed on the sum, written back as Partial (the dispatcher's write step).
    px.exp_();
    EXPECT_EQ(placements_of(px), Placements{Partial()});
    EXPECT_TRUE(at::allclose(full_tensor(px), at::full({2}, std::exp(2.0))));
  });
}

TEST(DTensorBasics, DetachItemEqualAndCopy) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor a = random_tensor({4}, 1);
    at::Tensor da = distribute_tensor(a, mesh, {Shard(0)}).set_requires_grad(true);
    at::Tensor det = da.detach();
    EXPECT_FALSE(det.requires_grad());
    EXPECT_EQ(layout_of(det), layout_of(da));
    at::Tensor one = distribute_tensor(at::full({1}, 2.5, at::kDouble), mesh, {Shard(0)});
    EXPECT_EQ(one.item<double>(), 2.5);
    EXPECT_TRUE(at::equal(det, distribute_tensor(a, mesh, {Replicate()})));
    at::Tensor dst = distribute_tensor(at::zeros({4}, at::kDouble), mesh, {Replicate()});
    dst.copy_(det);
    EXPECT_TRUE(full_tensor(dst).equal(a));
  });
}

TEST(DTensorBasics, AnOpWithoutARuleNamesTheOpAndItsPlacements) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor a = random_tensor({4, 4}, 1);
    at::Tensor da = distribute_tensor(a, mesh, {Shard(0)});
    try {
      at::flip(da, {0});
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'flip'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[Shard(0)] shape [4, 4]"), std::string::npos) << msg;
    }
    set_implicit_replication(true);
    at::Tensor flipped = at::flip(da, {0});
    set_implicit_replication(false);
    EXPECT_EQ(placements_of(flipped), Placements{Replicate()});
    EXPECT_TRUE(to_local(flipped).equal(at::flip(a, {0})));
  });
}

}  // namespace dispatch_basic_test
