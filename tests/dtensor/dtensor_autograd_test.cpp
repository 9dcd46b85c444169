// Gradients through from_local / to_local / redistribute / DTensor ops equal the
// single-process gradients, with PyTorch's backward placement rules.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

namespace dtensor_autograd_test {

using namespace hyper_parallel;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;

namespace {
at::Tensor piece(const at::Tensor& full, const Layout& layout) {
  at::Tensor v = full;
  for (int64_t d = 0; d < full.dim(); ++d) v = v.narrow(d, layout.local_offset()[d], layout.local_shape()[d]);
  return v;
}
}  // namespace

TEST(DTensorAutograd, ToLocalGradientComesBackAsADTensorOfTheSameLayout) {
  run_ranks(3, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {3});
    at::Tensor w = random_tensor({7, 4}, 1);
    at::Tensor dw = distribute_tensor(w, mesh, {Shard(0)}).set_requires_grad(true);
    at::Tensor c = random_tensor({7, 4}, 2);
    at::Tensor local = to_local(dw);
    (local * piece(c, layout_of(dw))).sum().backward();
    ASSERT_TRUE(dw.grad().defined());
    ASSERT_TRUE(is_dtensor(dw.grad()));
    EXPECT_EQ(layout_of(dw.grad()), layout_of(dw));
    EXPECT_TRUE(at::allclose(full_tensor(dw.grad()), c));
  });
}

TEST(DTensorAutograd, FromLocalGradientIsTheLocalPieceOfTheIncomingGradient) {
  run_ranks(2, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor x = random_tensor({3, 5}, 10 + rank).set_requires_grad(true);
    at::Tensor c = random_tensor({6, 5}, 3);
    // Shard(0) from pieces, then gathered: d loss / d piece = matching rows of c.
    at::Tensor dt = DTensor::from_local(x, mesh, {Shard(0)});
    (full_tensor(dt) * c).sum().backward();
    EXPECT_TRUE(at::allclose(x.grad(), c.narrow(0, 3 * rank, 3)));
  });
}

TEST(DTensorAutograd, PartialToReplicateIsAllReduceForwardIdentityBackward) {
  run_ranks(4, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {4});
    at::Tensor x = random_tensor({2, 3}, 20 + rank).set_requires_grad(true);
    at::Tensor c = random_tensor({2, 3}, 4);
    at::Tensor r = redistribute(DTensor::from_local(x, mesh, {Partial()}), {Replicate()});
    at::Tensor expect_full = at::zeros({2, 3}, at::kDouble);
    for (int k = 0; k < 4; ++k) expect_full += random_tensor({2, 3}, 20 + k);
    EXPECT_TRUE(at::allclose(to_local(r), expect_full));
    (to_local(r) * c).sum().backward();
    // d(sum_k x_k)/dx_rank = 1: each piece gets the replicated gradient unchanged.
    EXPECT_TRUE(at::allclose(x.grad(), c));
  });
}

TEST(DTensorAutograd, RedistributeBackwardMatchesSingleProcessForEveryPair) {
  run_ranks(3, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {3});
    const std::vector<Placements> all = {{Shard(0)}, {Shard(1)}, {Replicate()}};
    at::Tensor w = random_tensor({5, 4}, 5);
    at::Tensor c = random_tensor({5, 4}, 6);
    for (const auto& src : all) {
      for (const auto& dst : all) {
        at::Tensor leaf = distribute_tensor(w, mesh, src).set_requires_grad(true);
        at::Tensor out = redistribute(leaf, dst);
        // loss = sum(full(out) * c) on every rank; d loss / d w = c.
        (full_tensor(out) * c).sum().backward();
        EXPECT_EQ(layout_of(leaf.grad()), layout_of(leaf));
        EXPECT_TRUE(at::allclose(full_tensor(leaf.grad()), c)) << to_string(src) << " -> " << to_string(dst);
      }
    }
  });
}

TEST(DTensorAutograd, PointwiseOpsOnDTensorsBackpropagateLikeOneProcess) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor w = random_tensor({5, 3}, 7);
    at::Tensor b = random_tensor({3}, 8);
    at::Tensor c = random_tensor({5, 3}, 9);
    // Reference.
    at::Tensor w1 = w.clone().set_requires_grad(true);
    at::Tensor b1 = b.clone().set_requires_grad(true);
    (at::tanh(w1 * w1 + b1) * c).sum().backward();
    // Distributed: w sharded on rows, b replicated.
    at::Tensor dw = distribute_tensor(w, mesh, {Shard(0)}).set_requires_grad(true);
    at::Tensor db = distribute_tensor(b, mesh, {Replicate()}).set_requires_grad(true);
    at::Tensor y = at::tanh(dw * dw + db);
    EXPECT_EQ(placements_of(y), Placements{Shard(0)});
    (full_tensor(y) * c).sum().backward();
    EXPECT_TRUE(at::allclose(full_tensor(dw.grad()), w1.grad()));
    // b's gradient sums over rows held on different ranks: Partial, then exact when reduced.
    EXPECT_TRUE(at::allclose(full_tensor(db.grad()), b1.grad()));
  });
}

}  // namespace dtensor_autograd_test
