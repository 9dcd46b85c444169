// Every Shard/Replicate/Partial transition on 1-D and 2-D meshes, even and uneven
// shapes: the redistributed pieces must be exactly the pieces of the same full tensor.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"

namespace redistribute_test {

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
      case ReduceOp::Max:
        v = c == 0 ? v : v - r(c).abs();
        break;
      case ReduceOp::Min:
        v = c == 0 ? v : v + r(c).abs();
        break;
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

void check_all_pairs(const DeviceMesh& mesh, const std::vector<Placements>& all, const std::vector<int64_t>& shape,
                     uint64_t seed) {
  at::Tensor full = random_ints(shape, seed);
  for (const auto& src : all) {
    at::Tensor dt =
        DTensor::from_local(expected_piece(full, mesh, src), mesh, src, FromLocalOptions{false, shape, std::nullopt});
    for (const auto& dst : all) {
      SCOPED_TRACE(to_string(src) + " -> " + to_string(dst) + " shape " + c10::str(c10::IntArrayRef(shape)) + " rank " +
                   std::to_string(mesh.get_rank()));
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
  return {{Shard(0)},
          {Shard(1)},
          {Replicate()},
          {Partial(ReduceOp::Sum)},
          {Partial(ReduceOp::Max)},
          {Partial(ReduceOp::Min)},
          {Partial(ReduceOp::Avg)}};
}

std::vector<Placements> two_d_placements() {
  std::vector<Placement> each = {Shard(0), Shard(1), Replicate(), Partial(ReduceOp::Sum)};
  std::vector<Placements> out;
  for (auto& a : each)
    for (auto& b : each) out.push_back({a, b});
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
    check_all_pairs(mesh,
                    {{Shard(0), Shard(0)},
                     {Shard(0), Shard(1)},
                     {Shard(1), Shard(0)},
                     {Replicate(), Shard(0)},
                     {Shard(0), Replicate()},
                     {Partial(ReduceOp::Sum), Shard(0)},
                     {Replicate(), Replicate()},
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

// Ranks seeded differently (per-rank dropout or data-loader seeds) each draw another
// tensor. PyTorch's default (src_data_rank = 0) takes the data of mesh coordinate 0, so the
// DTensor is rank 0's tensor, with one scatter (Shard) or broadcast (Replicate, Partial)
// per mesh dim, and the same pieces as rank 0's tensor distributed locally.
TEST(DistributeTensor, TakesCoordinateZerosDataByDefaultWhenRanksHoldDifferentData) {
  auto draw = [](int64_t rank, at::ScalarType dtype) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(4242 + rank);  // this rank's own seed
    return at::randn({7, 6}, gen, at::kDouble).to(dtype);
  };
  auto check = [&](const DeviceMesh& mesh, int64_t rank, const Placements& ps) {
    for (auto dtype : {at::kDouble, at::kBFloat16}) {
      SCOPED_TRACE(to_string(ps) + " " + c10::toString(dtype) + " on " + mesh.str());
      reset_collective_counts();
      at::Tensor d = distribute_tensor(draw(rank, dtype), mesh, ps);
      EXPECT_EQ(collective_counts().total(), mesh.ndim()) << "one scatter or broadcast per mesh dim";
      EXPECT_TRUE(full_tensor(d).equal(draw(0, dtype)));
      EXPECT_TRUE(to_local(d).equal(to_local(distribute_tensor(draw(0, dtype), mesh, ps, std::nullopt))));
    }
  };
  for (int64_t n : {2, 3, 4}) {  // 3 and 4: uneven pieces (7 rows, 6 columns)
    run_ranks(n, [&](int64_t rank) {
      auto mesh = init_device_mesh("cpu", {n});
      for (const Placements& ps : std::vector<Placements>{{Shard(0)}, {Shard(1)}, {Replicate()}, {Partial()}}) {
        check(mesh, rank, ps);
      }
    });
  }
  run_ranks(4, [&](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2, 2});
    for (const Placements& ps : std::vector<Placements>{{Shard(0), Replicate()},
                                                        {Replicate(), Shard(1)},
                                                        {Shard(0), Shard(0)},
                                                        {Shard(1), Shard(0)},
                                                        {Partial(), Shard(1)},
                                                        {Replicate(), Replicate()}}) {
      check(mesh, rank, ps);
    }
  });
}

// std::nullopt (PyTorch's src_data_rank=None): each rank's own data as is, no collective.
TEST(DistributeTensor, NulloptTakesEachRanksOwnDataWithoutCollectives) {
  run_ranks(2, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor mine = at::full({4, 2}, static_cast<double>(rank), at::kDouble);
    reset_collective_counts();
    at::Tensor d = distribute_tensor(mine, mesh, {Shard(0)}, std::nullopt);
    EXPECT_EQ(collective_counts().total(), 0);
    EXPECT_TRUE(to_local(d).equal(mine.narrow(0, 2 * rank, 2)));
  });
}

// src_data_rank names the source's rank within each mesh dim, as PyTorch's group_src: 1 on
// a 2 x 2 mesh is coordinate (1, 1), global rank 3.
TEST(DistributeTensor, SourceRankIsACoordinateOfEveryMeshDim) {
  run_ranks(4, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2, 2});
    at::Tensor mine = at::full({3, 2}, static_cast<double>(rank), at::kDouble);
    at::Tensor d = distribute_tensor(mine, mesh, {Replicate(), Shard(0)}, /*src_data_rank=*/1);
    EXPECT_TRUE(full_tensor(d).equal(at::full({3, 2}, 3.0, at::kDouble)));
    EXPECT_THROW(distribute_tensor(mine, mesh, {Replicate(), Shard(0)}, /*src_data_rank=*/2), c10::Error);
  });
}

// As PyTorch: a tensor computed by autograd is refused (DTensor::from_local is the way).
TEST(DistributeTensor, RefusesANonLeafTensor) {
  run_ranks(1, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {1});
    at::Tensor x = at::ones({2, 2}, at::kDouble).set_requires_grad(true);
    EXPECT_THROW(distribute_tensor(x * 2, mesh, {Replicate()}), c10::Error);
  });
}

// As PyTorch: run_check broadcasts coordinate 0's data along Replicate mesh dims.
TEST(DTensorFromLocal, RunCheckTakesCoordinateZerosDataForReplicate) {
  run_ranks(3, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {3});
    at::Tensor mine = at::full({2, 2}, static_cast<double>(rank + 1), at::kDouble);
    FromLocalOptions check;
    check.run_check = true;
    at::Tensor d = DTensor::from_local(mine, mesh, {Replicate()}, check);
    EXPECT_TRUE(to_local(d).equal(at::ones({2, 2}, at::kDouble)));
    EXPECT_TRUE(mine.equal(at::full({2, 2}, static_cast<double>(rank + 1), at::kDouble))) << "input written";
  });
}

// grad_placements of from_local and full_tensor (PyTorch's keyword of both): how the
// gradient reaching them is laid out.
TEST(DTensorFromLocal, GradPlacementsSayHowTheGradientIsLaidOut) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    for (bool partial : {false, true}) {
      at::Tensor x = at::ones({2, 2}, at::kDouble).set_requires_grad(true);
      FromLocalOptions o;
      if (partial) o.grad_placements = Placements{Partial()};
      (to_local(DTensor::from_local(x, mesh, {Replicate()}, o)) * 3).sum().backward();
      at::Tensor total = x.grad().clone();
      mesh.comm(0).all_reduce_(total, ReduceOp::Sum);
      // Partial: the ranks' pieces add up to the gradient; Replicate: each holds all of it.
      EXPECT_TRUE(total.equal(at::full({2, 2}, partial ? 3.0 : 6.0, at::kDouble))) << partial;
    }
    for (bool partial : {false, true}) {
      at::Tensor d = distribute_tensor(at::ones({4, 2}, at::kDouble), mesh, {Shard(0)}).set_requires_grad(true);
      std::optional<Placements> g;
      if (partial) g = Placements{Partial()};
      full_tensor(d, g).sum().backward();
      // Each rank's gradient of ones: summed over the ranks when Partial.
      EXPECT_TRUE(to_local(d.grad()).equal(at::full({2, 2}, partial ? 2.0 : 1.0, at::kDouble))) << partial;
    }
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

}  // namespace redistribute_test
