// hyper_parallel/loss/vocab_parallel.h: the kernels on plain local pieces (what the Python
// package's ops call) against one process's ATen, float64, TP 1-4 (13 classes: uneven).
#include "hyper_parallel/loss/vocab_parallel.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "harness/rank_harness.h"
#include "hyper_parallel/core/device_mesh.h"

namespace vocab_parallel_test {

namespace hp = hyper_parallel;
using hyper_parallel::testing::random_tensor;
using hyper_parallel::testing::run_ranks;

namespace {

constexpr int64_t kVocab = 13;

// This rank's torch.chunk piece of the last dim (empty where there is none).
at::Tensor piece(const at::Tensor& full, int64_t rank, int64_t world) {
  const auto r = hp::chunk_range(full.size(-1), world, rank);
  return full.narrow(-1, r.offset, r.length);
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  if (want.numel() == 0) return;  // an empty piece: its shape is all there is to compare
  const double err = (got - want).abs().max().item<double>() / std::max(1.0, want.abs().max().item<double>());
  EXPECT_LE(err, 1e-12) << what;
}

}  // namespace

TEST(VocabParallel, CrossEntropyOnLocalPiecesMatchesOneProcessWithEveryOption) {
  for (int64_t world : {1, 2, 3, 4}) {
    run_ranks(world, [world](int64_t rank) {
      auto mesh = hp::init_device_mesh("cpu", {world});
      const hp::Communicator* comm = &mesh.comm(0);
      const at::Tensor full = random_tensor({3, 5, kVocab}, 1) * 4;
      at::Tensor target = (random_tensor({3, 5}, 2).abs() * 100).to(at::kLong).remainder(kVocab);
      target.index_put_({0, at::indexing::Slice(at::indexing::None, at::indexing::None, 2)}, -100);
      const at::Tensor weight = random_tensor({kVocab}, 3).abs() + 0.5;
      for (int64_t reduction : {at::Reduction::None, at::Reduction::Mean, at::Reduction::Sum}) {
        for (auto [smoothing, weighted, vocab] :
             {std::tuple{0.0, false, kVocab}, std::tuple{0.2, true, kVocab}, std::tuple{0.1, true, int64_t{-1}}}) {
          const std::optional<at::Tensor> w = weighted ? std::optional<at::Tensor>(weight) : std::nullopt;
          const at::Tensor ref_x = full.clone().requires_grad_();
          at::Tensor ref = at::cross_entropy_loss(ref_x.flatten(0, 1), target.flatten(), w, reduction, -100, smoothing);
          if (reduction == at::Reduction::None) ref = ref.reshape({3, 5});
          const at::Tensor seed = reduction == at::Reduction::None ? random_tensor({3, 5}, 4) : random_tensor({}, 4);
          (ref * seed).sum().backward();

          hp::VocabCrossEntropyOptions o;
          o.reduction = reduction;
          o.label_smoothing = smoothing;
          hp::VocabCrossEntropySaved saved;
          const at::Tensor x = piece(full, rank, world).contiguous();
          hp::reset_collective_counts();
          const at::Tensor loss = hp::vocab_parallel_cross_entropy_forward(x, -1, target, w, comm, vocab, o, &saved);
          // The call's record (learning the vocabulary on the way), then the statistics.
          EXPECT_EQ(hp::collective_counts().all_gather, world == 1 ? 1 : 2);
          hp::reset_collective_counts();
          const at::Tensor grad =
              hp::vocab_parallel_cross_entropy_backward(seed, x, -1, target, w, saved, comm, kVocab, o);
          EXPECT_EQ(hp::collective_counts().total(), 0);
          expect_close(loss, ref.detach(), "loss");
          expect_close(grad, piece(ref_x.grad(), rank, world), "gradient");
        }
      }
    });
  }
}

TEST(VocabParallel, LogSoftmaxAndNllLossOnLocalPiecesMatchOneProcess) {
  run_ranks(3, [](int64_t rank) {
    auto mesh = hp::init_device_mesh("cpu", {3});
    const hp::Communicator* comm = &mesh.comm(0);
    const at::Tensor full = random_tensor({6, kVocab}, 5) * 3;
    const at::Tensor coef = random_tensor({6, kVocab}, 6);
    const at::Tensor target = (random_tensor({6}, 7).abs() * 100).to(at::kLong).remainder(kVocab);
    const at::Tensor ref_lp = at::log_softmax(full, 1);
    const at::Tensor x = piece(full, rank, 3).contiguous();
    const at::Tensor lp = hp::vocab_parallel_log_softmax(x, 1, comm, kVocab);
    expect_close(lp, piece(ref_lp, rank, 3), "log_softmax");
    // d/dx of sum(coef * log_softmax(x)): the all-reduce in backward joins the pieces' sums.
    const at::Tensor ref_grad = coef - at::softmax(full, 1) * coef.sum(1, true);
    const at::Tensor grad =
        hp::vocab_parallel_log_softmax_backward(piece(coef, rank, 3).contiguous(), lp, 1, comm, kVocab, at::kDouble);
    expect_close(grad, piece(ref_grad, rank, 3), "log_softmax backward");
    const auto nll =
        hp::vocab_parallel_nll_loss_forward(lp, 1, target, std::nullopt, at::Reduction::Mean, -100, comm, kVocab);
    expect_close(nll[0], at::nll_loss(ref_lp, target), "nll_loss");
  });
}

// More ranks than classes leaves torch.chunk's last pieces empty (V = 2 at TP 3: 1, 1, 0;
// V = 5 at TP 4: 2, 2, 1, 0): such a rank takes part in every collective with nothing of its own.
TEST(VocabParallel, EmptyPiecesAreExactOnEveryLocalPath) {
  for (auto [vocab, world] : {std::pair<int64_t, int64_t>{2, 3}, std::pair<int64_t, int64_t>{5, 4}}) {
    run_ranks(world, [vocab = vocab, world = world](int64_t rank) {
      SCOPED_TRACE("V " + std::to_string(vocab) + " TP " + std::to_string(world) + " rank " + std::to_string(rank));
      auto mesh = hp::init_device_mesh("cpu", {world});
      const hp::Communicator* comm = &mesh.comm(0);
      const at::Tensor full = random_tensor({2, 3, vocab}, 21) * 3;
      const at::Tensor target = (random_tensor({2, 3}, 22).abs() * 100).to(at::kLong).remainder(vocab);
      const at::Tensor seed = random_tensor({2, 3}, 23);
      const at::Tensor x = piece(full, rank, world).contiguous();
      for (int64_t vocab_given : {vocab, int64_t{-1}}) {
        const at::Tensor ref_x = full.clone().requires_grad_();
        const at::Tensor ref =
            at::cross_entropy_loss(ref_x.flatten(0, 1), target.flatten(), std::nullopt, at::Reduction::None, -100, 0.1)
                .reshape({2, 3});
        (ref * seed).sum().backward();
        hp::VocabCrossEntropyOptions o;
        o.reduction = at::Reduction::None;
        o.label_smoothing = 0.1;
        hp::VocabCrossEntropySaved saved;
        const at::Tensor loss =
            hp::vocab_parallel_cross_entropy_forward(x, -1, target, std::nullopt, comm, vocab_given, o, &saved);
        expect_close(loss, ref.detach(), "cross-entropy");
        const at::Tensor grad =
            hp::vocab_parallel_cross_entropy_backward(seed, x, -1, target, std::nullopt, saved, comm, vocab, o);
        expect_close(grad, piece(ref_x.grad(), rank, world), "cross-entropy gradient");
      }
      const at::Tensor lp = hp::vocab_parallel_log_softmax(x, 2, comm, vocab);
      expect_close(lp, piece(at::log_softmax(full, 2), rank, world), "log_softmax");
      const at::Tensor coef = random_tensor({2, 3, vocab}, 24);
      const at::Tensor ref_grad = coef - at::softmax(full, 2) * coef.sum(2, true);
      const at::Tensor grad = hp::vocab_parallel_log_softmax_backward(piece(coef, rank, world).contiguous(), lp, 2,
                                                                      comm, vocab, at::kDouble);
      expect_close(grad, piece(ref_grad, rank, world), "log_softmax gradient");
      const auto nll =
          hp::vocab_parallel_nll_loss_forward(lp, 2, target, std::nullopt, at::Reduction::Sum, -100, comm, vocab);
      expect_close(
          nll[0],
          at::nll_loss(at::log_softmax(full, 2).flatten(0, 1), target.flatten(), std::nullopt, at::Reduction::Sum),
          "nll_loss");
    });
  }
}

TEST(VocabParallel, APieceThatIsNotTorchChunksIsTheSameErrorOnEveryRank) {
  run_ranks(3, [](int64_t rank) {
    auto mesh = hp::init_device_mesh("cpu", {3});
    const hp::Communicator* comm = &mesh.comm(0);
    // 12 classes as 5, 5, 2 instead of torch.chunk's 4, 4, 4.
    const int64_t local = rank < 2 ? 5 : 2;
    const at::Tensor x = random_tensor({4, local}, 8);
    const at::Tensor target = at::zeros({4}, at::kLong);
    EXPECT_THROW(hp::vocab_parallel_cross_entropy_forward(x, 1, target, std::nullopt, comm, -1, {}, nullptr),
                 hp::LossParallelLayoutError);
    // A given vocabulary: every rank checks its own piece; the all-gather settles it everywhere.
    try {
      hp::vocab_parallel_cross_entropy_forward(x, 1, target, std::nullopt, comm, 12, {}, nullptr);
      ADD_FAILURE() << "rank " << rank << ": no error";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("torch.chunk piece"), std::string::npos) << e.what();
    }
  });
}

}  // namespace vocab_parallel_test
