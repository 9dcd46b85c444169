// hp-export-train: writes what a training job starts from, for another framework to start
// from the same place (scripts/bench_train_vs_pytorch.sh trains PyTorch from it).
//
//   hp-export-train DIR [--config FILE] [--section.key VALUE ...]
//
// DIR/manifest.json names the model and optimiser settings; DIR/weights/<name>.bin holds
// every parameter of the unsharded model exactly as hp-train starts from it (initialised
// from the seed, or read from the Hugging Face checkpoint of checkpoint.initial_load_in_hf;
// float32, raw little-endian, row-major; a float64 or bfloat16 job converts them as
// hp-train does: a bfloat16 job rounds them to bfloat16 and starts its float32 master
// weights from the rounded values);
// DIR/batches/{input,target}_<step>.bin the int64 token batches of steps 1..training.steps,
// exactly as hp-train draws them (synthetic, text or pre-tokenized data).
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "compat/file_system.h"
#include "train/checkpoint/checkpoint_io.h"
#include "hyper_parallel/models/causal_lm.h"
#include "train/data/corpus.h"
#include "hyper_parallel_train/spec/train_spec.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/trainer.h"

namespace hp = hyper_parallel;

namespace {

void write_raw(const std::string& path, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(c.const_data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  if (!out) throw std::runtime_error("hp-export-train: cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2 || std::string(argv[1]).rfind("--", 0) == 0) {
      std::cerr << "usage: hp-export-train DIR [--config FILE] [--section.key VALUE ...]\n";
      return 2;
    }
    const std::string dir = argv[1];
    std::vector<std::string> args(argv + 2, argv + argc);
    hp::train::JobConfig cfg = hp::train::parse_job_config(args);
    // The family's module, as hp-train builds it (the spec sets cfg.model from a Hugging Face
    // config). The PyTorch side of bench_train_vs_pytorch.sh rebuilds a Llama of these sizes;
    // the Hugging Face fine-tuning parity reads only the batches.
    const hp::train::TrainSpec& spec = hp::train::train_spec(cfg.model.name);
    const std::shared_ptr<torch::nn::Module> model = spec.build(cfg.model);
    const auto& m = cfg.model;
    const auto& t = cfg.training;
    hp::as_causal_lm(*model).init_weights(static_cast<uint64_t>(t.seed));
    if (cfg.checkpoint.initial_load_in_hf) {
      const std::string& path =
          cfg.checkpoint.initial_load_path.empty() ? m.hf_assets_path : cfg.checkpoint.initial_load_path;
      hp::train::load_hf_checkpoint(*model, spec, path);
    }
    hp::train::make_directories(hp::compat::join_path(dir, "weights"));
    hp::train::make_directories(hp::compat::join_path(dir, "batches"));
    nlohmann::json weights = nlohmann::json::array();
    for (const auto& p : model->named_parameters()) {
      write_raw(hp::compat::join_path(dir, "weights/" + p.key() + ".bin"), p.value().detach().to(at::kFloat));
      weights.push_back({{"name", p.key()}, {"shape", p.value().sizes().vec()}});
    }
    // One data-parallel replica: the global batches hp-train's ranks split between them.
    const auto corpus = hp::train::open_training_corpus(t, m.vocab_size);
    const auto batches = corpus->train_batches(/*dp_rank=*/0, /*dp_size=*/1);
    for (int64_t step = 1; step <= t.steps; ++step) {
      const hp::train::Batch b = batches->batch_at(step - 1);
      write_raw(hp::compat::join_path(dir, "batches/input_" + std::to_string(step) + ".bin"), b.input.to(at::kLong));
      write_raw(hp::compat::join_path(dir, "batches/target_" + std::to_string(step) + ".bin"), b.target.to(at::kLong));
    }
    const hp::DecoderSizes a = hp::as_causal_lm(*model).sizes();
    nlohmann::json manifest = {{"model",
                                {{"name", m.name},
                                 {"dim", a.dim},
                                 {"n_layers", a.n_layers},
                                 {"n_heads", a.n_heads},
                                 {"vocab_size", a.vocab_size},
                                 {"hidden_dim", a.ffn_hidden_dim},
                                 {"norm_eps", a.norm_eps},
                                 {"rope_theta", a.rope_theta},
                                 {"max_seq_len", a.max_seq_len},
                                 {"n_kv_heads", a.n_kv_heads},
                                 {"head_dim", a.head_dim},
                                 {"tie_word_embeddings", a.tie_word_embeddings},
                                 {"hf_assets_path", m.hf_assets_path}}},
                               {"training",
                                {{"batch_size", t.batch_size},
                                 {"seq_len", t.seq_len},
                                 {"steps", t.steps},
                                 {"lr", t.lr},
                                 {"weight_decay", t.weight_decay},
                                 {"beta1", t.beta1},
                                 {"beta2", t.beta2},
                                 {"eps", t.eps},
                                 {"max_norm", t.max_norm}}},
                               {"lr_scheduler",
                                {{"warmup_steps", cfg.lr_scheduler.warmup_steps},
                                 {"decay_ratio", cfg.lr_scheduler.decay_ratio},
                                 {"decay_type", cfg.lr_scheduler.decay_type},
                                 {"min_lr_factor", cfg.lr_scheduler.min_lr_factor}}},
                               {"dtype", t.dtype},
                               {"tensor_parallel_degree", cfg.parallelism.tensor_parallel_degree},
                               {"loss_parallel", !cfg.parallelism.disable_loss_parallel},
                               {"weights", weights}};
    std::ofstream(hp::compat::join_path(dir, "manifest.json")) << manifest.dump(1) << "\n";
    std::cout << "hp-export-train: " << weights.size() << " parameters and " << t.steps << " batches in " << dir
              << std::endl;
  } catch (const c10::Error& e) {
    std::cerr << "hp-export-train: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "hp-export-train: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
