// Our Llama loaded from transformers checkpoints (tests/hf/make_llama_models.py makes tiny
// random LlamaForCausalLM models offline and records what transformers computes on them)
// at TP 1, 2 and 4 (ranks as threads): the logits, the loss and every parameter's
// gradient, mapped back to Hugging Face names, agree with transformers' within 1e-10 in
// float64 and 1e-5 in float32. The tied model's head is its embedding parameter, whose
// gradient is transformers' gradient of the tied weight. Skipped, saying why, when the venv has no transformers.
#include <gtest/gtest.h>

#include <cmath>
#include <torch/nn/functional/loss.h>

#include <iostream>
#include <mutex>

#include "compat/file_system.h"
#include "harness/hf_models.h"
#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/llama.h"
#include "hyper_parallel/model_registry.h"

using namespace hyper_parallel;
using hyper_parallel::testing::hf_models;
using hyper_parallel::testing::read_safetensors_file;
using hyper_parallel::testing::run_ranks;
namespace F = torch::nn::functional;

namespace {

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// NaN until rank 0 has compared (a case whose ranks threw prints NaN, not 0).
struct Differences {
  double logits = std::nan(""), loss = std::nan(""), grads = 0;
};

// One case at one TP degree and dtype; returns the largest differences seen on rank 0.
Differences run_case(const std::string& name, at::ScalarType dtype, int64_t tp, double tol) {
  const std::string folder = compat::join_path(hf_models().dir, name);
  const auto ref = read_safetensors_file(folder + "/reference_" + (dtype == at::kDouble ? "float64" : "float32") + ".safetensors");
  Differences worst;
  std::mutex mu;
  run_ranks(tp, [&](int64_t rank) {
    const ModelFamily& family = model_family("llama");
    auto module = family.from_hf_config(folder + "/config.json");
    module->to(dtype);
    std::optional<DeviceMesh> mesh;
    if (tp > 1) {
      mesh = init_device_mesh("cpu", {tp}, {"tp"});
      family.parallelize(*module, *mesh, /*loss_parallel=*/true, /*sequence_parallel=*/false);
    }
    const HfAdapter adapter = family.hf_adapter(*module);
    load_hf_checkpoint(*module, adapter, folder);
    Llama model(std::dynamic_pointer_cast<LlamaImpl>(module));
    if (model->args().tie_word_embeddings) {  // one parameter, read by the head at every TP degree
      EXPECT_TRUE(model->output->weight.is_same(model->tok_embeddings->weight)) << name << " tp " << tp;
      EXPECT_FALSE(model->named_parameters().contains("output.weight")) << name;
    }

    std::optional<LossParallelGuard> guard;
    if (tp > 1) guard.emplace();
    at::Tensor logits = model->forward(ref.at("tokens"));
    at::Tensor loss = F::cross_entropy(logits.flatten(0, 1), ref.at("targets").flatten());
    loss.backward();
    auto full = [](const at::Tensor& t) { return (is_dtensor(t) ? full_tensor(t) : t).detach(); };
    std::map<std::string, at::Tensor> grads;
    for (const auto& p : model->named_parameters()) grads[p.key()] = full(p.value().grad());
    const auto hf_grads = to_hf_names(grads, adapter, /*sum_shared=*/true);

    Differences d;
    d.logits = max_diff(full(logits), ref.at("logits"));
    d.loss = max_diff(full(loss), ref.at("loss"));
    EXPECT_LE(d.logits, tol) << name << " tp " << tp << ": logits vs transformers";
    EXPECT_LE(d.loss, tol) << name << " tp " << tp << ": loss vs transformers";
    size_t compared = 0;
    for (const auto& [key, want] : ref) {
      if (key.rfind("grad.", 0) != 0) continue;
      const std::string hf_name = key.substr(5);
      ASSERT_TRUE(hf_grads.count(hf_name)) << name << ": no gradient of ours maps to " << hf_name;
      const double g = max_diff(hf_grads.at(hf_name), want);
      EXPECT_LE(g, tol) << name << " tp " << tp << ": gradient of " << hf_name;
      d.grads = std::max(d.grads, g);
      ++compared;
    }
    EXPECT_EQ(compared, hf_grads.size()) << name << ": every gradient of ours has a transformers counterpart";
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      worst = d;
    }
  });
  return worst;
}

void check_all_cases(at::ScalarType dtype, double tol) {
  if (!hf_models().skip_reason.empty()) GTEST_SKIP() << hf_models().skip_reason;
  for (const char* name : {"gqa", "tied", "llama3", "sharded", "bf16"}) {
    for (int64_t tp : {1, 2, 4}) {
      const Differences d = run_case(name, dtype, tp, tol);
      std::cout << "[ hf parity ] " << name << " " << c10::toString(dtype) << " tp " << tp << ": max |d logits| "
                << d.logits << ", |d loss| " << d.loss << ", max |d grad| " << d.grads << "\n";
    }
  }
}

}  // namespace

TEST(HfLlamaParity, Float64LogitsLossAndGradientsMatchTransformersWithin1e10AtTP1To4) {
  check_all_cases(at::kDouble, 1e-10);
}

TEST(HfLlamaParity, Float32LogitsLossAndGradientsMatchTransformersWithin1e5AtTP1To4) {
  check_all_cases(at::kFloat, 1e-5);
}
