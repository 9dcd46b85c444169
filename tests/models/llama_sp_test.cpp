// Sequence parallel: the tiny Llama under the sequence-parallel plan matches one process
// (loss and every parameter gradient, float64) at TP 2, 3 and 4 with a sequence length
// that none of them divides, feeding loss_parallel, the gathered head, or the fused
// linear loss; and the collectives it issues per forward and backward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "harness/rank_harness.h"
#include "hyper_parallel/loss/fused_linear_loss.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/models/llama.h"

namespace llama_sp_test {

using namespace hyper_parallel;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

// dim, heads and ffn hidden split over 2, 3 and 4 ranks; the sequence (13) splits over
// none of them evenly (pieces 7+6, 5+5+3, 4+4+4+1).
LlamaArgs sp_args() {
  LlamaArgs a;
  a.dim = 48;
  a.n_layers = 2;
  a.n_heads = 12;
  a.ffn_hidden_dim = 96;
  a.vocab_size = 101;
  a.max_seq_len = 16;
  return a;
}
constexpr int64_t kSeq = 13;

enum class Head { LossParallel, Gathered, Fused };
const char* head_name(Head h) {
  return h == Head::LossParallel ? "loss parallel" : h == Head::Gathered ? "gathered logits" : "fused linear loss";
}

struct Result {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;  // full values
};

at::Tensor loss_of(Llama& model, const at::Tensor& tokens, const at::Tensor& targets, Head head) {
  if (head == Head::Fused) {
    at::Tensor hidden = model->hidden_states(tokens);
    if (is_dtensor(hidden)) hidden = redistribute(hidden, Placements{Placement::replicate()});
    return fused_linear_cross_entropy(hidden.flatten(0, 1), model->output->weight, targets.flatten());
  }
  std::optional<LossParallelGuard> guard;
  if (head == Head::LossParallel) guard.emplace();
  return F::cross_entropy(model->forward(tokens).flatten(0, 1), targets.flatten());
}

Result run_model(Llama& model, const at::Tensor& tokens, const at::Tensor& targets, Head head) {
  at::Tensor loss = loss_of(model, tokens, targets, head);
  loss.backward();
  Result r;
  r.loss = is_dtensor(loss) ? full_tensor(loss) : loss.detach();
  for (const auto& p : model->named_parameters()) {
    const at::Tensor& g = p.value().grad();
    EXPECT_TRUE(g.defined()) << p.key();
    if (is_dtensor(g)) EXPECT_EQ(placements_of(g), placements_of(p.value())) << p.key();
    r.grads[p.key()] = is_dtensor(g) ? full_tensor(g) : g;
  }
  return r;
}

Llama make_model(at::ScalarType dtype) {
  Llama model(sp_args());
  model->init_weights(7);
  model->to(dtype);
  return model;
}

}  // namespace

// Float64, so that only summation order differs: loss and every gradient within 1e-9
// relative (+1e-12 absolute) of one process.
TEST(LlamaSequenceParallel, TwoThreeAndFourRanksWithUnevenSequencePiecesMatchOneProcess) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor tokens = at::randint(101, {2, kSeq}, gen, at::kLong);
  const at::Tensor targets = at::randint(101, {2, kSeq}, gen, at::kLong);
  Llama ref = make_model(at::kDouble);
  const Result want = run_model(ref, tokens, targets, Head::Gathered);
  EXPECT_GT(want.loss.item<double>(), 4.0);
  for (int64_t tp : {2, 3, 4}) {
    for (Head head : {Head::LossParallel, Head::Gathered, Head::Fused}) {
      run_ranks(tp, [&](int64_t rank) {
        const std::string what = "tp " + std::to_string(tp) + ", " + head_name(head);
        auto mesh = init_device_mesh("cpu", {tp}, {"tp"});
        Llama model = make_model(at::kDouble);
        parallelize_llama(model, mesh, head != Head::Gathered, /*sequence_parallel=*/true);
        // The norms' weights are replicated DTensors and what the head reads is this
        // rank's piece of the sequence (torch.chunk's: ceil(13 / tp) rows, the last shorter).
        EXPECT_EQ(placements_of(model->norm->weight), Placements{Placement::replicate()});
        {
          at::NoGradGuard no_grad;
          at::Tensor hidden = model->hidden_states(tokens);
          ASSERT_TRUE(is_dtensor(hidden)) << what;
          EXPECT_EQ(placements_of(hidden), Placements{Placement::shard(1)}) << what;
          const int64_t piece = (kSeq + tp - 1) / tp;
          EXPECT_EQ(to_local(hidden).size(1), std::max<int64_t>(0, std::min(piece, kSeq - rank * piece))) << what;
        }
        const Result got = run_model(model, tokens, targets, head);
        EXPECT_TRUE(torch::allclose(got.loss, want.loss, 1e-9, 1e-12))
            << what << ": " << got.loss << " vs " << want.loss;
        for (const auto& [name, g] : want.grads) {
          EXPECT_TRUE(torch::allclose(got.grads.at(name), g, 1e-9, 1e-12))
              << name << ", " << what << ": max difference " << (got.grads.at(name) - g).abs().max().item<double>();
        }
      });
    }
  }
}

// What sequence parallel costs in collectives, per forward (loss included) and backward at
// TP 2 with loss parallel, n_layers = 2, against the plain TP plan (counted per rank).
// With SP, forward: reduce-scatter after the embedding, wo and w2 (1 + 2L), all-gather
// before attention, feed_forward and the head (2L + 1). Backward mirrors them (each
// all-gather's backward is a reduce-scatter and vice versa) plus one all-reduce per norm
// weight (2L + 1), which sums its gradient over the ranks' sequence pieces. Without SP:
// an all-reduce after the embedding, wo and w2 in forward; in backward one per attention
// and feed_forward input (q/k/v and w1/w3 share one) and one at the head's input.
TEST(LlamaSequenceParallel, CollectivesPerForwardAndBackward) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor tokens = at::randint(101, {2, kSeq}, gen, at::kLong);
  const at::Tensor targets = at::randint(101, {2, kSeq}, gen, at::kLong);
  const int64_t L = sp_args().n_layers;
  for (bool sp : {false, true}) {
    run_ranks(2, [&](int64_t rank) {
      auto mesh = init_device_mesh("cpu", {2}, {"tp"});
      Llama model = make_model(at::kFloat);
      parallelize_llama(model, mesh, /*loss_parallel=*/true, sp);
      // The loss alone, measured without the model: what the loss adds to the forward.
      CollectiveCounts loss_only;
      {
        at::Tensor logits = model->forward(tokens).detach();
        reset_collective_counts();
        LossParallelGuard guard;
        (void)F::cross_entropy(logits.flatten(0, 1), targets.flatten());
        loss_only = collective_counts();
      }
      reset_collective_counts();
      at::Tensor loss = loss_of(model, tokens, targets, Head::LossParallel);
      const CollectiveCounts fwd = collective_counts();
      reset_collective_counts();
      loss.backward();
      const CollectiveCounts bwd = collective_counts();
      if (rank == 0) {
        std::cout << (sp ? "SP" : "TP") << " forward: " << fwd.all_gather << " all-gather, " << fwd.reduce_scatter
                  << " reduce-scatter, " << fwd.all_reduce << " all-reduce (the loss: " << loss_only.total()
                  << "); backward: " << bwd.all_gather << " all-gather, " << bwd.reduce_scatter << " reduce-scatter, "
                  << bwd.all_reduce << " all-reduce" << std::endl;
      }
      const CollectiveCounts model_fwd{fwd.all_reduce - loss_only.all_reduce, fwd.all_gather - loss_only.all_gather,
                                       fwd.reduce_scatter - loss_only.reduce_scatter};
      if (sp) {
        EXPECT_EQ(model_fwd.reduce_scatter, 1 + 2 * L);
        EXPECT_EQ(model_fwd.all_gather, 2 * L + 1);
        EXPECT_EQ(model_fwd.all_reduce, 0);
        EXPECT_EQ(bwd.all_gather, 1 + 2 * L);
        EXPECT_EQ(bwd.reduce_scatter, 2 * L + 1);
        EXPECT_EQ(bwd.all_reduce, 2 * L + 1);
      } else {
        EXPECT_EQ(model_fwd.all_reduce, 1 + 2 * L);
        EXPECT_EQ(model_fwd.all_gather + model_fwd.reduce_scatter, 0);
        EXPECT_EQ(bwd.all_reduce, 2 * L + 1);
        EXPECT_EQ(bwd.all_gather + bwd.reduce_scatter, 0);
      }
      EXPECT_EQ(fwd.broadcast + fwd.all_to_all + bwd.broadcast + bwd.all_to_all, 0);
    });
  }
}

TEST(SequenceParallelStyle, ModulesWithSubModulesAreAClearError) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    Llama model(sp_args());
    try {
      parallelize_module(*model, mesh, {{"layers.0.attention", SequenceParallel::make()}});
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected a leaf module that works per token"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace llama_sp_test
