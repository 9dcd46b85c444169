// loss_parallel on N-D meshes (PyTorch 2.15's contract): the class dim sharded by one mesh
// dim anywhere in the mesh, the other dims Replicate or sharding the batch / sequence. Each
// case against single-process cross_entropy on the full logits in float64 (values and
// gradients): dp x tp, tp x dp, cp x tp (sequence-sharded 3-D logits), rep x tp, dp 2 x tp 3
// (uneven class pieces), 7 rows over dp 2. Plus the loss's placements, the collectives, the
// routed log_softmax / nll_loss, and the refusals.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>

#include "harness/job_errors.h"
#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

namespace loss_parallel_meshes_test {

using namespace hyper_parallel;
using hyper_parallel::testing::error_of;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  return (g - w).norm().item<double>() / std::max(w.norm().item<double>(), 1e-30);
}

// A mesh, the logits on it, and what the contract says follows from them.
struct MeshCase {
  std::string name;
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> dim_names;
  std::vector<int64_t> logits_shape;  // class dim 1
  Placements logits;                  // the logits' (contract) placements
  Placements rows;                    // the target's and a per-row loss's
  Placements reduced;                 // a summed loss's
  int64_t world() const {
    int64_t n = 1;
    for (int64_t s : mesh_shape) n *= s;
    return n;
  }
};

std::ostream& operator<<(std::ostream& os, const MeshCase& m) { return os << m.name; }

std::vector<MeshCase> mesh_cases() {
  const Placement P = Partial(), R = Replicate();
  return {
      {"dp2_tp2", {2, 2}, {"dp", "tp"}, {8, 10}, {Shard(0), Shard(1)}, {Shard(0), R}, {P, R}},
      {"tp2_dp2", {2, 2}, {"tp", "dp"}, {8, 10}, {Shard(1), Shard(0)}, {R, Shard(0)}, {R, P}},
      // 3-D logits [B, C, S], the sequence sharded on cp: the target [B, S] is Shard(1) there.
      {"cp2_tp2", {2, 2}, {"cp", "tp"}, {3, 10, 6}, {Shard(2), Shard(1)}, {Shard(1), R}, {P, R}},
      {"rep2_tp2", {2, 2}, {"rep", "tp"}, {8, 10}, {R, Shard(1)}, {R, R}, {R, R}},
      // 13 classes over 3: pieces of 5, 5, 3.
      {"dp2_tp3", {2, 3}, {"dp", "tp"}, {6, 13}, {Shard(0), Shard(1)}, {Shard(0), R}, {P, R}},
      // 7 rows over dp 2: pieces of 4 and 3.
      {"dp2_tp2_uneven_rows", {2, 2}, {"dp", "tp"}, {7, 13}, {Shard(0), Shard(1)}, {Shard(0), R}, {P, R}},
  };
}

enum class Target { Index, IndexReplicated, Soft, SoftReplicated };

struct LossCase {
  int64_t reduction;
  bool weighted = false;
  double label_smoothing = 0.0;
  Target target = Target::Index;
  int64_t ignore_index = -100;
  bool strict = true;
  std::string name() const {
    std::string s = reduction == at::Reduction::None ? "none" : reduction == at::Reduction::Sum ? "sum" : "mean";
    if (weighted) s += " weighted";
    if (label_smoothing > 0) s += " smoothing";
    if (target == Target::IndexReplicated) s += " replicated target";
    if (target == Target::Soft) s += " probabilities";
    if (target == Target::SoftReplicated) s += " replicated probabilities";
    if (ignore_index != -100) s += " ignore_index=" + std::to_string(ignore_index);
    if (!strict) s += " strict=false";
    return s;
  }
  bool soft() const { return target == Target::Soft || target == Target::SoftReplicated; }
};

std::vector<LossCase> loss_cases() {
  std::vector<LossCase> cases;
  // Strict takes 'none' and 'sum'; strict = false adds the exact global mean.
  for (bool strict : {true, false}) {
    std::vector<int64_t> reductions = {at::Reduction::None, at::Reduction::Sum};
    if (!strict) reductions.push_back(at::Reduction::Mean);
    for (int64_t r : reductions) {
      cases.push_back({r, false, 0.0, Target::Index, -100, strict});
      cases.push_back({r, true, 0.0, Target::Index, 2, strict});  // ignore_index and class weights
      cases.push_back({r, true, 0.1, Target::IndexReplicated, 2, strict});
      cases.push_back({r, false, 0.2, Target::Index, -100, strict});
      cases.push_back({r, true, 0.0, Target::Soft, -100, strict});
      cases.push_back({r, false, 0.1, Target::SoftReplicated, -100, strict});
    }
  }
  return cases;
}

F::CrossEntropyFuncOptions options_for(const LossCase& c, const at::Tensor& weight) {
  F::CrossEntropyFuncOptions::reduction_t r = torch::kMean;
  if (c.reduction == at::Reduction::None) r = torch::kNone;
  if (c.reduction == at::Reduction::Sum) r = torch::kSum;
  auto o = F::CrossEntropyFuncOptions().reduction(r).ignore_index(c.ignore_index).label_smoothing(c.label_smoothing);
  if (weight.defined()) o = o.weight(weight);
  return o;
}

// The full inputs and single-process results of one case (float64).
struct Data {
  at::Tensor logits, target, weight, grad_loss;  // grad_loss: the loss's incoming gradient
  at::Tensor loss, grad;                         // the reference
};

Data make_data(const MeshCase& m, const LossCase& c, uint64_t seed) {
  Data d;
  d.logits = random_tensor(m.logits_shape, seed) * 3;
  const int64_t classes = m.logits_shape[1];
  std::vector<int64_t> rows = m.logits_shape;
  rows.erase(rows.begin() + 1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  if (c.soft()) {
    d.target = torch::softmax(random_tensor(m.logits_shape, seed + 2) * 2, 1);
  } else {
    d.target = at::randint(classes, rows, gen, at::kLong);
    if (c.ignore_index >= 0) d.target.masked_fill_(at::rand(rows, gen, at::kDouble) < 0.3, c.ignore_index);
  }
  if (c.weighted) d.weight = at::rand({classes}, gen, at::kDouble) + 0.5;
  at::Tensor x = d.logits.clone().set_requires_grad(true);
  at::Tensor loss = F::cross_entropy(x, d.target, options_for(c, d.weight));
  d.grad_loss = random_tensor(loss.sizes(), seed + 3);
  torch::autograd::backward({loss}, {d.grad_loss});
  d.loss = loss.detach();
  d.grad = x.grad();
  return d;
}

LossParallelOptions strictness(bool strict) {
  LossParallelOptions o;
  o.strict = strict;
  return o;
}

// One case on this rank: values, gradients, the loss's layout, the collectives.
void check_case(const DeviceMesh& mesh, const MeshCase& m, const LossCase& c, const Data& d) {
  SCOPED_TRACE(m.name + ": " + c.name());
  at::Tensor logits = distribute_tensor(d.logits, mesh, m.logits).set_requires_grad(true);
  const Placements replicated(mesh.ndim(), Replicate());
  at::Tensor target;
  switch (c.target) {
    case Target::Index:
      target = distribute_tensor(d.target, mesh, m.rows);
      break;
    case Target::IndexReplicated:
      target = distribute_tensor(d.target, mesh, replicated);
      break;
    case Target::Soft:
      target = distribute_tensor(d.target, mesh, m.logits);
      break;
    case Target::SoftReplicated:
      target = distribute_tensor(d.target, mesh, replicated);
      break;
  }
  auto guard = loss_parallel(strictness(c.strict));
  reset_collective_counts();
  at::Tensor loss = F::cross_entropy(logits, target, options_for(c, d.weight));
  const auto forward = collective_counts();
  // The call's record and the statistics on the TP group; the global mean's denominator
  // summed over each mesh dim that shards the rows (a target cut from a replicated one: none).
  int64_t row_dims = 0;
  for (const auto& p : m.rows) row_dims += p.is_shard() ? 1 : 0;
  const int64_t reduces = c.reduction == at::Reduction::Mean ? row_dims : 0;
  EXPECT_EQ(forward.all_gather, 2) << "the call's record and the per-row statistics";
  EXPECT_EQ(forward.all_reduce, reduces) << "the mean's denominator, only where other mesh dims shard the rows";
  EXPECT_EQ(forward.total(), 2 + reduces);
  ASSERT_TRUE(is_dtensor(loss));
  if (c.reduction == at::Reduction::None) {
    EXPECT_EQ(placements_of(loss), m.rows) << to_string(placements_of(loss));
    EXPECT_EQ(loss.sizes(), d.loss.sizes());
  } else {
    EXPECT_EQ(placements_of(loss), m.reduced) << to_string(placements_of(loss));
  }
  EXPECT_LE(rel_err(full_tensor(loss), d.loss), 1e-12) << full_tensor(loss) << " vs " << d.loss;
  const at::Tensor grad_loss =
      distribute_tensor(d.grad_loss, mesh, c.reduction == at::Reduction::None ? m.rows : replicated);
  reset_collective_counts();
  torch::autograd::backward({loss}, {grad_loss});
  EXPECT_EQ(collective_counts().total(), 0) << "no collective in backward";
  ASSERT_TRUE(is_dtensor(logits.grad()));
  EXPECT_EQ(layout_of(logits.grad()), layout_of(logits)) << "the gradient has the logits' layout";
  EXPECT_LE(rel_err(full_tensor(logits.grad()), d.grad), 1e-12);
}

}  // namespace

class LossParallelMeshes : public ::testing::TestWithParam<MeshCase> {};

TEST_P(LossParallelMeshes, CrossEntropyMatchesOneProcessWithPyTorchsPlacements) {
  const MeshCase m = GetParam();
  const auto cases = loss_cases();
  std::vector<Data> data;
  for (size_t i = 0; i < cases.size(); ++i) data.push_back(make_data(m, cases[i], 500 + i));
  run_ranks(m.world(), [&](int64_t) {
    auto mesh = init_device_mesh("cpu", m.mesh_shape, m.dim_names);
    for (size_t i = 0; i < cases.size(); ++i) check_case(mesh, m, cases[i], data[i]);
  });
}

// log_softmax keeps the logits' layout; nll_loss lays its target and loss out as
// cross_entropy does (the total weight of the global mean summed over the row dims).
TEST_P(LossParallelMeshes, LogSoftmaxAndNllLossRouteOnTheMesh) {
  const MeshCase m = GetParam();
  const LossCase none{at::Reduction::None, true, 0.0, Target::Index, 2};
  const LossCase sum{at::Reduction::Sum, true, 0.0, Target::Index, 2};
  const LossCase mean{at::Reduction::Mean, true, 0.0, Target::Index, 2, /*strict=*/false};
  const std::vector<LossCase> cases = {none, sum, mean};
  std::vector<Data> data;
  for (size_t i = 0; i < cases.size(); ++i) data.push_back(make_data(m, cases[i], 700 + i));
  run_ranks(m.world(), [&](int64_t) {
    auto mesh = init_device_mesh("cpu", m.mesh_shape, m.dim_names);
    for (size_t i = 0; i < cases.size(); ++i) {
      const LossCase& c = cases[i];
      const Data& d = data[i];
      SCOPED_TRACE(m.name + ": nll_loss(log_softmax) " + c.name());
      at::Tensor logits = distribute_tensor(d.logits, mesh, m.logits).set_requires_grad(true);
      const at::Tensor target = distribute_tensor(d.target, mesh, m.rows);
      auto guard = loss_parallel(strictness(c.strict));
      at::Tensor lp = torch::log_softmax(logits, 1);
      EXPECT_EQ(layout_of(lp), layout_of(logits)) << "log_softmax's output is sharded as its input";
      EXPECT_LE(rel_err(full_tensor(lp), torch::log_softmax(d.logits, 1)), 1e-12);
      F::NLLLossFuncOptions::reduction_t r = torch::kMean;
      if (c.reduction == at::Reduction::None) r = torch::kNone;
      if (c.reduction == at::Reduction::Sum) r = torch::kSum;
      at::Tensor loss =
          F::nll_loss(lp, target, F::NLLLossFuncOptions().reduction(r).ignore_index(c.ignore_index).weight(d.weight));
      EXPECT_EQ(placements_of(loss), c.reduction == at::Reduction::None ? m.rows : m.reduced);
      EXPECT_LE(rel_err(full_tensor(loss), d.loss), 1e-12) << full_tensor(loss) << " vs " << d.loss;
      const Placements replicated(mesh.ndim(), Replicate());
      torch::autograd::backward(
          {loss}, {distribute_tensor(d.grad_loss, mesh, c.reduction == at::Reduction::None ? m.rows : replicated)});
      EXPECT_EQ(layout_of(logits.grad()), layout_of(logits));
      EXPECT_LE(rel_err(full_tensor(logits.grad()), d.grad), 1e-12);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Meshes, LossParallelMeshes, ::testing::ValuesIn(mesh_cases()),
                         [](const ::testing::TestParamInfo<MeshCase>& info) { return info.param.name; });

// A summed loss that is Partial on dp: loss.backward() seeds it as PyTorch does (each rank's
// rows get the gradient 1), and its full value is the sum over every row.
TEST(LossParallelMeshesSum, BackwardOfAPartialLossSeedsEveryRankWithOne) {
  const MeshCase m = mesh_cases()[0];
  const LossCase c{at::Reduction::Sum};
  const Data d = make_data(m, c, 900);
  at::Tensor x = d.logits.clone().set_requires_grad(true);
  F::cross_entropy(x, d.target, options_for(c, {})).backward();
  run_ranks(4, [&](int64_t) {
    auto mesh = init_device_mesh("cpu", m.mesh_shape, m.dim_names);
    at::Tensor logits = distribute_tensor(d.logits, mesh, m.logits).set_requires_grad(true);
    auto guard = loss_parallel();
    at::Tensor loss = F::cross_entropy(logits, distribute_tensor(d.target, mesh, m.rows), options_for(c, {}));
    loss.backward();
    EXPECT_LE(rel_err(full_tensor(logits.grad()), x.grad()), 1e-12);
  });
}

TEST(LossParallelMeshesErrors, StrictRefusesWhatPyTorchsContractRefuses) {
  const at::Tensor full = random_tensor({4, 6}, 31);
  const at::Tensor t = torch::tensor({0, 1, 5, 3});
  run_ranks(4, [&](int64_t) {
    auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    auto guard = loss_parallel();
    const at::Tensor x = distribute_tensor(full, mesh, {Shard(0), Shard(1)});
    // A plain target where other mesh dims shard the rows: it could be the whole or a piece.
    std::string msg = error_of<LossParallelLayoutError>(
        [&] { F::cross_entropy(x, t, F::CrossEntropyFuncOptions().reduction(torch::kSum)); });
    EXPECT_TRUE(contains(msg, "requires a DTensor") && contains(msg, "[Shard(0), Replicate()]")) << msg;
    // A target laid out otherwise than the rows (nor replicated).
    msg = error_of<LossParallelLayoutError>([&] {
      F::cross_entropy(x, distribute_tensor(t, mesh, {Replicate(), Shard(0)}),
                       F::CrossEntropyFuncOptions().reduction(torch::kSum));
    });
    EXPECT_TRUE(contains(msg, "[Shard(0), Replicate()]") && contains(msg, "[Replicate(), Shard(0)]")) << msg;
    // Partial on the non-TP dim.
    msg = error_of<LossParallelLayoutError>([&] {
      F::cross_entropy(DTensor::from_local(to_local(x), mesh, {Partial(), Shard(1)}), t,
                       F::CrossEntropyFuncOptions().reduction(torch::kSum));
    });
    EXPECT_TRUE(contains(msg, "loss_parallel") && contains(msg, "[Partial(sum), Shard(1)]") &&
                contains(msg, "exactly one mesh dim"))
        << msg;
    // The class dim sharded by two mesh dims.
    msg = error_of<LossParallelLayoutError>([&] {
      F::cross_entropy(distribute_tensor(full, mesh, {Shard(1), Shard(1)}), t,
                       F::CrossEntropyFuncOptions().reduction(torch::kSum));
    });
    EXPECT_TRUE(contains(msg, "loss_parallel") && contains(msg, "[Shard(1), Shard(1)]")) << msg;
    // 'mean' on a mesh of more than one dim, as PyTorch's NotImplementedError.
    const at::Tensor rows = distribute_tensor(t, mesh, {Shard(0), Replicate()});
    msg = error_of<LossParallelUnsupportedError>([&] { F::cross_entropy(x, rows); });
    EXPECT_TRUE(contains(msg, "only supported on a one-dimensional mesh")) << msg;
    msg = error_of<LossParallelUnsupportedError>([&] {
      F::cross_entropy(distribute_tensor(full, mesh, {Replicate(), Shard(1)}), t);
    });
    EXPECT_TRUE(contains(msg, "only supported on a one-dimensional mesh")) << msg;
    msg = error_of<LossParallelUnsupportedError>([&] { F::nll_loss(torch::log_softmax(x, 1), rows); });
    EXPECT_TRUE(contains(msg, "only supported on a one-dimensional mesh")) << msg;
  });
}

TEST(LossParallelMeshesErrors, NonStrictTakesThePlainTargetOnlyWhereTheRowsAreWhole) {
  const at::Tensor full = random_tensor({4, 6}, 32);
  const at::Tensor t = torch::tensor({0, 1, 5, 3});
  run_ranks(4, [&](int64_t) {
    auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    {
      auto guard = loss_parallel(strictness(false));
      const std::string msg = error_of<LossParallelLayoutError>([&] {
        F::cross_entropy(distribute_tensor(full, mesh, {Shard(0), Shard(1)}), t);
      });
      EXPECT_TRUE(contains(msg, "requires a DTensor")) << msg;
    }
    // The z-loss's mean divides by another count: its global mean is refused.
    LossParallelOptions z = strictness(false);
    z.z_loss_weight = 1e-4;
    auto zg = loss_parallel(z);
    const std::string zmsg = error_of<LossParallelUnsupportedError>([&] {
      F::cross_entropy(distribute_tensor(full, mesh, {Shard(0), Shard(1)}),
                       distribute_tensor(t, mesh, {Shard(0), Replicate()}));
    });
    EXPECT_TRUE(contains(zmsg, "z_loss")) << zmsg;
  });
}

// strict = false re-lays out what the contract does not take (Partial reduced, a second
// class shard gathered, a target laid out otherwise redistributed) and stays exact.
TEST(LossParallelMeshesErrors, NonStrictReLaysOutAndStaysExact) {
  const at::Tensor full = random_tensor({4, 6}, 33);
  const at::Tensor t = torch::tensor({0, 1, 5, 3});
  at::Tensor x = full.clone().set_requires_grad(true);
  const at::Tensor ref = F::cross_entropy(x, t, F::CrossEntropyFuncOptions().reduction(torch::kSum));
  ref.backward();
  run_ranks(4, [&](int64_t) {
    auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    auto guard = loss_parallel(strictness(false));
    const auto sum = F::CrossEntropyFuncOptions().reduction(torch::kSum);
    // Partial on dp: each dp rank holds half the values.
    const at::Tensor piece = to_local(distribute_tensor(full, mesh, {Replicate(), Shard(1)}));
    at::Tensor partial = DTensor::from_local(piece * 0.5, mesh, {Partial(), Shard(1)});
    at::Tensor partial_leaf = partial.detach().set_requires_grad(true);
    at::Tensor loss = F::cross_entropy(partial_leaf, t, sum);
    EXPECT_EQ(placements_of(loss), (Placements{Replicate(), Replicate()}));
    EXPECT_LE(rel_err(full_tensor(loss), ref.detach()), 1e-12);
    loss.backward();
    EXPECT_LE(rel_err(full_tensor(partial_leaf.grad()), x.grad()), 1e-12);
    // The class dim sharded by both mesh dims: kept on the last.
    at::Tensor nested = distribute_tensor(full, mesh, {Shard(1), Shard(1)}).set_requires_grad(true);
    loss = F::cross_entropy(nested, t, sum);
    EXPECT_LE(rel_err(full_tensor(loss), ref.detach()), 1e-12);
    loss.backward();
    EXPECT_LE(rel_err(full_tensor(nested.grad()), x.grad()), 1e-12);
    // A target sharded on the wrong mesh dim: redistributed to the rows' layout.
    at::Tensor batch = distribute_tensor(full, mesh, {Shard(0), Shard(1)}).set_requires_grad(true);
    loss = F::cross_entropy(batch, distribute_tensor(t, mesh, {Replicate(), Shard(0)}), sum);
    EXPECT_EQ(placements_of(loss), (Placements{Partial(), Replicate()}));
    EXPECT_LE(rel_err(full_tensor(loss), ref.detach()), 1e-12);
    loss.backward();
    EXPECT_LE(rel_err(full_tensor(batch.grad()), x.grad()), 1e-12);
  });
}

}  // namespace loss_parallel_meshes_test

namespace loss_parallel_meshes_test {

// The global mean's only collective outside the TP group is the sum of its denominator over
// dp: a target refused on one dp group only (an id out of range in its rows) must not leave
// the other group waiting there. That group raises its own error (IndexError); the other
// says that the inputs were refused elsewhere on the mesh.
TEST(LossParallelMeshesErrors, AGlobalMeanRefusedOnOneDpGroupIsAnErrorOnEveryRank) {
  const at::Tensor full = random_tensor({4, 6}, 34);
  const at::Tensor bad = torch::tensor({0, 1, 5, 99});  // row 3: dp group 1's
  for (bool routed : {false, true}) {
    SCOPED_TRACE(routed ? "nll_loss(log_softmax)" : "cross_entropy");
    std::vector<std::string> errors(4);
    run_ranks(
        4,
        [&](int64_t rank) {
          auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
          auto guard = loss_parallel(strictness(false));
          const at::Tensor x = distribute_tensor(full, mesh, {Shard(0), Shard(1)});
          const at::Tensor t = distribute_tensor(bad, mesh, {Shard(0), Replicate()});
          try {
            if (routed) {
              F::nll_loss(torch::log_softmax(x, 1), t);
            } else {
              F::cross_entropy(x, t);
            }
          } catch (const std::exception& e) {
            errors[static_cast<size_t>(rank)] = e.what();
          }
        },
        std::chrono::seconds(20));
    for (int64_t rank = 0; rank < 4; ++rank) {
      const std::string& msg = errors[static_cast<size_t>(rank)];
      // Ranks 2 and 3 are dp coordinate 1 (the mesh is row-major).
      if (rank >= 2) {
        EXPECT_TRUE(contains(msg, "out of bounds")) << "rank " << rank << ": " << msg;
      } else {
        EXPECT_TRUE(contains(msg, "refused on other ranks of the mesh")) << "rank " << rank << ": " << msg;
      }
    }
  }
}

}  // namespace loss_parallel_meshes_test
