// Ops that write into an argument (in-place ops, out= ops, in-place view ops): the
// written DTensor ends up holding exactly what one process computes, in its own layout
// (or, for in-place view ops, the layout the view gives it).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

namespace dtensor_writes_test {

using namespace hyper_parallel;
using hyper_parallel::testing::run_ranks;

TEST(DTensorWrites, InPlaceTransposeChangesTheShapeAndTheLayout) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2}, {"tp"});
    at::Tensor full = at::arange(8, at::kDouble).view({4, 2});
    at::Tensor x = distribute_tensor(full, mesh, {Shard(0)});
    x.transpose_(0, 1);
    EXPECT_EQ(x.sizes(), c10::IntArrayRef({2, 4}));
    EXPECT_EQ(placements_of(x), Placements{Shard(1)});
    EXPECT_TRUE(full_tensor(x).equal(full.t())) << full_tensor(x);
    at::Tensor y = distribute_tensor(full, mesh, {Shard(0)});
    y.unsqueeze_(0);
    EXPECT_EQ(y.sizes(), c10::IntArrayRef({1, 4, 2}));
    EXPECT_TRUE(full_tensor(y).equal(full.unsqueeze(0)));
  });
}

TEST(DTensorWrites, AnOutArgumentReceivesTheResultInItsOwnLayout) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2}, {"tp"});
    at::Tensor fa = at::arange(8, at::kDouble).view({4, 2}), fb = fa * 10;
    at::Tensor a = distribute_tensor(fa, mesh, {Shard(0)});
    at::Tensor b = distribute_tensor(fb, mesh, {Shard(0)});
    for (const Placements& p : std::vector<Placements>{{Replicate()}, {Shard(1)}, {Shard(0)}}) {
      at::Tensor out = distribute_tensor(at::zeros({4, 2}, at::kDouble), mesh, p);
      at::Tensor r = at::add_out(out, a, b);
      EXPECT_TRUE(r.is_same(out));
      EXPECT_EQ(placements_of(out), p);
      EXPECT_TRUE(full_tensor(out).equal(fa + fb)) << to_string(p) << "\n" << full_tensor(out);
    }
  });
}

TEST(DTensorWrites, InPlaceOpsKeepSelfsLayoutAndValue) {
  run_ranks(2, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2}, {"tp"});
    // Replicate self, Shard(0) other: self stays Replicate and gets every row.
    at::Tensor r = distribute_tensor(at::ones({4, 2}), mesh, {Replicate()});
    r.add_(distribute_tensor(at::ones({4, 2}), mesh, {Shard(0)}));
    EXPECT_EQ(placements_of(r), Placements{Replicate()});
    EXPECT_TRUE(full_tensor(r).equal(at::full({4, 2}, 2.0))) << full_tensor(r);
    // Partial self (1 + 2 = 3): adding 1 must add it once, and self stays Partial.
    at::Tensor p = DTensor::from_local(at::full({3}, static_cast<double>(rank + 1)), mesh, {Partial()});
    p.add_(1);
    EXPECT_EQ(placements_of(p), Placements{Partial()});
    EXPECT_TRUE(full_tensor(p).equal(at::full({3}, 4.0))) << full_tensor(p);
  });
}

TEST(DTensorWrites, AnOutArgumentOfAnotherShapeIsAnError) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2}, {"tp"});
    at::Tensor a = distribute_tensor(at::ones({4, 2}), mesh, {Shard(0)});
    // [1, 2] broadcasts with the operands, so only the write step can see the mismatch
    // (ATen would resize a plain out; a DTensor's layout cannot be resized behind it).
    at::Tensor out = distribute_tensor(at::zeros({1, 2}), mesh, {Replicate()});
    try {
      at::add_out(out, a, a);
      ADD_FAILURE() << "add_out of [4, 2] results into a [1, 2] out should be refused";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("it is written into has shape"), std::string::npos) << e.what();
    }
  });
}

}  // namespace dtensor_writes_test
