// minigpt_family.cpp — the family's registry entry and the plugin's entry point. hp-train
// loads this library from HYPER_PARALLEL_MODEL_PLUGIN_PATH and calls
// hyper_parallel_register_model_families(), which registers "minigpt"; a job with
// model.name = "minigpt" then trains it as it trains the library's own families.
#include <torch/nn/module.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

#include <hyper_parallel/models/model_registry.h>
#include <hyper_parallel/nn/parallel_style.h>

#include "minigpt_model.h"

namespace minigpt {
namespace {

namespace hp = hyper_parallel;

const MiniGptImpl& as_minigpt(const torch::nn::Module& module) {
  const auto* impl = dynamic_cast<const MiniGptImpl*>(&module);
  if (!impl) throw std::invalid_argument("minigpt: the module is not a MiniGpt");
  return *impl;
}

std::shared_ptr<torch::nn::Module> from_config_json(const std::string& json, const std::string& source) {
  return MiniGpt(MiniGptArgs::from_config_json(json, source)).ptr();
}

// TorchTitan's plan for a dense decoder: q/k/v and the MLP's first matmul split by output
// (heads, hidden units), wo and the second matmul by input, each block's exit an all-reduce;
// the head split over the vocabulary, its logits left sharded for loss parallel.
void parallelize(torch::nn::Module& module, const hp::DeviceMesh& tp_mesh, bool loss_parallel, bool sequence_parallel) {
  if (sequence_parallel)
    throw std::invalid_argument("minigpt: parallelism.sequence_parallel is not supported by this example family");
  const MiniGptArgs& a = as_minigpt(module).args();
  const int64_t tp = tp_mesh.size();
  if (a.n_heads % tp != 0 || a.hidden_dim() % tp != 0)
    throw std::invalid_argument("minigpt: n_heads " + std::to_string(a.n_heads) + " and ffn hidden " +
                                std::to_string(a.hidden_dim()) + " must be divisible by tensor_parallel_degree " +
                                std::to_string(tp));
  hp::StyleOptions head;
  head.output_layouts = hp::Placements{loss_parallel ? hp::Placement::shard(-1) : hp::Placement::replicate()};
  head.use_local_output = !loss_parallel;
  const hp::ParallelizePlan plan = {
      {"layers.*.wq", hp::ColwiseParallel::make()},    {"layers.*.wk", hp::ColwiseParallel::make()},
      {"layers.*.wv", hp::ColwiseParallel::make()},    {"layers.*.wo", hp::RowwiseParallel::make()},
      {"layers.*.fc_in", hp::ColwiseParallel::make()}, {"layers.*.fc_out", hp::RowwiseParallel::make()},
      {"output", hp::ColwiseParallel::make(head)},
  };
  // Every rank built the same weights from one seed (or reads its pieces next): no scatter.
  hp::parallelize_module(module, tp_mesh, plan, /*src_data_rank=*/std::nullopt);
}

// Its checkpoint names: ours under "model.", the head as lm_head (no RoPE rows to permute).
hp::HfAdapter hf_adapter(const torch::nn::Module& module) {
  hp::HfAdapter adapter;
  for (const auto& p : module.named_parameters())
    adapter.push_back({p.key(), p.key() == "output.weight" ? "lm_head.weight" : "model." + p.key(), 0});
  return adapter;
}

}  // namespace

hp::ModelFamily minigpt_family() {
  return {
      .name = "minigpt",
      .from_hf_config =
          [](const std::string& path) {
            std::ifstream in(path);
            if (!in) throw std::invalid_argument("minigpt: cannot read " + path);
            std::stringstream text;
            text << in.rdbuf();
            return from_config_json(text.str(), path);
          },
      .from_hf_config_json = from_config_json,
      .parallelize = parallelize,
      .hf_adapter = hf_adapter,
      .to_hf_config = [](const torch::nn::Module& m) { return as_minigpt(m).args().to_config_json(); },
      .from_sizes = [](const hp::DecoderSizes& s) { return MiniGpt(MiniGptArgs::from_sizes(s)).ptr(); },
      // No activation estimate: hp-dry-run says so (and --measure measures it).
      .block_activation_bytes = nullptr,
  };
}

}  // namespace minigpt

// The plugin's entry point (HYPER_PARALLEL_MODEL_PLUGIN_PATH).
extern "C" __attribute__((visibility("default"))) void hyper_parallel_register_model_families() {
  hyper_parallel::register_model_family(minigpt::minigpt_family());
}
