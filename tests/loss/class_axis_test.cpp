// The one class-axis decision (src/loss/class_axis.h), read as a table through the C interface
// every Python front end calls (hpk_resolve_class_axis, hpk_class_axis_mean): which mesh dim
// shards the classes, whether the logits are re-laid out, the rows' placements, whether reduction
// 'mean' is taken, or which error with which words.
// The routes' own tests (loss_parallel_behaviour_test.cpp, loss_parallel_meshes_test.cpp,
// tests/python) run the same decisions on real meshes.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "hyper_parallel_kernels/loss_kernels.h"
#include "loss/class_axis.h"

namespace {

hpk_placement S(int64_t dim) { return {HPK_PLACEMENT_SHARD, dim}; }
const hpk_placement R{HPK_PLACEMENT_REPLICATE, -1};
const hpk_placement P{HPK_PLACEMENT_PARTIAL, -1};
const hpk_placement O{HPK_PLACEMENT_OTHER, -1};

bool same(const hpk_placement& a, const hpk_placement& b) {
  return a.kind == b.kind && (a.kind != HPK_PLACEMENT_SHARD || a.dim == b.dim);
}

struct Route {
  bool can_relayout, rows_sharded;
  const char* tensor;
  const char* relax;
};
const Route kPyTorch{true, true, "a DTensor", "strict=False"};
const Route kHyperParallel{false, false, "a HyperParallel DTensor", "strict=False"};

struct Answer {
  int32_t status = HPK_OK;
  hpk_class_axis axis{};
  std::string message;
};

using Question = int32_t (*)(const hpk_class_axis_query*, hpk_class_axis*, hpk_error*);

Answer ask(Question question, const std::vector<hpk_placement>& placements, const Route& route, int32_t strictness,
           int64_t ndim = 2, int64_t class_dim = 1, std::vector<int32_t> options_mesh_fits = {}) {
  hpk_class_axis_query q{};
  q.is_dtensor = 1;
  q.mesh_ndim = static_cast<int64_t>(placements.size());
  for (size_t i = 0; i < placements.size(); ++i) q.placements[i] = placements[i];
  q.ndim = ndim;
  q.class_dim = class_dim;
  q.can_relayout = route.can_relayout;
  q.rows_sharded = route.rows_sharded;
  q.strictness = strictness;
  q.has_options_mesh = !options_mesh_fits.empty();
  for (size_t i = 0; i < options_mesh_fits.size(); ++i) q.options_mesh_fits[i] = options_mesh_fits[i];
  q.op = "cross_entropy";
  q.tensor = route.tensor;
  q.relax = route.relax;
  q.found = "FOUND";
  q.options_mesh = "dp";
  Answer a;
  char buffer[2048];
  a.axis.message = buffer;
  a.axis.message_capacity = sizeof buffer;
  hpk_error error{};
  a.status = question(&q, &a.axis, &error);
  a.message = a.status == HPK_OK ? "" : error.message;
  if (a.status == HPK_ERROR_LAYOUT || a.status == HPK_ERROR_UNSUPPORTED) {
    EXPECT_EQ(a.message, std::string(buffer));  // the whole message, in both
    EXPECT_EQ(a.axis.message_length, static_cast<int64_t>(a.message.size()));
  }
  a.axis.message = nullptr;
  return a;
}

Answer resolve(const std::vector<hpk_placement>& placements, const Route& route, int32_t strictness, int64_t ndim = 2,
               int64_t class_dim = 1, std::vector<int32_t> options_mesh_fits = {}) {
  return ask(hpk_resolve_class_axis, placements, route, strictness, ndim, class_dim, std::move(options_mesh_fits));
}

Answer mean(const std::vector<hpk_placement>& placements, const Route& route, int32_t strictness) {
  return ask(hpk_class_axis_mean, placements, route, strictness);
}

constexpr int32_t kUnknown = HPK_STRICTNESS_UNKNOWN, kStrict = HPK_STRICTNESS_STRICT, kRelaxed = HPK_STRICTNESS_RELAXED;

}  // namespace

TEST(ClassAxis, TheContractIsTakenAsItIsWithoutAskingTheStrictness) {
  struct Row {
    std::vector<hpk_placement> placements;
    int64_t mesh_dim;
    std::vector<hpk_placement> rows;
  };
  for (const Row& row : std::vector<Row>{{{S(1)}, 0, {R}}, {{S(0), S(1)}, 1, {S(0), R}}, {{R, S(1)}, 1, {R, R}}}) {
    const Answer a = resolve(row.placements, kPyTorch, kUnknown);
    ASSERT_EQ(a.status, HPK_OK) << a.message;
    EXPECT_EQ(a.axis.outcome, HPK_CLASS_AXIS_RESOLVED);
    EXPECT_EQ(a.axis.mesh_dim, row.mesh_dim);
    EXPECT_EQ(a.axis.relayout, 0);
    for (size_t i = 0; i < row.placements.size(); ++i) {
      EXPECT_TRUE(same(a.axis.want[i], row.placements[i])) << i;
      EXPECT_TRUE(same(a.axis.rows[i], row.rows[i])) << i;
    }
  }
}

TEST(ClassAxis, OffTheContractStrictRefusesAndNotStrictRelaysOutOnceAsked) {
  for (const auto& placements : std::vector<std::vector<hpk_placement>>{{S(1), S(1)}, {P, S(1)}, {O, S(1)}}) {
    EXPECT_EQ(resolve(placements, kPyTorch, kUnknown).axis.outcome, HPK_CLASS_AXIS_NEEDS_STRICTNESS);
    const Answer strict = resolve(placements, kPyTorch, kStrict);
    EXPECT_EQ(strict.status, HPK_ERROR_LAYOUT);
    EXPECT_NE(strict.message.find("cross_entropy under loss_parallel (strict): expected the input to be a DTensor "
                                  "sharded along its class dim 1 on exactly one mesh dim (Shard(1))"),
              std::string::npos)
        << strict.message;
    EXPECT_NE(strict.message.find("got FOUND"), std::string::npos) << strict.message;
    EXPECT_NE(strict.message.find("or use strict=False"), std::string::npos) << strict.message;
    const Answer relaxed = resolve(placements, kPyTorch, kRelaxed);
    ASSERT_EQ(relaxed.status, HPK_OK) << relaxed.message;
    EXPECT_EQ(relaxed.axis.mesh_dim, 1);
    EXPECT_EQ(relaxed.axis.relayout, 1);
    EXPECT_TRUE(same(relaxed.axis.want[0], R) && same(relaxed.axis.want[1], S(1)));
  }
  EXPECT_NE(resolve({P, S(1)}, kPyTorch, kStrict).message.find("reduce the Partial first"), std::string::npos);
}

TEST(ClassAxis, WhatNoRouteTakesIsRefusedWithoutAskingTheStrictness) {
  for (const Route& route : {kPyTorch, kHyperParallel}) {
    Answer a = resolve({S(0)}, route, kUnknown);
    EXPECT_EQ(a.status, HPK_ERROR_LAYOUT);
    EXPECT_NE(a.message.find("got FOUND: the class dim 1 is not sharded"), std::string::npos) << a.message;
    a = resolve({P}, route, kUnknown);
    EXPECT_EQ(a.status, HPK_ERROR_LAYOUT);
    EXPECT_NE(a.message.find("not sharded (reduce the Partial first"), std::string::npos) << a.message;
    a = resolve({S(1)}, route, kUnknown, 2, 1, {0});
    EXPECT_EQ(a.status, HPK_ERROR_LAYOUT);
    EXPECT_EQ(a.message, "cross_entropy under loss_parallel(mesh = dp): expected the input on that mesh, got FOUND");
    EXPECT_EQ(resolve({S(1)}, route, kStrict, 2, 1, {1}).status, HPK_OK);
  }
  hpk_class_axis_query q{};
  q.ndim = 2;
  q.class_dim = 1;
  q.can_relayout = q.rows_sharded = 1;
  q.op = "nll_loss";
  q.tensor = "a DTensor";
  q.found = "[4, 8]";
  hpk_class_axis axis{};
  hpk_error error{};
  EXPECT_EQ(hpk_resolve_class_axis(&q, &axis, &error), HPK_ERROR_LAYOUT);
  EXPECT_STREQ(
      error.message,
      "nll_loss under loss_parallel: expected the input to be a DTensor sharded along its class dim 1 on "
      "exactly one mesh dim (Shard(1)), its other mesh dims Shard or Replicate (a Shard of another dim), got a plain "
      "tensor of shape [4, 8]");
}

TEST(ClassAxis, ARouteThatCannotRelayOutRefusesWhatTheOtherRelaysOut) {
  Answer a = resolve({P, S(1)}, kHyperParallel, kUnknown);
  EXPECT_EQ(a.status, HPK_ERROR_LAYOUT);
  EXPECT_NE(a.message.find("reduce the Partial first"), std::string::npos) << a.message;
  a = resolve({S(1), S(1)}, kHyperParallel, kUnknown);
  EXPECT_EQ(a.status, HPK_ERROR_UNSUPPORTED);
  EXPECT_NE(a.message.find("the class dim is sharded by 2 mesh dims (FOUND); expected exactly one"), std::string::npos)
      << a.message;
}

TEST(ClassAxis, ARouteWithReplicatedResultsTakesOtherMeshDimsOnlyReplicatedAndNotStrict) {
  EXPECT_EQ(resolve({R, S(1)}, kHyperParallel, kUnknown).axis.outcome, HPK_CLASS_AXIS_NEEDS_STRICTNESS);
  Answer a = resolve({R, S(1)}, kHyperParallel, kStrict);
  EXPECT_EQ(a.status, HPK_ERROR_LAYOUT);
  EXPECT_NE(a.message.find("(strict): expected a HyperParallel DTensor"), std::string::npos) << a.message;
  EXPECT_NE(a.message.find("1-D tensor-parallel sub-mesh or strict=False"), std::string::npos) << a.message;
  a = resolve({R, S(1)}, kHyperParallel, kRelaxed);
  ASSERT_EQ(a.status, HPK_OK) << a.message;
  EXPECT_EQ(a.axis.mesh_dim, 1);
  a = resolve({S(0), S(1)}, kHyperParallel, kRelaxed);
  EXPECT_EQ(a.status, HPK_ERROR_LAYOUT);
  EXPECT_NE(a.message.find("(strict=False): expected every mesh axis but the class axis to be Replicate"),
            std::string::npos)
      << a.message;
  // A route without strictness (MindSpore's) says nothing of it.
  a = resolve({S(0), S(1)}, {false, false, "a HyperParallel DTensor", ""}, kRelaxed);
  EXPECT_NE(a.message.find("cross_entropy under loss_parallel: expected every mesh axis"), std::string::npos)
      << a.message;
}

TEST(ClassAxis, MeanIsTakenOnOneMeshDimAndOnMoreOnlyWithoutStrict) {
  for (int32_t strictness : {kUnknown, kStrict, kRelaxed}) {
    const Answer one = mean({S(1)}, kPyTorch, strictness);
    ASSERT_EQ(one.status, HPK_OK) << one.message;
    EXPECT_EQ(one.axis.outcome, HPK_CLASS_AXIS_RESOLVED);  // without asking the strictness
  }
  EXPECT_EQ(mean({S(0), S(1)}, kPyTorch, kUnknown).axis.outcome, HPK_CLASS_AXIS_NEEDS_STRICTNESS);
  const Answer relaxed = mean({S(0), S(1)}, kPyTorch, kRelaxed);
  ASSERT_EQ(relaxed.status, HPK_OK) << relaxed.message;
  EXPECT_EQ(relaxed.axis.outcome, HPK_CLASS_AXIS_RESOLVED);
  const Answer strict = mean({R, S(1)}, kPyTorch, kStrict);
  EXPECT_EQ(strict.status, HPK_ERROR_UNSUPPORTED);
  EXPECT_EQ(strict.message,
            "cross_entropy under loss_parallel (strict): reduction 'mean' is only supported on a one-dimensional mesh "
            "(PyTorch's loss_parallel contract), got a mesh of 2 dims (FOUND). Use reduction 'sum' or 'none', or "
            "strict=False for the exact global mean (one small all-reduce of its denominator over each mesh dim that "
            "shards the rows)");
}

TEST(ClassAxis, RowsAreLaidOutAsTheLogitsWithoutTheClassDim) {
  // [batch, classes, sequence] on dp x tp x sp: the rows [batch, sequence] keep dp and sp.
  const Answer a = resolve({S(0), S(1), S(2)}, kPyTorch, kUnknown, 3);
  ASSERT_EQ(a.status, HPK_OK) << a.message;
  EXPECT_TRUE(same(a.axis.rows[0], S(0)) && same(a.axis.rows[1], R) && same(a.axis.rows[2], S(1)));
  // The C++ route's own call, the same function.
  namespace ca = hyper_parallel::class_axis;
  const ca::Placements rows = ca::row_placements({ca::shard(0), ca::shard(1), ca::shard(2)}, 1, 1);
  EXPECT_TRUE(rows == (ca::Placements{ca::shard(0), ca::replicate(), ca::shard(1)}));
}

TEST(ClassAxis, AMalformedQueryIsAStatusAndAMessage) {
  Answer a = resolve({S(5)}, kPyTorch, kUnknown);
  EXPECT_EQ(a.status, HPK_ERROR_SHAPE);
  EXPECT_NE(a.message.find("hpk_resolve_class_axis: placements[0]: expected a Shard of a dim in [0, 2), got 5"),
            std::string::npos)
      << a.message;
  EXPECT_EQ(resolve({S(1)}, kPyTorch, kUnknown, 2, 2).status, HPK_ERROR_SHAPE);
  hpk_error error{};
  EXPECT_EQ(hpk_resolve_class_axis(nullptr, nullptr, &error), HPK_ERROR_NULL_POINTER);
}
