// Placements, torch.chunk arithmetic and per-rank pieces of a Layout.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "harness/rank_harness.h"
#include "hyper_parallel/core/collective_stats.h"
#include "hyper_parallel/hyper_parallel.h"

namespace placement_layout_test {

using namespace hyper_parallel;
using hyper_parallel::testing::run_ranks;

TEST(Placement, ShardNormalisesNegativeDims) {
  EXPECT_EQ(Shard(-1).normalized(3), Shard(2));
  EXPECT_EQ(Shard(0).normalized(1), Shard(0));
  EXPECT_THROW(Shard(3).normalized(3), c10::IndexError);
  EXPECT_THROW(Shard(-4).normalized(3), c10::IndexError);
}

TEST(Placement, EqualityAndPrinting) {
  EXPECT_EQ(Replicate(), Replicate());
  EXPECT_NE(Shard(0), Shard(1));
  EXPECT_NE(Partial(ReduceOp::Sum), Partial(ReduceOp::Max));
  EXPECT_EQ(to_string({Shard(1), Replicate(), Partial(ReduceOp::Avg)}), "[Shard(1), Replicate(), Partial(avg)]");
}

TEST(ChunkRange, FollowsTorchChunkIncludingEmptyPieces) {
  // torch.chunk(arange(10), 4) -> 3, 3, 3, 1
  EXPECT_EQ(chunk_range(10, 4, 0).length, 3);
  EXPECT_EQ(chunk_range(10, 4, 3).offset, 9);
  EXPECT_EQ(chunk_range(10, 4, 3).length, 1);
  // torch.chunk(arange(5), 4) -> 2, 2, 1 and nothing for the fourth rank
  EXPECT_EQ(chunk_range(5, 4, 2).length, 1);
  EXPECT_EQ(chunk_range(5, 4, 3).length, 0);
  EXPECT_EQ(chunk_range(5, 4, 3).offset, 5);
  // More ranks than rows
  EXPECT_EQ(chunk_range(2, 3, 2).length, 0);
  EXPECT_EQ(chunk_range(0, 3, 0).length, 0);
}

TEST(Layout, LocalPiecesTileTheGlobalTensorOnA2DMesh) {
  run_ranks(4, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    EXPECT_EQ(mesh.coordinate(), (std::vector<int64_t>{rank / 2, rank % 2}));
    Layout l(mesh, {Shard(0), Shard(-1)}, {5, 7});
    EXPECT_EQ(l.placement(1), Shard(1));
    const int64_t rows = rank / 2 == 0 ? 3 : 2, cols = rank % 2 == 0 ? 4 : 3;
    EXPECT_EQ(l.local_shape(), (std::vector<int64_t>{rows, cols}));
    EXPECT_EQ(l.local_offset(), (std::vector<int64_t>{rank / 2 * 3, rank % 2 * 4}));
    // Nested: both mesh dims split dim 0 (chunk of a chunk).
    Layout nested(mesh, {Shard(0), Shard(0)}, {7, 2});
    std::vector<int64_t> expect_rows = {2, 2, 2, 1};  // 7 -> 4,3 -> 2,2 | 2,1
    EXPECT_EQ(nested.local_shape()[0], expect_rows[rank]);
    EXPECT_TRUE(nested.has_nested_shards());
  });
}

TEST(Layout, RejectsPlacementsThatDoNotFitTheMesh) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    EXPECT_THROW(Layout(mesh, {Shard(0), Shard(1)}, {4, 4}), c10::Error);
    EXPECT_THROW(Layout(mesh, {Shard(2)}, {4, 4}), c10::IndexError);
  });
}

TEST(DeviceMesh, SubMeshesShareGroupsAndListTheirRanks) {
  run_ranks(4, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    auto tp = mesh["tp"];
    auto dp = mesh["dp"];
    EXPECT_EQ(tp.ndim(), 1);
    EXPECT_EQ(tp.ranks(), (std::vector<int64_t>{rank / 2 * 2, rank / 2 * 2 + 1}));
    EXPECT_EQ(dp.ranks(), (std::vector<int64_t>{rank % 2, rank % 2 + 2}));
    EXPECT_EQ(tp.comm(0).global_ranks(), tp.ranks());
    // The tp group really is the pair (2r, 2r+1): all-reduce the global ranks.
    at::Tensor t = at::full({1}, static_cast<double>(rank), at::kDouble);
    tp.comm(0).all_reduce_(t, ReduceOp::Sum);
    EXPECT_EQ(t.item<double>(), static_cast<double>(tp.ranks()[0] + tp.ranks()[1]));
    EXPECT_THROW(mesh["pp"], c10::IndexError);
    EXPECT_EQ(mesh.slice({"tp", "dp"}).shape(), (std::vector<int64_t>{2, 2}));
  });
}

TEST(DeviceMesh, WrongWorldSizeIsAnErrorNamingBothNumbers) {
  run_ranks(2, [](int64_t) {
    try {
      init_device_mesh("cpu", {3});
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("needs 3 ranks but the world has 2"), std::string::npos) << e.what();
    }
  });
}

// Gathering a sequence (dim 1 of [batch, seq, dim]) must give an ordinary contiguous
// tensor: a transposed view made each linear that flattens it keep its own copy for
// backward, which cost sequence parallel more memory than it saved.
TEST(Communicator, AllGatherAlongAnInnerDimIsContiguous) {
  run_ranks(3, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {3});
    at::Tensor full = at::arange(2 * 7 * 4, at::kDouble).view({2, 7, 4});
    ChunkRange r = chunk_range(7, 3, rank);
    at::Tensor gathered = mesh.comm(0).all_gather(full.narrow(1, r.offset, r.length).contiguous(), 1, {3, 3, 1});
    EXPECT_TRUE(gathered.equal(full));
    EXPECT_TRUE(gathered.is_contiguous()) << gathered.strides();
  });
}

// Equal pieces arrive straight in their blocks of the result (strided views of it, along an
// inner dim): every dim, float64 and bfloat16 bits, the result contiguous.
TEST(Communicator, EvenAllGatherFillsTheResultInPlaceAlongEveryDim) {
  run_ranks(2, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor bits = at::arange(-32768, 32768, at::kInt).to(at::kShort).view({16, 64, 64});
    for (at::Tensor full : {at::randn({4, 6, 8}, at::kDouble), bits.view(at::kBFloat16)}) {
      // The same values on both ranks: a broadcast of rank 0's draw.
      if (full.scalar_type() == at::kDouble) mesh.comm(0).broadcast_(full, 0);
      for (int64_t dim = 0; dim < full.dim(); ++dim) {
        const int64_t half = full.size(dim) / 2;
        at::Tensor gathered = mesh.comm(0).all_gather(full.narrow(dim, rank * half, half), dim, {half, half});
        const bool exact =
            full.scalar_type() == at::kDouble ? gathered.equal(full) : gathered.view(at::kShort).equal(bits);
        EXPECT_TRUE(exact) << full.scalar_type() << " along dim " << dim;
        EXPECT_TRUE(gathered.is_contiguous()) << gathered.strides();
      }
    }
  });
}

// Gathering bfloat16 over Gloo (which has no bfloat16): the bits travel as they are (as
// float16), every value arriving exactly (NaN payloads, infinities, denormals), and half
// the bytes of a float32 round trip go over the wire (the logits' gather path was 1.9x
// PyTorch's time in bfloat16 while widening).
TEST(Communicator, Bfloat16AllGatherMovesItsOwnBytesOverGloo) {
  run_ranks(3, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {3});
    // Every bfloat16 bit pattern once, as [8, 8192] gathered along dim 1 (pieces of
    // 2731, 2731, 2730 columns).
    at::Tensor bits = at::arange(-32768, 32768, at::kInt).to(at::kShort).view({8, 8192});
    at::Tensor full = bits.view(at::kBFloat16);
    ChunkRange r = chunk_range(8192, 3, rank);
    const std::vector<int64_t> sizes{2731, 2731, 2730};
    const CollectiveTally before = collective_tally();
    at::Tensor gathered = mesh.comm(0).all_gather(full.narrow(1, r.offset, r.length), 1, sizes);
    const CollectiveTally after = collective_tally();
    ASSERT_EQ(gathered.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(gathered.view(at::kShort).equal(bits));
    EXPECT_EQ(after.bytes - before.bytes, 8 * r.length * 2) << "bytes this rank sent";
  });
}

TEST(Communicator, UnevenAllGatherAndReduceScatter) {
  run_ranks(3, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {3});
    const auto& comm = mesh.comm(0);
    // Pieces of 7 rows split three ways: 3, 3, 1.
    at::Tensor full = at::arange(14, at::kDouble).view({7, 2});
    ChunkRange r = chunk_range(7, 3, rank);
    at::Tensor mine = full.narrow(0, r.offset, r.length);
    EXPECT_TRUE(comm.all_gather(mine, 0, {3, 3, 1}).equal(full));
    at::Tensor scattered = comm.reduce_scatter(full, 0, ReduceOp::Sum);
    EXPECT_TRUE(scattered.equal(mine * 3));
    reset_collective_counts();
    at::Tensor x = at::ones({2});
    comm.all_reduce_(x, ReduceOp::Avg);
    EXPECT_TRUE(x.equal(at::ones({2})));
    EXPECT_EQ(collective_counts().all_reduce, 1);
  });
}

}  // namespace placement_layout_test
