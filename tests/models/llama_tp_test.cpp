// The tiny Llama under TorchTitan's TP plan matches one process: logits, loss and every
// parameter gradient, with loss parallel enabled and disabled.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/models/llama.h"

namespace llama_tp_test {

using namespace hyper_parallel;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

LlamaArgs tiny() {
  LlamaArgs a;
  a.dim = 32;
  a.n_layers = 2;
  a.n_heads = 4;
  a.vocab_size = 101;  // uneven over 2 and 4 ranks
  a.multiple_of = 16;
  a.max_seq_len = 16;
  return a;
}

struct Result {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;  // full values
};

Result run_model(Llama& model, const at::Tensor& tokens, const at::Tensor& targets, bool loss_parallel) {
  std::optional<LossParallelGuard> guard;
  if (loss_parallel) guard.emplace();
  at::Tensor logits = model->forward(tokens);
  at::Tensor loss = F::cross_entropy(logits.flatten(0, 1), targets.flatten());
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

}  // namespace

TEST(LlamaTensorParallel, TwoAndFourRanksMatchOneProcessWithAndWithoutLossParallel) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  at::Tensor tokens = at::randint(101, {2, 12}, gen, at::kLong);
  at::Tensor targets = at::randint(101, {2, 12}, gen, at::kLong);
  Llama ref(tiny());
  ref->init_weights(7);
  Result want = run_model(ref, tokens, targets, false);
  EXPECT_GT(want.loss.item<double>(), 4.0);
  for (int64_t tp : {2, 4}) {
    for (bool lp : {true, false}) {
      run_ranks(tp, [&](int64_t) {
        auto mesh = init_device_mesh("cpu", {tp}, {"tp"});
        Llama model(tiny());
        model->init_weights(7);
        parallelize_llama(model, mesh, lp);
        Result got = run_model(model, tokens, targets, lp);
        EXPECT_TRUE(torch::allclose(got.loss, want.loss, 1e-5, 1e-6)) << got.loss << " vs " << want.loss;
        for (const auto& [name, g] : want.grads) {
          EXPECT_TRUE(torch::allclose(got.grads.at(name), g, 1e-4, 1e-6)) << name << " tp " << tp << " lp " << lp;
        }
      });
    }
  }
}

TEST(LlamaTensorParallel, HeadsThatDoNotSplitAreAClearError) {
  run_ranks(3, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {3});
    Llama model(tiny());
    try {
      parallelize_llama(model, mesh, true);
      ADD_FAILURE() << "expected an error";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("n_heads 4 does not split over tensor_parallel_degree 3"),
                std::string::npos);
    }
  });
}

TEST(ParallelizeModule, UnsupportedModulesAndUnmatchedPatternsAreErrors) {
  run_ranks(2, [](int64_t) {
    auto mesh = init_device_mesh("cpu", {2});
    Llama model(tiny());
    EXPECT_THROW(parallelize_module(*model, mesh, {{"norm", ColwiseParallel::make()}}), c10::Error);
    EXPECT_THROW(parallelize_module(*model, mesh, {{"layers.*.nothing", ColwiseParallel::make()}}), c10::Error);
    // The same module in two entries would be sharded twice.
    EXPECT_THROW(parallelize_module(*model, mesh,
                                    {{"output", ColwiseParallel::make()},
                                     {"out*", RowwiseParallel::make()},
                                     {"output", RowwiseParallel::make()}}),
                 c10::Error);
  });
}

}  // namespace llama_tp_test
