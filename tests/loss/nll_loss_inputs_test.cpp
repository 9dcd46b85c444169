// nll_loss_inputs_test.cpp — nll_loss under loss_parallel and vocab_parallel_nll_loss are as
// strict as PyTorch's nll_loss (the target's shape and dtype, the class weight's length and
// dtype), and their checks are settled across the ranks as cross_entropy's are: a refusal on
// one rank is the same error on every rank, and a caller that catches it and goes on finds
// every rank in step (no rank left behind in a collective).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "harness/job_errors.h"
#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/loss/vocab_parallel.h"

namespace nll_loss_inputs_test {

using namespace hyper_parallel;
using hyper_parallel::testing::error_text;
using hyper_parallel::testing::mesh_rank_errors;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

constexpr int64_t kRanks = 2, kRows = 6, kVocab = 9;

at::Tensor logp() { return at::log_softmax(random_tensor({kRows, kVocab}, 1), 1); }

at::Tensor piece(const at::Tensor& full, int64_t rank) {
  const auto r = chunk_range(full.size(-1), kRanks, rank);
  return full.narrow(-1, r.offset, r.length).contiguous();
}

at::Tensor good_target() { return torch::tensor({0, 3, 5, 8, 1, 2}); }

// Each rank's error from `call` ("no error" when none); bounded by 10 s for a hang.
std::vector<std::string> errors_of(const std::function<void(int64_t, const DeviceMesh&)>& call) {
  return mesh_rank_errors(kRanks, call);
}

void expect_everywhere(const std::vector<std::string>& errors, const std::string& needle, const std::string& what) {
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_NE(errors[r].find(needle), std::string::npos) << what << ", rank " << r << ": " << errors[r];
    EXPECT_EQ(errors[r], errors[0]) << what << ": rank " << r << " differs from rank 0";
  }
}

// vocab_parallel_nll_loss with `target` and `weight` on every rank.
std::function<void(int64_t, const DeviceMesh&)> functional(const at::Tensor& target,
                                                           const std::optional<at::Tensor>& weight) {
  return [=](int64_t rank, const DeviceMesh& mesh) {
    vocab_parallel_nll_loss_forward(piece(logp(), rank), 1, target, weight, at::Reduction::Mean, -100, &mesh.comm(0),
                                    kVocab);
  };
}

}  // namespace

TEST(NllLossInputs, TheFunctionalOpRefusesWhatPyTorchsNllLossRefuses) {
  const at::Tensor w = at::ones({kVocab}, at::kDouble);
  expect_everywhere(errors_of(functional(good_target().narrow(0, 0, 3), std::nullopt)),
                    "Expected input batch_size (6) to match target batch_size (3)", "a [3] target");
  expect_everywhere(errors_of(functional(good_target().view({2, 3}), std::nullopt)),
                    "Expected input batch_size (6) to match target batch_size (2)", "a [2, 3] target");
  expect_everywhere(errors_of(functional(good_target().to(at::kInt), std::nullopt)),
                    "expected target dtype to be Long or Byte, but got Int", "an int32 target");
  for (int64_t length : {kVocab - 1, kVocab + 3, kVocab - 2}) {
    expect_everywhere(errors_of(functional(good_target(), at::ones({length}, at::kDouble))),
                      "weight tensor should be defined either for all 9 classes or no classes",
                      "a weight of length " + std::to_string(length));
  }
  expect_everywhere(errors_of(functional(good_target(), w.to(at::kFloat))),
                    "expected scalar type Double but found Float", "a float32 weight");
}

TEST(NllLossInputs, UnderLossParallelAWrongWeightIsTheSameErrorEverywhere) {
  for (int64_t length : {kVocab - 1, kVocab + 3}) {
    expect_everywhere(errors_of([&](int64_t, const DeviceMesh& mesh) {
                        auto guard = loss_parallel();
                        F::nll_loss(distribute_tensor(logp(), mesh, {Shard(1)}), good_target(),
                                    F::NLLLossFuncOptions().weight(at::ones({length}, at::kDouble)));
                      }),
                      "weight tensor should be defined either for all 9 classes",
                      "a weight of length " + std::to_string(length));
  }
}

TEST(NllLossInputs, ARefusalOnOneRankIsTheSameErrorAndTheRanksStayInStep) {
  const at::Tensor bad = torch::tensor({0, 3, 5, 99, 1, 2});
  std::vector<double> after(kRanks);
  const auto errors = errors_of([&](int64_t rank, const DeviceMesh& mesh) {
    std::string first;
    try {
      vocab_parallel_nll_loss_forward(piece(logp(), rank), 1, rank == 1 ? bad : good_target(), std::nullopt,
                                      at::Reduction::Mean, -100, &mesh.comm(0), kVocab);
    } catch (const std::exception& e) {
      first = error_text(e);
    }
    // The loop goes on, as a training loop that catches the error would: the next calls must
    // meet every rank at the same collective.
    after[rank] = vocab_parallel_nll_loss_forward(piece(logp(), rank), 1, good_target(), std::nullopt,
                                                  at::Reduction::Mean, -100, &mesh.comm(0), kVocab)[0]
                      .item<double>();
    auto guard = loss_parallel();
    try {
      F::nll_loss(distribute_tensor(logp(), mesh, {Shard(1)}), rank == 1 ? bad : good_target());
    } catch (const std::exception& e) {
      first += " | " + error_text(e);
    }
    full_tensor(F::nll_loss(distribute_tensor(logp(), mesh, {Shard(1)}), good_target()));
    throw std::runtime_error(first);
  });
  expect_everywhere(errors, "rank(s) 1", "a target out of range on rank 1");
  for (const auto& e : errors) EXPECT_NE(e.find("out of bounds"), std::string::npos) << e;
  for (double a : after) EXPECT_NEAR(a, at::nll_loss(logp(), good_target()).item<double>(), 1e-12);
}

}  // namespace nll_loss_inputs_test
