// loss_agreement_test.cpp — every rank agrees on a loss call or every rank refuses it: an
// option, a row count, a dtype or a vocabulary that differs between the ranks of a loss's
// group is the same LossParallelLayoutError on every rank, naming what differs and where,
// on every loss path (the functional kernels, the DTensor route, the fused linear loss),
// never a wrong value on some ranks or a Gloo abort (which would end this test binary).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "harness/job_errors.h"
#include "harness/rank_harness.h"
#include "hyper_parallel/loss/fused_linear_loss.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/loss/vocab_parallel.h"
#include "loss/call/call_agreement.h"

namespace loss_agreement_test {

using namespace hyper_parallel;
using hyper_parallel::testing::error_text;
using hyper_parallel::testing::mesh_rank_errors;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

constexpr int64_t kRanks = 2, kRows = 6, kVocab = 13;  // pieces 7 and 6

// Runs `call(rank, comm)` on 2 ranks; each rank's LossParallelLayoutError message, or
// "no error" / "other error: ..." for anything else. Bounded: a hang fails in 10 s.
std::vector<std::string> layout_errors(const std::function<void(int64_t, const DeviceMesh&)>& call) {
  return mesh_rank_errors<LossParallelLayoutError>(kRanks, call);
}

// Every rank has the same error, which names `field` and rank 1 as the one that differs.
void expect_named_everywhere(const std::vector<std::string>& errors, const std::string& field,
                             const std::string& context) {
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_NE(errors[r].find("disagree on the " + field), std::string::npos)
        << context << ", rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("rank(s) 1: "), std::string::npos) << context << ", rank " << r << ": " << errors[r];
    EXPECT_EQ(errors[r], errors[0]) << context << ": rank " << r << " differs from rank 0";
  }
}

at::Tensor piece(const at::Tensor& full, int64_t rank) {
  const auto r = chunk_range(full.size(-1), kRanks, rank);
  return full.narrow(-1, r.offset, r.length).contiguous();
}

at::Tensor targets(int64_t rows) { return at::arange(rows, at::kLong).remainder(kVocab); }

}  // namespace

TEST(LossAgreement, ACrossEntropyOptionOnOneRankOnlyIsTheSameNamedErrorEverywhere) {
  const at::Tensor full = random_tensor({kRows, kVocab}, 1);
  const at::Tensor weight = random_tensor({kVocab}, 2).abs() + 0.5;
  struct Case {
    std::string field;
    std::function<void(VocabCrossEntropyOptions&, std::optional<at::Tensor>&, int64_t&)> on_rank_1;
  };
  const std::vector<Case> cases = {
      {"reduction", [](auto& o, auto&, auto&) { o.reduction = at::Reduction::Sum; }},
      {"ignore_index", [](auto& o, auto&, auto&) { o.ignore_index = 3; }},
      {"label_smoothing", [](auto& o, auto&, auto&) { o.label_smoothing = 0.1; }},
      {"z_loss_weight", [](auto& o, auto&, auto&) { o.z_loss_weight = 1e-4; }},
      {"logit_softcap", [](auto& o, auto&, auto&) { o.logit_softcap = 5; }},
      {"gradient_in_forward", [](auto& o, auto&, auto&) { o.gradient_in_forward = true; }},
      {"class weight", [&](auto&, auto& w, auto&) { w = weight * 2; }},
      // 14 classes split 7 + 7: rank 0's own piece check passes with either.
      {"vocabulary size", [](auto&, auto&, auto& v) { v = kVocab + 1; }},
  };
  for (const Case& c : cases) {
    const auto errors = layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
      VocabCrossEntropyOptions o;
      std::optional<at::Tensor> w = weight;
      int64_t vocab = kVocab;
      // The field differs on rank 0 for the vocabulary (rank 0's piece fits both sizes).
      if (rank == (c.field == "vocabulary size" ? 0 : 1)) c.on_rank_1(o, w, vocab);
      vocab_parallel_cross_entropy_forward(piece(full, rank).clone(), 1, targets(kRows), w, &mesh.comm(0), vocab, o,
                                           nullptr);
    });
    if (c.field == "vocabulary size") {
      for (const auto& e : errors) EXPECT_NE(e.find("disagree on the vocabulary size"), std::string::npos) << e;
    } else {
      expect_named_everywhere(errors, c.field, c.field);
    }
  }
}

TEST(LossAgreement, RowCountsThatDifferAreTheSameNamedErrorOnEveryPathNotAGlooAbort) {
  const at::Tensor full = random_tensor({kRows, kVocab}, 3);
  auto rows_on = [](int64_t rank) { return rank == 1 ? kRows - 2 : kRows; };
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            const int64_t n = rows_on(rank);
                            vocab_parallel_cross_entropy_forward(piece(full, rank).narrow(0, 0, n), 1, targets(n),
                                                                 std::nullopt, &mesh.comm(0), kVocab, {}, nullptr);
                          }),
                          "row count", "vocab_parallel_cross_entropy");
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            vocab_parallel_log_softmax(piece(full, rank).narrow(0, 0, rows_on(rank)), 1, &mesh.comm(0),
                                                       kVocab);
                          }),
                          "row count", "vocab_parallel_log_softmax");
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            const int64_t n = rows_on(rank);
                            vocab_parallel_nll_loss_forward(piece(full, rank).narrow(0, 0, n), 1, targets(n),
                                                            std::nullopt, at::Reduction::None, -100, &mesh.comm(0),
                                                            kVocab);
                          }),
                          "row count", "vocab_parallel_nll_loss");
  const at::Tensor head = random_tensor({kVocab, 4}, 4);
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            const int64_t n = rows_on(rank);
                            const auto r = chunk_range(kVocab, kRanks, rank);
                            vocab_parallel_linear_cross_entropy_forward(random_tensor({n, 4}, 5),
                                                                        head.narrow(0, r.offset, r.length), targets(n),
                                                                        &mesh.comm(0), kVocab, {}, nullptr);
                          }),
                          "row count", "vocab_parallel_linear_cross_entropy");
}

TEST(LossAgreement, DtypesThatDifferAreTheSameNamedErrorNotAGlooAbort) {
  const at::Tensor full = random_tensor({kRows, kVocab}, 6);
  auto on = [&](int64_t rank) { return rank == 1 ? piece(full, rank).to(at::kFloat) : piece(full, rank); };
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            vocab_parallel_cross_entropy_forward(on(rank), 1, targets(kRows), std::nullopt,
                                                                 &mesh.comm(0), kVocab, {}, nullptr);
                          }),
                          "dtype", "vocab_parallel_cross_entropy");
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            vocab_parallel_log_softmax(on(rank), 1, &mesh.comm(0), kVocab);
                          }),
                          "dtype", "vocab_parallel_log_softmax");
}

TEST(LossAgreement, ALearntVocabularyCostsNoCollectiveMoreThanAGivenOne) {
  run_ranks(kRanks, [](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {kRanks});
    const at::Tensor full = random_tensor({kRows, kVocab}, 7);
    for (int64_t vocab : {kVocab, int64_t{-1}}) {
      reset_collective_counts();
      const at::Tensor loss = vocab_parallel_cross_entropy_forward(piece(full, rank), 1, targets(kRows), std::nullopt,
                                                                   &mesh.comm(0), vocab, {}, nullptr);
      EXPECT_EQ(collective_counts().all_gather, 2) << "the call's record, then the per-row statistics";
      EXPECT_EQ(collective_counts().total(), 2);
      EXPECT_NEAR(loss.item<double>(), at::cross_entropy_loss(full, targets(kRows)).item<double>(), 1e-12);
    }
  });
}

// The forwards issue the call's record and compute their local statistics while it travels
// (PendingCallAgreement): issuing must not wait for the other ranks, and settling must give
// what agree_on_call gives, errors included. Rank 0 issues only once rank 1 has issued: were
// issuing a blocking collective, rank 1 would wait for rank 0 and rank 0 would give up.
TEST(LossAgreement, TheCallsRecordIsIssuedWithoutWaitingAndSettledLater) {
  for (const int64_t rows_on_1 : {kRows, kRows - 2}) {
    std::promise<void> issued_1;
    std::shared_future<void> issued = issued_1.get_future().share();
    std::vector<std::string> got(kRanks);
    run_ranks(
        kRanks,
        [&](int64_t rank) {
          auto mesh = init_device_mesh("cpu", {kRanks});
          LossCallRecord call;
          call.op = "cross_entropy";
          call.rows = rank == 1 ? rows_on_1 : kRows;
          call.dtype = static_cast<int64_t>(at::kFloat);
          call.vocab_size = kVocab;
          call.local_classes = chunk_range(kVocab, kRanks, rank).length;
          if (rank == 0 && issued.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
            got[0] = "rank 1 did not return from issuing its record before rank 0 issued";
          }
          PendingCallAgreement pending(call, &mesh.comm(0), at::kCPU);
          if (rank == 1) issued_1.set_value();
          try {
            const std::vector<int64_t> classes = pending.settle();
            EXPECT_EQ(pending.settle(), classes) << "settling again gives the same";
            if (got[rank].empty())
              got[rank] = "classes " + std::to_string(classes[0]) + " " + std::to_string(classes[1]);
          } catch (const LossParallelLayoutError& e) {
            if (got[rank].empty()) got[rank] = e.what();
          }
        },
        std::chrono::seconds(20));
    if (rows_on_1 == kRows) {
      EXPECT_EQ(got, std::vector<std::string>(kRanks, "classes 7 6"));
    } else {
      expect_named_everywhere(got, "row count", "PendingCallAgreement");
    }
  }
}

TEST(LossAgreement, UnderLossParallelAGuardOptionOnOneRankOnlyIsNamedEverywhere) {
  const at::Tensor full = random_tensor({kRows, kVocab}, 8);
  for (const std::string field : {"z_loss_weight", "logit_softcap"}) {
    expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                              LossParallelOptions o;
                              if (rank == 1) (field == "z_loss_weight" ? o.z_loss_weight : o.logit_softcap) = 5;
                              auto guard = loss_parallel(o);
                              F::cross_entropy(distribute_tensor(full, mesh, {Shard(1)}), targets(kRows));
                            }),
                            field, "cross_entropy, " + field);
  }
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            auto guard = loss_parallel();
                            F::cross_entropy(distribute_tensor(full, mesh, {Shard(1)}), targets(kRows),
                                             F::CrossEntropyFuncOptions().label_smoothing(rank == 1 ? 0.2 : 0.0));
                          }),
                          "label_smoothing", "cross_entropy, label_smoothing");
}

TEST(LossAgreement, UnderLossParallelPiecesThatImplyDifferentVocabulariesOrRowsAreNamed) {
  // DTensor::from_local without a shape: each rank takes its own piece times 2 as the
  // vocabulary (14 on rank 0, 12 on rank 1).
  const at::Tensor full = random_tensor({kRows, kVocab}, 9);
  const auto errors = layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
    auto guard = loss_parallel();
    F::cross_entropy(DTensor::from_local(piece(full, rank), mesh, {Shard(1)}), targets(kRows));
  });
  for (const auto& e : errors) EXPECT_NE(e.find("disagree on the vocabulary size"), std::string::npos) << e;
  for (const auto& e : errors) EXPECT_EQ(e, errors[0]);
  // Rows that differ, under log_softmax + nll_loss and cross_entropy.
  auto rows_on = [](int64_t rank) { return rank == 1 ? kRows - 2 : kRows; };
  auto logits = [&](int64_t rank, const DeviceMesh& mesh) {
    FromLocalOptions o;
    o.shape = std::vector<int64_t>{rows_on(rank), kVocab};
    return DTensor::from_local(piece(full, rank).narrow(0, 0, rows_on(rank)), mesh, {Shard(1)}, o);
  };
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            auto guard = loss_parallel();
                            F::cross_entropy(logits(rank, mesh), targets(rows_on(rank)));
                          }),
                          "row count", "cross_entropy");
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            auto guard = loss_parallel();
                            F::log_softmax(logits(rank, mesh), 1);
                          }),
                          "row count", "log_softmax");
}

TEST(LossAgreement, TheFusedLinearLossNamesAnOptionOnOneRankOnly) {
  const at::Tensor hidden = random_tensor({kRows, 4}, 10), head = random_tensor({kVocab, 4}, 11);
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            FusedLinearCrossEntropyOptions o;
                            if (rank == 1) o.logit_softcap = 5;
                            fused_linear_cross_entropy(hidden, distribute_tensor(head, mesh, {Shard(0)}),
                                                       targets(kRows), o);
                          }),
                          "logit_softcap", "fused_linear_cross_entropy");
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            FusedLinearCrossEntropyOptions o;
                            if (rank == 1) o.ignore_index = 2;
                            const auto r = chunk_range(kVocab, kRanks, rank);
                            vocab_parallel_linear_cross_entropy_forward(hidden, head.narrow(0, r.offset, r.length),
                                                                        targets(kRows), &mesh.comm(0), kVocab, o,
                                                                        nullptr);
                          }),
                          "ignore_index", "vocab_parallel_linear_cross_entropy");
}

// The DTensor form's input checks used to run on each rank alone: a target out of range on
// rank 1 raised there while rank 0 went on into the loss's collectives, out of step.
TEST(LossAgreement, TheFusedLinearLossSettlesARefusalOnOneRankEverywhere) {
  const at::Tensor hidden = random_tensor({kRows, 4}, 12), head = random_tensor({kVocab, 4}, 13);
  std::vector<std::string> errors(kRanks);
  std::vector<double> after(kRanks);
  run_ranks(
      kRanks,
      [&](int64_t rank) {
        auto mesh = init_device_mesh("cpu", {kRanks});
        const at::Tensor w = distribute_tensor(head, mesh, {Shard(0)});
        at::Tensor bad = targets(kRows).clone();
        if (rank == 1) bad[2] = kVocab + 4;
        try {
          fused_linear_cross_entropy(hidden, w, bad);
          errors[rank] = "no error";
        } catch (const std::exception& e) {
          errors[rank] = error_text(e);
        }
        // A caller that catches the error and goes on finds the ranks in step.
        after[rank] = to_local(fused_linear_cross_entropy(hidden, w, targets(kRows))).item<double>();
      },
      std::chrono::seconds(10));
  for (const auto& e : errors) {
    EXPECT_NE(e.find("refused on rank(s) 1"), std::string::npos) << e;
    EXPECT_NE(e.find("out of bounds"), std::string::npos) << e;
    EXPECT_EQ(e, errors[0]);
  }
  const double want = at::cross_entropy_loss(at::matmul(hidden, head.t()), targets(kRows)).item<double>();
  for (double a : after) EXPECT_NEAR(a, want, 1e-12);
}

// Every rank passes the same vocab_size, one too many: rank 1's piece (6 classes) is not its
// torch.chunk piece of 14 (7). The message names the op once, says no "under loss_parallel"
// for an op called outside it, and guesses nothing about inputs that differ between ranks.
TEST(LossAgreement, ARefusalOnSomeRanksSaysWhereWithoutGuessingWhy) {
  const at::Tensor full = random_tensor({kRows, kVocab}, 14);
  const std::vector<std::string> errors = mesh_rank_errors(kRanks, [&](int64_t rank, const DeviceMesh& mesh) {
    vocab_parallel_cross_entropy_forward(piece(full, rank), 1, targets(kRows), std::nullopt, &mesh.comm(0), kVocab + 1,
                                         {}, nullptr);
  });
  const std::string want =
      "vocab_parallel_cross_entropy: the inputs were refused on rank(s) 1 of the loss's group; on rank 1: expected "
      "member 1 of 2 to hold classes [7, 14)";
  for (const auto& e : errors) {
    EXPECT_EQ(e.rfind(want, 0), 0u) << e;
    EXPECT_EQ(e.find("differs between ranks?"), std::string::npos) << e;
    EXPECT_EQ(e, errors[0]);
  }
}

// Issue 68, item 1: the target's kind changes the loss, so it is in the record. Index targets
// on rank 0 and probability targets on rank 1 used to give each rank a different plausible loss.
TEST(LossAgreement, IndexTargetsOnOneRankAndProbabilitiesOnAnotherAreNamedEverywhere) {
  const at::Tensor full = random_tensor({kRows, kVocab}, 15);
  const at::Tensor probs = random_tensor({kRows, kVocab}, 16).softmax(1);
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            const at::Tensor target = rank == 1 ? piece(probs, rank) : targets(kRows);
                            vocab_parallel_cross_entropy_forward(piece(full, rank), 1, target, std::nullopt,
                                                                 &mesh.comm(0), kVocab, {}, nullptr);
                          }),
                          "target kind", "vocab_parallel_cross_entropy");
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            auto guard = loss_parallel();
                            F::cross_entropy(distribute_tensor(full, mesh, {Shard(1)}),
                                             rank == 1 ? probs : targets(kRows));
                          }),
                          "target kind", "cross_entropy");
}

// Item 2: hidden sizes that differ (8 on rank 0, 4 on rank 1) used to give wrong values under
// no_grad and a Gloo abort in backward's all-reduce of hidden's gradient.
TEST(LossAgreement, HiddenSizesThatDifferAreNamedOnEveryFusedLinearPath) {
  auto hidden_on = [](int64_t rank) { return random_tensor({kRows, rank == 1 ? 4 : 8}, 17); };
  auto head_on = [](int64_t rank) {
    const auto r = chunk_range(kVocab, kRanks, rank);
    return random_tensor({kVocab, rank == 1 ? 4 : 8}, 18).narrow(0, r.offset, r.length);
  };
  const std::string field = "hidden size";
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            at::NoGradGuard no_grad;
                            vocab_parallel_linear_cross_entropy_forward(hidden_on(rank), head_on(rank), targets(kRows),
                                                                        &mesh.comm(0), kVocab, {}, nullptr);
                          }),
                          field, "vocab_parallel_linear_cross_entropy");
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            FromLocalOptions o;
                            o.shape = std::vector<int64_t>{kVocab, rank == 1 ? 4 : 8};
                            const at::Tensor w =
                                DTensor::from_local(head_on(rank).clone().requires_grad_(), mesh, {Shard(0)}, o);
                            const at::Tensor h = hidden_on(rank).requires_grad_();
                            fused_linear_cross_entropy(h, w, targets(kRows)).backward();
                          }),
                          field, "fused_linear_cross_entropy");
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            vocab_parallel_linear_logprobs_forward(hidden_on(rank), head_on(rank), targets(kRows),
                                                                   &mesh.comm(0), kVocab, {}, nullptr);
                          }),
                          field, "vocab_parallel_linear_logprobs");
}

// Item 3: whether the vocabulary is given is in the record, and a call that needs it first
// learns it in a record of its own op: the first collective is the same either way.
TEST(LossAgreement, AVocabularyGivenOnOneRankAndLearntOnAnotherIsNamedNotAGlooAbort) {
  const at::Tensor full = random_tensor({kRows, kVocab}, 19);
  const at::Tensor logp = full.log_softmax(1);
  auto vocab_on = [](int64_t rank) { return rank == 1 ? int64_t{-1} : kVocab; };
  const std::string field = "vocabulary's source";
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            vocab_parallel_log_softmax(piece(full, rank), 1, &mesh.comm(0), vocab_on(rank));
                          }),
                          field, "vocab_parallel_log_softmax");
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            vocab_parallel_nll_loss_forward(piece(logp, rank), 1, targets(kRows), std::nullopt,
                                                            at::Reduction::Mean, -100, &mesh.comm(0), vocab_on(rank));
                          }),
                          field, "vocab_parallel_nll_loss");
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            vocab_parallel_cross_entropy_forward(piece(full, rank), 1, targets(kRows), std::nullopt,
                                                                 &mesh.comm(0), vocab_on(rank), {}, nullptr);
                          }),
                          field, "vocab_parallel_cross_entropy");
  // Cross-entropy on rank 0, log_softmax then nll_loss on rank 1, the vocabulary learnt or given.
  for (const int64_t vocab : {int64_t{-1}, kVocab}) {
    const auto errors = layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
      if (rank == 0) {
        vocab_parallel_cross_entropy_forward(piece(full, rank), 1, targets(kRows), std::nullopt, &mesh.comm(0), vocab,
                                             {}, nullptr);
      } else {
        vocab_parallel_log_softmax(piece(full, rank), 1, &mesh.comm(0), vocab);
      }
    });
    expect_named_everywhere(errors, "loss op", "cross_entropy against log_softmax, vocab " + std::to_string(vocab));
  }
  // Learnt on both: the values of one process, and nll_loss learns it in a record of its own.
  run_ranks(kRanks, [&](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {kRanks});
    const at::Tensor lp = vocab_parallel_log_softmax(piece(full, rank), 1, &mesh.comm(0), -1);
    EXPECT_TRUE(at::allclose(lp, piece(logp, rank), 1e-12, 1e-12));
    reset_collective_counts();
    const at::Tensor nll = vocab_parallel_nll_loss_forward(piece(logp, rank), 1, targets(kRows), std::nullopt,
                                                           at::Reduction::Mean, -100, &mesh.comm(0), -1)[0];
    EXPECT_EQ(collective_counts().all_gather, 2) << "the vocabulary's record, then the call's record";
    EXPECT_NEAR(nll.item<double>(), at::nll_loss(logp, targets(kRows)).item<double>(), 1e-12);
  });
}

// Item 4: loss_parallel() entered on one rank only, or with another strictness: the rank
// outside the context meets the others in the call's record.
TEST(LossAgreement, ALossParallelContextOnOneRankOnlyIsNamedEverywhere) {
  const at::Tensor full = random_tensor({kRows, kVocab}, 20);
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            std::optional<LossParallelGuard> guard;
                            if (rank == 0) guard.emplace(LossParallelOptions{});
                            F::cross_entropy(distribute_tensor(full, mesh, {Shard(1)}), targets(kRows));
                          }),
                          "loss_parallel context", "cross_entropy inside on rank 0 only");
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            LossParallelOptions o;
                            o.strict = rank == 0;
                            auto guard = loss_parallel(o);
                            F::cross_entropy(distribute_tensor(full, mesh, {Shard(1)}), targets(kRows));
                          }),
                          "loss_parallel strictness", "cross_entropy, strict on rank 0 only");
  // log_softmax (then nll_loss) with the context on rank 0 only: rank 1's ordinary rule would
  // gather the classes while rank 0 sends its record.
  const at::Tensor four = random_tensor({4, kVocab}, 26);
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            std::optional<LossParallelGuard> guard;
                            if (rank == 0) guard.emplace(LossParallelOptions{});
                            F::log_softmax(distribute_tensor(four, mesh, {Shard(1)}), 1);
                          }),
                          "loss_parallel context", "log_softmax inside on rank 0 only");
  // Outside the context on every rank: the usual error, on every rank alike.
  for (const auto& e : layout_errors([&](int64_t, const DeviceMesh& mesh) {
         F::cross_entropy(distribute_tensor(full, mesh, {Shard(1)}), targets(kRows));
       })) {
    EXPECT_NE(e.find("outside loss_parallel()"), std::string::npos) << e;
  }
}

// Item 7: ranks whose logits agree on the row count only ([12, 6] with class dim 1 on rank 0,
// [6, 12] with class dim 0 on rank 1; [2, 3, V] against [3, 2, V]) used to get garbage.
TEST(LossAgreement, ShapesThatDifferBeyondTheRowCountAreNamed) {
  const at::Tensor a = random_tensor({12, 12}, 21);
  expect_named_everywhere(layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
                            const at::Tensor local = rank == 0 ? a.narrow(1, 0, 6) : a.narrow(0, 6, 6);
                            vocab_parallel_log_softmax(local.contiguous(), rank == 0 ? 1 : 0, &mesh.comm(0), 12);
                          }),
                          "class dim", "vocab_parallel_log_softmax");
  const at::Tensor full = random_tensor({6, kVocab}, 22);
  expect_named_everywhere(
      layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
        const at::Tensor local = piece(full, rank).reshape({rank == 1 ? 3 : 2, rank == 1 ? 2 : 3, -1});
        vocab_parallel_log_softmax(local, 2, &mesh.comm(0), kVocab);
      }),
      "logits' shape", "vocab_parallel_log_softmax [2, 3, V] against [3, 2, V]");
}

// Item 8: HYPER_PARALLEL_CHECK_REPLICATED=1 compares what is meant to be replicated (class-index
// targets, a whole probability target) and not a rank's own piece of the probabilities.
TEST(LossAgreement, CheckReplicatedComparesOnlyWhatIsMeantToBeReplicated) {
  const at::Tensor full = random_tensor({kRows, kVocab}, 23);
  const at::Tensor probs = random_tensor({kRows, kVocab}, 24).softmax(1);
  const double want = at::cross_entropy_loss(full, probs).item<double>();
  setenv("HYPER_PARALLEL_CHECK_REPLICATED", "1", 1);
  std::vector<double> got(2 * kRanks);
  run_ranks(kRanks, [&](int64_t rank) {
    auto mesh = init_device_mesh("cpu", {kRanks});
    got[rank] = vocab_parallel_cross_entropy_forward(piece(full, rank), 1, piece(probs, rank), std::nullopt,
                                                     &mesh.comm(0), kVocab, {}, nullptr)
                    .item<double>();
    auto guard = loss_parallel();
    got[kRanks + rank] = to_local(F::cross_entropy(distribute_tensor(full, mesh, {Shard(1)}),
                                                   distribute_tensor(probs, mesh, {Shard(1)})))
                             .item<double>();
  });
  // Index targets that differ are still found.
  const auto errors = layout_errors([&](int64_t rank, const DeviceMesh& mesh) {
    at::Tensor t = targets(kRows).clone();
    if (rank == 1) t[0] = 5;
    try {
      vocab_parallel_cross_entropy_forward(piece(full, rank), 1, t, std::nullopt, &mesh.comm(0), kVocab, {}, nullptr);
    } catch (const c10::Error& e) {
      throw LossParallelLayoutError(e.what_without_backtrace());
    }
  });
  unsetenv("HYPER_PARALLEL_CHECK_REPLICATED");
  for (double g : got) EXPECT_NEAR(g, want, 1e-12);
  for (const auto& e : errors) {
    EXPECT_NE(e.find("the target differs between ranks: rank(s) 1"), std::string::npos) << e;
    EXPECT_EQ(e, errors[0]);
  }
}

// Item 4 on a dp 2 x tp 2 mesh: strictness decides alone whether a rank refuses 'mean' over
// rows other mesh dims shard (or re-lays out logits outside the contract) or goes on into
// collectives. Strict on rank 0 only used to leave its peers waiting in those collectives.
TEST(LossAgreement, StrictnessThatDiffersOnATwoDimMeshIsAnErrorOnEveryRankNotAWait) {
  const at::Tensor full = random_tensor({8, kVocab}, 25);
  const at::Tensor target = at::arange(8, at::kLong).remainder(kVocab);
  auto on_every_rank = [&](const Placements& logits_placements) {
    std::vector<std::string> got(4);
    run_ranks(
        4,
        [&](int64_t rank) {
          auto mesh = init_device_mesh("cpu", {2, 2});
          LossParallelOptions o;
          o.strict = rank == 0;
          try {
            auto guard = loss_parallel(o);
            F::cross_entropy(distribute_tensor(full, mesh, logits_placements),
                             distribute_tensor(target, mesh, {Shard(0), Replicate()}));
            got[rank] = "no error";
          } catch (const std::exception& e) {
            got[rank] = error_text(e);
          }
        },
        std::chrono::seconds(20));
    return got;
  };
  // 'mean' with the rows sharded by dp: the strict rank's TP peer is told in the call's record,
  // the other dp group by the global mean's denominator.
  const auto mean = on_every_rank({Shard(0), Shard(1)});
  for (int64_t r : {0, 1})
    EXPECT_NE(mean[r].find("disagree on the loss_parallel strictness"), std::string::npos) << mean[r];
  for (int64_t r : {2, 3}) EXPECT_NE(mean[r].find("rank"), std::string::npos) << mean[r];
  for (const auto& e : mean) EXPECT_NE(e, "no error");
  // Logits outside the contract (the class dim sharded by both mesh dims): refused on rank 0,
  // re-laid out on the others, before any record: the whole mesh agrees first.
  const auto relayout = on_every_rank({Shard(1), Shard(1)});
  for (const auto& e : relayout) {
    EXPECT_NE(e.find("the ranks of the loss's mesh disagree on the loss_parallel strictness"), std::string::npos) << e;
    EXPECT_EQ(e, relayout[0]);
  }
}

}  // namespace loss_agreement_test
