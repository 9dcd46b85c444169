// checkpoint_reshard_test.cpp — the resharding core without a Trainer: every piece a rank
// needs at any TP degree and placement is built, bit for bit, from only the saved pieces
// the plan names, for Shard(0), Shard(1) and Replicate() tensors with uneven and empty
// pieces; layouts round-trip through the manifest's JSON; bad layouts and files are errors
// naming the tensor.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <stdexcept>

#include "train/checkpoint/checkpoint_layout.h"
#include "train/checkpoint/checkpoint_reshard.h"
#include "hyper_parallel_train/config/parallel_dims.h"

namespace checkpoint_reshard_test {

using namespace hyper_parallel::train;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// The expected pieces come from torch.chunk itself, not from the library's piece_of: TP
// rank r of tp holds torch.chunk(full, tp, dim)[r] (an empty piece where torch.chunk
// returns fewer than tp, as PyTorch's DTensor pads), the whole tensor for Replicate().
at::Tensor chunk_of(const at::Tensor& full, const TensorLayout& l, int64_t tp, int64_t r) {
  if (l.shard_dim < 0) return full;
  const std::vector<at::Tensor> pieces = full.chunk(tp, l.shard_dim);
  return r < static_cast<int64_t>(pieces.size()) ? pieces[static_cast<size_t>(r)]
                                                 : full.narrow(l.shard_dim, full.size(l.shard_dim), 0);
}

// Where that piece lies: its first index along the shard dim (the dim's length for an
// empty piece) and its length.
Box chunk_box(const TensorLayout& l, int64_t tp, int64_t r) {
  Box b{std::vector<int64_t>(l.shape.size(), 0), l.shape};
  if (l.shard_dim < 0) return b;
  const auto d = static_cast<size_t>(l.shard_dim);
  const at::Tensor mine = chunk_of(at::arange(l.shape[d], at::kLong), {{l.shape[d]}, 0, at::kLong}, tp, r);
  b.offset[d] = mine.numel() ? mine[0].item<int64_t>() : l.shape[d];
  b.sizes[d] = mine.numel();
  return b;
}

// The saved file of TP rank r: its piece of `full` (a contiguous copy, as a file holds).
std::map<std::string, at::Tensor> file_of(const std::string& key, const at::Tensor& full, const TensorLayout& l,
                                          int64_t tp, int64_t r) {
  return {{key, chunk_of(full, l, tp, r).contiguous()}};
}

// The saved TP ranks whose pieces overlap `want` (what a rank must read for a sharded tensor).
std::vector<int64_t> overlapping(const TensorLayout& saved, int64_t saved_tp, const Box& want) {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < saved_tp; ++r) {
    const Box b = chunk_box(saved, saved_tp, r);
    bool any = want.numel() > 0;
    for (size_t d = 0; d < b.offset.size(); ++d) {
      any = any &&
            std::max(b.offset[d], want.offset[d]) < std::min(b.offset[d] + b.sizes[d], want.offset[d] + want.sizes[d]);
    }
    if (any) out.push_back(r);
  }
  return out;
}

}  // namespace

TEST(CheckpointReshard, EveryPieceAtEveryDegreeComesBackBitForBit) {
  // [7, 5]: uneven over 2, 3 and 4 ranks; [3, 2]: over 4 ranks the last Shard(0) piece is
  // empty, and Shard(1) over 3 or 4 ranks leaves empty pieces too.
  int64_t cases = 0;
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{7, 5}, std::vector<int64_t>{3, 2}}) {
    const at::Tensor full = at::randn(shape, at::kFloat);
    for (int64_t saved_dim : {-1, 0, 1}) {
      for (int64_t saved_tp : {1, 2, 3, 4}) {
        const TensorLayout saved{shape, saved_dim, at::kFloat};
        std::vector<std::map<std::string, at::Tensor>> files;
        for (int64_t r = 0; r < saved_tp; ++r) files.push_back(file_of("w", full, saved, saved_tp, r));
        for (int64_t dim : {-1, 0, 1}) {
          for (int64_t tp : {1, 2, 3, 4}) {
            for (int64_t rank = 0; rank < tp; ++rank) {
              SCOPED_TRACE("shape " + shape_string(shape) + ", saved " + placement_string(saved) + " over " +
                           std::to_string(saved_tp) + ", now " + placement_string({shape, dim, at::kFloat}) + " over " +
                           std::to_string(tp) + ", rank " + std::to_string(rank));
              const TensorLayout now{shape, dim, at::kFloat};
              const Box want = chunk_box(now, tp, rank);
              EXPECT_EQ(piece_of(now, tp, rank).sizes, want.sizes);
              if (want.numel() > 0) EXPECT_EQ(piece_of(now, tp, rank).offset, want.offset);
              ReshardPlan plan({{"w", saved}}, saved_tp, {{"w", now, want}}, rank % saved_tp);
              // Only the files that hold part of the piece; one for a whole saved tensor.
              if (saved_dim >= 0) {
                EXPECT_EQ(plan.sources(), overlapping(saved, saved_tp, want));
              } else if (want.numel() > 0) {
                EXPECT_EQ(plan.sources(), std::vector<int64_t>{rank % saved_tp});
              }
              if (saved_tp == tp && dim == saved_dim && want.numel() > 0) {
                EXPECT_EQ(plan.sources(), std::vector<int64_t>{rank}) << "same layout: only its own file";
              }
              for (int64_t r : plan.sources()) plan.take(r, files[static_cast<size_t>(r)], "rank-" + std::to_string(r));
              const at::Tensor got = plan.finish().at("w");
              const at::Tensor expected = file_of("w", full, now, tp, rank).at("w");
              ASSERT_EQ(got.sizes(), expected.sizes());
              EXPECT_TRUE(at::equal(got, expected));
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 3 * 4 * 3 * (1 + 2 + 3 + 4));
}

TEST(CheckpointReshard, AReplicatedTensorIsReadFromAFileTheRankOpensAnyway) {
  // Rank 3 of 4 needs saved rank 1's half of a Shard(0) tensor: it takes the norm from
  // that file too, not from its preferred rank 0.
  const TensorLayout sharded{{8, 4}, 0, at::kFloat}, whole{{4}, -1, at::kFloat};
  const TensorLayout step{{}, -1, at::kLong};
  ReshardPlan plan(
      {{"w", sharded}, {"norm", whole}, {"step", step}}, 2,
      {{"w", sharded, piece_of(sharded, 4, 3)}, {"norm", whole, piece_of(whole, 4, 3)}, {"step", step, Box{}}},
      /*preferred_rank=*/0);
  EXPECT_EQ(plan.sources(), std::vector<int64_t>{1});
  const at::Tensor w = at::arange(32, at::kFloat).reshape({8, 4});
  plan.take(1,
            {{"w", w.narrow(0, 4, 4).contiguous()}, {"norm", at::ones({4})}, {"step", at::scalar_tensor(7, at::kLong)}},
            "rank-1.pt");
  const auto out = plan.finish();
  EXPECT_TRUE(at::equal(out.at("w"), w.narrow(0, 6, 2)));
  EXPECT_TRUE(at::equal(out.at("norm"), at::ones({4})));
  EXPECT_EQ(out.at("step").item<int64_t>(), 7);
}

TEST(CheckpointReshard, AnotherModelNamesEveryTensorWithBothShapes) {
  const TensorLayout saved{{515, 48}, 0, at::kFloat};
  const TensorLayout now{{515, 24}, 0, at::kFloat};
  const std::string e = error_of([&] {
    ReshardPlan({{"model.tok_embeddings.weight", saved}}, 2,
                {{"model.tok_embeddings.weight", now, piece_of(now, 2, 0)},
                 {"model.norm.weight", {{24}, -1, at::kFloat}, Box{{0}, {24}}}},
                0);
  });
  EXPECT_NE(e.find("tensor model.tok_embeddings.weight: checkpoint [515, 48] Float, this job [515, 24] Float"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("tensor model.norm.weight: not in the checkpoint, this job [24] Float"), std::string::npos) << e;
}

TEST(CheckpointReshard, AFileWhosePieceDisagreesWithTheLayoutIsNamed) {
  const TensorLayout l{{7, 5}, 1, at::kFloat};
  ReshardPlan plan({{"w", l}}, 2, {{"w", l, piece_of(l, 1, 0)}}, 0);
  // Saved rank 1 of 2 holds columns 3..4: a [7, 3] piece is not what the layout says.
  const std::string e = error_of([&] { plan.take(1, {{"w", at::zeros({7, 3})}}, "step-4/rank-1.pt"); });
  EXPECT_NE(e.find("'step-4/rank-1.pt': tensor w is [7, 3] Float"), std::string::npos) << e;
  EXPECT_NE(e.find("gives rank 1 a piece [7, 2] Float"), std::string::npos) << e;
  const std::string missing = error_of([&] { plan.take(0, {}, "step-4/rank-0.pt"); });
  EXPECT_NE(missing.find("'step-4/rank-0.pt' has no tensor w"), std::string::npos) << missing;
}

TEST(CheckpointReshard, AFileNotTakenIsAnErrorNotZeros) {
  const TensorLayout l{{8}, 0, at::kFloat};
  ReshardPlan plan({{"w", l}}, 2, {{"w", l, piece_of(l, 1, 0)}}, 0);
  ASSERT_EQ(plan.sources(), (std::vector<int64_t>{0, 1}));
  plan.take(0, {{"w", at::zeros({4})}}, "rank-0.pt");
  const std::string e = error_of([&] { plan.finish(); });
  EXPECT_NE(e.find("tensor w: 4 of its 8 elements"), std::string::npos) << e;
}

TEST(CheckpointLayout, TheManifestsTableRoundTripsAndRefusesWhatItCannotHold) {
  const LayoutTable table = {{"model.w", {{515, 48}, 0, at::kFloat}},
                             {"model.norm", {{48}, -1, at::kBFloat16}},
                             {"optim.0.step", {{}, -1, at::kLong}}};
  const nlohmann::json j = to_json(table);
  EXPECT_EQ(j.at("model.w").at("placement"), "Shard(0)");
  EXPECT_EQ(j.at("model.norm").at("placement"), "Replicate()");
  EXPECT_EQ(layout_table_from_json(j, "m"), table);
  auto refused = [&](const char* key, const nlohmann::json& value, const std::string& needle) {
    nlohmann::json bad = j;
    bad["model.w"][key] = value;
    const std::string e = error_of([&] { layout_table_from_json(bad, "manifest.json"); });
    EXPECT_NE(e.find("manifest.json: tensor model.w"), std::string::npos) << e;
    EXPECT_NE(e.find(needle), std::string::npos) << e;
  };
  refused("placement", "Shard(2)", "neither Replicate() nor Shard(d)");
  refused("placement", "Partial()", "neither Replicate() nor Shard(d)");
  refused("shape", nlohmann::json::array({515, -1}), "not an integer");
  refused("shape", nlohmann::json::array({int64_t{1} << 30, int64_t{1} << 30}), "over 2^48 elements");
  refused("shape", "515", "expected 'shape'");
  refused("dtype", "Complex", "is not one a checkpoint holds");
  EXPECT_NE(error_of([] { layout_table_from_json(nlohmann::json::array(), "m"); }).find("not an object"),
            std::string::npos);
}

// The file a resuming rank reads for a saved piece: that of saved replica (replica mod
// saved dp), its own when the layout is unchanged (checkpoint_manager.cpp).
TEST(CheckpointReshard, DataParallelRanksReadOneSavedReplicaTheirOwnWhenUnchanged) {
  const ParallelDims saved(2, 1, 2);  // dp 2 x tp 2: global rank = replica * 2 + tp rank
  auto file = [&](const ParallelDims& now, int64_t rank, int64_t saved_piece) {
    return saved.rank_of(now.replica_of(rank) % saved.dp_replicate(), saved_piece);
  };
  const ParallelDims same(2, 1, 2), dp4(4, 1, 2);
  EXPECT_EQ(file(same, 0, 1), 1);
  for (int64_t rank = 0; rank < 4; ++rank) EXPECT_EQ(file(same, rank, same.piece_of(rank)), rank);  // its own
  EXPECT_EQ(file(dp4, 6, 1), 3);  // dp 4 now: replicas 0, 1, 0, 1
  EXPECT_EQ(file(dp4, 4, 0), 0);
  const ParallelDims tp4(1, 1, 4);  // saved without dp: the one replica
  EXPECT_EQ(tp4.rank_of(ParallelDims(6, 1, 1).replica_of(5) % tp4.dp_replicate(), 2), 2);
}

}  // namespace checkpoint_reshard_test
