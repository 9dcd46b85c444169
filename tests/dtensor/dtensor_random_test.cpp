// Random ops on DTensors: the value does not depend on the placements, and every rank
// holding the same piece holds the same numbers (PyTorch's RNG-tracker promise).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

namespace dtensor_random_test {

using namespace hyper_parallel;
using hyper_parallel::testing::run_ranks;

namespace {

// This rank's local piece next to every other rank's, along the 1-D mesh.
std::vector<at::Tensor> pieces_of_all_ranks(const at::Tensor& dtensor) {
  const DeviceMesh& mesh = mesh_of(dtensor);
  at::Tensor local = to_local(dtensor).contiguous();
  std::vector<int64_t> sizes(mesh.size(), 1);
  at::Tensor all = mesh.comm(0).all_gather(local.unsqueeze(0), 0, sizes);
  return all.unbind(0);
}

}  // namespace

TEST(RandomDTensor, ReplicatedRandomValuesAreTheSameOnEveryRank) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2}, {"tp"});
    at::Tensor x = distribute_tensor(at::zeros({6, 4}), mesh, {Replicate()});
    for (const auto& [name, r] :
         std::vector<std::pair<std::string, at::Tensor>>{{"rand_like", at::rand_like(x)},
                                                         {"randn_like", at::randn_like(x)},
                                                         {"randint_like", at::randint_like(x, 100)},
                                                         {"uniform_", x.clone().uniform_(-1, 1)},
                                                         {"normal_", x.clone().normal_(0, 2)},
                                                         {"bernoulli_", x.clone().bernoulli_(0.5)},
                                                         {"dropout", at::dropout(x + 1, 0.5, /*train=*/true)}}) {
      ASSERT_TRUE(is_dtensor(r)) << name;
      EXPECT_TRUE(layout_of(r).is_replicated()) << name;
      auto all = pieces_of_all_ranks(r);
      EXPECT_TRUE(all[0].equal(all[1])) << name << ": rank 0 drew\n" << all[0] << "\nrank 1 drew\n" << all[1];
    }
  });
}

TEST(RandomDTensor, TheValueDoesNotDependOnThePlacements) {
  run_ranks(3, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {3}, {"tp"});
    const at::Tensor zeros = at::zeros({7, 5});
    using Draw = std::function<at::Tensor(const at::Tensor&)>;
    const std::vector<std::pair<std::string, Draw>> draws = {
        {"rand_like", [](const at::Tensor& x) { return at::rand_like(x); }},
        {"randn_like", [](const at::Tensor& x) { return at::randn_like(x); }},
        {"randint_like", [](const at::Tensor& x) { return at::randint_like(x, 3, 50); }},
        {"normal_", [](const at::Tensor& x) { return x.clone().normal_(1, 3); }},
        {"exponential_", [](const at::Tensor& x) { return x.clone().exponential_(2); }},
        {"dropout", [](const at::Tensor& x) { return at::dropout(x + 1, 0.3, /*train=*/true); }}};
    for (const auto& [name, draw] : draws) {
      std::vector<at::Tensor> fulls;
      for (const Placements& p : std::vector<Placements>{{Replicate()}, {Shard(0)}, {Shard(1)}}) {
        mesh.manual_seed(11);
        at::Tensor r = draw(distribute_tensor(zeros, mesh, p));
        EXPECT_EQ(placements_of(r), p) << name;
        fulls.push_back(full_tensor(r));
      }
      EXPECT_TRUE(fulls[0].equal(fulls[1])) << name << ": Shard(0) differs from Replicate";
      EXPECT_TRUE(fulls[0].equal(fulls[2])) << name << ": Shard(1) differs from Replicate";
      // Consecutive draws differ; a reseed repeats the sequence.
      EXPECT_FALSE(full_tensor(draw(distribute_tensor(zeros, mesh, {Replicate()}))).equal(fulls[0])) << name;
    }
  });
}

TEST(RandomDTensor, APartialInputGivesAReplicatedDrawAndInPlaceOnPartialIsRefused) {
  run_ranks(2, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2}, {"tp"});
    at::Tensor p = DTensor::from_local(at::full({4}, static_cast<double>(rank)), mesh, {Partial()});
    at::Tensor r = at::rand_like(p);
    EXPECT_TRUE(layout_of(r).is_replicated());
    auto all = pieces_of_all_ranks(r);
    EXPECT_TRUE(all[0].equal(all[1]));
    EXPECT_THROW(p.uniform_(), c10::Error);
  });
}

TEST(RandomDTensor, RandomOpsWithTensorParametersAreRefused) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2}, {"tp"});
    at::Tensor x = distribute_tensor(at::zeros({4, 2}), mesh, {Shard(0)});
    at::Tensor p = distribute_tensor(at::full({4, 2}, 0.5), mesh, {Shard(0)});
    try {
      x.bernoulli_(p);
      ADD_FAILURE() << "bernoulli_ with a tensor p should be refused";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("random ops with tensor parameters"), std::string::npos) << e.what();
    }
  });
}

}  // namespace dtensor_random_test
