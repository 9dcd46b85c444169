// hp-hf-load: loads a Hugging Face checkpoint folder into our model, tensor-parallel over
// every rank hp-run starts, and reports per rank what it cost: the load's time, the peak
// resident memory from building the model to loaded (VmHWM, reset before the model is built)
// against the checkpoint's size, and the loss on a few random tokens (the same on every TP
// degree). The model is built on the meta device (ParametersOnMeta), sharded, then
// materialized: no rank allocates more than its shards. --built-full builds it the plain
// way instead (every rank initialises the whole model first), for comparison.
//
//   hp-run --nproc-per-node 4 build/bin/hp-hf-load DIR [float32|bfloat16|float64] [--built-full]
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

#include "compat/file_system.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel/models/model_registry.h"
#include "hyper_parallel/nn/parameters_on_meta.h"

namespace hp = hyper_parallel;

namespace {

// A /proc/self/status field in MiB (VmHWM: peak resident set, VmRSS: now).
double status_mib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  }
  return -1;
}

// Linux resets VmHWM to the current RSS when "5" is written to clear_refs.
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

double checkpoint_mib(const std::string& dir) {
  double bytes = 0;
  for (const auto& name : hp::compat::list_directory(dir)) {
    if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0) {
      bytes += static_cast<double>(hp::compat::file_size(hp::compat::join_path(dir, name)));
    }
  }
  return bytes / (1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  const bool built_full = argc > 1 && std::string(argv[argc - 1]) == "--built-full";
  if (built_full) --argc;
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: hp-run --nproc-per-node TP hp-hf-load DIR [float32|bfloat16|float64] [--built-full]"
              << std::endl;
    return 2;
  }
  const std::string dir = argv[1];
  const std::string dtype_name = argc == 3 ? argv[2] : "float32";
  const at::ScalarType dtype = dtype_name == "float64"    ? at::kDouble
                               : dtype_name == "bfloat16" ? at::kBFloat16
                                                          : at::kFloat;
  try {
    hp::init_process_group();
    const int64_t rank = hp::get_rank(), tp = hp::get_world_size();
    nlohmann::json config = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
    const hp::ModelFamily& family = hp::model_family(config.value("model_type", std::string("llama")));
    std::optional<hp::DeviceMesh> mesh;
    if (tp > 1) mesh = hp::init_device_mesh("cpu", {tp}, {"tp"});
    const double before = status_mib("VmRSS");
    reset_peak_rss();
    std::shared_ptr<torch::nn::Module> model;
    {
      std::optional<hp::ParametersOnMeta> on_meta;
      if (!built_full && tp > 1) on_meta.emplace();  // at TP 1 the rank holds the whole model anyway
      model = family.from_hf_config(dir + "/config.json");
    }
    model->to(dtype);
    if (mesh) family.parallelize(*model, *mesh, /*loss_parallel=*/true, /*sequence_parallel=*/false);
    hp::materialize_parameters(*model, at::kCPU);
    double local_mib = 0;
    for (const auto& p : model->parameters()) {
      local_mib += static_cast<double>((hp::is_dtensor(p) ? hp::to_local(p) : p).nbytes()) / (1 << 20);
    }
    const auto start = std::chrono::steady_clock::now();
    hp::load_hf_checkpoint(*model, family.hf_adapter(*model), dir);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double peak = status_mib("VmHWM");

    auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
    const int64_t vocab = config.at("vocab_size").get<int64_t>();
    at::Tensor tokens = at::randint(vocab, {1, 17}, gen, at::kLong);
    double loss_value;
    {
      at::NoGradGuard no_grad;
      // Any registered family: its module is a causal language model whose logits come before
      // its final soft-capping (Gemma 2's), which the loss applies.
      hp::CausalLanguageModel& lm = hp::as_causal_lm(*model);
      hp::LossParallelOptions options;
      options.logit_softcap = lm.final_logit_softcap();
      std::optional<hp::LossParallelGuard> guard;
      if (tp > 1) guard.emplace(options);
      const at::Tensor input = tokens.narrow(1, 0, 16);
      at::Tensor logits = lm.logits(input);
      if (tp == 1) logits = hp::soft_cap(logits, options.logit_softcap);
      at::Tensor loss = torch::nn::functional::cross_entropy(logits.flatten(0, 1), tokens.narrow(1, 1, 16).flatten());
      loss_value = (hp::is_dtensor(loss) ? hp::full_tensor(loss) : loss).item<double>();
    }
    std::ostringstream line;
    line.precision(4);
    line << "rank " << rank << "/" << tp << ": checkpoint " << checkpoint_mib(dir) << " MiB, local parameters "
         << local_mib << " MiB (" << dtype_name << "); RSS before the model " << before << " MiB, peak building "
         << (built_full || tp == 1 ? "the whole model" : "on meta") << " to loaded " << peak << " MiB (+"
         << peak - before << "); load " << seconds << " s; loss on 16 random tokens ";
    line.precision(10);
    line << loss_value << "\n";
    std::cout << line.str() << std::flush;
    hp::destroy_process_group();
  } catch (const std::exception& e) {
    std::cerr << "hp-hf-load: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
