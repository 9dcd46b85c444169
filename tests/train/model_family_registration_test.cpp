// model_family_registration_test.cpp — a model family from outside the library: defined in
// this file, registered at run time by name (register_model_family, designated fields) with
// a spec of its own (default_train_spec with its loss and description replaced,
// register_train_spec), then trained and dry-run by hp-train's library as the library's
// own families are. Bad registrations are refused naming what is wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "hyper_parallel/models/llama.h"
#include "hyper_parallel/models/model_registry.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/spec/train_spec.h"
#include "harness/build_paths.h"
#include "harness/scratch_folder.h"
#include "harness/train_steps.h"
#include "train/dry_run.h"

namespace model_family_registration_test {

using namespace hyper_parallel;
using namespace hyper_parallel::train;
using ::testing::HasSubstr;

namespace {

constexpr const char* kFamily = "tied_test_decoder";

// The calls of the family's own loss, on every rank thread.
std::atomic<int64_t> loss_calls{0};

// A decoder with tied embeddings built from [model]'s sizes alone (the library's Llama can
// only be tied through a config.json), the Llama TP plan; no config.json of its own.
ModelFamily tied_test_decoder() {
  auto no_config = [](const std::string&) -> std::shared_ptr<torch::nn::Module> {
    throw std::invalid_argument(std::string(kFamily) + " is built from [model]'s sizes only");
  };
  return {
      .name = kFamily,
      .from_hf_config = no_config,
      .from_hf_config_json = [no_config](const std::string& json, const std::string&) { return no_config(json); },
      .parallelize =
          [](torch::nn::Module& m, const DeviceMesh& mesh, bool loss_parallel, bool sequence_parallel) {
            Llama model = as_llama(m);
            parallelize_llama(model, mesh, loss_parallel, sequence_parallel, /*src_data_rank=*/std::nullopt);
          },
      .hf_adapter = [](const torch::nn::Module& m) { return llama_hf_adapter(as_llama(m)->args()); },
      .from_sizes =
          [](const DecoderSizes& s) {
            LlamaArgs args = LlamaArgs::from_sizes(s);
            args.tie_word_embeddings = true;
            return Llama(args).ptr();
          },
  };
}

// Registered once per process, before any job names it.
void register_tied_test_decoder() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_model_family(tied_test_decoder());
    TrainSpec spec = default_train_spec(kFamily);
    auto token_loss_sum = spec.loss;
    spec.loss = [token_loss_sum](torch::nn::Module& model, const Batch& batch, const TrainContext& context,
                                 const LossCall& call) {
      ++loss_calls;
      return token_loss_sum(model, batch, context, call);
    };
    spec.describe = [](const torch::nn::Module&) { return std::string("the test's tied decoder"); };
    register_train_spec(std::move(spec));
  });
}

// The training tests' tiny job (train_steps.h) at TP 2, naming the family, without checkpoints.
JobConfig tied_job() {
  JobConfig c = hyper_parallel::testing::tiny_checkpointed_job(
      hyper_parallel::testing::scratch_path("model_family_registration"), /*tp=*/2, /*steps=*/2);
  c.model.name = kFamily;
  c.checkpoint.enable = false;
  return c;
}

std::string registration_error(const std::function<void()>& registration) {
  try {
    registration();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ModelFamilyRegistration, AFamilyDefinedHereTrainsAndDryRunsThroughHpTrainsLibrary) {
  register_tied_test_decoder();
  EXPECT_THAT(model_family_names(), ::testing::Contains(std::string(kFamily)));
  EXPECT_THAT(job_config_usage(), HasSubstr(kFamily));
  const JobConfig job = tied_job();
  const int64_t calls_before = loss_calls;
  const std::vector<StepResult> steps = hyper_parallel::testing::train_steps(job, 1, 2);
  ASSERT_EQ(steps.size(), 2u);
  for (const StepResult& s : steps) EXPECT_TRUE(std::isfinite(s.loss) && s.loss > 0) << s.loss;
  EXPECT_EQ(loss_calls - calls_before, 2 * 2) << "the family's own loss: 2 steps on 2 ranks";
  // The dry run builds and steps the same job on meta tensors: the state two real steps
  // hold (tied: one vocabulary matrix), the spec's own description.
  const DryRunRank dry = dry_run_rank(job, 2, 0);
  EXPECT_EQ(dry.model, "the test's tied decoder");
  EXPECT_TRUE(dry.sizes.tie_word_embeddings);
  EXPECT_EQ(dry.state.parameters, steps.back().state.parameters);
  EXPECT_EQ(dry.state.gradients, steps.back().state.gradients);
  EXPECT_EQ(dry.state.optimizer, steps.back().state.optimizer);
  EXPECT_GT(dry.state.optimizer, 0);
  // It counts no block activations: the dry run says so rather than guessing.
  EXPECT_EQ(dry.block_activation_bytes, -1);
  EXPECT_EQ(dry.no_block_activations,
            "model.name = \"tied_test_decoder\": its family gives no "
            "block_activation_bytes (hp-dry-run --measure measures it)");
}

TEST(ModelFamilyRegistration, BadRegistrationsAreRefusedNamingWhatIsWrong) {
  register_tied_test_decoder();
  EXPECT_THAT(registration_error([] { register_model_family(tied_test_decoder()); }),
              HasSubstr("a family named 'tied_test_decoder' is registered already"));
  EXPECT_THAT(registration_error([] { register_model_family(llama_family()); }),
              HasSubstr("'llama' is registered already"));
  ModelFamily unnamed = tied_test_decoder();
  unnamed.name = "";
  EXPECT_THAT(registration_error([&] { register_model_family(unnamed); }), HasSubstr("ModelFamily::name is empty"));
  ModelFamily no_plan = tied_test_decoder();
  no_plan.name = "no_plan";
  no_plan.parallelize = nullptr;
  EXPECT_THAT(registration_error([&] { register_model_family(no_plan); }),
              HasSubstr("ModelFamily::parallelize is empty"));
  TrainSpec stranger = default_train_spec("llama");
  stranger.name = "not_a_family";
  EXPECT_THAT(registration_error([&] { register_train_spec(stranger); }),
              HasSubstr("unknown model family 'not_a_family'"));
  TrainSpec lossless = default_train_spec(kFamily);
  lossless.loss = nullptr;
  EXPECT_THAT(registration_error([&] { register_train_spec(lossless); }), HasSubstr("TrainSpec::loss is empty"));
  EXPECT_THAT(registration_error([] { register_train_spec(default_train_spec(kFamily)); }),
              HasSubstr("the spec of 'tied_test_decoder' is set already"));
}

TEST(ModelFamilyRegistration, TheSpecIsTheOneDoorToItsFamily) {
  register_tied_test_decoder();
  // The registered spec and the default one both carry the registry entry itself: what the
  // Trainer loads with, the checkpoints export with and the dry run estimates with.
  EXPECT_EQ(train_spec(kFamily).family, &model_family(kFamily));
  EXPECT_EQ(train_spec("llama").family, &model_family("llama"));
  EXPECT_EQ(default_train_spec("qwen3").family, &model_family("qwen3"));
  TrainSpec borrowed = default_train_spec(kFamily);
  borrowed.family = &model_family("llama");
  EXPECT_THAT(registration_error([&] { register_train_spec(borrowed); }),
              HasSubstr("TrainSpec::family is the registry entry of 'llama', not of 'tied_test_decoder'"));
  // The tied decoder has no config.json writer: an export through its spec says so.
  EXPECT_THAT(registration_error([] {
                const TrainSpec& spec = train_spec(kFamily);
                ModelConfig m;
                m.name = kFamily;
                export_hf_checkpoint(*spec.build(m), spec, hyper_parallel::testing::scratch_path("no_export"));
              }),
              HasSubstr("model family 'tied_test_decoder' cannot write a config.json yet"));
}

TEST(ModelFamilyPlugin, ALibraryThatCannotBeLoadedOrLacksTheEntryPointIsNamed) {
  EXPECT_THAT(registration_error([] { load_model_family_plugins("/no/such/minigpt_family.so"); }),
              ::testing::AllOf(HasSubstr("HYPER_PARALLEL_MODEL_PLUGIN_PATH: cannot load model family plugin "
                                         "'/no/such/minigpt_family.so'"),
                               HasSubstr("No such file")));
  const std::string no_entry = hyper_parallel::testing::no_entry_point_plugin_path();
  EXPECT_THAT(registration_error([&] { load_model_family_plugins(":" + no_entry + ":"); }),
              HasSubstr("model family plugin '" + no_entry +
                        "' does not export the symbol hyper_parallel_register_model_families (expected extern \"C\" "
                        "void hyper_parallel_register_model_families())"));
}

}  // namespace model_family_registration_test
