// Every Shard/Replicate/Partial transition on 1-D and 2-D meshes, even and uneven
// shapes: the redistributed pieces must be exactly the pieces of the same full tensor.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

using namespace hyper_parallel;
using hyper_parallel::testing::run_ranks;

namespace {

// Integer-valued doubles: sums, maxima and averages below are exact.
at::Tensor random_ints(c10::IntArrayRef shape, uint64_t seed) {
  return at::round(hyper_parallel::testing::random_tensor(shape, seed) * 8);
}

// torch.chunk(t, n, dim)[i], or an empty piece where torch.chunk returns fewer than n
// (PyTorch's DTensor pads its shard list so).
at::Tensor chunk_piece(const at::Tensor& t, int64_t dim, int64_t n, int64_t i) {
  const std::vector<at::Tensor> pieces = t.chunk(n, dim);
  return i < static_cast<int64_t>(pieces.size()) ? pieces[static_cast<size_t>(i)] : t.narrow(dim, t.size(dim), 0);
}

// The value a rank holds for `full` under `placements` (built independently of the
// library): partial mesh dims split the value so that their reduction gives it back,
// innermost mesh dim first (reductions run outermost first); shards then take chunks.
// Nothing here asks the library where a piece lies.
at::Tensor expected_piece(const at::Tensor& full, const DeviceMesh& mesh, const Placements& ps) {
  at::Tensor v = full;
  for (int64_t m = mesh.ndim() - 1; m >= 0; --m) {
    if (!ps[m].is_partial()) continue;
    const int64_t n = mesh.size(m), c = mesh.coordinate()[m];
    auto r = [&](int64_t k) { return random_ints(full.sizes(), 1000 + 10 * m + k); };
    switch (ps[m].reduce_op()) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: {
        // Sum: pieces add up to v. Avg: pieces are v + d_c with sum(d) = 0.
        at::Tensor rest = at::zeros_like(v);
        for (int64_t k = 0; k < n - 1; ++k) rest += r(k);
        if (ps[m].reduce_op() == ReduceOp::Sum) {
          v = c < n - 1 ? r(c) : v - rest;
        } else {
          v = c < n - 1 ? v + r(c) : v - rest;
        }
        break;
      }
      case ReduceOp::Max: v = c == 0 ? v : v - r(c).abs(); break;
      case ReduceOp::Min: v = c == 0 ? v : v + r(c).abs(); break;
    }
  }
  // Shards as PyTorch's DTensor cuts them: torch.chunk along the dim, mesh dim 0 first,
  // each later mesh dim chunking the piece the earlier ones left.
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    if (!ps[m].is_shard()) continue;
    const int64_t d = ps[m].dim() < 0 ? ps[m].dim() + full.dim() : ps[m].dim();
    v = chunk_piece(v, d, mesh.size(m), mesh.coordinate()[m]);
  }
  return v.contiguous();
}

void check_all_pairs(const DeviceMesh& mesh, const std::vector<Placements>& all,
                     const std::vector<int64_t>& shape, uint64_t seed) {
  at::Tensor full = random_ints(shape, seed);
  for (const auto& src : all) {
    at::Tensor dt = DTensor::from_local(expected_piece(full, mesh, src), mesh, src,
                                       FromLocalOptions{false, shape, std::nullopt});
    for (const auto& dst : all) {
      SCOPED_TRACE(to_string(src) + " -> " + to_string(dst) + " shape " +
                   c10::str(c10::IntArrayRef(shape)) + " rank " + std::to_string(mesh.get_rank()));
      at::Tensor out = redistribute(dt, dst);
      ASSERT_EQ(placements_of(out), dst);
      ASSERT_EQ(out.sizes(), full.sizes());
      if (std::none_of(dst.begin(), dst.end(), [](const Placement& p) { return p.is_partial(); })) {
        EXPECT_TRUE(to_local(out).equal(expected_piece(full, mesh, dst)));
      }
      at::Tensor back = full_tensor(out);
      EXPECT_TRUE(at::allclose(back, full, 0, 1e-12)) << (back - full).abs().max();
    }
  }
}

std::vector<Placements> one_d_placements() {
  return {{Shard(0)}, {Shard(1)}, {Replicate()}, {Partial(ReduceOp::Sum)},
          {Partial(ReduceOp::Max)}, {Partial(ReduceOp::Min)}, {Partial(ReduceOp::Avg)}};
}

std::vector<Placements> two_d_placements() {
  std::vector<Placement> each = {Shard(0), Shard(1), Replicate(), Partial(ReduceOp::Sum)};
  std::vector<Placements> out;
  for (auto& a : each) for (auto& b : each) out.push_back({a, b});
  out.push_back({Partial(ReduceOp::Max), Shard(0)});
  out.push_back({Shard(1), Partial(ReduceOp::Avg)});
  return out;
}

}  // namespace

class RedistributeOn1DMesh : public ::testing::TestWithParam<int64_t> {};

TEST_P(RedistributeOn1DMesh, AllPlacementPairsGiveTheSameFullTensor) {
  const int64_t n = GetParam();
  run_ranks(n, [n](int64_t) {
    auto mesh = init_device_mesh("cpu", {n});
    check_all_pairs(mesh, one_d_placements(), {5, 7}, 1);   // uneven for n = 2, 3, 4
    check_all_pairs(mesh, one_d_placements(), {4, 12}, 2);  // even for n = 2, 4
    check_all_pairs(mesh, one_d_placements(), {2, 3}, 3);   // empty pieces for n = 3, 4
  });
}

INSTANTIATE_TEST_SUITE_P(Degrees, RedistributeOn1DMesh, ::testing::Values(1, 2, 3, 4));

TEST(RedistributeOn2DMesh, AllPlacementPairsGiveTheSameFullTensor) {
  run_ranks(4, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    check_all_pairs(mesh, two_d_placements(), {6, 4}, 4);
    check_all_pairs(mesh, two_d_placements(), {5, 3}, 5);
  });
}

TEST(RedistributeOn2DMesh, UnevenMeshShapesAndNestedShards) {
  run_ranks(6, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2, 3});
    check_all_pairs(mesh, {{Shard(0), Shard(0)}, {Shard(0), Shard(1)}, {Shard(1), Shard(0)},
                           {Replicate(), Shard(0)}, {Shard(0), Replicate()},
                           {Partial(ReduceOp::Sum), Shard(0)}, {Replicate(), Replicate()},
                           {Shard(1), Shard(1)}},
                    {7, 5}, 6);
  });
}

TEST(Redistribute, CountsOneCollectivePerChangedMeshDim) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor full = random_ints({4, 4}, 7);
    at::Tensor s = distribute_tensor(full, mesh, {Shard(0)});
    reset_collective_counts();
    redistribute(s, {Replicate()});
    EXPECT_EQ(collective_counts().all_gather, 1);
    EXPECT_EQ(collective_counts().total(), 1);
    reset_collective_counts();
    redistribute(s, {Shard(1)});
    EXPECT_EQ(collective_counts().total(), 1);
    reset_collective_counts();
    at::Tensor r = redistribute(s, {Replicate()});
    reset_collective_counts();
    redistribute(r, {Shard(1)});  // a local chunk, no communication
    EXPECT_EQ(collective_counts().total(), 0);
  });
}

TEST(DistributeTensor, BroadcastsFromTheSourceRankWhenAsked) {
  run_ranks(4, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2, 2});
    at::Tensor mine = at::full({3, 2}, static_cast<double>(rank), at::kDouble);
    at::Tensor d = distribute_tensor(mine, mesh, {Replicate(), Shard(0)}, /*src_data_rank=*/3);
    EXPECT_TRUE(full_tensor(d).equal(at::full({3, 2}, 3.0, at::kDouble)));
  });
}

TEST(DTensorFromLocal, RunCheckReportsAPieceOfTheWrongShape) {
  run_ranks(2, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2});
    // Each piece alone looks like an even shard, but together they do not fit.
    at::Tensor local = at::zeros({rank == 0 ? 3 : 1, 2});
    FromLocalOptions check;
    check.run_check = true;
    try {
      DTensor::from_local(local, mesh, {Shard(0)}, check);
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("run_check"), std::string::npos) << e.what();
    }
    // A piece that does not fit the given global shape fails at once, without collectives.
    FromLocalOptions with_shape;
    with_shape.shape = std::vector<int64_t>{4, 2};
    EXPECT_THROW(DTensor::from_local(at::zeros({3, 2}), mesh, {Shard(0)}, with_shape), c10::Error);
  });
}
