// hp-train's Hugging Face keys through the Trainer (ranks as threads): model.hf_assets_path
// builds the model from config.json and sets [model]'s sizes (a conflicting size is an
// error naming both values, on every rank); checkpoint.initial_load_path with
// initial_load_in_hf starts from the checkpoint's weights unless a resume finds a
// checkpoint; a tied head stays the embeddings' parameter through training at TP 2 and
// trains as at TP 1. The checkpoints here are written by the test (no transformers needed);
// tests/hf/finetune_parity.py compares a fine-tuning run with transformers itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <mutex>
#include <sstream>

#include "compat/file_system.h"
#include "harness/hf_models.h"
#include "harness/rank_harness.h"
#include "hyper_parallel/hyper_parallel.h"
#include "hyper_parallel/models/llama.h"
#include "models/safetensors.h"
#include "models/safetensors_writer.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/trainer.h"

namespace trainer_hf_test {

using namespace hyper_parallel;
using namespace hyper_parallel::train;
using hyper_parallel::testing::run_ranks;
using ::testing::HasSubstr;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string dir =
      compat::join_path(compat::temp_directory(), "hp_trainer_hf_" + name + "_" + std::to_string(::getpid()));
  compat::remove_all(dir);
  compat::create_directories(dir);
  return dir;
}

// A transformers-style folder: config.json (GQA 4 query / 2 kv heads, explicit head_dim,
// eps 1e-6) and model.safetensors holding a seeded model's weights under HF names.
// Returns our parameters by our names, as saved.
std::map<std::string, at::Tensor> write_hf_folder(const std::string& dir, bool tied) {
  std::ofstream(dir + "/config.json")
      << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "intermediate_size": 48, "vocab_size": 67, "max_position_embeddings": 32, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": )"
      << (tied ? "true" : "false") << "}";
  Llama source(LlamaArgs::from_hf_config_file(dir + "/config.json"));
  source->init_weights(11);
  std::map<std::string, at::Tensor> ours;
  for (const auto& p : source->named_parameters()) ours[p.key()] = p.value().detach().clone();
  hf::write_safetensors(dir + "/model.safetensors", to_hf_names(ours, llama_hf_adapter(source->args()), false));
  return ours;
}

JobConfig hf_job(const std::string& hf_dir, const std::string& dump, int64_t tp, int64_t steps) {
  JobConfig c;
  c.dump_folder = dump;
  c.model.hf_assets_path = hf_dir;
  c.checkpoint.initial_load_in_hf = true;  // initial_load_path empty: hf_assets_path
  c.training.dtype = "float64";
  c.training.batch_size = 4;
  c.training.seq_len = 16;
  c.training.steps = steps;
  c.lr_scheduler.warmup_steps = 2;
  c.parallelism.tensor_parallel_degree = tp;
  c.validation.enable = false;
  c.checkpoint.enable = true;
  c.checkpoint.interval = steps;
  c.metrics.enable_plot = false;
  return c;
}

at::Tensor full(const at::Tensor& t) { return (is_dtensor(t) ? full_tensor(t) : t).detach(); }

std::string text_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST(TrainerHf, ModelSizesComeFromConfigJsonAndAConflictingSizeIsAnErrorNamingBothOnEveryRank) {
  const std::string hf = fresh_dir("sizes");
  write_hf_folder(hf, /*tied=*/false);
  JobConfig job = hf_job(hf, fresh_dir("sizes_dump"), 2, 1);
  job.model.dim = 32;         // the config's value: fine
  job.model.n_heads = 8;      // the default: takes the config's 4
  job.model.vocab_size = 50;  // neither the default 32000 nor the config's 67
  job.model.norm_eps = 1e-5;  // the default: takes the config's 1e-6
  std::vector<std::string> messages(2);
  run_ranks(2, [&](int64_t rank) {
    try {
      Trainer trainer(job);
      ADD_FAILURE() << "expected an error";
    } catch (const std::invalid_argument& e) {
      messages[rank] = e.what();
    }
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_THAT(messages[0], HasSubstr("model.vocab_size = 50 but " + hf + "/config.json has vocab_size = 67"));
  EXPECT_THAT(messages[0], ::testing::Not(HasSubstr("model.dim")));
  EXPECT_THAT(messages[0], ::testing::Not(HasSubstr("model.norm_eps")));

  // A relative folder that is not there: read from the working directory (every path of a
  // job config is, as TorchTitan's), which the error names, so running elsewhere is explained.
  JobConfig elsewhere = job;
  elsewhere.model.hf_assets_path = "configs/no_such_model";
  run_ranks(1, [&](int64_t) {
    try {
      Trainer trainer(elsewhere);
      ADD_FAILURE() << "expected an error";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("no config.json there (configs/no_such_model/config.json, relative to the "
                                      "working directory " +
                                      compat::current_directory() + ")"));
    }
  });

  job.model.vocab_size = 32000;
  job.training.steps = 1;
  run_ranks(2, [&](int64_t) {
    Trainer trainer(job);
    EXPECT_EQ(trainer.config().model.vocab_size, 67);
    EXPECT_EQ(trainer.config().model.norm_eps, 1e-6);
    EXPECT_EQ(trainer.config().model.ffn_hidden_dim, 48);
    EXPECT_EQ(as_llama(trainer.model())->args().resolved_kv_heads(), 2);
    EXPECT_TRUE(as_llama(trainer.model())->args().rope_tables_like_hf);
  });

  // Before the config is read its sizes are unknown: the command line's validate() does not
  // hold a TP degree against the default n_heads (8 does not split over 3; the model's may).
  JobConfig unresolved;
  unresolved.model.hf_assets_path = hf;
  unresolved.parallelism.tensor_parallel_degree = 3;
  EXPECT_NO_THROW(validate(unresolved));

  // The checkpoint keys' rules (--help lists the keys: JobConfig.UsageListsEveryKeyWithTypeAndDefault).
  auto validate_error = [](const JobConfig& c) -> std::string {
    try {
      validate(c);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(no error)";
  };
  JobConfig bad;
  bad.checkpoint.initial_load_path = hf;
  EXPECT_THAT(validate_error(bad), HasSubstr("set checkpoint.initial_load_in_hf = true"));
  EXPECT_THAT(validate_error(bad), HasSubstr("not supported this way, use checkpoint.resume"));
  bad.checkpoint.initial_load_in_hf = true;
  EXPECT_THAT(validate_error(bad), HasSubstr("checkpoint.initial_load_in_hf = true needs model.hf_assets_path"));
}

TEST(TrainerHf, StartsFromTheHfCheckpointAndATiedHeadStaysTheEmbeddingThroughTrainingAtTp2) {
  const std::string hf = fresh_dir("tied");
  const auto saved = write_hf_folder(hf, /*tied=*/true);
  EXPECT_FALSE(saved.count("output.weight"));
  const int64_t steps = 3;
  std::map<int64_t, std::vector<StepResult>> curves;
  for (int64_t tp : {1, 2}) {
    const JobConfig job = hf_job(hf, fresh_dir("tied_tp" + std::to_string(tp)), tp, steps);
    std::mutex mu;
    run_ranks(tp, [&](int64_t rank) {
      Trainer trainer(job);
      Llama model = as_llama(trainer.model());
      for (const auto& p : model->named_parameters()) {
        EXPECT_TRUE(at::equal(full(p.value()), saved.at(p.key()).to(at::kDouble))) << p.key() << " tp " << tp;
      }
      auto results = trainer.train();
      // After training: still one tensor, one parameter in every walk, one in the checkpoint.
      EXPECT_TRUE(model->output->weight.is_same(model->tok_embeddings->weight)) << "tp " << tp;
      EXPECT_FALSE(model->named_parameters().contains("output.weight"));
      EXPECT_GT((full(model->tok_embeddings->weight) - saved.at("tok_embeddings.weight").to(at::kDouble))
                    .abs()
                    .max()
                    .item<double>(),
                0.0)
          << "the tied weight trained";
      if (rank == 0) {
        std::lock_guard<std::mutex> lock(mu);
        curves[tp] = results;
      }
    });
    std::ifstream manifest(job.dump_folder + "/checkpoints/step-3/manifest.json");
    std::stringstream text;
    text << manifest.rdbuf();
    EXPECT_THAT(text.str(), HasSubstr("model.tok_embeddings.weight"));
    EXPECT_THAT(text.str(), ::testing::Not(HasSubstr("model.output.weight")));
  }
  ASSERT_EQ(curves[1].size(), static_cast<size_t>(steps));
  ASSERT_EQ(curves[2].size(), static_cast<size_t>(steps));
  for (int64_t s = 0; s < steps; ++s) {
    EXPECT_NEAR(curves[2][s].loss, curves[1][s].loss, 1e-12 * curves[1][s].loss) << "step " << s + 1;
    EXPECT_NEAR(curves[2][s].grad_norm, curves[1][s].grad_norm, 1e-10 * curves[1][s].grad_norm) << "step " << s + 1;
  }

  // A resume that finds the checkpoint takes precedence over the initial load.
  JobConfig resume =
      hf_job(hf, compat::join_path(compat::temp_directory(), "hp_trainer_hf_tied_tp2_" + std::to_string(::getpid())), 2,
             steps + 1);
  resume.checkpoint.resume = true;
  std::ostringstream log;
  run_ranks(2, [&](int64_t rank) {
    Trainer trainer(resume, rank == 0 ? &log : nullptr);
    EXPECT_EQ(trainer.step(), steps);
    EXPECT_TRUE(as_llama(trainer.model())->output->weight.is_same(as_llama(trainer.model())->tok_embeddings->weight));
    EXPECT_FALSE(at::equal(full(as_llama(trainer.model())->tok_embeddings->weight),
                           saved.at("tok_embeddings.weight").to(at::kDouble)));
  });
  EXPECT_THAT(log.str(), HasSubstr("is not read (a resume takes precedence)"));
}

// checkpoint.last_save_in_hf: after the last step's checkpoint, hf/step-<N> holds the trained
// weights under Hugging Face names (q/k rows in HF's RoPE layout) in export_dtype, with the
// source folder's tokenizer files; without checkpoint.enable it is a config error.
TEST(TrainerHf, LastSaveInHfWritesTheTrainedWeightsAsAHfCheckpointAtTp2) {
  const std::string hf = fresh_dir("last_save");
  (void)write_hf_folder(hf, /*tied=*/false);
  std::ofstream(hf + "/tokenizer.json") << R"({"version": "1.0"})";
  JobConfig job = hf_job(hf, fresh_dir("last_save_run"), 2, 2);
  job.checkpoint.last_save_in_hf = true;
  std::map<std::string, at::Tensor> trained;
  LlamaArgs args;
  std::ostringstream log;
  run_ranks(2, [&](int64_t rank) {
    Trainer trainer(job, rank == 0 ? &log : nullptr);
    (void)trainer.train();
    std::map<std::string, at::Tensor> mine;
    for (const auto& p : trainer.model().named_parameters()) mine[p.key()] = full(p.value());
    if (rank == 0) {
      trained = mine;
      args = as_llama(trainer.model())->args();
    }
  });
  const std::string out = hf_export_folder(job, 2);
  EXPECT_EQ(out, job.dump_folder + "/hf/step-2");
  EXPECT_THAT(log.str(), HasSubstr("step 2 written as a Hugging Face checkpoint in " + out));
  EXPECT_TRUE(compat::path_exists(out + "/config.json"));
  EXPECT_TRUE(compat::path_exists(out + "/tokenizer.json")) << "the source folder's tokenizer files go with it";
  const auto written = hyper_parallel::testing::read_safetensors_file(out + "/model.safetensors");
  const auto want = to_hf_names(trained, llama_hf_adapter(args), false);
  ASSERT_EQ(written.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(written.count(name)) << name;
    EXPECT_EQ(written.at(name).scalar_type(), at::kFloat) << name << ": checkpoint.export_dtype's default";
    EXPECT_TRUE(at::equal(written.at(name), t.to(at::kFloat))) << name;
  }

  JobConfig no_checkpoints = job;
  no_checkpoints.checkpoint.enable = false;
  EXPECT_THAT([&] { validate(no_checkpoints); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  HasSubstr("checkpoint.last_save_in_hf = true needs checkpoint.enable = true")));
  JobConfig bad_dtype = job;
  bad_dtype.checkpoint.export_dtype = "float16";
  EXPECT_THAT([&] { validate(bad_dtype); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  HasSubstr("checkpoint.export_dtype = \"float16\" is not one of float32, bfloat16")));
}

// Probes: after a failed last_save_in_hf a resume said "nothing left to train" and wrote no
// export; hp-hf-export without --source dropped the bos/eos ids last_save_in_hf keeps; and
// model.hf_assets_path without initial_load_in_hf trained from random weights while the
// log said "from <folder>".
TEST(TrainerHf, AMissingLastExportIsWrittenOnResumeAndHpHfExportWritesTheSameMetadata) {
  const std::string hf = fresh_dir("last_save_retry");
  (void)write_hf_folder(hf, /*tied=*/false);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(hf + "/config.json"));
  config["bos_token_id"] = 1;
  config["eos_token_id"] = 2;
  std::ofstream(hf + "/config.json") << config.dump();
  std::ofstream(hf + "/tokenizer.json") << R"({"version": "1.0"})";
  JobConfig job = hf_job(hf, fresh_dir("last_save_retry_run"), 1, 2);
  job.checkpoint.last_save_in_hf = true;
  run_ranks(1, [&](int64_t) { (void)Trainer(job).train(); });
  const std::string out = hf_export_folder(job, 2);
  const std::string exported_config = text_of(out + "/config.json");
  compat::remove_all(out);  // as if the run had failed while exporting

  JobConfig resume = job;
  resume.checkpoint.resume = true;
  std::ostringstream log;
  run_ranks(1, [&](int64_t) { EXPECT_TRUE(Trainer(resume, &log).train().empty()); });
  EXPECT_THAT(log.str(), HasSubstr("step 2 has no Hugging Face export yet"));
  EXPECT_EQ(text_of(out + "/config.json"), exported_config);
  EXPECT_TRUE(compat::path_exists(out + "/tokenizer.json"));

  // hp-hf-export without --source (in last_save_in_hf's export_dtype): the same config.json,
  // token ids included, from the config the checkpoint recorded.
  const std::string tool_out = fresh_dir("last_save_tool");
  const auto r = hyper_parallel::testing::run_command(hyper_parallel::testing::binary_path("hp-hf-export") + " '" +
                                                      compat::join_path(job.dump_folder, job.checkpoint.folder) +
                                                      "' '" + tool_out + "' --dtype float32 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("token ids from the config.json the checkpoint recorded"));
  EXPECT_EQ(text_of(tool_out + "/config.json"), exported_config);

  JobConfig shaped = hf_job(hf, fresh_dir("shaped_only"), 1, 1);
  shaped.checkpoint.initial_load_in_hf = false;
  shaped.checkpoint.enable = false;
  std::ostringstream shaped_log;
  run_ranks(1, [&](int64_t) { Trainer t(shaped, &shaped_log); });
  EXPECT_THAT(shaped_log.str(), HasSubstr("shaped as " + hf +
                                          " (its config.json; its weights are read only with "
                                          "--checkpoint.initial_load_in_hf)"));
  EXPECT_THAT(shaped_log.str(), ::testing::Not(HasSubstr(" from " + hf)));
}

}  // namespace trainer_hf_test
