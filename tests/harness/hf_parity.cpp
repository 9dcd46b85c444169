#include "harness/hf_parity.h"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>

#include <iostream>
#include <map>
#include <mutex>
#include <optional>

#include "compat/file_system.h"
#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel/models/model_registry.h"

namespace hyper_parallel::testing {

namespace F = torch::nn::functional;

namespace {

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace

HfDifferences run_hf_parity_case(const HfParityCase& c) {
  const auto ref = read_safetensors_file(c.folder + "/reference_" + (c.dtype == at::kDouble ? "float64" : "float32") +
                                         ".safetensors");
  const std::string what = c.folder + " tp " + std::to_string(c.tp) + (c.sequence_parallel ? " sp" : "");
  HfDifferences worst;
  std::mutex mu;
  run_ranks(c.tp, [&](int64_t rank) {
    const ModelFamily& family = model_family(c.family);
    auto module = family.from_hf_config(c.folder + "/config.json");
    module->to(c.dtype);
    std::optional<DeviceMesh> mesh;
    if (c.tp > 1) {
      mesh = init_device_mesh("cpu", {c.tp}, {"tp"});
      family.parallelize(*module, *mesh, /*loss_parallel=*/true, c.sequence_parallel);
    }
    HfAdapter adapter = family.hf_adapter(*module);
    if (c.edit_adapter) c.edit_adapter(adapter);
    load_hf_checkpoint(*module, adapter, c.folder);
    CausalLanguageModel& model = as_causal_lm(*module);
    const double final_logit_softcap = model.final_logit_softcap();
    if (model.sizes().tie_word_embeddings) {  // one parameter, read by the head at every TP degree
      const auto parameters = module->named_parameters();
      EXPECT_TRUE(model.head_weight().is_same(parameters["tok_embeddings.weight"])) << what;
      EXPECT_FALSE(parameters.contains("output.weight")) << what;
    }

    // transformers' logits and loss are after the final soft-capping: loss_parallel's
    // logit_softcap under TP, the plain formula at TP 1.
    std::optional<LossParallelGuard> guard;
    LossParallelOptions loss_options;
    loss_options.logit_softcap = final_logit_softcap;
    if (c.tp > 1) guard.emplace(loss_options);
    at::Tensor logits = model.logits(ref.at("tokens"));
    const at::Tensor capped = c.tp > 1 ? logits : soft_cap(logits, final_logit_softcap);
    at::Tensor loss = F::cross_entropy(capped.flatten(0, 1), ref.at("targets").flatten());
    loss.backward();
    auto full = [](const at::Tensor& t) { return (is_dtensor(t) ? full_tensor(t) : t).detach(); };
    std::map<std::string, at::Tensor> grads;
    for (const auto& p : module->named_parameters()) grads[p.key()] = full(p.value().grad());
    const auto hf_grads = to_hf_names(grads, adapter, /*sum_shared=*/true);

    HfDifferences d;
    d.logits = max_diff(soft_cap(full(logits), final_logit_softcap), ref.at("logits"));
    d.loss = max_diff(full(loss), ref.at("loss"));
    EXPECT_LE(d.logits, c.tol) << what << ": logits vs transformers";
    EXPECT_LE(d.loss, c.tol) << what << ": loss vs transformers";
    size_t compared = 0;
    for (const auto& [key, want] : ref) {
      if (key.rfind("grad.", 0) != 0) continue;
      const std::string hf_name = key.substr(5);
      ASSERT_TRUE(hf_grads.count(hf_name)) << what << ": no gradient of ours maps to " << hf_name;
      const double g = max_diff(hf_grads.at(hf_name), want);
      EXPECT_LE(g, c.tol) << what << ": gradient of " << hf_name;
      d.grads = std::max(d.grads, g);
      ++compared;
    }
    EXPECT_EQ(compared, hf_grads.size()) << what << ": every gradient of ours has a transformers counterpart";
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      worst = d;
    }
  });
  return worst;
}

void check_hf_parity(const std::string& family, const std::string& script, const std::vector<std::string>& cases,
                     at::ScalarType dtype, double tol, bool with_sequence_parallel) {
  const HfModels& models = hf_models(script);
  if (!models.skip_reason.empty()) GTEST_SKIP() << models.skip_reason;
  for (const std::string& name : cases) {
    for (int64_t tp : {1, 2, 4}) {
      for (bool sp : {false, true}) {
        if (sp && (!with_sequence_parallel || tp == 1)) continue;
        HfParityCase c{family, compat::join_path(models.dir, name), dtype, tp, sp, tol, {}};
        const HfDifferences d = run_hf_parity_case(c);
        std::cout << "[ hf parity ] " << family << " " << name << " " << c10::toString(dtype) << " tp " << tp
                  << (sp ? " sp" : "") << ": max |d logits| " << d.logits << ", |d loss| " << d.loss
                  << ", max |d grad| " << d.grads << "\n";
      }
    }
  }
}

}  // namespace hyper_parallel::testing
